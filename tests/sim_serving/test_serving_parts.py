"""The serving stack's parts without a sim (no root): checkpoint files, the image tarball,
launch-cluster.sh against stub commands, and the image's ``vllm`` and ``ray``."""

from __future__ import annotations

import json
import os
import shlex
import socket
import struct
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from pytest_spark.sim import image, models, serving
from pytest_spark.sim.emulator.config import ENV_PREFIX, Knobs
from pytest_spark.sim.emulator.tp import PeerLink

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "pytest_spark/sim/launcher/launch-cluster.sh"
SHIMS = REPO / "pytest_spark/sim/launcher/image"


# ------------------------------------------------------------------ checkpoint


def test_checkpoint_is_deterministic_and_valid_safetensors() -> None:
    files = models.files()
    assert files == models.files()
    shards = sorted(n for n in files if n.endswith(".safetensors"))
    assert shards == [f"model-{i:05d}-of-00039.safetensors" for i in range(1, 40)]
    index = json.loads(files["model.safetensors.index.json"])
    total = 0
    for name in shards:
        data = files[name]
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + size])
        for tensor, meta in header.items():
            if tensor == "__metadata__":
                continue
            assert index["weight_map"][tensor] == name
            start, end = meta["data_offsets"]
            total += end - start
        assert len(data) == 8 + size + max(
            m["data_offsets"][1] for k, m in header.items() if k != "__metadata__"
        )
    assert index["metadata"]["total_size"] == total
    config = json.loads(files["config.json"])
    assert config["quantization_config"]["quant_method"] == "fp8"


@pytest.mark.parametrize("how", models.FAULT_KINDS)
def test_model_damage_makes_the_copy_differ(tmp_path: Path, how: str) -> None:
    models.install(tmp_path)
    before = {p.name: p.read_bytes() for p in models.model_dir(tmp_path).iterdir()}
    models.damage(tmp_path, how)
    after = {p.name: p.read_bytes() for p in models.model_dir(tmp_path).iterdir()}
    assert after != before
    if how == "corrupt":
        assert {k: len(v) for k, v in after.items()} == {k: len(v) for k, v in before.items()}


# ----------------------------------------------------------------------- image


def test_image_tarball_holds_python_the_emulator_and_the_shims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("no /usr/bin/python3 for the serving image")
    monkeypatch.setenv(image.CACHE_ENV, str(tmp_path))
    path, built = image.tarball()
    assert built
    assert image.tarball() == (path, False), "cached by content"
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
    py = image._python_layout(image.image_python())
    for wanted in (
        "usr/local/bin/vllm",
        "usr/local/bin/ray",
        "etc/passwd",
        f"{py['stdlib']}/os.py",
        py["zip"],
    ):
        assert wanted.lstrip("/") in names, wanted
    site = next(n for n in names if n.endswith("pytest_spark/sim/emulator/__main__.py"))
    assert site.replace("/sim/emulator/__main__.py", "/__init__.py") in names
    assert any(n.endswith("/libgcc_s.so.1") for n in names), "glibc dlopens it at thread exit"
    assert len(names) < 400, "the standard library travels as one zip"


def test_image_carries_the_system_libraries_of_real_vllms_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--engine vllm-cpu` mounts a venv whose torch loads libraries the sim's Python may not
    (a checkout without torch built an image without libstdc++/libpthread, and real vLLM
    died at `import torch`): the image takes them from that venv's shared objects."""
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("no /usr/bin/python3 for the serving image")
    import matplotlib

    # a C++ extension that links libstdc++, standing in for libtorch_cpu.so
    cxx = next(Path(matplotlib.__file__).parent.glob("_path*.so"))
    needs = {Path(lib).name for lib in image._shared_libraries([str(cxx)])}
    assert "libstdc++.so.6" in needs
    monkeypatch.setattr(image, "torch_site", lambda: None)  # the sim's Python has no torch
    monkeypatch.setenv(image.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("SPARKSIM_VLLM_CPU", str(tmp_path / "absent.json"))
    assert image.engine_venv_site() is None
    with tarfile.open(image.tarball()[0]) as tar:
        without = {Path(n).name for n in tar.getnames()}
    assert "libstdc++.so.6" not in without, "python3 and the core tools need no libstdc++"

    engine = tmp_path / "engine"  # what scripts/setup-vllm-cpu makes
    site = engine / "venv/lib/python3.11/site-packages"
    (site / "torch/lib").mkdir(parents=True)
    (site / "torch/lib" / "libtorch_cpu.so").write_bytes(cxx.read_bytes())
    for part in ("model", "cache"):
        (engine / part).mkdir()
    info = engine / "vllm-cpu.json"
    info.write_text(json.dumps({k: str(engine / k) for k in ("venv", "model", "cache")}))
    monkeypatch.setenv("SPARKSIM_VLLM_CPU", str(info))
    assert image.engine_venv_site() == str(site)
    path, built = image.tarball()
    assert built, "a new engine venv is a new image"
    with tarfile.open(path) as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert needs - {"linux-vdso.so.1"} <= names


def test_serving_fault_variable_is_the_emulators() -> None:
    assert hasattr(Knobs(), "fault")
    assert serving.FAULT_ENV == ENV_PREFIX + "FAULT"


# -------------------------------------------------------------- launcher, stubbed

STUBS = {
    "ibdev2netdev": """#!/bin/sh
cat <<EOF
roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)
roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)
rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)
rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)
EOF
""",
    "ip": """#!/bin/sh
case "$*" in
  *enp1s0f1np1*) echo "3: enp1s0f1np1    inet 198.19.0.1/24 scope global enp1s0f1np1";;
  *enP2p1s0f1np1*) echo "4: enP2p1s0f1np1    inet 198.19.1.1/24 scope global enP2p1s0f1np1";;
esac
""",
    # Every docker and ssh call is logged, one line per call, arguments NUL-separated.
    "docker": """#!/bin/bash
printf '%s\\0' docker "$@" >> "$STUB_LOG"; echo >> "$STUB_LOG"
if [ "$1" = ps ] && [ -f "$STUB_RUNNING" ]; then cat "$STUB_RUNNING"; fi
if [ "$1" = exec ] && [ "$3" = ray ]; then echo "RAY STATUS"; fi
exit 0
""",
    "ssh": """#!/bin/bash
printf '%s\\0' ssh "$@" >> "$STUB_LOG"; echo >> "$STUB_LOG"
exit 0
""",
    "sleep": "#!/bin/sh\nexit 0\n",
}


def run_launcher(
    tmp_path: Path, *args: str, running: str | None = None
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    log = tmp_path / "calls.log"
    log.write_text("")
    running_file = tmp_path / "running"
    if running is not None:
        running_file.write_text(running)
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "STUB_LOG": str(log),
        "STUB_RUNNING": str(running_file),
        "VLLM_SPARK_EXTRA_DOCKER_ARGS": "-v /root/models:/models",
    }
    proc = subprocess.run(
        ["bash", str(LAUNCHER), *args], capture_output=True, text=True, env=env, timeout=30
    )
    calls = [line.split("\0")[:-1] for line in log.read_text().splitlines() if line]
    return proc, calls


def test_launcher_start_runs_both_containers_and_ray(tmp_path: Path) -> None:
    proc, calls = run_launcher(
        tmp_path, "-n", "198.19.0.1,198.19.0.2", "-e", "X=1", "--nccl-debug", "-d", "start"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "  Detected IB_IF: roceP2p1s0f1,rocep1s0f1" in out
    assert "  Detected ETH_IF: enp1s0f1np1" in out
    assert "Head Node: 198.19.0.1" in out and "Worker Nodes: 198.19.0.2" in out
    assert ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "198.19.0.2", "true"] in calls
    head_run = next(c for c in calls if c[:2] == ["docker", "run"])
    for flag in (
        "--privileged",
        "--gpus",
        "all",
        "--network",
        "host",
        "--ipc=host",
        "--rm",
        "-d",
        "--name",
        "vllm_node",
        "--entrypoint=",
        "vllm-node",
    ):
        assert flag in head_run
    for env in (
        "VLLM_HOST_IP=198.19.0.1",
        "NCCL_SOCKET_IFNAME=enp1s0f1np1",
        "NCCL_IB_HCA=roceP2p1s0f1,rocep1s0f1",
        "NCCL_IB_DISABLE=0",
        "GLOO_SOCKET_IFNAME=enp1s0f1np1",
        "TP_SOCKET_IFNAME=enp1s0f1np1",
        "UCX_NET_DEVICES=enp1s0f1np1",
        "MASTER_ADDR=198.19.0.1",
        "NCCL_DEBUG=INFO",
        "X=1",
    ):
        assert env in head_run, env
    assert head_run[-2:] == ["sleep", "infinity"]
    assert "/root/models:/models" in head_run, "VLLM_SPARK_EXTRA_DOCKER_ARGS is honoured"
    worker_run = next(c for c in calls if c[0] == "ssh" and "run" in c[-1].split()[:2])
    assert "VLLM_HOST_IP=198.19.0.2" in worker_run[-1]
    ray_head = next(c for c in calls if c[:3] == ["docker", "exec", "-d"])
    assert "ray start --block --head --port 6379 --dashboard-port 8265" in ray_head[-1]
    assert ">> /proc/1/fd/1 2>&1" in ray_head[-1]
    ray_worker = next(c for c in calls if c[0] == "ssh" and "--address=198.19.0.1:6379" in c[-1])
    remote = shlex.split(ray_worker[-1])  # the launcher quotes what it sends over SSH
    assert remote[:5] == ["docker", "exec", "-d", "vllm_node", "bash"]
    assert "--node-ip-address 198.19.0.2" in remote[-1]
    assert "Cluster started in background (Daemon mode)." in out


def test_launcher_exec_daemon_logs_to_the_container_output(tmp_path: Path) -> None:
    proc, calls = run_launcher(
        tmp_path,
        "-n",
        "198.19.0.1,198.19.0.2",
        "-d",
        "exec",
        "vllm",
        "serve",
        "/models/m",
        "--port",
        "8000",
        running="vllm_node\n",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Cluster containers are already running. Skipping launch." in proc.stdout
    dispatched = [c for c in calls if c[:3] == ["docker", "exec", "-d"]]
    assert dispatched[-1][3:] == [
        "vllm_node",
        "bash",
        "-c",
        "vllm serve /models/m --port 8000  >> /proc/1/fd/1 2>&1",
    ]


def test_launcher_status_and_stop_formats(tmp_path: Path) -> None:
    proc, _ = run_launcher(tmp_path, "-n", "198.19.0.1,198.19.0.2", "status", running="vllm_node\n")
    assert "[HEAD] 198.19.0.1: Container 'vllm_node' is RUNNING." in proc.stdout
    assert "--- Ray Status ---\nRAY STATUS\n------------------" in proc.stdout
    assert "[WORKER] 198.19.0.2: Container 'vllm_node' is NOT running." in proc.stdout
    proc, calls = run_launcher(tmp_path, "-n", "198.19.0.1,198.19.0.2", "--name", "x", "stop")
    assert ["docker", "stop", "x"] in calls
    assert any(c[0] == "ssh" and c[-1].strip() == "docker stop x" for c in calls)
    assert "Cluster stopped." in proc.stdout


def test_launcher_refuses_a_head_outside_the_node_list(tmp_path: Path) -> None:
    proc, _ = run_launcher(tmp_path, "-n", "198.18.0.11,198.18.0.12", "start")
    assert proc.returncode == 1
    assert "Error: Local IP (198.19.0.1) is not in the list of nodes" in proc.stdout


# --------------------------------------------------------------- vllm and ray


def test_vllm_shim_merges_the_nodes_engine_settings(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "engine.env").write_text("SPARKSIM_EMU_FAULT=crash-oom\nSPARKSIM_EMU_TIME_SCALE=0.5\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text('#!/bin/sh\nenv | grep ^SPARKSIM_ | sort\necho "ARGS $*"\n')
    (fake / "python3").chmod(0o755)
    env = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "SPARKSIM_ETC": str(etc),
        "SPARKSIM_EMU_FAULT": "slow-load",
        "VLLM_HOST_IP": "198.19.0.1",
        "SPARKSIM_EMU_RAY_STATUS_FILE": str(tmp_path / "ray" / "status.json"),
    }
    proc = subprocess.run(
        ["bash", str(SHIMS / "vllm"), "serve", "/models/m", "--port", "8000"],
        capture_output=True,
        text=True,
        env=env,
        timeout=10,
    )
    lines = proc.stdout.splitlines()
    assert "SPARKSIM_EMU_FAULT=slow-load,crash-oom" in lines
    assert "SPARKSIM_EMU_TIME_SCALE=0.5" in lines
    assert f"SPARKSIM_EMU_CONTROL={etc}/control.json" in lines
    assert "SPARKSIM_EMU_HEAD_IP=198.19.0.1" in lines
    assert "ARGS -m pytest_spark.sim.emulator serve /models/m --port 8000" in lines


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ray_head_keeps_membership_and_relays_rank1_to_the_engine(tmp_path: Path) -> None:
    gcs_port, tp_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SPARKSIM_RAY_DIR": str(tmp_path),
        "SPARKSIM_EMU_TP_PEER_PORT": str(tp_port),
        "SPARKSIM_EMU_HEARTBEAT_S": "0.1",
        "SPARKSIM_EMU_HEARTBEAT_TIMEOUT_S": "1.0",
        "SPARKSIM_EMU_RAY_STATUS_FILE": str(tmp_path / "serve.json"),
    }
    ray = [sys.executable, str(SHIMS / "ray")]
    status = subprocess.run([*ray, "status"], capture_output=True, text=True, env=env)
    assert status.returncode == 1 and "Could not find any running Ray instance" in status.stderr
    head = subprocess.Popen(
        [
            *ray,
            "start",
            "--head",
            "--port",
            str(gcs_port),
            "--node-ip-address",
            "127.0.0.1",
            "--block",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    worker = None
    try:
        assert head.stdout is not None
        assert head.stdout.readline().startswith("Usage stats collection is disabled.")
        worker = subprocess.Popen(
            [
                *ray,
                "start",
                "--address",
                f"127.0.0.1:{gcs_port}",
                "--node-ip-address",
                "127.0.0.1",
                "--block",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            status = subprocess.run([*ray, "status"], capture_output=True, text=True, env=env)
            if status.stdout.count(" 1 node_") == 2:
                break
            time.sleep(0.2)
        assert status.stdout.count(" 1 node_") == 2, status.stdout + status.stderr
        # The engine's side of the TP link sees the worker through the head's relay.
        knobs = Knobs(heartbeat_s=0.1, heartbeat_timeout_s=1.0)
        lost: list[str] = []
        got_lost = threading.Event()
        link = PeerLink(
            "127.0.0.1", tp_port, knobs, lambda cause: (lost.append(cause), got_lost.set())
        )
        try:
            assert link.connected.wait(10), "the relay never dialled the engine"
            assert link.peer_pid == worker.pid
            worker.kill()
            assert got_lost.wait(10)
            assert lost == ["eof"], "a killed worker closes its end at once"
        finally:
            link.close()
    finally:
        for proc in (worker, head):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if head.stdout is not None:
            head.stdout.close()
