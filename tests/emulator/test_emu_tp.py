"""TP=2 across two nodes: the head waits for the ``worker`` (placement-group wait lines),
serves once it joins, and turns /health to 503 with vLLM's failure lines when the worker's
heartbeat is lost; ``ray status`` follows the live nodes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from conftest import Emu, base_env, emulator_cmd, free_port, refused

TP2 = [
    "--served-model-name",
    "qwen",
    "--tensor-parallel-size",
    "2",
    "--distributed-executor-backend",
    "ray",
]


def ray_status(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        emulator_cmd("ray", "status"),
        env=base_env({"SPARKSIM_EMU_RAY_STATUS_FILE": str(path)}),
        capture_output=True,
        text=True,
        timeout=20,
    )


def wait_status(path: Path, needle: str, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        out = ray_status(path).stdout
        if needle in out:
            return out
        time.sleep(0.2)
    raise AssertionError(f"ray status never showed {needle!r}:\n{out}")


def start_head(emu_factory: Any, tmp_path: Path) -> tuple[Emu, int, Path]:
    peer_port = free_port()
    status = tmp_path / "ray_status.json"
    env = {"SPARKSIM_EMU_TP_PEER_PORT": str(peer_port), "SPARKSIM_EMU_RAY_STATUS_FILE": str(status)}
    return emu_factory(TP2, env, wait=False), peer_port, status


def start_worker(proc_factory: Any, peer_port: int) -> Any:
    return proc_factory(
        emulator_cmd(
            "worker",
            "--head-addr",
            "127.0.0.1",
            "--port",
            str(peer_port),
            "--node-ip",
            "198.19.0.2",
        )
    )


def test_head_waits_for_worker_then_serves_then_dies_with_it(
    emu_factory: Any, proc_factory: Any, tmp_path: Path
) -> None:
    head, peer_port, status = start_head(emu_factory, tmp_path)
    pg = (
        r"Waiting for creating a placement group of specs for \d+ seconds\. "
        r"specs=\[\{'GPU': 1\.0, 'node:"
    )
    first = head.wait_for(pg, 30)
    head.wait_for(pg, 5, first + 1)  # repeats while no worker
    assert refused(head.port)
    out = wait_status(status, "pending placement groups")
    assert len(re.findall(r"^ 1 node_[0-9a-f]{56}$", out, re.M)) == 1
    assert " 0.0/1.0 GPU" in out

    worker = start_worker(proc_factory, peer_port)
    head.ready(10)
    worker.wait_for("Ray runtime started.", 30)
    assert re.search(r"^\(RayWorkerWrapper pid=\d+, ip=198\.19\.0\.2\) INFO ", head.text(), re.M)
    out = wait_status(status, "2.0/2.0 GPU")
    assert len(re.findall(r"^ 1 node_[0-9a-f]{56}$", out, re.M)) == 2
    assert out.startswith("======== Autoscaler status: ")
    assert "Pending:\n (no pending nodes)\nRecent failures:\n (no failures)" in out
    assert head.request("GET", "/health").status == 200
    assert (
        head.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).status == 200
    )

    worker.proc.kill()  # the worker node's process dies: EOF on the link
    head.wait_for(r"vllm\.v1\.engine\.exceptions\.EngineDeadError", 30)
    text = head.text()
    assert (
        "ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task."
        in text
    )
    assert "\tip: 198.19.0.2" in text
    assert re.search(r"NCCL error: remote process exited or there was a network error", text)
    assert head.request("GET", "/health").status == 503
    assert head.chat({"messages": [{"role": "user", "content": "hi"}]}).status == 500
    out = wait_status(status, " 0.0/1.0 GPU")
    assert len(re.findall(r"^ 1 node_[0-9a-f]{56}$", out, re.M)) == 1


def test_silent_link_times_out_with_nccl_watchdog(
    emu_factory: Any, proc_factory: Any, tmp_path: Path
) -> None:
    head, peer_port, _ = start_head(emu_factory, tmp_path)
    worker = start_worker(proc_factory, peer_port)
    head.ready(10)
    os.kill(worker.proc.pid, signal.SIGSTOP)  # no heartbeats, no EOF: like a link going down
    try:
        head.wait_for(r"Watchdog caught collective operation timeout", 30)
        head.wait_for(r"EngineDeadError", 30)
        assert "The actor is dead because its node has died." in head.text()
        assert head.request("GET", "/health").status == 503
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)


def test_worker_waits_for_head_and_ray_status_without_cluster(
    proc_factory: Any, tmp_path: Path
) -> None:
    worker = start_worker(proc_factory, free_port())
    worker.wait_for(r"Failed to connect to GCS at address 127\.0\.0\.1:\d+", 30)
    r = ray_status(tmp_path / "missing.json")
    assert r.returncode == 1 and "Could not find any running Ray instance" in r.stderr
