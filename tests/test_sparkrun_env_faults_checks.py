"""Three faults from sparkrun's tracker, judged on recorded probe outputs (field reference
6a): the head's NCCL_IB_HCA / NCCL_SOCKET_IFNAME on a worker cabled the other way
(sparkrun#135), GLOO/NCCL on the WiFi (PR #219; sparkrun's own init over the wired
management link passes with a note), and another sparkrun job
left running beside the tested one (#229). Each is one failure naming the node, what was
measured, what was expected and the fix; ``ports=()`` (no ibdev2netdev given) is the check
as it judged before, cluster-wide, kept here as the "before" these were measured against."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_spark.infra.finding import Finding, Skip
from pytest_spark.infra.links.parse import parse_ibdev2netdev
from pytest_spark.infra.links.probe import link_probe_command, parse_link_probe
from pytest_spark.infra.preflight.cabling_check import MGMT_INIT
from pytest_spark.infra.preflight.docker_check import check_gpu_holders
from pytest_spark.infra.preflight.env_check import OWN_CABLING, check_serving_env
from pytest_spark.infra.preflight.probe import DockerFacts, GpuFacts, parse_preflight_probe
from pytest_spark.verdict import cause_signature

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
H, W = "spark-head", "spark-worker-1"
# REFERENCE 2: the recorded healthy ibdev2netdev (the f1 port cabled: both twins Up)
HEAD_IBDEV = (ROOT / "links" / "ibdev2netdev_healthy.txt").read_text()
# A worker cabled on the other QSFP port (#135: "ports cabled 1<->2"): f0 Up, f1 Down.
OTHER_WAY = (
    "roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Up)\n"
    "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Down)\n"
    "rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)\n"
    "rocep1s0f1 port 1 ==> enp1s0f1np1 (Down)\n"
)
ONE_TWIN_DOWN = (ROOT / "links" / "ibdev2netdev_one_twin_down.txt").read_text()
# What sparkrun sets, from the head's detection (6a "Env it sets"), on every rank.
SPARKRUN_ENV = {
    "NCCL_NET": "IB",
    "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
    "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
    "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
    "NCCL_IB_GID_INDEX": "3",
    "NCCL_CROSS_NIC": "1",
}
ALL_IFS = ["enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1"]
NODE_IFS = {"lo": True, "mgmt0": True, **{n: n.endswith("f1np1") for n in ALL_IFS}}


def ports(text: str) -> list[tuple[str, str, bool]]:
    return [(m.dev, m.netdev, m.up) for m in parse_ibdev2netdev(text)]


def judge(
    node: str, env: dict[str, str], ibdev: str, fabric: list[str], wireless: tuple[str, ...] = ()
) -> Finding:
    devs = [d for d, n, _ in ports(ibdev) if n in fabric]
    node_ifs = {**NODE_IFS, **dict.fromkeys(wireless, True)}
    return check_serving_env(
        node,
        "sparkrun_x_1_node_1",
        env,
        fabric,
        devs,
        node_ifs,
        ports=ports(ibdev),
        wireless=wireless,
    )


# ----------------------------------------------------------------- #135 cabled the other way


def test_head_env_on_a_worker_cabled_the_other_way_fails_on_the_worker_only() -> None:
    # the cluster's fabric: every twin Up on some node, plus its twin (links.gather)
    fabric = ALL_IFS
    head = judge(H, SPARKRUN_ENV, HEAD_IBDEV, fabric)
    worker = judge(W, SPARKRUN_ENV, OTHER_WAY, fabric)
    assert head.level == "pass", head.message
    assert worker.level == "fail" and worker.node == W
    m = worker.message
    assert m.startswith(f"{W}: container sparkrun_x_1_node_1 environment does not match")
    assert "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1 names rocep1s0f1 (port not Up on " in m
    assert "NCCL_SOCKET_IFNAME=enp1s0f1np1 names enp1s0f1np1, whose port is not Up" in m
    assert "GLOO_SOCKET_IFNAME=enp1s0f1np1 names enp1s0f1np1" in m
    assert f"Up on {W} (ibdev2netdev): roceP2p1s0f0 ==> enP2p1s0f0np0, rocep1s0f0" in m
    assert m.endswith(
        f"; on {W} set its own NCCL_IB_HCA=roceP2p1s0f0,rocep1s0f0 "
        "NCCL_SOCKET_IFNAME=enP2p1s0f0np0 GLOO_SOCKET_IFNAME=enP2p1s0f0np0 (sparkrun "
        "passes the head's values to every rank, sparkrun#135: give this host its own, or "
        "cable every node on the same port)"
    )
    assert worker.measured["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    # wrong whatever the links say: the suite does not skip it for a down fabric twin
    assert "names rocep1s0f1 (port not Up" in worker.evidence[OWN_CABLING]
    assert OWN_CABLING not in head.evidence


def test_before_the_cluster_wide_judgement_missed_it_and_blamed_the_head() -> None:
    """Without the node's own ibdev2netdev (as before): the worker's down port passed as
    fabric, and both nodes failed for 'leaving out' the other node's cabled port."""
    devs = ["roceP2p1s0f0", "roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1"]
    for node in (H, W):
        f = check_serving_env(node, "c", SPARKRUN_ENV, ALL_IFS, devs, NODE_IFS)
        assert f.level == "fail" and "leaves out roceP2p1s0f0, rocep1s0f0" in f.message
        assert "not Up" not in f.message


def test_the_sim_model_a_worker_env_naming_its_uncabled_port() -> None:
    """sparksim's #135: every node is cabled on f1; the worker's rank env names f0, its port
    with no cable (Down there), as the head's names the port a worker cabled the other way
    has Down. The fabric is then f1 alone (cluster-wide), and the worker fails alone."""
    fabric = ["enp1s0f1np1", "enP2p1s0f1np1"]
    env = {
        **SPARKRUN_ENV,
        "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0",
        "NCCL_SOCKET_IFNAME": "enp1s0f0np0",
    }
    f = judge(W, env, HEAD_IBDEV, fabric)
    assert f.level == "fail"
    assert "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0 names rocep1s0f0 (port not Up" in f.message
    assert "NCCL_SOCKET_IFNAME=enp1s0f0np0 names enp1s0f0np0, whose port is not Up" in f.message
    assert "GLOO_SOCKET_IFNAME" not in f.message.split("; expected")[0]
    assert "set its own NCCL_IB_HCA=roceP2p1s0f1,rocep1s0f1 NCCL_SOCKET_IFNAME=enP2p1s0f1np1" in (
        f.message
    )


def test_a_device_the_node_does_not_have() -> None:
    env = {**SPARKRUN_ENV, "NCCL_IB_HCA": "mlx5_0,mlx5_1"}
    f = judge(W, env, HEAD_IBDEV, ["enp1s0f1np1", "enP2p1s0f1np1"])
    assert "names mlx5_0 (no such device on spark-worker-1), mlx5_1 (no such" in f.message


def test_one_twin_down_is_the_link_checks_not_a_miscabling() -> None:
    """A port with one twin Up is cabled here: its Down twin in NCCL_IB_HCA is the link
    checks' finding (the env check then skips citing the down link), not #135's words."""
    f = judge(W, SPARKRUN_ENV, ONE_TWIN_DOWN, ["enp1s0f1np1", "enP2p1s0f1np1"])
    assert f.level == "pass", f.message


def test_healthy_sparkrun_env_passes() -> None:
    assert judge(W, SPARKRUN_ENV, HEAD_IBDEV, ["enp1s0f1np1", "enP2p1s0f1np1"]).level == "pass"


# ------------------------------------------------------------ PR #219 the default route
# A Spark's WiFi netdev (wlP9s9, as DGX Spark hosts name it; its wired port is enP7s7).
WIFI = "wlP9s9"
F1 = ["enp1s0f1np1", "enP2p1s0f1np1"]
# What sparkrun 0.4.2 sets when the workers reach the head's management address
# (runtimes/_init_network.py, orchestration/infiniband.py): the management interface for
# gloo / TP and first in NCCL_SOCKET_IFNAME, the data over RDMA (NCCL_NET=IB).
MGMT_FIRST = {
    **SPARKRUN_ENV,
    "NCCL_SOCKET_IFNAME": "mgmt0,enp1s0f1np1,enP2p1s0f1np1",
    "GLOO_SOCKET_IFNAME": "mgmt0",
    "TP_SOCKET_IFNAME": "mgmt0",
}
# eugr's launch-cluster.sh: every socket variable its ETH_IF (the fabric), no NCCL_NET.
EUGR_ENV = {k: v for k, v in SPARKRUN_ENV.items() if k != "NCCL_NET"}


@pytest.mark.parametrize(
    "keys", [("GLOO_SOCKET_IFNAME",), ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")]
)
def test_gloo_on_the_wifi_is_one_failure(keys: tuple[str, ...]) -> None:
    env = {**SPARKRUN_ENV, **dict.fromkeys(keys, WIFI)}
    f = judge(H, env, HEAD_IBDEV, F1, wireless=(WIFI,))
    assert f.level == "fail" and f.node == H
    m = f.message
    assert f"{WIFI} ({', '.join(keys)}) is wireless: serving dies when it drops (sparkrun " in m
    assert "PR #219)" in m and "not a fabric interface" not in m
    assert f"the fabric interfaces Up on {H}: enP2p1s0f1np1, enp1s0f1np1" in m
    assert m.endswith(
        f"; set {' '.join(k + '=enP2p1s0f1np1' for k in keys)} on every rank: the fabric "
        "interface, not the default route"
    )
    assert f.measured["GLOO_SOCKET_IFNAME"] == WIFI
    assert f.evidence[OWN_CABLING]  # wrong whatever the links say


def test_the_wifi_first_in_sparkruns_layout_still_fails() -> None:
    env = {**MGMT_FIRST, "NCCL_SOCKET_IFNAME": f"{WIFI},enp1s0f1np1", "GLOO_SOCKET_IFNAME": WIFI}
    f = judge(H, env, HEAD_IBDEV, F1, wireless=(WIFI,))
    assert f.level == "fail"
    assert f"{WIFI} (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME) is wireless" in f.message


def test_sparkruns_management_first_init_passes_with_a_note() -> None:
    """A healthy sparkrun job: never called broken, and the note says what it rides on."""
    for node in (H, W):
        f = judge(node, MGMT_FIRST, HEAD_IBDEV, F1, wireless=(WIFI,))  # a WiFi, not named
        assert f.level == "pass", f.message
        note = f.evidence[MGMT_INIT]
        assert note.startswith(f"{node}: NCCL_NET=IB carries the data over RDMA")
        assert "wired management link mgmt0 (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)" in note
        assert "serving depends on that link too" in note
        assert "GLOO_SOCKET_IFNAME=enP2p1s0f1np1 NCCL_SOCKET_IFNAME=enP2p1s0f1np1" in note


def test_a_fabric_only_env_has_no_note() -> None:
    f = judge(H, SPARKRUN_ENV, HEAD_IBDEV, F1)
    assert f.level == "pass" and MGMT_INIT not in f.evidence


@pytest.mark.parametrize(
    "keys", [("GLOO_SOCKET_IFNAME",), ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")]
)
def test_eugr_layout_on_the_management_interface_fails_as_before(keys: tuple[str, ...]) -> None:
    """launch-cluster.sh sets every socket variable to its ETH_IF (the fabric) and no
    NCCL_NET: mgmt0 there is a departure from the launcher, a failure as before PR #219's
    check (which failed ``GLOO_SOCKET_IFNAME=mgmt0`` whatever the layout)."""
    env = {**EUGR_ENV, **dict.fromkeys(keys, "mgmt0")}
    f = judge(H, env, HEAD_IBDEV, F1)
    assert f.level == "fail" and f.node == H
    m = f.message
    assert f"mgmt0 ({', '.join(keys)}) is not a fabric interface: no RDMA device on it" in m
    assert "serving dies when it drops (sparkrun PR #219)" in m
    assert "GLOO_SOCKET_IFNAME=mgmt0" in m
    assert MGMT_INIT not in f.evidence


def test_before_gloo_on_mgmt_said_only_the_value() -> None:
    env = {**EUGR_ENV, "GLOO_SOCKET_IFNAME": "mgmt0"}
    f = check_serving_env(H, "c", env, ["enp1s0f1np1"], ["rocep1s0f1"], NODE_IFS)
    assert f.level == "fail" and "not a fabric interface" not in f.message


# ------------------------------------------------------ #229 a job left after stop --all

MINE = "sparkrun_qwen35-122b_1a2b3c4d"
STRAY = "sparkrun_gpt-oss-120b_9f8e7d6c"


def _stray_facts(rank: int) -> tuple[DockerFacts, GpuFacts]:
    """The recorded stale-container probe, its containers renamed to two sparkrun jobs':
    the tested job's rank and the stray job's rank on the same node."""
    probe = parse_preflight_probe(
        (ROOT / "preflight" / "probe_worker_stale_container.txt").read_text(), "/models/m"
    )
    containers = []
    for c in probe.docker.containers:
        name = f"{STRAY}_node_{rank}" if c.name == "vllm_stale" else f"{MINE}_node_{rank}"
        containers.append(replace(c, name=name, restart_policy="no"))
    serving = probe.docker.serving
    if serving is not None:
        serving = replace(serving, name=f"{MINE}_node_{rank}")
    return replace(probe.docker, containers=tuple(containers), serving=serving), probe.gpu


@pytest.mark.parametrize("rank", [0, 1])
def test_a_stray_sparkrun_job_is_named_with_its_cluster_id(rank: int) -> None:
    docker, gpu = _stray_facts(rank)
    f = check_gpu_holders(W, docker, gpu, f"{MINE}_node_{rank}")
    assert isinstance(f, Finding) and f.level == "fail", f
    m = f.message
    assert m.startswith(f"{W}: sparkrun job {STRAY} runs beside the tested job {MINE}: ")
    assert f"in container {STRAY}_node_{rank} (image" in m
    assert "sparkrun#229" in m and "expected no other serve on this box" in m
    assert m.endswith(
        f"Stop it: sparkrun stop {STRAY} (every node of it), "
        f"or here docker rm -f {STRAY}_node_{rank}"
    )
    assert f.measured["sparkrun jobs"] == [STRAY]


def test_the_stray_job_on_every_node_is_one_cause() -> None:
    """Rank 0 on the head, rank 1 on the worker: different containers, one job: the same
    signature, so the per-node dedupe makes it one failure."""
    sigs = set()
    for node, rank in ((H, 0), (W, 1)):
        docker, gpu = _stray_facts(rank)
        f = check_gpu_holders(node, docker, gpu, f"{MINE}_node_{rank}")
        assert isinstance(f, Finding) and f.level == "fail"
        sigs.add(cause_signature(f, node))
    assert len(sigs) == 1


def test_the_tested_jobs_own_ranks_are_not_strangers() -> None:
    docker, gpu = _stray_facts(1)
    mine_only = replace(docker, containers=tuple(c for c in docker.containers if MINE in c.name))
    result = check_gpu_holders(W, mine_only, replace(gpu, processes=()), f"{MINE}_node_1")
    assert not isinstance(result, Skip) and result.level == "pass", result


def test_a_non_sparkrun_holder_keeps_the_generic_words() -> None:
    probe = parse_preflight_probe(
        (ROOT / "preflight" / "probe_worker_stale_container.txt").read_text(), "/models/m"
    )
    f = check_gpu_holders(W, probe.docker, probe.gpu, f"{MINE}_node_1")
    assert isinstance(f, Finding) and "held outside the serving container" in f.message
    assert "cause" not in f.evidence


# ------------------------------------------------------------- the probe's wireless netdevs


def _probe(tmp_path: Path, path_dirs: list[Path]) -> frozenset[str]:
    env = {**os.environ, "PATH": ":".join([*map(str, path_dirs), os.environ["PATH"]])}
    out = subprocess.run(
        link_probe_command(sysfs=str(tmp_path / "sys")),
        shell=True,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    ).stdout
    return parse_link_probe(out).wireless


def test_the_link_probe_finds_wireless_netdevs_in_sysfs_and_iw(tmp_path: Path) -> None:
    net = tmp_path / "sys" / "class" / "net"
    (net / WIFI / "phy80211").mkdir(parents=True)
    (net / "wlan1").mkdir()
    (net / "wlan1" / "wireless").write_text("")
    (net / "enP7s7").mkdir()
    (net / "mgmt0").mkdir()
    tools = tmp_path / "bin"
    tools.mkdir()
    iw = tools / "iw"  # first on PATH: not this machine's
    iw.write_text("#!/bin/sh\n")
    iw.chmod(0o755)
    assert _probe(tmp_path, [tools]) == {WIFI, "wlan1"}
    # iw dev's own format: a netdev that sysfs does not mark (a veth, as on the sim)
    iw.write_text("#!/bin/sh\nprintf 'phy#0\\n\\tInterface mgmt0\\n\\t\\tifindex 3\\n'\n")
    assert _probe(tmp_path, [tools]) == {WIFI, "wlan1", "mgmt0"}
    (net / WIFI / "phy80211").rmdir()
    (net / "wlan1" / "wireless").unlink()
    iw.write_text("#!/bin/sh\n")
    assert not _probe(tmp_path, [tools])
