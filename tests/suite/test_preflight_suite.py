"""The preflight suite against sparksim, as a user runs it (a pytest subprocess, verdicts
from the JSON results): healthy, every check passes; under each fault exactly its check
fails, naming the node, what was measured, what was expected and the fix.

Only the serving-environment check needs the serving containers: the healthy and the
nccl-socket scenarios launch the cluster (--spark-launch, the sim's launcher and serve
args); the other faults run the checks that need no launch, since several of them (Docker
down, image gone, no SSH to the worker) stop the launcher itself, as their checks foretell.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, run_suite, sim_fault  # type: ignore[import-not-found]
from pytest_spark.access.simcontrol import SimCluster

pytestmark = pytest.mark.sim
INFRA = str(REPO / "tests_infra" / "test_preflight.py")
H, W = "spark-head", "spark-worker-1"
PER_NODE = (
    "test_docker_ready",
    "test_gpu_not_held_by_others",
    "test_gpu_visible",
    "test_disk_space",
    "test_node_reachable",
)
CLUSTER = ("test_model_dir_identical", "test_clock_skew", "test_passwordless_ssh_head_to_workers")
# sparksim's twin 1 (enP2p1s0f1np1, roceP2p1s0f1) is the suite's twin0: ibdev2netdev order.
NO_LAUNCH = (
    {f"{t}[{n}]" for t in PER_NODE for n in (H, W)}
    | set(CLUSTER)
    | {f"test_link_flaps[{n}-twin{t}]" for n in (H, W) for t in (0, 1)}
)
SERVING = {f"test_serving_env_matches_fabric[{n}]" for n in (H, W)}
# tests_infra/test_alike.py: nodes alike, in the preflight category, one check each
ALIKE = {
    "test_host_software_alike",
    "test_serving_image_alike",
    "test_clock_ntp_synchronized",
    "test_no_known_bad_versions",
}
# tests_infra/test_gpuhealth.py: GPU health per node, in the preflight category
GPU_HEALTH = {
    f"{t}[{n}]"
    for t in (
        "test_gpu_temperature",
        "test_gpu_clocks_not_throttled",
        "test_gpu_persistence_mode",
        "test_gpu_kernel_errors",
    )
    for n in (H, W)
}
# tests_infra/test_memory.py: GB10 memory headroom, preflight, per node
MEMORY = {f"test_memory_headroom[{n}]" for n in (H, W)}
FDLIMIT = {f"test_dockerd_open_files_limit[{n}]" for n in (H, W)}
# tests_infra/test_kernel.py: the previous boot and PCIe AER, preflight, per node
KERNEL = {f"{t}[{n}]" for t in ("test_previous_boot_clean", "test_pcie_aer") for n in (H, W)}
# tests_infra/test_loaded.py: what the serving ranks loaded, preflight, per node
LOADED = {
    f"{t}[{n}]" for t in ("test_nccl_loaded_same_build", "test_vllm_tree_identical") for n in (H, W)
}


def launch(sim: SimCluster) -> dict[str, Any]:
    hints = sim.info.get("launch")
    if not hints:
        pytest.skip("sparksim has no serving stack here (docker missing)")
    return dict(hints)


def spark_args(sim: SimCluster, *, launched: bool) -> list[str]:
    """What a user gives for this cluster: image and model directory, and to launch, the
    launcher and the serve args."""
    hints = launch(sim)
    args = [
        f"--spark-image={hints['image']}",
        f"--spark-model-dir={hints['model_dir']}",
        "--spark-history=off",
    ]
    if launched:
        args += [
            "--spark-launch",
            f"--spark-launch-script={hints['script']}",
            f"--spark-serve-args={hints['serve_args']}",
        ]
    else:
        args += ["-k", "not serving_env"]
    return args


@pytest.fixture
def clean(sim: SimCluster) -> Iterator[SimCluster]:
    sim_fault(sim, "clear")
    yield sim
    sim_fault(sim, "clear")


# fault -> (spark-sim fault args, the check that fails, the other non-passing checks
# (skipped, with the check that covers it named), phrases of the failure message)
FAULTS: dict[str, tuple[tuple[str, ...], str, set[str], tuple[str, ...]]] = {
    "docker-stopped": (
        ("docker", "spark-2"),
        f"test_docker_ready[{W}]",
        {f"test_gpu_not_held_by_others[{W}]"},
        (
            f"{W}: the Docker daemon is not answering",
            "Cannot connect to the Docker daemon",
            "expected it running",
            "systemctl start docker",
        ),
    ),
    "image-removed": (
        ("docker", "spark-2", "no-image"),
        f"test_docker_ready[{W}]",
        set(),
        (
            f"{W}: serving image vllm-node:latest not present",
            "No such image",
            "expected it on every node",
            "docker save vllm-node:latest",
        ),
    ),
    "stale-container": (
        ("stale-container", "spark-2"),
        f"test_gpu_not_held_by_others[{W}]",
        set(),
        (
            f"{W}: the GPU is held outside the serving container vllm_node",
            "VLLM::EngineCore in container vllm_stale (image vllm-node:latest, up ",
            "restart policy unless-stopped",
            "expected no other GPU process",
            "docker stop vllm_stale",
        ),
    ),
    "gpu-invisible": (
        ("gpu-invisible", "spark-1"),
        f"test_gpu_visible[{H}]",
        {f"test_gpu_not_held_by_others[{H}]"},
        (f"{H}: nvidia-smi -L lists 0 GPU(s) (No devices were found), expected >= 1", "reboot"),
    ),
    "disk-full": (
        ("disk-full", "spark-2"),
        f"test_disk_space[{W}]",
        set(),
        (
            f"{W}: /root/models (sparksim-disk, holding /root/models/",
            "is 97 % used",
            "expected < 95 %",
            "docker system prune",
        ),
    ),
    "model-differs": (
        ("model", "spark-2", "corrupt"),
        "test_model_dir_identical",
        set(),
        (
            f"{W} differs from {H}: model-00017-of-00039.safetensors sha256 differs",
            "expected the same files, sizes and hashes",
            "rsync -a --delete",
        ),
    ),
    "clock-skew": (
        ("clock", "spark-2", "5"),
        "test_clock_skew",
        set(),
        (
            f"{W} runs ",
            f"s ahead of {H}",
            "offsets against the runner",
            "expected < 1 s",
            "chronyc",
        ),
    ),
    "ssh-key": (
        ("ssh", "spark-2"),
        "test_passwordless_ssh_head_to_workers",
        set(),
        (
            f"{H}: passwordless SSH failed to {W} (198.19.0.2)",
            "Permission denied (publickey)",
            "expected `ssh -o BatchMode=yes WORKER true`",
            "ssh-copy-id",
        ),
    ),
    "ssh-known-hosts": (
        ("ssh", "spark-2", "known-hosts"),
        "test_passwordless_ssh_head_to_workers",
        set(),
        ("Host key verification failed.", "ssh-keyscan"),
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_fails_exactly_its_check(clean: SimCluster, tmp_path: Path, fault: str) -> None:
    args, check, skipped, phrases = FAULTS[fault]
    sim_fault(clean, *args)
    run = run_suite(tmp_path, INFRA, *spark_args(clean, launched=False), sim=clean)
    outcomes = run.outcomes()
    assert set(outcomes) == NO_LAUNCH, outcomes
    failed = run.failed()
    assert list(failed) == [check], (failed, run.output[-3000:])
    assert {k for k, v in outcomes.items() if v == "skipped"} == skipped, outcomes
    message = failed[check]
    for phrase in phrases:
        assert phrase in message, message
    record = run.checks(nodeid=f"tests_infra/test_preflight.py::{check}")[0]
    assert record["measured"] is not None and record["expected"] is not None
    if fault == "clock-skew":
        assert 4.5 < record["measured"] < 5.5 and record["unit"] == "s"
    for name in skipped:
        reason = run.checks(nodeid=f"tests_infra/test_preflight.py::{name}")[0]["message"]
        assert "see test_docker_ready" in reason or "see test_gpu_visible" in reason


def test_link_flaps_fail_both_ends_of_the_cable(clean: SimCluster, tmp_path: Path) -> None:
    sim_fault(clean, "link-flap", "spark-2", "enP2p1s0f1np1", "6")
    run = run_suite(tmp_path, INFRA, *spark_args(clean, launched=False), sim=clean)
    failed = run.failed()
    assert set(failed) == {f"test_link_flaps[{H}-twin0]", f"test_link_flaps[{W}-twin0]"}, failed
    message = failed[f"test_link_flaps[{W}-twin0]"]
    assert message.startswith(
        f"{W} enP2p1s0f1np1: 6 carrier losses per 24 h (sysfs carrier "
        "counters: 6 carrier loss(es) since boot"
    )
    assert "expected < 5" in message and "QSFP cable" in message
    record = run.checks(nodeid=f"tests_infra/test_preflight.py::test_link_flaps[{W}-twin0]")
    assert (record[0]["measured"], record[0]["expected"]) == (6.0, "< 5")
    assert {v for k, v in run.outcomes().items() if k not in failed} == {"passed"}


def test_nccl_on_the_management_network_fails_the_env_check(
    clean: SimCluster, tmp_path: Path
) -> None:
    sim_fault(clean, "nccl-socket")
    run = run_suite(tmp_path, INFRA, *spark_args(clean, launched=True), sim=clean)
    failed = run.failed()
    # One launch set both containers' environment: one failure, the head's, naming both
    # nodes; the worker's check skips citing it.
    verdict = f"test_serving_env_matches_fabric[{H}]"
    assert set(failed) == {verdict}, (failed, run.output[-3000:])
    message = failed[verdict]
    # read from the rank process itself (/proc/PID/environ), the container named
    assert re.match(
        rf"{H}: container vllm_node rank process (\d+) \(/proc/\1/environ\) environment does "
        "not match the fabric: NCCL_SOCKET_IFNAME=mgmt0 selects mgmt0",
        message,
    ), message
    assert "NCCL_IB_DISABLE=1 (RDMA off" in message
    assert "expected the fabric interfaces enP2p1s0f1np1, enp1s0f1np1" in message
    assert "CONTAINER_NCCL_*" in message
    assert message.endswith(f"The same environment on {W}: this one fix covers them.")
    skipped = {k for k, v in run.outcomes().items() if v == "skipped"}
    assert skipped == SERVING - {verdict}, run.outcomes()
    (worker,) = run.checks(nodeid=f"tests_infra/test_preflight.py::{sorted(skipped)[0]}")
    assert f"{W}: its serving container's environment is {H}'s" in worker["message"]
    assert f"({verdict} has the evidence)" in worker["message"]
    assert {v for k, v in run.outcomes().items() if k not in set(failed) | skipped} == {"passed"}
    assert run.results["serving"]["stopped"] is True  # what the suite launched, it stopped


def test_spark_sim_healthy_passes_every_preflight_check(tmp_path: Path) -> None:
    """``pytest --spark-sim -m preflight``: the sim stands up with its serving stack (the
    serving-env check launches it), every preflight check passes, nothing is left behind."""
    run = run_suite(
        tmp_path, "--spark-sim", "-m", "preflight", "--spark-history=off", str(REPO / "tests_infra")
    )
    assert run.ret == 0, run.output
    assert run.results["cluster"]["sim"] is True
    outcomes = run.outcomes()
    expected = NO_LAUNCH | SERVING | ALIKE | GPU_HEALTH | MEMORY | FDLIMIT | KERNEL | LOADED
    assert set(outcomes) == expected, outcomes
    assert set(outcomes.values()) == {"passed"}, outcomes
    assert {c["category"] for c in run.results["checks"]} == {"preflight"}

    def record(name: str) -> dict[str, Any]:
        return dict(run.checks(nodeid=f"tests_infra/test_preflight.py::{name}")[0])

    gpu = record(f"test_gpu_visible[{W}]")
    assert (gpu["node"], gpu["measured"], gpu["unit"]) == (W, 1, "GPUs")
    assert gpu["extra"]["driver_version"] == "580.95.05"
    assert record(f"test_docker_ready[{H}]")["measured"]["image"] == "vllm-node:latest"
    skew = record("test_clock_skew")
    assert skew["measured"] < 0.5 and skew["unit"] == "s"
    model = record("test_model_dir_identical")["message"]
    assert "/root/models/Qwen3.5-122B-A10B-FP8: 46 files" in model  # the sim's model_dir hint
    assert "identical on 2 nodes" in model
    flaps = record(f"test_link_flaps[{H}-twin0]")
    assert flaps["measured"] == 0 and "since boot" in flaps["message"]
    env = record(f"test_serving_env_matches_fabric[{W}]")
    assert env["measured"]["NCCL_IB_HCA"] == "roceP2p1s0f1,rocep1s0f1"
    assert run.results["serving"]["launched"] is True and run.results["serving"]["stopped"]
    instance = run.results["cluster"]["head"].split(".")[2]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"spk{instance}-" not in left, left


def test_empty_known_hosts_is_one_failure_the_heads(clean: SimCluster, tmp_path: Path) -> None:
    """Issue #25 part 4: an empty known_hosts, the worker reached through the head
    (ProxyJump). The head's reachability check is the one failure, with the ssh-keyscan
    fix; the worker's skips citing it (it failed with the head's key error), and every
    other check skips citing one of them."""
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    config = clean.ssh_config.read_text().replace(str(clean.info["known_hosts"]), str(empty))
    worker_block = f"Host {clean.workers[0]}\n"
    assert worker_block in config, config
    config = config.replace(worker_block, f"{worker_block}    ProxyJump {clean.head}\n")
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(config)
    run = run_suite(
        tmp_path,
        INFRA,
        *spark_args(clean, launched=False),
        f"--spark-ssh-config={ssh_config}",
        sim=clean,
    )
    failed = run.failed()
    assert list(failed) == [f"test_node_reachable[{H}]"], (failed, run.output[-3000:])
    assert "ssh-keyscan" in failed[f"test_node_reachable[{H}]"]
    (worker,) = run.checks(nodeid=f"tests_infra/test_preflight.py::test_node_reachable[{W}]")
    assert worker["outcome"] == "skipped", worker
    assert worker["message"].startswith(f"{W} is reached through {H} (its jump host)"), worker
    assert f"test_node_reachable[{H}] has the evidence" in worker["message"], worker
    assert {v for k, v in run.outcomes().items() if k not in failed} == {"skipped"}
