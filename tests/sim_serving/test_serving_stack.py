"""sparksim's serving stack end to end: a Docker engine per node reached over SSH, the
serving image, the checkpoint, launch-cluster.sh with Ray (--ray) and without (its default),
the vLLM emulator, the serving faults, and a ``down`` that leaves nothing behind.

The tests run in file order on one module-wide sim: they form one launch, serve, fail,
stop story, as an operator's session would.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sim

MODEL = "/models/Qwen3.5-122B-A10B-FP8"
SERVED = "qwen3.5-122b"
# Emulator phases at 1/500 of the real 122B load (~1.5 s instead of ~13 min).
FAST = ("-e", "SPARKSIM_EMU_TIME_SCALE=0.002")
SERVE = (
    "vllm", "serve", MODEL, "--served-model-name", SERVED, "--tensor-parallel-size", "2",
    "--max-model-len", "32768",
    "--gpu-memory-utilization", "0.90", "--host", "0.0.0.0", "--port", "8000",
    "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen3_coder",
    "--enable-auto-tool-choice",
)  # fmt: skip


def health_url(sim: Any) -> str:
    return f"http://{sim.head['mgmt']}:8000/health"


def container_env(sim: Any, node: str, name: str = "vllm_node") -> dict[str, str]:
    out = sim.out(node, f"docker inspect -f '{{{{json .Config.Env}}}}' {name}")
    return dict(item.split("=", 1) for item in json.loads(out))


def test_docker_cli_reaches_each_nodes_own_engine(sim: Any) -> None:
    ids = set()
    for n in sim.cluster["nodes"]:
        name = n["name"]
        info = json.loads(sim.out(name, "docker info --format '{{json .}}'"))
        assert info["Name"] == name, "the engine runs in the node's UTS namespace"
        assert info["DockerRootDir"] == str(sim.state_dir / "nodes" / name / "docker" / "data")
        assert "nvidia" in info["Runtimes"], "as on a Spark: the NVIDIA runtime is configured"
        ids.add(info["ID"])
        images = sim.out(name, "docker images --format '{{.Repository}}:{{.Tag}}'").split()
        assert "vllm-node:latest" in images
        # No flag, no context: the node's sshd points the CLI at the node's engine.
        env = sim.out(name, "echo $DOCKER_HOST").strip()
        assert env == f"unix://{sim.state_dir}/nodes/{name}/docker.sock"
    assert len(ids) == 2, "each node has an engine of its own"


def test_checkpoint_is_identical_on_every_node(sim: Any) -> None:
    listing = f"cd /root/models/{Path(MODEL).name} && sha256sum * | sort"
    copies = [sim.out(n["name"], listing) for n in sim.cluster["nodes"]]
    assert copies[0] == copies[1]
    names = [line.split()[1] for line in copies[0].splitlines()]
    shards = [n for n in names if re.fullmatch(r"model-000\d\d-of-00039\.safetensors", n)]
    assert len(shards) == 39
    for required in (
        "config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert required in names


def test_check_config_detects_the_fabric(sim: Any) -> None:
    proc = sim.launch("--check-config")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"Detected Local IP: {sim.fabric_ip('spark-1')} ({sim.fabric_ip('spark-1')}/24)" in out
    assert "  ETH Interface: enp1s0f1np1" in out
    ib = re.search(r"  IB Interface: (\S+)", out)
    assert ib and set(ib.group(1).split(",")) == {"rocep1s0f1", "roceP2p1s0f1"}
    assert f"  SSH to {sim.fabric_ip('spark-2')}: OK" in out
    assert "Configuration Check Complete." in out


def test_ray_start_runs_a_ray_cluster_across_both_nodes(sim: Any) -> None:
    t0 = time.monotonic()
    proc = sim.launch(*FAST, "--ray", "-d", "start")
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Cluster head is responsive." in proc.stdout
    assert "Cluster started in background (Daemon mode)." in proc.stdout
    head_ip, worker_ip = sim.fabric_ip("spark-1"), sim.fabric_ip("spark-2")
    for node, ip in (("spark-1", head_ip), ("spark-2", worker_ip)):
        env = container_env(sim, node)
        assert env["VLLM_HOST_IP"] == ip
        for var in (
            "NCCL_SOCKET_IFNAME",
            "GLOO_SOCKET_IFNAME",
            "TP_SOCKET_IFNAME",
            "UCX_NET_DEVICES",
        ):
            assert env[var] == "enp1s0f1np1"
        assert set(env["NCCL_IB_HCA"].split(",")) == {"rocep1s0f1", "roceP2p1s0f1"}
        assert env["NCCL_IB_DISABLE"] == "0"
    ray = sim.out("spark-1", "docker exec vllm_node ray status")
    active = ray.split("Active:")[1].split("Pending:")[0]
    assert len(re.findall(r"^ 1 node_[0-9a-f]+$", active, re.M)) == 2
    assert " 0.0/2.0 GPU" in ray
    worker_log = sim.out("spark-2", "docker logs vllm_node 2>&1")
    assert "Ray runtime started." in worker_log
    assert f"connected to head node {head_ip}:29501" in worker_log
    print(f"launch-cluster.sh start: {took:.1f} s")


def test_ray_serve_becomes_ready_with_the_real_startup_log(sim: Any) -> None:
    assert sim.http_status(health_url(sim)) is None, "nothing listens before vllm serve"
    t0 = time.monotonic()
    proc = sim.launch("--ray", "-d", "exec", *SERVE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Command dispatched in background (Daemon mode)." in proc.stdout
    assert "Cluster containers are already running. Skipping launch." in proc.stdout
    ready = sim.wait_http(health_url(sim), 200, timeout=60)
    print(
        f"exec -d vllm serve -> /health 200: {time.monotonic() - t0:.1f} s (polled {ready:.1f} s)"
    )
    assert (
        sim.out("spark-1", "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health")
        == "200"
    )
    log = sim.out("spark-1", "docker logs vllm_node 2>&1")
    for line in (
        "Loading safetensors checkpoint shards: 100% Completed | 39/39",
        "INFO:     Application startup complete.",
    ):
        assert line in log, f"{line!r} missing from the head's docker logs"
    assert re.search(r"Starting vLLM (API )?server .*on http://0\.0\.0\.0:8000", log)
    assert "(RayWorkerWrapper pid=" in log and f"ip={sim.fabric_ip('spark-2')})" in log
    models = sim.out("spark-1", "curl -s http://127.0.0.1:8000/v1/models")
    data = json.loads(models)["data"][0]
    assert (data["id"], data["root"], data["max_model_len"]) == (SERVED, MODEL, 32768)
    ray = sim.out("spark-1", "docker exec vllm_node ray status")
    assert "2.0/2.0 GPU" in ray, "the placement group holds both GPUs"


def test_status_prints_the_launchers_format(sim: Any) -> None:
    proc = sim.launch("--ray", "status")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    head, worker = sim.fabric_ip("spark-1"), sim.fabric_ip("spark-2")
    assert f"[HEAD] {head}: Container 'vllm_node' is RUNNING." in proc.stdout
    assert f"[WORKER] {worker}: Container 'vllm_node' is RUNNING." in proc.stdout
    assert "--- Ray Status ---" in proc.stdout and "Autoscaler status" in proc.stdout


def test_ray_killing_the_worker_container_turns_health_503(sim: Any) -> None:
    proc = sim.cli("fault", "worker-kill", "worker-1")
    assert "spark-2: killed container vllm_node" in proc.stdout
    took = sim.wait_http(health_url(sim), 503, timeout=15)
    print(f"worker container killed -> /health 503: {took:.1f} s")
    log = sim.out("spark-1", "docker logs vllm_node 2>&1")
    assert "ray.exceptions.RayActorError" in log
    assert "EngineDeadError" in log
    assert sim.out("spark-2", "docker ps -q").strip() == ""
    status = sim.launch("status").stdout
    assert f"[WORKER] {sim.fabric_ip('spark-2')}: Container 'vllm_node' is NOT running." in status


def test_stop_removes_the_containers_on_all_nodes(sim: Any) -> None:
    proc = sim.launch("stop")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Cluster stopped." in proc.stdout
    for n in sim.cluster["nodes"]:
        assert sim.out(n["name"], "docker ps -aq").strip() == "", n["name"]
    assert sim.http_status(health_url(sim)) is None


def wait_log(sim: Any, node: str, needle: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    log = ""
    while time.monotonic() < deadline:
        log = sim.out(node, "docker logs vllm_node 2>&1")
        if needle in log:
            break
        time.sleep(0.2)
    return log


def serving_processes(sim: Any, node: str) -> str:
    return sim.out(node, "docker top vllm_node -eo pid,args -ww")


def test_no_ray_serve_runs_one_rank_per_node(sim: Any) -> None:
    assert sim.http_status(health_url(sim)) is None
    proc = sim.launch(*FAST, "-d", "exec", *SERVE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    head_ip, worker_ip = sim.fabric_ip("spark-1"), sim.fabric_ip("spark-2")
    assert f"Launching worker (rank 1) on {worker_ip}..." in proc.stdout
    assert "Ray" not in proc.stdout, "no Ray cluster without --ray"
    sim.wait_http(health_url(sim), 200, timeout=60)
    head_log = sim.out("spark-1", "docker logs vllm_node 2>&1")
    worker_log = sim.out("spark-2", "docker logs vllm_node 2>&1")
    assert "INFO:     Application startup complete." in head_log, "the head's rank logs to PID 1"
    assert f"distributed_init_method=tcp://{head_ip}:29501" in head_log
    assert "RayWorkerWrapper" not in head_log and "(Worker_TP1 " not in head_log
    assert "world_size=2 rank=1 " in worker_log and "Loading weights took" in worker_log
    assert f"head node address {head_ip}:29501" in worker_log
    assert "--headless" in serving_processes(sim, "spark-2")
    assert "vllm serve" in serving_processes(sim, "spark-1")
    ray = sim.ssh("spark-1", "docker exec vllm_node ray status")
    assert ray.returncode != 0 and "Could not find any running Ray instance" in ray.stderr


def test_no_ray_worker_kill_turns_health_503_and_the_head_container_runs_on(sim: Any) -> None:
    proc = sim.cli("fault", "worker-kill", "worker-1")
    assert "spark-2: killed container vllm_node" in proc.stdout
    sim.wait_http(health_url(sim), 503, timeout=15)
    log = sim.out("spark-1", "docker logs vllm_node 2>&1")
    assert "Worker proc rank 1 (" in log and "EngineDeadError" in log
    assert "vllm_node" in sim.out("spark-1", "docker ps --format '{{.Names}}'").split()
    proc = sim.launch("stop")
    assert proc.returncode == 0 and "Cluster stopped." in proc.stdout
    assert sim.out("spark-1", "docker ps -aq").strip() == "", "--rm: stop removes it"


def test_no_ray_head_times_out_on_a_rank_that_never_joins(sim: Any) -> None:
    try:
        assert (
            sim.launch(*FAST, "-e", "SPARKSIM_EMU_RENDEZVOUS_TIMEOUT_S=2", "-d", "start").returncode
            == 0
        )
        sim.cli("fault", "worker-kill", "worker-1")  # the worker node has no container now
        proc = sim.launch("-d", "exec", *SERVE)
        assert "Cluster containers are already running. Skipping launch." in proc.stdout
        log = wait_log(sim, "spark-1", "Engine core initialization failed")
        assert "torch.distributed.DistStoreError: wait timeout after 2000ms, keys: " in log
        assert "vllm_node" in sim.out("spark-1", "docker ps --format '{{.Names}}'").split()
        assert "vllm serve" not in serving_processes(sim, "spark-1"), "the process died"
    finally:
        sim.launch("stop")


def test_engine_load_fault_crashes_the_next_start_leaving_the_container(sim: Any) -> None:
    proc = sim.cli("fault", "engine", "crash-oom")
    assert "at the next `vllm serve`" in proc.stdout
    try:
        assert sim.launch(*FAST, "-d", "start").returncode == 0
        assert sim.launch("-d", "exec", *SERVE).returncode == 0
        log = wait_log(sim, "spark-1", "Engine core initialization failed")
        assert "torch.OutOfMemoryError: CUDA out of memory." in log
        assert "RuntimeError: Engine core initialization failed. See root cause above." in log
        assert sim.http_status(health_url(sim)) is None
        # vLLM ran under `docker exec`: its crash leaves the container (sleep infinity) up.
        assert "vllm_node" in sim.out("spark-1", "docker ps --format '{{.Names}}'").split()
        assert "vllm serve" not in serving_processes(sim, "spark-1")
    finally:
        sim.cli("fault", "clear")
        sim.launch("stop")
    assert sim.out("spark-1", "cat /root/.sparksim/engine.env") == ""
    assert sim.out("spark-1", "docker ps -aq").strip() == "", "--rm: stop removes it"


def test_stale_container_holds_the_gpu(sim: Any) -> None:
    proc = sim.cli("fault", "stale-container", "worker-1")
    assert "stale container vllm_stale" in proc.stdout
    assert "vllm_stale" in sim.out("spark-2", "docker ps --format '{{.Names}}'").split()
    apps = sim.out(
        "spark-2", "nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader"
    )
    pid, name = [x.strip() for x in apps.strip().split(",")]
    assert name == "VLLM::EngineCore"
    # The PID is a real process of the node: the stale container's vllm serve.
    cmd = sim.out("spark-2", f"cat /proc/{pid}/cmdline | tr '\\0' ' '")
    assert "vllm serve" in cmd
    assert sim.out("spark-1", "docker ps -q").strip() == "", "only the faulted node"
    status = json.loads(sim.cli("status", "--json").stdout)
    assert any(f["kind"] == "stale-container" and f["node"] == "spark-2" for f in status["faults"])
    sim.cli("fault", "clear")
    assert sim.out("spark-2", "docker ps -aq").strip() == ""
    assert (
        sim.out("spark-2", "nvidia-smi --query-compute-apps=pid --format=csv,noheader").strip()
        == ""
    )


def test_model_fault_makes_one_node_differ(sim: Any) -> None:
    sim.cli("fault", "model", "worker-1", "corrupt")
    listing = (
        f"cd /root/models/{Path(MODEL).name} && stat -c '%n %s' * | md5sum; sha256sum * | md5sum"
    )
    head = sim.out("spark-1", listing).splitlines()
    worker = sim.out("spark-2", listing).splitlines()
    assert head[0] == worker[0], "same names and sizes"
    assert head[1] != worker[1], "different content"
    sim.cli("fault", "clear")
    assert sim.out("spark-2", listing) == sim.out("spark-1", listing)


def test_down_leaves_no_engine_container_mount_or_namespace(sim: Any) -> None:
    engines = [
        json.loads((sim.state_dir / "nodes" / n["name"] / "docker" / "cgroups.json").read_text())
        for n in sim.cluster["nodes"]
    ]
    sim.cli("down")
    state = str(sim.state_dir)
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if state in cmdline:
            left.append(f"process {pid}: {cmdline.replace(chr(0), ' ')}")
    left += [
        f"mount {line}"
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if state in line
    ]
    left += (
        [f"netns {ns}" for ns in os.listdir("/run/netns") if ns.startswith(f"spk{sim.instance}-")]
        if os.path.isdir("/run/netns")
        else []
    )
    left += [f"cgroup {p}" for paths in engines for p in paths if os.path.exists(p)]
    for n in sim.cluster["nodes"]:
        for leftover in ("docker", "docker.sock"):
            path = sim.state_dir / "nodes" / n["name"] / leftover
            if path.exists():
                left.append(f"file {path}")
    assert not left, "\n".join(left)
