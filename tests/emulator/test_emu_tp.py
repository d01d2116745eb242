"""TP=2 across two nodes: the head waits for the ``worker`` (placement-group wait lines),
serves once it joins, and turns /health to 503 with vLLM's failure lines when the worker's
heartbeat is lost; ``ray status`` follows the live nodes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
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


PP3 = [
    "--served-model-name",
    "qwen",
    "--tensor-parallel-size",
    "1",
    "--pipeline-parallel-size",
    "3",
    "--distributed-executor-backend",
    "ray",
]


def test_pp3_over_three_nodes_waits_for_every_rank_and_names_the_one_lost(
    emu_factory: Any, proc_factory: Any, tmp_path: Path
) -> None:
    """TP 1 x PP 3 with Ray, one GPU a node: the placement group needs both other nodes'
    GPUs (one worker joined is not enough), the ranks follow vLLM's Ray executor (the
    driver's node, then the workers by IP), `ray status` lists three nodes and 3.0/3.0 GPU,
    and the rank that goes is the one the engine's death names."""
    peer_port = free_port()
    status = tmp_path / "ray_status.json"
    env = {"SPARKSIM_EMU_TP_PEER_PORT": str(peer_port), "SPARKSIM_EMU_RAY_STATUS_FILE": str(status)}
    head = emu_factory(PP3, env, wait=False)
    workers = {}
    for ip in ("198.19.0.3", "198.19.0.2"):  # the third node joins first
        workers[ip] = proc_factory(
            emulator_cmd(
                "worker", "--head-addr", "127.0.0.1", "--port", str(peer_port), "--node-ip", ip
            )
        )
        if ip == "198.19.0.3":
            pg = r"Waiting for creating a placement group of specs for \d+ seconds"
            at = head.wait_for(pg, 30)
            head.wait_for(pg, 5, at + 1)  # one of two workers: still waiting
            assert refused(head.port)
            wait_status(status, "pending placement groups")
    head.ready(15)
    text = head.text()
    for rank, ip in ((1, "198.19.0.2"), (2, "198.19.0.3")):
        assert re.search(
            rf"^\(RayWorkerWrapper pid=\d+, ip={re.escape(ip)}\) INFO .*rank {rank} in world "
            rf"size 3 is assigned as DP rank 0, PP rank {rank}, PCP rank 0, TP rank 0,",
            text,
            re.M,
        ), text[-3000:]
    assert "Custom allreduce is disabled" not in text  # no TP group spans nodes at TP 1
    out = wait_status(status, "3.0/3.0 GPU")
    assert len(re.findall(r"^ 1 node_[0-9a-f]{56}$", out, re.M)) == 3
    assert head.request("GET", "/health").status == 200

    workers["198.19.0.3"].proc.kill()  # the last stage's node
    head.wait_for(r"vllm\.v1\.engine\.exceptions\.EngineDeadError", 30)
    assert "\tip: 198.19.0.3" in head.text() and "\tip: 198.19.0.2" not in head.text()
    out = wait_status(status, " 0.0/2.0 GPU")
    assert len(re.findall(r"^ 1 node_[0-9a-f]{56}$", out, re.M)) == 2


def test_pp3_without_ray_one_stage_per_node_and_a_lost_stage_named(tmp_path: Path) -> None:
    """``--nnodes 3`` at TP 1 x PP 3: each node runs its own pipeline stage (vLLM's worker
    title Worker_PP<p>), the head serves once both other ranks joined, and the death of
    rank 2 names rank 2 and its address."""
    port, master = free_port(), free_port()
    env = base_env({"SPARKSIM_EMU_RENDEZVOUS_TIMEOUT_S": "30"})
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    ranks = ["--nnodes", "3", "--master-addr", "127.0.0.1", "--master-port", str(master)]
    serve = [
        *("-m", "sparksim.emulator", "serve", "/models/m", "-tp", "1", "-pp", "3"),
        *("--host", "127.0.0.1", *ranks),
    ]
    procs: dict[int, subprocess.Popen[str]] = {}
    logs = {rank: tmp_path / f"rank{rank}.log" for rank in range(3)}

    def start(rank: int, *extra: str) -> None:
        with logs[rank].open("w") as log:
            procs[rank] = subprocess.Popen(
                [sys.executable, *serve, "--node-rank", str(rank), *extra],
                stdout=log, stderr=subprocess.STDOUT, text=True,
                env={**env, "VLLM_HOST_IP": f"127.0.0.{rank + 1}"},
            )  # fmt: skip

    try:
        start(0, "--port", str(port))
        start(1, "--headless")
        time.sleep(1.0)
        assert refused(port), "two of three ranks: the head still waits at the rendezvous"
        start(2, "--headless")
        deadline = time.monotonic() + 30
        while not _answers(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _answers(port), logs[0].read_text()[-2000:]
        for rank in (1, 2):
            text = logs[rank].read_text()
            assert re.search(rf"^\(Worker_PP{rank} pid=\d+\) INFO ", text, re.M), text[-2000:]
            assert f"world_size=3 rank={rank} " in text
            assert f"assigned as DP rank 0, PP rank {rank}, PCP rank 0, TP rank 0," in text
        assert "(Worker_PP1 " not in logs[0].read_text(), "each node prints only its own rank"
        procs[2].kill()
        procs[2].wait()
        deadline = time.monotonic() + 15
        while "EngineDeadError" not in logs[0].read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "Worker proc rank 2 (127.0.0.3, pid " in logs[0].read_text()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _answers(port: int) -> bool:
    import http.client

    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/health")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False
