"""The fake tools on a live sim: REFERENCE formats when healthy, real state under faults."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.sim

# REFERENCE.md section 2, healthy ibdev2netdev, verbatim.
IBDEV2NETDEV_HEALTHY = """\
roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)
roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)
rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)
rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)
"""
ACTIVE_PORT = "\t\tState: Active\n\t\tPhysical state: LinkUp\n\t\tRate: 200\n"
DOWN_PORT = "\t\tState: Down\n\t\tPhysical state: Disabled\n\t\tRate: 40\n"


def ca_block(ibstat: str, dev: str) -> str:
    blocks = {b.split("'")[0]: "CA '" + b for b in ibstat.split("CA '")[1:]}
    return (
        blocks[f"{dev}"]
        if dev in blocks
        else next(
            b for b in ("CA '" + x for x in ibstat.split("CA '")[1:]) if b.startswith(f"CA '{dev}'")
        )
    )


def test_healthy_tools_print_reference_formats(healthy_sim: Any) -> None:
    sim = healthy_sim
    assert sim.out("spark-1", "ibdev2netdev") == IBDEV2NETDEV_HEALTHY
    ibstat = sim.out("spark-2", "ibstat")
    for dev in ("rocep1s0f1", "roceP2p1s0f1"):
        block = ca_block(ibstat, dev)
        assert block.startswith(f"CA '{dev}'\n\tCA type: MT4129\n")
        assert "\tFirmware version: 28.45.4028\n" in block
        assert ACTIVE_PORT in block
        assert "\t\tLink layer: Ethernet\n" in block
    for dev in ("rocep1s0f0", "roceP2p1s0f0"):
        assert DOWN_PORT in ca_block(ibstat, dev)
    assert sim.out("spark-2", "ibstat roceP2p1s0f1") == ca_block(ibstat, "roceP2p1s0f1")

    devinfo = sim.out("spark-1", "ibv_devinfo -d rocep1s0f1")
    assert devinfo.startswith("hca_id:\trocep1s0f1\n\ttransport:\t\t\tInfiniBand (0)\n")
    assert "\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n" in devinfo
    assert "\t\t\tactive_mtu:\t\t4096 (5)\n" in devinfo
    unplugged = sim.out("spark-1", "ibv_devinfo -d rocep1s0f0")
    assert "\t\t\tstate:\t\t\tPORT_DOWN (1)\n" in unplugged
    assert "\t\t\tactive_mtu:\t\t1024 (3)\n" in unplugged

    rdma = sim.out("spark-1", "rdma link").splitlines()
    assert "link rocep1s0f1/1 state ACTIVE physical_state LINK_UP netdev enp1s0f1np1 " in rdma
    assert "link rocep1s0f0/1 state DOWN physical_state DISABLED netdev enp1s0f0np0 " in rdma

    assert "\tSpeed: 200000Mb/s" in sim.out("spark-1", "ethtool enp1s0f1np1")
    links = {x["ifname"]: x for x in json.loads(sim.out("spark-1", "ip -j link"))}
    assert links["enp1s0f0np0"]["operstate"] == "DOWN"
    assert "NO-CARRIER" in links["enp1s0f0np0"]["flags"]
    assert links["enp1s0f1np1"]["operstate"] == "UP"
    assert {"UP", "LOWER_UP"} <= set(links["enp1s0f1np1"]["flags"])
    assert links["enP2p1s0f1np1"]["mtu"] == 9000


def test_nvidia_smi_reports_one_gb10_with_unified_memory(healthy_sim: Any) -> None:
    sim = healthy_sim
    assert sim.out("spark-1", "nvidia-smi -L").startswith("GPU 0: NVIDIA GB10 (UUID: GPU-")
    csv = sim.out("spark-1", "nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv")
    assert csv == ("name, driver_version, memory.used [MiB]\nNVIDIA GB10, 580.95.05, [N/A]\n")
    apps = sim.out(
        "spark-2",
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader",
    )
    assert apps == ""
    table = sim.out("spark-2", "nvidia-smi")
    assert "|   0  NVIDIA GB10                    On  |   0000000F:01:00.0 Off |" in table
    assert "No running processes found" in table


def test_link_down_shows_on_both_ends(healthy_sim: Any) -> None:
    sim = healthy_sim
    sim.cli("fault", "link-down", "worker-1", "0")
    assert "rocep1s0f1 port 1 ==> enp1s0f1np1 (Down)\n" in sim.out("spark-2", "ibdev2netdev")
    assert "\t\tState: Down\n\t\tPhysical state: Disabled\n" in sim.out(
        "spark-2", "ibstat rocep1s0f1"
    )
    # The head's end lost its carrier, as with a pulled cable.
    head = sim.out("spark-1", "ibstat rocep1s0f1")
    assert "\t\tState: Down\n\t\tPhysical state: Polling\n\t\tRate: 40\n" in head
    assert "rocep1s0f1 port 1 ==> enp1s0f1np1 (Down)\n" in sim.out("spark-1", "ibdev2netdev")
    assert "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)\n" in sim.out("spark-1", "ibdev2netdev")
    faults = sim.status()["faults"]
    assert [(f["kind"], f["node"], f["if"]) for f in faults] == [
        ("link-down", "spark-2", "enp1s0f1np1")
    ]
    sim.cli("fault", "clear")
    assert sim.out("spark-2", "ibdev2netdev") == IBDEV2NETDEV_HEALTHY
    assert sim.status()["faults"] == []


def test_mtu_fault_lowers_active_mtu(healthy_sim: Any) -> None:
    sim = healthy_sim
    sim.cli("fault", "mtu", "2", "1500", "enp1s0f1np1")
    devinfo = sim.out("spark-2", "ibv_devinfo -d rocep1s0f1")
    assert "\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n" in devinfo
    assert "\t\t\tactive_mtu:\t\t1024 (3)\n" in devinfo
    assert "mtu 1500" in sim.out("spark-2", "ip link show enp1s0f1np1")
    assert "\t\t\tactive_mtu:\t\t4096 (5)\n" in sim.out("spark-1", "ibv_devinfo -d rocep1s0f1")
    sim.cli("fault", "mtu", "2", "4200", "0")
    assert "\t\t\tactive_mtu:\t\t4096 (5)\n" in sim.out("spark-2", "ibv_devinfo -d rocep1s0f1")
    sim.cli("fault", "mtu", "2", "2200", "0")
    assert "\t\t\tactive_mtu:\t\t2048 (4)\n" in sim.out("spark-2", "ibv_devinfo -d rocep1s0f1")


def test_link_rate_fault_sets_rate_and_shaping(healthy_sim: Any) -> None:
    sim = healthy_sim
    sim.cli("fault", "link-rate", "head", "100000")
    ibstat = sim.out("spark-1", "ibstat")
    assert ibstat.count("\t\tRate: 100\n") == 2
    assert "\tSpeed: 100000Mb/s" in sim.out("spark-1", "ethtool enP2p1s0f1np1")
    # a link has one rate: the far end of the direct cable reports it too
    assert "\t\tRate: 100\n" in sim.out("spark-2", "ibstat rocep1s0f1")
    for name in ("spark-1", "spark-2"):  # a slow link is slow both ways
        qdisc = sim.out(name, "tc qdisc show dev enp1s0f1np1")
        assert "tbf" in qdisc and "rate 500Mbit" in qdisc, (name, qdisc)
    links = {n["name"]: n["links"] for n in sim.status()["nodes"]}
    for name in ("spark-1", "spark-2"):
        assert [link["rate_mbps"] for link in links[name]] == [100000, 100000], name
    assert [link["shaped_mbit"] for link in links["spark-2"]] == [500, 500]
    sim.cli("fault", "clear")
    assert "rate 1Gbit" in sim.out("spark-2", "tc qdisc show dev enp1s0f1np1")
    for name in ("spark-1", "spark-2"):
        assert sim.out(name, "ibstat").count("\t\tRate: 200\n") == 2, name


def test_no_rdma_removes_the_rdma_devices_and_keeps_the_netdevs(healthy_sim: Any) -> None:
    """Fault no-rdma: a node whose RDMA drivers are not loaded. /sys/class/infiniband is
    gone, the RDMA tools see no device (ibdev2netdev exits 255 silently, as Mellanox's
    script does without the directory), the fabric netdevs stay up with their addresses;
    ``fault clear`` loads the drivers again."""
    sim = healthy_sim
    sim.cli("fault", "no-rdma", "all")
    for name in ("spark-1", "spark-2"):
        proc = sim.ssh(name, "ibdev2netdev")
        assert (proc.returncode, proc.stdout, proc.stderr) == (255, "", "")
        proc = sim.ssh(name, "ls -d /sys/class/infiniband")
        assert proc.returncode != 0 and "No such file or directory" in proc.stderr
        proc = sim.ssh(name, "ibv_devinfo")
        assert proc.returncode == 255
        assert "Failed to get IB devices list: Function not implemented" in proc.stderr
        assert sim.ssh(name, "ibv_devices").returncode == 1
        assert sim.out(name, "ibstat") == ""
        assert sim.out(name, "rdma link") == ""
        links = json.loads(sim.out(name, "ip -j addr show enp1s0f1np1"))
        assert links[0]["operstate"] == "UP"
        assert any(a["family"] == "inet" for a in links[0]["addr_info"])
        assert "/sys/class/net/enp1s0f1np1" in sim.out(name, "ls -d /sys/class/net/enp1s0f1np1")
    faults = sim.status()["faults"]
    assert [(f["kind"], f["node"]) for f in faults] == [
        ("no-rdma", "spark-1"),
        ("no-rdma", "spark-2"),
    ]
    sim.cli("fault", "clear")
    assert sim.out("spark-2", "ibdev2netdev") == IBDEV2NETDEV_HEALTHY
    assert sim.out("spark-1", "cat /sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/3") == (
        "RoCE v2\n"
    )
    assert "rocep1s0f1" in sim.out("spark-1", "ibv_devices")
    assert sim.status()["faults"] == []
