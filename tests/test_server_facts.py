"""What the server was started with, read from ``docker top`` as Docker prints it: the PID
column is required (``-eo args`` alone is refused), the server's own process wins over the
``bash -c`` that started it, and the shell's redirections are not read as vLLM flags."""

from __future__ import annotations

from pathlib import Path

from pytest_spark.infra.servecmd import MARK, parse_probe, probe, serve_line_of

TOP = (Path(__file__).parents[1] / "fixtures" / "docker" / "top-pid-args-no-ray.txt").read_text()
REFUSED = "Error response from daemon: Couldn't find PID field in ps output\n"


def _probe(top: str) -> str:
    return f'{MARK}inspect\n"sleep" ["infinity"]\n{MARK}top\n{top}{MARK}log\n\n'


def test_probe_asks_docker_top_for_the_pid_column() -> None:
    """Docker answers ``-eo args`` with "Couldn't find PID field in ps output"."""
    assert "docker top vllm_node -eo pid,args -ww" in probe("vllm_node")
    assert parse_probe(_probe(REFUSED), None) is None


def test_the_server_process_is_read_not_the_shell_around_it() -> None:
    cmd = parse_probe(_probe(TOP), None)
    assert cmd is not None and cmd.source == "the vllm serve process"
    assert cmd.line.startswith("vllm serve /models/Qwen3.5-122B-A10B-FP8 --served-model-name")
    assert cmd.line.endswith("--master-port 29501"), cmd.line
    assert cmd.args.reasoning_parser == "qwen3" and cmd.args.tool_call_parser == "qwen3_coder"
    assert cmd.args.auto_tool_choice and cmd.args.nnodes == 2


def test_a_bash_c_listing_stops_at_the_shell_operators() -> None:
    """Only the shell is there (its child not yet started): its row is read up to ``>>``."""
    rows = [line for line in TOP.splitlines() if "python3" not in line]
    cmd = parse_probe(_probe("\n".join(rows) + "\n"), None)
    assert cmd is not None and cmd.line.endswith("--master-port 29501"), cmd
    assert ">>" not in cmd.line and "echo" not in cmd.line
    line = "vllm serve M --port 8000 && echo done | tee x; true"
    assert serve_line_of(["bash", "-c", line]) == "vllm serve M --port 8000"
    assert serve_line_of(["bash", "-c", "vllm serve M 2>&1"]) == "vllm serve M"


# A launch script (`launch-cluster.sh --launch-script`, recipes): the container runs
# `bash -c "/workspace/exec-script.sh >> /proc/1/fd/1 2>&1"`, bash runs the script, and the
# script's last line, patched per node, is the real `vllm serve` (a child): its flags are
# nowhere in the container's command or the shells above it.
EXEC_SCRIPT_TOP = """PID                 COMMAND
161                 /sbin/docker-init -- sleep infinity
176                 sleep infinity
236                 bash -c /workspace/exec-script.sh >> /proc/1/fd/1 2>&1; echo $? > /tmp/.launch-cluster-head-exit
237                 /bin/bash /workspace/exec-script.sh
242                 python3 /opt/vllm/bin/vllm serve /models/M --served-model-name m --tensor-parallel-size 2 --tool-call-parser qwen3_coder --enable-auto-tool-choice --nnodes 2 --node-rank 0 --master-addr 198.19.0.1 --master-port 29501
"""  # noqa: E501


def test_a_launch_scripts_serve_args_are_read_from_its_child_process() -> None:
    """The suite's --spark-serve-args have the parser; the running server does not: the
    process wins, so the missing flag is found."""
    given = "vllm serve /models/M --reasoning-parser qwen3 --tensor-parallel-size 2"
    cmd = parse_probe(_probe(EXEC_SCRIPT_TOP), given)
    assert cmd is not None and cmd.source == "the vllm serve process", cmd
    assert cmd.line.startswith("vllm serve /models/M --served-model-name m"), cmd.line
    assert cmd.args.reasoning_parser is None and cmd.args.nnodes == 2
