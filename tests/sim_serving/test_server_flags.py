"""The server-flag readers (test_server_has_reasoning_parser / test_server_has_tool_parser)
on sparksim, attached with no --spark-serve-args: what the server was started with is read
from the head's container as on a Spark (``docker top -eo pid,args``: the ``vllm serve``
process), never from the suite's own launch arguments.

Ray mode is the hard case: the head's vLLM output goes to the launcher's stdout (the
operator's log), not to ``docker logs``, so the process listing is the only source."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sim
REPO = Path(__file__).resolve().parents[2]

CONTAINER = "vllm_node"
MODEL = "/models/Qwen3.5-122B-A10B-FP8"
TOOLS = "--tool-call-parser qwen3_coder --enable-auto-tool-choice"
SERVE = (
    f"vllm serve {MODEL} --served-model-name qwen3.5-122b --tensor-parallel-size 2 "
    f"--gpu-memory-utilization 0.90 --max-model-len 32768 --host 0.0.0.0 --port 8000 {TOOLS}"
)


def _serve(sim: Any, serve: str, *mode: str) -> None:
    """``nohup launch-cluster.sh ... exec SERVE &`` on the head (as an operator starts it,
    its output in a log file), until /health answers 200."""
    nodes = ",".join(sim.fabric_ip(n["name"]) for n in sim.cluster["nodes"])
    script = "/root/spark-vllm-docker/launch-cluster.sh"
    argv = [script, "-n", nodes, "-t", "vllm-node:latest", "--name", CONTAINER, *mode]
    launcher = shlex.join([*argv, "exec", *shlex.split(serve)])
    sim.out(sim.head["name"], f"setsid nohup {launcher} >/root/cluster.log 2>&1 </dev/null &")
    sim.wait_http(f"http://{sim.head['mgmt']}:8000/health", 200, timeout=120)


def _stop(sim: Any) -> None:
    sim.ssh(
        sim.head["name"],
        f"/root/spark-vllm-docker/launch-cluster.sh --name {CONTAINER} stop",
        timeout=120,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        names = sim.out(sim.head["name"], "docker ps --format '{{.Names}}'").split()
        if CONTAINER not in names:
            return
        time.sleep(0.5)


def _read(sim: Any) -> list[str]:
    """The plugin's reader over SSH, from a fresh interpreter of the checkout."""
    code = (
        "import subprocess, sys\n"
        "from pytest_spark.infra.servecmd import probe, parse_probe\n"
        f"cmd = ['ssh', '-F', {sim.cluster['ssh_config']!r}, {sim.head['mgmt']!r}, "
        f"probe({CONTAINER!r})]\n"
        "out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout\n"
        "found = parse_probe(out, None)\n"
        "print(found.source if found else None)\n"
        "print(found.line if found else None)\n"
        "print(found.args.reasoning_parser if found else None)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=90
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def _attach(run_suite: Any) -> tuple[dict[str, Any], str]:
    run = run_suite(
        f"--spark-container={CONTAINER}",
        "--spark-port=8000",
        "-k",
        "test_server_has_reasoning_parser or test_server_has_tool_parser",
    )
    return {c["nodeid"].rsplit("::", 1)[-1]: c for c in run.results["checks"]}, run.output


def test_ray_head_without_reasoning_parser_is_read_from_its_process(
    sim: Any, run_suite: Any
) -> None:
    """Ray mode, the head's log not in ``docker logs``, no --spark-serve-args: the reader
    finds the ``vllm serve`` process, and the missing parser is one failure quoting it."""
    _serve(sim, SERVE, "--ray")
    try:
        source, line, parser = _read(sim)
        assert source == "the vllm serve process", (source, line)
        assert line.startswith(f"vllm serve {MODEL} ") and TOOLS in line, line
        assert "--distributed-executor-backend ray" in line and parser == "None"
        checks, output = _attach(run_suite)
        reasoning = checks["test_server_has_reasoning_parser"]
        assert reasoning["outcome"] == "failed", output
        assert "started without --reasoning-parser" in reasoning["message"], reasoning
        assert "Read from the vllm serve process: vllm serve" in reasoning["message"]
        assert checks["test_server_has_tool_parser"]["outcome"] == "passed", output
    finally:
        _stop(sim)


def test_no_ray_head_with_parsers_passes_from_its_process(sim: Any, run_suite: Any) -> None:
    """No Ray (the launcher's default): the server's own process is read, not the
    ``bash -c`` around it (whose listing runs on into ``>> /proc/1/fd/1 2>&1; echo ...``)."""
    _serve(sim, f"{SERVE} --reasoning-parser qwen3")
    try:
        source, line, parser = _read(sim)
        assert source == "the vllm serve process", (source, line)
        assert parser == "qwen3" and "--node-rank 0" in line, line
        assert ">>" not in line and "echo" not in line, line
        checks, output = _attach(run_suite)
        assert checks["test_server_has_reasoning_parser"]["outcome"] == "passed", output
        assert checks["test_server_has_tool_parser"]["outcome"] == "passed", output
    finally:
        _stop(sim)
