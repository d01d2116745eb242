"""The node tools against a fake sysfs (pure: no root needed): exact real formats."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

IBDEV2NETDEV_HEALTHY = """\
roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)
roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)
rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)
rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)
"""


class FakeNode:
    """A node dir (state.json) plus a fake /sys/class/net the tools read."""

    def __init__(self, tmp_path: Path, sparksim: ModuleType, tools: ModuleType) -> None:
        node_mod = importlib.import_module("sparksim_under_test.node")
        topology = importlib.import_module("sparksim_under_test.topology")
        self.dir = tmp_path / "node"
        self.dir.mkdir()
        self.state = node_mod.initial_state(topology.build(0, 2).nodes[0])
        self.save()
        self.sys = tmp_path / "sys"
        self.tools = tools
        for i, (name, plugged) in enumerate(
            [
                ("enp1s0f0np0", False),
                ("enp1s0f1np1", True),
                ("enP2p1s0f0np0", False),
                ("enP2p1s0f1np1", True),
            ]
        ):
            self.set_port(
                name, up=True, carrier=plugged, mtu=9000 if plugged else 1500, ifindex=3 + i
            )

    def save(self) -> None:
        (self.dir / "state.json").write_text(json.dumps(self.state))

    def set_port(self, name: str, *, up: bool, carrier: bool, mtu: int, ifindex: int = 3) -> None:
        d = self.sys / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "flags").write_text("0x1003\n" if up else "0x1002\n")
        (d / "carrier").unlink(missing_ok=True)
        if up:  # reading carrier fails (EINVAL) on an admin-down link
            (d / "carrier").write_text("1\n" if carrier else "0\n")
        (d / "mtu").write_text(f"{mtu}\n")
        (d / "ifindex").write_text(f"{ifindex}\n")
        (d / "operstate").write_text("up\n" if up and carrier else "down\n")

    def run(self, tool: str, *argv: str, capsys: Any) -> tuple[int, str, str]:
        rc = self.tools.main(tool, str(self.dir), list(argv))
        out, err = capsys.readouterr()
        return rc, out, err


@pytest.fixture
def node(
    tmp_path: Path, sparksim: ModuleType, tools: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> FakeNode:
    fake = FakeNode(tmp_path, sparksim, tools)
    monkeypatch.setattr(
        importlib.import_module("sparksim_tools_under_test.ports"), "SYS_NET", str(fake.sys)
    )
    return fake


def test_ibdev2netdev_healthy_is_verbatim(node: FakeNode, capsys: Any) -> None:
    assert node.run("ibdev2netdev", capsys=capsys) == (0, IBDEV2NETDEV_HEALTHY, "")


def test_ibstat_layout_and_tabs(node: FakeNode, capsys: Any) -> None:
    rc, out, _ = node.run("ibstat", "rocep1s0f1", capsys=capsys)
    assert rc == 0
    assert out == (
        "CA 'rocep1s0f1'\n"
        "\tCA type: MT4129\n"
        "\tNumber of ports: 1\n"
        "\tFirmware version: 28.45.4028\n"
        "\tHardware version: 0\n"
        f"\tNode GUID: {out.split('Node GUID: ')[1].splitlines()[0]}\n"
        f"\tSystem image GUID: {out.split('Node GUID: ')[1].splitlines()[0]}\n"
        "\tPort 1:\n"
        "\t\tState: Active\n"
        "\t\tPhysical state: LinkUp\n"
        "\t\tRate: 200\n"
        "\t\tBase lid: 0\n"
        "\t\tLMC: 0\n"
        "\t\tSM lid: 0\n"
        "\t\tCapability mask: 0x00010000\n"
        f"\t\tPort GUID: {out.split('Port GUID: ')[1].splitlines()[0]}\n"
        "\t\tLink layer: Ethernet\n"
    )
    rc, out, _ = node.run("ibstat", capsys=capsys)
    assert [line.split("'")[1] for line in out.splitlines() if line.startswith("CA '")] == [
        "rocep1s0f0",
        "rocep1s0f1",
        "roceP2p1s0f0",
        "roceP2p1s0f1",
    ]
    assert out.count("\t\tState: Down\n\t\tPhysical state: Disabled\n\t\tRate: 40\n") == 2
    rc, out, _ = node.run("ibstat", "roceP2p1s0f1", "1", capsys=capsys)
    assert out.startswith("CA: 'roceP2p1s0f1'\nPort 1:\nState: Active\nPhysical state: LinkUp\n")
    rc, out, err = node.run("ibstat", "mlx5_0", capsys=capsys)
    assert rc == 255 and out == "" and "'mlx5_0' IB device can't be found" in err
    assert node.run("ibstat", "-l", capsys=capsys)[1].split() == [
        "rocep1s0f0",
        "rocep1s0f1",
        "roceP2p1s0f0",
        "roceP2p1s0f1",
    ]


@pytest.mark.parametrize(
    ("rate_gbps", "text"), [(200, "200"), (100, "100"), (25, "25"), (2.5, "2.5")]
)
def test_ibstat_rate_comes_from_state(
    node: FakeNode, capsys: Any, rate_gbps: float, text: str
) -> None:
    node.state["ports"]["rocep1s0f1"]["rate_gbps"] = rate_gbps
    node.save()
    assert f"\t\tRate: {text}\n" in node.run("ibstat", "rocep1s0f1", capsys=capsys)[1]


def test_down_link_states(node: FakeNode, capsys: Any) -> None:
    node.set_port("enp1s0f1np1", up=False, carrier=False, mtu=9000)  # our end pulled
    node.set_port("enP2p1s0f1np1", up=True, carrier=False, mtu=9000)  # peer pulled
    ibstat = node.run("ibstat", capsys=capsys)[1]
    assert "CA 'rocep1s0f1'" in ibstat
    own = ibstat.split("CA 'rocep1s0f1'")[1].split("CA '")[0]
    peer = ibstat.split("CA 'roceP2p1s0f1'")[1]
    assert "\t\tState: Down\n\t\tPhysical state: Disabled\n\t\tRate: 40\n" in own
    assert "\t\tState: Down\n\t\tPhysical state: Polling\n\t\tRate: 40\n" in peer
    assert "rocep1s0f1 port 1 ==> enp1s0f1np1 (Down)" in node.run("ibdev2netdev", capsys=capsys)[1]
    rdma = node.run("rdma", "link", "show", capsys=capsys)[1].splitlines()
    assert "link rocep1s0f1/1 state DOWN physical_state DISABLED netdev enp1s0f1np1 " in rdma
    assert "link roceP2p1s0f1/1 state DOWN physical_state POLLING netdev enP2p1s0f1np1 " in rdma
    devinfo = node.run("ibv_devinfo", "-d", "rocep1s0f1", capsys=capsys)[1]
    assert "\t\t\tstate:\t\t\tPORT_DOWN (1)\n" in devinfo


def test_a_missing_netdev_hides_its_device(node: FakeNode, capsys: Any) -> None:
    for f in (node.sys / "enP2p1s0f0np0").iterdir():
        f.unlink()
    (node.sys / "enP2p1s0f0np0").rmdir()
    assert "roceP2p1s0f0" not in node.run("ibdev2netdev", capsys=capsys)[1]
    assert "roceP2p1s0f0" not in node.run("ibv_devinfo", capsys=capsys)[1]


@pytest.mark.parametrize(
    ("mtu", "active"),
    [
        (9000, "4096 (5)"),
        (4200, "4096 (5)"),
        (4192, "4096 (5)"),
        (4191, "2048 (4)"),
        (2144, "2048 (4)"),
        (2143, "1024 (3)"),
        (1500, "1024 (3)"),
        (1119, "512 (2)"),
    ],
)
def test_ibv_devinfo_active_mtu_follows_netdev_mtu(
    node: FakeNode, capsys: Any, mtu: int, active: str
) -> None:
    node.set_port("enp1s0f1np1", up=True, carrier=True, mtu=mtu)
    out = node.run("ibv_devinfo", "-d", "rocep1s0f1", capsys=capsys)[1]
    assert f"\t\t\tmax_mtu:\t\t4096 (5)\n\t\t\tactive_mtu:\t\t{active}\n" in out


def test_ibv_devinfo_layout(node: FakeNode, capsys: Any) -> None:
    rc, out, _ = node.run("ibv_devinfo", capsys=capsys)
    assert rc == 0
    first = out.split("\n\n")[0] + "\n"
    guid = first.split("node_guid:\t\t\t")[1].splitlines()[0]
    assert first == (
        "hca_id:\trocep1s0f0\n"
        "\ttransport:\t\t\tInfiniBand (0)\n"
        "\tfw_ver:\t\t\t\t28.45.4028\n"
        f"\tnode_guid:\t\t\t{guid}\n"
        f"\tsys_image_guid:\t\t\t{guid}\n"
        "\tvendor_id:\t\t\t0x02c9\n"
        "\tvendor_part_id:\t\t\t4129\n"
        "\thw_ver:\t\t\t\t0x0\n"
        "\tboard_id:\t\t\tNVD0000000087\n"
        "\tphys_port_cnt:\t\t\t1\n"
        "\t\tport:\t1\n"
        "\t\t\tstate:\t\t\tPORT_DOWN (1)\n"
        "\t\t\tmax_mtu:\t\t4096 (5)\n"
        "\t\t\tactive_mtu:\t\t1024 (3)\n"
        "\t\t\tsm_lid:\t\t\t0\n"
        "\t\t\tport_lid:\t\t0\n"
        "\t\t\tport_lmc:\t\t0x00\n"
        "\t\t\tlink_layer:\t\tEthernet\n"
    )
    assert out.count("hca_id:") == 4
    rc, _, err = node.run("ibv_devinfo", "-d", "mlx5_0", capsys=capsys)
    assert rc == 255 and err == "IB device 'mlx5_0' wasn't found\n"


def test_rdma_link_json(node: FakeNode, capsys: Any) -> None:
    rows = json.loads(node.run("rdma", "-j", "link", capsys=capsys)[1])
    assert rows[1] == {
        "ifindex": 1,
        "ifname": "rocep1s0f1",
        "port": 1,
        "state": "ACTIVE",
        "physical_state": "LINK_UP",
        "netdev": "enp1s0f1np1",
        "netdev_index": 4,
    }
    out = node.run("rdma", "link", "show", "rocep1s0f1/1", capsys=capsys)[1]
    assert out == "link rocep1s0f1/1 state ACTIVE physical_state LINK_UP netdev enp1s0f1np1 \n"


# A real GB10 `nvidia-smi` (DGX Spark, driver 580.95.05), minus the date line.
NVIDIA_SMI_GB10 = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA GB10                    On  |   0000000F:01:00.0 Off |                  N/A |
| N/A   41C    P8              4W /  N/A  | Not Supported          |      0%      Default |
|                                         |                        |                  N/A |
+-----------------------------------------+------------------------+----------------------+

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
"""


def test_nvidia_smi_table_matches_a_real_gb10(node: FakeNode, capsys: Any) -> None:
    rc, out, _ = node.run("nvidia-smi", capsys=capsys)
    assert rc == 0
    date, rest = out.split("\n", 1)
    assert date.endswith("       ") and len(date.split()) == 5
    assert rest == NVIDIA_SMI_GB10


def test_nvidia_smi_lists_fake_processes(node: FakeNode, capsys: Any) -> None:
    node.state["gpu"]["processes"] = [
        {"pid": 2804, "type": "G", "name": "/usr/lib/xorg/Xorg", "used_memory_mib": 179},
        {"pid": 4242, "type": "C", "name": "VLLM::Worker_TP0", "used_memory_mib": None},
    ]
    node.save()
    table = node.run("nvidia-smi", capsys=capsys)[1]
    assert (
        "|    0   N/A  N/A            2804      G   /usr/lib/xorg/Xorg"
        "                      179MiB |\n"
    ) in table
    assert all(len(line) == 91 for line in table.splitlines()[1:] if line)
    csv = node.run(
        "nvidia-smi",
        "--query-compute-apps=pid,process_name,used_memory",
        "--format=csv",
        capsys=capsys,
    )[1]
    assert csv == (
        "pid, process_name, used_gpu_memory [MiB]\n"
        "2804, /usr/lib/xorg/Xorg, 179 MiB\n"
        "4242, VLLM::Worker_TP0, [N/A]\n"
    )
    csv = node.run(
        "nvidia-smi",
        "--query-compute-apps=pid,used_memory",
        "--format=csv,noheader,nounits",
        capsys=capsys,
    )[1]
    assert csv == "2804, 179\n4242, [N/A]\n"


def test_nvidia_smi_queries(node: FakeNode, capsys: Any) -> None:
    out = node.run(
        "nvidia-smi",
        "--query-gpu=index,name,memory.total,memory.used,utilization.gpu,compute_cap",
        "--format=csv,noheader,nounits",
        capsys=capsys,
    )[1]
    assert out == "0, NVIDIA GB10, [N/A], [N/A], 0, 12.1\n"
    rc, out, _ = node.run("nvidia-smi", "--query-gpu=bogus", "--format=csv", capsys=capsys)
    assert rc == 2 and 'Field "bogus" is not a valid field to query.' in out
    rc, out, _ = node.run("nvidia-smi", "-L", capsys=capsys)
    assert out.startswith("GPU 0: NVIDIA GB10 (UUID: GPU-") and out.endswith(")\n")


def test_ibv_devices_layout(node: FakeNode, capsys: Any) -> None:
    rc, out, _ = node.run("ibv_devices", capsys=capsys)
    lines = out.splitlines()
    assert rc == 0
    assert lines[:2] == [
        "    device          \t   node GUID",
        "    ------          \t----------------",
    ]
    assert [line.split()[0] for line in lines[2:]] == [
        "rocep1s0f0",
        "rocep1s0f1",
        "roceP2p1s0f0",
        "roceP2p1s0f1",
    ]
    assert all(len(line.split("\t")[1]) == 16 for line in lines[2:])


def test_no_rdma_drivers_leave_the_rdma_tools_without_devices(node: FakeNode, capsys: Any) -> None:
    """state.json rdma false (fault no-rdma): what the real tools print without mlx5_ib /
    ib_core: Mellanox's ibdev2netdev exits -1 silently with no /sys/class/infiniband,
    libibverbs fails ENOSYS, ibstat and rdma link list nothing."""
    node.state["rdma"] = False
    node.save()
    assert node.run("ibdev2netdev", capsys=capsys) == (255, "", "")
    enosys = "Failed to get IB devices list: Function not implemented\n"
    assert node.run("ibv_devinfo", capsys=capsys) == (255, "", enosys)
    assert node.run("ibv_devices", capsys=capsys) == (1, "", enosys)
    assert node.run("ibstat", capsys=capsys) == (0, "", "")
    assert node.run("rdma", "link", capsys=capsys) == (0, "", "")
