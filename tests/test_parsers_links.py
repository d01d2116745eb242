"""Link-state parsers on the recorded outputs in fixtures/links/ (see its README)."""

from __future__ import annotations

from ipaddress import IPv4Interface
from pathlib import Path

import pytest

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.links.parse import (
    CaInfo,
    Ethtool,
    IbPort,
    IbvPort,
    PingResult,
    RdmaLink,
    RoceMapping,
    parse_ethtool,
    parse_ibdev2netdev,
    parse_ibstat,
    parse_ibv_devinfo,
    parse_ip_addr_json,
    parse_ip_link_json,
    parse_ping,
    parse_rdma_link,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "links"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


# ---------------------------------------------------------------------------- ibdev2netdev


def test_ibdev2netdev_healthy() -> None:
    assert parse_ibdev2netdev(read("ibdev2netdev_healthy.txt")) == [
        RoceMapping("roceP2p1s0f0", 1, "enP2p1s0f0np0", False, "Down"),
        RoceMapping("roceP2p1s0f1", 1, "enP2p1s0f1np1", True, "Up"),
        RoceMapping("rocep1s0f0", 1, "enp1s0f0np0", False, "Down"),
        RoceMapping("rocep1s0f1", 1, "enp1s0f1np1", True, "Up"),
    ]


def test_ibdev2netdev_one_twin_down() -> None:
    up = [m.netdev for m in parse_ibdev2netdev(read("ibdev2netdev_one_twin_down.txt")) if m.up]
    assert up == ["enp1s0f1np1"]


def test_ibdev2netdev_tolerates_blank_lines_and_trailing_spaces() -> None:
    text = "\n  rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)   \n\n\n"
    assert parse_ibdev2netdev(text) == [RoceMapping("rocep1s0f1", 1, "enp1s0f1np1", True, "Up")]


def test_ibdev2netdev_empty_is_no_devices() -> None:
    assert parse_ibdev2netdev("") == []


@pytest.mark.parametrize(
    "line",
    [
        "rocep1s0f1 port 1 ==> enp1s0f1np1",  # no state
        "rocep1s0f1 port x ==> enp1s0f1np1 (Up)",  # port not a number
        "bash: ibdev2netdev: command not found",
        "==>",
    ],
)
def test_ibdev2netdev_garbage_raises_with_line(line: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_ibdev2netdev("rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)\n" + line + "\n")
    assert info.value.line == line
    assert info.value.lineno == 2
    assert line in str(info.value)


# ---------------------------------------------------------------------------------- ibstat


def test_ibstat_reference_fragment_verbatim() -> None:
    text = read("ibstat_reference.txt")
    assert "\t\tState: Active\n" in text  # TAB indentation preserved
    assert parse_ibstat(text) == {
        "rocep1s0f0": CaInfo(
            "MT4129", "28.45.4028", {1: IbPort("Active", "LinkUp", 200.0, "Ethernet")}
        ),
        "roceP2p1s0f1": CaInfo(None, None, {1: IbPort("Down", "Disabled", 40.0, None)}),
    }


def test_ibstat_healthy_full() -> None:
    cas = parse_ibstat(read("ibstat_healthy.txt"))
    assert list(cas) == ["roceP2p1s0f0", "roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1"]
    assert cas["rocep1s0f1"] == CaInfo(
        "MT4129",
        "28.45.4028",
        {1: IbPort("Active", "LinkUp", 200.0, "Ethernet")},
        hardware_version="0",
        node_guid="0x4cbb47030046a3d1",
    )
    assert cas["roceP2p1s0f1"].ports[1] == IbPort("Active", "LinkUp", 200.0, "Ethernet")
    assert cas["rocep1s0f0"].ports[1] == IbPort("Down", "Disabled", 40.0, "Ethernet")
    assert cas["roceP2p1s0f0"].ports[1] == IbPort("Down", "Disabled", 40.0, "Ethernet")


def test_ibstat_polling_variant() -> None:
    cas = parse_ibstat(read("ibstat_polling.txt"))
    assert cas["roceP2p1s0f1"].ports[1] == IbPort("Down", "Polling", 40.0, "Ethernet")
    assert cas["rocep1s0f1"].ports[1].state == "Active"


def test_ibstat_rate100_variant() -> None:
    cas = parse_ibstat(read("ibstat_rate100.txt"))
    assert cas["rocep1s0f1"].ports[1].rate_gbps == 100.0
    assert cas["roceP2p1s0f1"].ports[1].rate_gbps == 100.0
    assert cas["rocep1s0f0"].ports[1].rate_gbps == 40.0


def test_ibstat_indentation_not_trusted() -> None:
    text = "CA 'mlx5_0'\n  CA type: MT4129  \n\n  Port 1:\n    State: Active\n    Rate: 2.5\n"
    assert parse_ibstat(text) == {
        "mlx5_0": CaInfo("MT4129", None, {1: IbPort("Active", None, 2.5, None)})
    }


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("\tState: Active\n", "\tState: Active"),  # field before any CA
        ("CA 'x'\n\tPort 1:\n\t\tRate: fast\n", "\t\tRate: fast"),
        ("CA 'x'\n\tthis is not a field\n", "\tthis is not a field"),
        ("ibpanic: [1234] main: stat of IB device 'x' failed\n", None),
    ],
)
def test_ibstat_garbage_raises(text: str, bad: str | None) -> None:
    with pytest.raises(ParseError) as info:
        parse_ibstat(text)
    if bad is not None:
        assert info.value.line == bad


# ----------------------------------------------------------------------------- ibv_devinfo


def test_ibv_devinfo_healthy() -> None:
    devs = parse_ibv_devinfo(read("ibv_devinfo_healthy.txt"))
    active = IbvPort("PORT_ACTIVE", 4, 4096, 5, "Ethernet", max_mtu=4096)
    down = IbvPort("PORT_DOWN", 1, 1024, 3, "Ethernet", max_mtu=4096)
    assert devs == {
        "roceP2p1s0f0": {1: down},
        "roceP2p1s0f1": {1: active},
        "rocep1s0f0": {1: down},
        "rocep1s0f1": {1: active},
    }


def test_ibv_devinfo_mtu1500_active_mtu_1024() -> None:
    port = parse_ibv_devinfo(read("ibv_devinfo_mtu1500.txt"))["rocep1s0f1"][1]
    assert (port.state, port.state_code, port.active_mtu, port.active_mtu_code) == (
        "PORT_ACTIVE",
        4,
        1024,
        3,
    )


def test_ibv_devinfo_no_devices_and_verbose_noise() -> None:
    assert parse_ibv_devinfo("No IB devices found\n") == {}
    text = (
        "hca_id:\tmlx5_0\n\tcompletion_timestamp_mask not supported\n"
        "\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_INIT (2)\n\t\t\t\t\tSUPPORT_UD\n"
    )
    assert parse_ibv_devinfo(text) == {"mlx5_0": {1: IbvPort("PORT_INIT", 2, None, None, None)}}


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("transport: InfiniBand (0)\n", "transport: InfiniBand (0)"),  # before hca_id
        ("hca_id:\tx\n\t\tport:\t1\n\t\t\tstate:\tACTIVE\n", "\t\t\tstate:\tACTIVE"),
        (
            "hca_id:\tx\n\t\tport:\t1\n\t\t\tstate:\tPORT_ACTIVE (4)\n\t\t\tactive_mtu:\tbig (5)\n",
            "\t\t\tactive_mtu:\tbig (5)",
        ),
        ("hca_id:\tx\n\t\tport:\tone\n", "\t\tport:\tone"),
    ],
)
def test_ibv_devinfo_garbage_raises(text: str, bad: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_ibv_devinfo(text)
    assert info.value.line == bad


def test_ibv_devinfo_port_without_state_raises() -> None:
    with pytest.raises(ParseError, match="no 'state:' line"):
        parse_ibv_devinfo("hca_id:\tx\n\t\tport:\t1\n\t\t\tactive_mtu:\t\t4096 (5)\n")


# ------------------------------------------------------------------------------- rdma link


def test_rdma_link_reference_line() -> None:
    assert parse_rdma_link(read("rdma_link_reference.txt")) == [
        RdmaLink("rocep1s0f0", 1, "ACTIVE", "LINK_UP", "enp1s0f0np0")
    ]


def test_rdma_link_healthy_with_trailing_spaces() -> None:
    text = read("rdma_link_healthy.txt")
    assert text.splitlines()[0].endswith(" ")
    assert parse_rdma_link(text) == [
        RdmaLink("roceP2p1s0f0", 1, "DOWN", "DISABLED", "enP2p1s0f0np0"),
        RdmaLink("roceP2p1s0f1", 1, "ACTIVE", "LINK_UP", "enP2p1s0f1np1"),
        RdmaLink("rocep1s0f0", 1, "DOWN", "DISABLED", "enp1s0f0np0"),
        RdmaLink("rocep1s0f1", 1, "ACTIVE", "LINK_UP", "enp1s0f1np1"),
    ]


def test_rdma_link_polling() -> None:
    links = {link.dev: link for link in parse_rdma_link(read("rdma_link_polling.txt"))}
    assert links["roceP2p1s0f1"] == RdmaLink("roceP2p1s0f1", 1, "DOWN", "POLLING", "enP2p1s0f1np1")


def test_rdma_link_missing_optional_fields() -> None:
    assert parse_rdma_link("link mlx5_0/1 subnet_prefix fe80:: lid 3 state ACTIVE\n") == [
        RdmaLink("mlx5_0", 1, "ACTIVE", None, None)
    ]


@pytest.mark.parametrize("line", ["link rocep1s0f0 state ACTIVE", "dev rocep1s0f0", "link /1"])
def test_rdma_link_garbage_raises(line: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_rdma_link(line + "\n")
    assert info.value.line == line


# --------------------------------------------------------------------------------- ethtool


def test_ethtool_200g() -> None:
    assert parse_ethtool(read("ethtool_enp1s0f1np1_200g.txt")) == Ethtool(
        "enp1s0f1np1", 200000, True, "Full", 4, "Direct Attach Copper", True
    )


def test_ethtool_100g_degraded() -> None:
    eth = parse_ethtool(read("ethtool_enp1s0f1np1_100g.txt"))
    assert (eth.ifname, eth.speed_mbps, eth.link_detected) == ("enp1s0f1np1", 100000, True)


def test_ethtool_no_link_speed_unknown() -> None:
    assert parse_ethtool(read("ethtool_enp1s0f0np0_nolink.txt")) == Ethtool(
        "enp1s0f0np0", None, False, "Unknown! (255)", None, "Other", True
    )


def test_ethtool_non_root_noise_before_header() -> None:
    eth = parse_ethtool(read("ethtool_enp1s0f1np1_nonroot.txt"))
    assert (eth.speed_mbps, eth.link_detected) == (200000, True)


def test_ethtool_veth_fixed_speed() -> None:
    eth = parse_ethtool(read("ethtool_veth_10g.txt"))
    assert (eth.speed_mbps, eth.link_detected, eth.auto_negotiation) == (10000, True, False)


def test_ethtool_missing_optional_fields() -> None:
    assert parse_ethtool("Settings for eth0:\n") == Ethtool("eth0", None, None)


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("Speed: 200000Mb/s\n", "Speed: 200000Mb/s"),
        ("Settings for eth0:\n\tSpeed: fast\n", "\tSpeed: fast"),
        ("Settings for eth0:\n\tLink detected: maybe\n", "\tLink detected: maybe"),
        ("netlink error: no device matches name (offset 24)\n", None),
    ],
)
def test_ethtool_garbage_raises(text: str, bad: str | None) -> None:
    with pytest.raises(ParseError) as info:
        parse_ethtool(text)
    assert info.value.line == bad


# ------------------------------------------------------------------------------ ip -j link


def test_ip_link_healthy() -> None:
    links = parse_ip_link_json(read("ip_link_healthy.json"))
    assert list(links) == [
        "lo",
        "enP7s7",
        "enp1s0f0np0",
        "enp1s0f1np1",
        "wlP9s9",
        "enP2p1s0f0np0",
        "enP2p1s0f1np1",
        "docker0",
    ]
    twin = links["enp1s0f1np1"]
    assert twin.flags == ("BROADCAST", "MULTICAST", "UP", "LOWER_UP")
    assert (twin.operstate, twin.mtu, twin.up, twin.lower_up, twin.no_carrier) == (
        "UP",
        9000,
        True,
        True,
        False,
    )
    unplugged = links["enp1s0f0np0"]
    assert (unplugged.operstate, unplugged.up, unplugged.lower_up, unplugged.no_carrier) == (
        "DOWN",
        True,
        False,
        True,
    )


def test_ip_link_unplugged_and_admin_down() -> None:
    unplugged = parse_ip_link_json(read("ip_link_unplugged.json"))["enP2p1s0f1np1"]
    assert (unplugged.up, unplugged.no_carrier, unplugged.operstate) == (True, True, "DOWN")
    admin = parse_ip_link_json(read("ip_link_admin_down.json"))["enP2p1s0f1np1"]
    assert (admin.up, admin.no_carrier, admin.lower_up, admin.operstate) == (
        False,
        False,
        False,
        "DOWN",
    )


def test_ip_link_skips_empty_entries_and_accepts_empty_output() -> None:
    assert parse_ip_link_json("") == {}
    links = parse_ip_link_json('[{}, {"ifname": "x", "flags": [], "mtu": 1500}]')
    assert links["x"].mtu == 1500
    assert links["x"].operstate is None


@pytest.mark.parametrize(
    "text",
    [
        '[{"ifname": "x"',
        '{"ifname": "x"}',
        '[{"ifname": "x", "mtu": "9000"}]',
        '[{"ifname": "x", "flags": "UP"}]',
        'Option "-j" is unknown, try "ip -help".',
    ],
)
def test_ip_link_garbage_raises(text: str) -> None:
    with pytest.raises(ParseError):
        parse_ip_link_json(text)


# ------------------------------------------------------------------------------ ip -j addr


def test_ip_addr_healthy() -> None:
    addrs = parse_ip_addr_json(read("ip_addr_healthy.json"))
    assert addrs["enp1s0f1np1"] == [IPv4Interface("192.168.200.12/24")]
    assert addrs["enP2p1s0f1np1"] == [IPv4Interface("192.168.201.12/24")]
    assert addrs["enP7s7"] == [IPv4Interface("10.1.230.180/24")]  # IPv6 ignored
    assert addrs["enp1s0f0np0"] == []


def test_ip_addr_garbage_raises() -> None:
    with pytest.raises(ParseError):
        parse_ip_addr_json('[{"ifname": "x", "addr_info": [{"family": "inet", "local": "1.2"}]}]')
    with pytest.raises(ParseError):
        parse_ip_addr_json("not json")


# ------------------------------------------------------------------------------------ ping


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ping_ok_9000.txt", PingResult(3, 3, 0.0, 0.196)),
        ("ping_small_ok.txt", PingResult(3, 3, 0.0, 0.106)),
        ("ping_partial.txt", PingResult(3, 2, 33.3333, 0.231)),
        ("ping_no_reply.txt", PingResult(3, 0, 100.0, None)),
        ("ping_message_too_long.txt", PingResult(3, 0, 100.0, None, ("message too long",), 1500)),
        ("ping_frag_needed.txt", PingResult(3, 0, 100.0, None, ("Frag needed",), 1500)),
        (
            "ping_unreachable.txt",
            PingResult(3, 0, 100.0, None, ("Destination Host Unreachable",)),
        ),
        (
            "ping_network_unreachable.txt",
            PingResult(0, 0, 100.0, None, ("Network is unreachable",)),
        ),
    ],
)
def test_ping_fixtures(name: str, expected: PingResult) -> None:
    assert parse_ping(read(name)) == expected


def test_ping_mtu_problem_property() -> None:
    assert parse_ping(read("ping_message_too_long.txt")).mtu_problem
    assert parse_ping(read("ping_frag_needed.txt")).mtu_problem
    assert not parse_ping(read("ping_unreachable.txt")).mtu_problem


def test_ping_busybox_format() -> None:
    text = (
        "--- 10.0.0.2 ping statistics ---\n"
        "3 packets transmitted, 3 packets received, 0% packet loss\n"
        "round-trip min/avg/max = 0.1/0.2/0.3 ms\n"
    )
    assert parse_ping(text) == PingResult(3, 3, 0.0, 0.2)


def test_ping_garbage_raises() -> None:
    with pytest.raises(ParseError) as info:
        parse_ping("hello\nworld\n")
    assert info.value.line == "hello"
    with pytest.raises(ParseError):
        parse_ping("")
