"""Preflight checks on facts parsed from recorded outputs (fixtures/preflight): each
failure names the node, what was measured, what was expected and the usual fix."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pytest_spark.infra.finding import Finding, Skip
from pytest_spark.infra.human import human_duration
from pytest_spark.infra.modelfiles import ModelListing
from pytest_spark.infra.preflight.docker_check import check_docker, check_gpu_holders
from pytest_spark.infra.preflight.env_check import check_serving_env
from pytest_spark.infra.preflight.host_check import (
    check_clock_skew,
    check_gpu_visible,
    check_link_flaps,
    check_passwordless_ssh,
)
from pytest_spark.infra.preflight.model_check import check_disk, check_model_identical
from pytest_spark.infra.preflight.probe import (
    CarrierCounters,
    ClockSample,
    DockerFacts,
    GpuProcess,
    JournalFacts,
    NodePreflight,
    parse_container_env,
    parse_preflight_probe,
    parse_ssh_probe,
)
from pytest_spark.infra.probe import PROBE_CONTAINER_PREFIX

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "preflight"
MODEL = "/root/models/Qwen3.5-122B-A10B-FP8"
W = "spark-worker-1"
FABRIC = ["enP2p1s0f1np1", "enp1s0f1np1"]
DEVS = ["roceP2p1s0f1", "rocep1s0f1"]
NODE_IFS = {
    "lo": True,
    "mgmt0": True,
    "enp1s0f1np1": True,
    "enP2p1s0f1np1": True,
    "enp1s0f0np0": False,
    "enP2p1s0f0np0": False,
}


def facts(name: str) -> NodePreflight:
    return parse_preflight_probe((FIXTURES / name).read_text(), MODEL)


def worker(name: str) -> NodePreflight:
    return facts(f"probe_worker_{name}.txt")


def failed(result: Finding | Skip) -> Finding:
    assert isinstance(result, Finding) and result.level == "fail", result
    return result


def passed(result: Finding | Skip) -> Finding:
    assert isinstance(result, Finding) and result.level == "pass", result
    return result


# ------------------------------------------------------------------------------ docker


def test_docker_ready_and_image_present() -> None:
    f = passed(check_docker(W, worker("idle").docker, "vllm_node"))
    assert f.measured == {"docker": "20.10.24+dfsg1", "image": "vllm-node:latest"}


def test_docker_daemon_down() -> None:
    f = failed(check_docker(W, worker("docker_stopped").docker, "vllm_node"))
    assert f.message.startswith(f"{W}: the Docker daemon is not answering")
    assert "Is the docker daemon running?" in f.message
    assert "expected it running" in f.message and "systemctl start docker" in f.message


def test_docker_missing_cli() -> None:
    f = failed(check_docker(W, DockerFacts(False, None, "x", missing=True), "vllm_node"))
    assert "docker: command not found" in f.message and "Install docker" in f.message


def test_serving_image_missing() -> None:
    f = failed(check_docker(W, worker("image_missing").docker, "vllm_node"))
    assert f"{W}: serving image vllm-node:latest not present" in f.message
    assert "No such image" in f.message and "expected it on every node" in f.message
    assert f"docker save vllm-node:latest | ssh {W} docker load" in f.message


def test_no_image_to_look_for_is_a_skip() -> None:
    docker = replace(worker("idle").docker, image=None, image_present=None)
    result = check_docker(W, docker, "vllm_node")
    assert isinstance(result, Skip) and "no --spark-image" in result.reason


# ------------------------------------------------------------------------- GPU holders


def test_stale_container_holds_the_gpu() -> None:
    stale = worker("stale_container")
    f = failed(check_gpu_holders(W, stale.docker, stale.gpu, "vllm_node", stale.now))
    assert f.message.startswith(
        f"{W}: the GPU is held outside the serving container "
        "vllm_node: pid 1041 VLLM::EngineCore in container vllm_stale "
        "(image vllm-node:latest, up "
    )
    assert "restart policy unless-stopped" in f.message
    assert "expected no other GPU process or GPU container" in f.message
    assert "docker stop vllm_stale && docker rm vllm_stale" in f.message
    assert "--restart=no" in f.message and "after a reboot" in f.message
    assert f.measured["holders"][0].startswith("pid 1041 VLLM::EngineCore")


def test_serving_containers_own_gpu_processes_are_fine() -> None:
    head = facts("probe_head_serving.txt")
    serving = head.docker.serving
    assert serving is not None
    pid = max(serving.pids)
    gpu = replace(head.gpu, processes=(GpuProcess(pid, "VLLM::EngineCore"),))
    f = passed(check_gpu_holders("spark-head", head.docker, gpu, "vllm_node", head.now))
    assert f.message == "spark-head: 1 GPU process(es), all in vllm_node"


def test_gpu_process_outside_any_container() -> None:
    idle = worker("idle")
    gpu = replace(idle.gpu, processes=(GpuProcess(4242, "python3", 7200, "python3 x.py"),))
    f = failed(check_gpu_holders(W, idle.docker, gpu, "vllm_node", idle.now))
    assert "pid 4242 python3 outside any container, running 2.0 h" in f.message
    assert "kill PID" in f.message


def test_other_gpu_container_without_process_is_stale_too() -> None:
    stale = worker("stale_container")
    gpu = replace(stale.gpu, processes=())
    f = failed(check_gpu_holders(W, stale.docker, gpu, "vllm_node", stale.now))
    assert "container vllm_stale (image vllm-node:latest" in f.message
    assert "has GPU access" in f.message


def test_the_suites_own_probe_container_is_not_a_holder() -> None:
    """Under xdist, one worker's nodes-alike probe runs the serving image (``docker run --rm
    --name pytest-spark-probe-PID``, no GPU access) while another lists the containers: it
    is the suite's own, not an earlier run's. Given GPU access, or holding a GPU process,
    it is a holder all the same; an unnamed container of the image still is."""
    stale = worker("stale_container")
    base = next(c for c in stale.docker.containers if c.name == "vllm_stale")
    probe = replace(base, name=PROBE_CONTAINER_PREFIX + "4242", gpu_access=False, pids=frozenset())
    docker = replace(stale.docker, containers=(probe,))
    gpu = replace(stale.gpu, processes=())
    passed(check_gpu_holders(W, docker, gpu, "vllm_node", stale.now))
    armed = replace(docker, containers=(replace(probe, gpu_access=True),))
    f = failed(check_gpu_holders(W, armed, gpu, "vllm_node", stale.now))
    assert f"container {PROBE_CONTAINER_PREFIX}4242 (image vllm-node:latest" in f.message
    unnamed = replace(docker, containers=(replace(probe, name="romantic_lamport"),))
    f = failed(check_gpu_holders(W, unnamed, gpu, "vllm_node", stale.now))
    assert "container romantic_lamport (image vllm-node:latest" in f.message
    holding = replace(docker, containers=(replace(probe, pids=frozenset({1041})),))
    gpu_held = replace(stale.gpu, processes=(GpuProcess(1041, "python3"),))
    f = failed(check_gpu_holders(W, holding, gpu_held, "vllm_node", stale.now))
    assert f"pid 1041 python3 in container {PROBE_CONTAINER_PREFIX}4242" in f.message


def test_holders_skip_when_nothing_can_be_listed() -> None:
    down = worker("docker_stopped")
    result = check_gpu_holders(W, down.docker, down.gpu, "vllm_node", down.now)
    assert isinstance(result, Skip) and "docker is not answering" in result.reason
    lost = worker("gpu_invisible")
    result = check_gpu_holders(W, lost.docker, lost.gpu, "vllm_node", lost.now)
    assert isinstance(result, Skip) and "No devices were found" in result.reason


# ------------------------------------------------------------------------- GPU visible


def test_gpu_visible() -> None:
    f = passed(check_gpu_visible(W, worker("idle").gpu, 1))
    assert (f.measured, f.expected, f.message) == (1, 1, f"{W}: 1 GPU(s), 0 compute process(es)")


def test_gpu_invisible() -> None:
    f = failed(check_gpu_visible(W, worker("gpu_invisible").gpu, 1))
    assert (f.measured, f.expected, f.unit) == (0, 1, "GPUs")
    assert f.message.startswith(
        f"{W}: nvidia-smi -L lists 0 GPU(s) (No devices were found), expected >= 1."
    )
    assert "Xid" in f.message and "reboot" in f.message


def test_nvidia_smi_missing() -> None:
    gpu = replace(worker("idle").gpu, gpus=None, error="nvidia-smi: command not found")
    f = failed(check_gpu_visible(W, gpu, 1))
    assert "nvidia-smi -L failed (nvidia-smi: command not found)" in f.message
    assert "driver" in f.message


# -------------------------------------------------------------------------------- disk


def test_disk_ok_and_full() -> None:
    idle = worker("idle")
    f = passed(check_disk(W, idle.disk, 95, MODEL))
    assert f.unit == "%" and f.measured < 95
    full = worker("disk_full")
    f = failed(check_disk(W, full.disk, 95, MODEL))
    assert (f.measured, f.expected, f.unit) == (97.0, "< 95", "%")
    assert f.message.startswith(
        f"{W}: /root/models (sparksim-disk, holding {MODEL}) is 97 % "
        "used (503.8 kB free), expected < 95 %."
    )
    assert "delete-cache" in f.message and "docker system prune" in f.message


def test_disk_without_room_for_the_model() -> None:
    disk = worker("disk_full").disk
    f = failed(check_disk(W, disk, 99, MODEL, model_bytes=10**9, have_bytes=0))
    assert (f.measured, f.expected, f.unit) == (492 * 1024, 10**9, "B")
    assert "the model needs 1.0 GB more (1.0 GB on the other nodes)" in f.message
    f = passed(check_disk(W, disk, 99, MODEL, model_bytes=10**5, have_bytes=0))
    assert "model needs 100.0 kB more" in f.message


def test_disk_unreadable() -> None:
    f = failed(check_disk(W, None, 95, None, disk_error="df: command not found"))
    assert "df: command not found" in f.message and "expected < 95 % used" in f.message


# ------------------------------------------------------------------------------- model


def test_model_identical() -> None:
    idle = worker("idle").model
    f = passed(check_model_identical(MODEL, {"spark-head": idle, W: idle}, "--spark-model-dir"))
    assert "46 files" in f.message and "identical on 2 nodes" in f.message


@pytest.mark.parametrize(
    ("damage", "phrase"),
    [
        ("model_corrupt", "model-00017-of-00039.safetensors sha256 differs"),
        ("model_shard_missing", "missing model-00017-of-00039.safetensors"),
    ],
)
def test_model_differs(damage: str, phrase: str) -> None:
    listings = {"spark-head": worker("idle").model, W: worker(damage).model}
    f = failed(check_model_identical(MODEL, listings, "from command line --spark-model-dir"))
    assert f.node == W
    assert f.message.startswith(
        f"model directory {MODEL} (from command line "
        "--spark-model-dir) is not identical on every node: "
        f"{W} differs from spark-head: {phrase}"
    )
    assert "expected the same files, sizes and hashes everywhere" in f.message
    assert f"rsync -a --delete {MODEL}/ NODE:{MODEL}/" in f.message


def test_model_dir_on_no_node() -> None:
    gone = ModelListing(MODEL, False, error="stat: cannot statx: No such file or directory")
    f = failed(check_model_identical(MODEL, {"spark-head": gone, W: gone}, "x"))
    assert f.message.startswith(f"model directory {MODEL} (x) is not on any node (spark-head:")
    assert "expected it on every node" in f.message and "--local-dir" in f.message


def test_large_files_compare_by_their_sampled_hash() -> None:
    ref = ModelListing(
        MODEL,
        True,
        {"config.json": 9, "w.safetensors": 10**9},
        {"config.json": "a" * 64},
        {"w.safetensors": "b" * 64},
    )
    other = replace(ref, samples={"w.safetensors": "c" * 64})
    f = failed(check_model_identical(MODEL, {"spark-head": ref, W: other}, "x"))
    assert "w.safetensors content differs (sampled sha256: 16 blocks of 64 KiB)" in f.message
    shorter = replace(ref, files={"config.json": 9, "w.safetensors": 5 * 10**8})
    f = failed(check_model_identical(MODEL, {"spark-head": ref, W: shorter}, "x"))
    assert "w.safetensors 500000000 bytes vs 1000000000" in f.message


def test_model_config_hash_and_absent_node() -> None:
    idle = worker("idle").model
    assert idle is not None
    other = replace(idle, hashes={**idle.hashes, "config.json": "0" * 64})
    f = failed(check_model_identical(MODEL, {"spark-head": idle, W: other}, "x"))
    assert "config.json sha256 differs" in f.message
    gone = ModelListing(MODEL, False, error="stat: cannot statx '/x': No such file or directory")
    f = failed(check_model_identical(MODEL, {"spark-head": idle, W: gone}, "x"))
    assert f"{W}: stat: cannot statx" in f.message and f.measured[W] == {"missing": gone.error}


# ------------------------------------------------------------------------------- clock


def test_clock_skew() -> None:
    ok = [ClockSample("spark-head", 0.002, 0.004), ClockSample(W, -0.01, 0.006)]
    f = passed(check_clock_skew(ok, 1.0))
    assert f.measured == 0.012 and "offsets against the runner" in f.message
    bad = [ClockSample("spark-head", 0.002, 0.004), ClockSample(W, 5.003, 0.006)]
    f = failed(check_clock_skew(bad, 1.0))
    assert (f.measured, f.expected, f.unit, f.node) == (5.001, "< 1", "s", W)
    assert f.message.startswith(f"{W} runs 5.001 s ahead of spark-head (± 0.005 s;")
    assert "expected < 1 s" in f.message and "chronyc" in f.message


# --------------------------------------------------------------------------------- ssh


def test_passwordless_ssh() -> None:
    names = {"198.19.0.2": W}
    ok = parse_ssh_probe((FIXTURES / "ssh_ok.txt").read_text())
    f = passed(check_passwordless_ssh("spark-head", ok, names))
    assert f.measured == {W: "ok"}
    denied = parse_ssh_probe((FIXTURES / "ssh_permission_denied.txt").read_text())
    f = failed(check_passwordless_ssh("spark-head", denied, names))
    assert f.message.startswith(
        f"spark-head: passwordless SSH failed to {W} (198.19.0.2): root@198.19.0.2: "
        "Permission denied (publickey).; expected `ssh -o BatchMode=yes WORKER true`"
    )
    assert "ssh-copy-id" in f.message and f.measured == {W: "rc 255"}
    unknown = parse_ssh_probe((FIXTURES / "ssh_host_key_unknown.txt").read_text())
    f = failed(check_passwordless_ssh("spark-head", unknown, names))
    assert "Host key verification failed." in f.message and "ssh-keyscan" in f.message


# ------------------------------------------------------------------------- serving env


def env(name: str) -> dict[str, str]:
    return parse_container_env((FIXTURES / name).read_text())


def test_serving_env_matches() -> None:
    f = passed(
        check_serving_env(
            "spark-head", "vllm_node", env("container_env_healthy.json"), FABRIC, DEVS, NODE_IFS
        )
    )
    assert "enp1s0f1np1" in f.message and f.measured["NCCL_IB_DISABLE"] == "0"


def test_serving_env_on_the_management_network() -> None:
    f = failed(
        check_serving_env(
            W, "vllm_node", env("container_env_nccl_socket.json"), FABRIC, DEVS, NODE_IFS
        )
    )
    assert f.message.startswith(
        f"{W}: container vllm_node environment does not match the "
        "fabric: NCCL_SOCKET_IFNAME=mgmt0 selects mgmt0; "
        "NCCL_IB_DISABLE=1 (RDMA off: NCCL falls back to TCP sockets"
    )
    assert "expected the fabric interfaces enP2p1s0f1np1, enp1s0f1np1" in f.message
    assert "CONTAINER_NCCL_*" in f.message
    assert f.measured["NCCL_SOCKET_IFNAME"] == "mgmt0"


@pytest.mark.parametrize(
    ("change", "phrase"),
    [
        ({"NCCL_IB_HCA": "rocep1s0f1"}, "NCCL_IB_HCA=rocep1s0f1 leaves out roceP2p1s0f1"),
        ({"NCCL_IB_HCA": "=rocep1s0f1,roceP2p1s0f1:1"}, None),
        ({"NCCL_IB_HCA": "roce"}, None),
        ({"NCCL_IB_HCA": "^roceP2p1s0f1"}, "leaves out roceP2p1s0f1"),
        ({"NCCL_SOCKET_IFNAME": "enp"}, None),  # also the unplugged port, which has no address
        ({"NCCL_SOCKET_IFNAME": "mgmt,enp1s0f1np1"}, "selects mgmt0, enp1s0f1np1"),
        ({"NCCL_SOCKET_IFNAME": "ib"}, "NCCL_SOCKET_IFNAME=ib selects no interface"),
        ({"NCCL_SOCKET_IFNAME": "^lo,docker"}, "NCCL_SOCKET_IFNAME=^lo,docker selects"),
        ({"NCCL_SOCKET_IFNAME": "=enP2p1s0f1np1"}, None),
        ({"GLOO_SOCKET_IFNAME": "mgmt0"}, "GLOO_SOCKET_IFNAME=mgmt0"),
        ({"GLOO_SOCKET_IFNAME": ""}, "GLOO_SOCKET_IFNAME unset"),
        ({"UCX_NET_DEVICES": "rocep1s0f1:1,roceP2p1s0f1:1"}, None),
        ({"UCX_NET_DEVICES": "mgmt0"}, "UCX_NET_DEVICES=mgmt0"),
        ({"UCX_NET_DEVICES": ""}, None),
    ],
)
def test_serving_env_variants(change: dict[str, str], phrase: str | None) -> None:
    values = {**env("container_env_healthy.json"), **change}
    values = {k: v for k, v in values.items() if v != "" or k == "GLOO_SOCKET_IFNAME"}
    if change.get("GLOO_SOCKET_IFNAME") == "":
        values.pop("GLOO_SOCKET_IFNAME")
    result = check_serving_env(W, "vllm_node", values, FABRIC, DEVS, NODE_IFS)
    if phrase is None:
        passed(result)
    else:
        assert phrase in failed(result).message


def test_serving_container_missing() -> None:
    f = failed(check_serving_env(W, "vllm_node", None, FABRIC, DEVS, NODE_IFS))
    assert f"{W}: serving container vllm_node not found" in f.message


# -------------------------------------------------------------------------- link flaps


NO_JOURNAL = JournalFacts(False, 0, error="no kernel log lines in the last 24 h")


def test_link_flaps_from_sysfs_counters() -> None:
    flaps = worker("link_flaps")
    f = failed(
        check_link_flaps(
            W, "enP2p1s0f1np1", flaps.carriers["enP2p1s0f1np1"], flaps.uptime_s, flaps.journal, 5
        )
    )
    assert (f.measured, f.expected, f.unit) == (7.0, "< 5", "per 24 h")
    assert f.message.startswith(
        f"{W} enP2p1s0f1np1: 7 carrier losses per 24 h (sysfs carrier "
        "counters: 7 carrier loss(es) since boot "
    )
    assert "expected < 5" in f.message and "replace the QSFP cable" in f.message
    f = passed(
        check_link_flaps(
            W, "enp1s0f1np1", flaps.carriers["enp1s0f1np1"], flaps.uptime_s, flaps.journal, 5
        )
    )
    assert f.measured == 0.0


def test_link_flaps_averaged_over_a_long_uptime() -> None:
    counters = CarrierCounters("enp1s0f1np1", True, 11, 11)
    f = passed(check_link_flaps(W, "enp1s0f1np1", counters, 10 * 86400, NO_JOURNAL, 5))
    assert f.measured == 1.0 and "10 carrier loss(es) in 10.0 d of uptime" in f.message


def test_link_flaps_from_the_journal_when_it_has_them() -> None:
    lines = (FIXTURES / "journal_mlx5_flaps.txt").read_text().splitlines()
    journal = JournalFacts(True, 41, tuple(lines[1:]))
    counters = CarrierCounters("enp1s0f1np1", True, 7, 8)
    f = failed(check_link_flaps(W, "enp1s0f1np1", counters, 30 * 86400, journal, 5))
    assert f.measured == 6.0
    assert "journalctl -k: 6 link-down line(s) in the last 24 h" in f.message
    assert "mlx5_core 0000:01:00.1 enp1s0f1np1: Link down" in f.evidence["journal"]
    f = passed(check_link_flaps(W, "enP2p1s0f1np1", None, 30 * 86400, journal, 5))
    assert f.measured == 1.0


def test_link_flaps_unmeasurable() -> None:
    f = failed(check_link_flaps(W, "enp1s0f1np1", None, 100.0, NO_JOURNAL, 5))
    assert "no carrier counters" in f.message


def test_human_duration() -> None:
    assert [human_duration(s) for s in (None, 5, 600, 9000, 5 * 86400)] == [
        "unknown time",
        "5 s",
        "10 min",
        "2.5 h",
        "5.0 d",
    ]
