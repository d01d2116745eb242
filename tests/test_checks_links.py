"""Link checks: pass/warn/fail boundaries and STYLE.md messages (node, interface,
measured, expected, usual fix)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from ipaddress import IPv4Interface
from pathlib import Path
from typing import Any

import pytest

import pytest_spark.infra.links.check as links_checks
import pytest_spark.infra.links.ping_check as ping_checks
from pytest_spark.infra.finding import Finding
from pytest_spark.infra.links.check import (
    DEPENDS_ON_LINK_UP,
    check_link_rate,
    check_link_up,
    check_roce_active,
    link_is_usable,
    link_rate_short,
)
from pytest_spark.infra.links.mtu_check import check_mtu, check_mtu_consistent
from pytest_spark.infra.links.parse import (
    PingResult,
    RoceMapping,
    parse_ibdev2netdev,
    parse_ip_addr_json,
    parse_ping,
)
from pytest_spark.infra.links.ping_check import check_ping
from pytest_spark.infra.links.probe import PortFacts, discover_fabric_ifs, parse_link_probe
from pytest_spark.infra.links.subnet_check import check_same_subnet, check_twin_subnets_distinct
from pytest_spark.infra.links.twins_check import check_fabric_twins, twin_key

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "links"
NODE = "spark-worker-1"
IF = "enp1s0f1np1"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


HEALTHY = PortFacts(
    netdev=IF,
    dev="rocep1s0f1",
    roce_up=True,
    ib_state="Active",
    phys_state="LinkUp",
    rate_gbps=200.0,
    active_mtu=4096,
    mtu=9000,
    operstate="UP",
    lower_up=True,
    carrier=True,
    addresses=(IPv4Interface("192.168.200.13/24"),),
    ethtool_speed_mbps=200000,
    ib_port=1,
    exists=True,
    admin_up=True,
    no_carrier=False,
    flags=("BROADCAST", "MULTICAST", "UP", "LOWER_UP"),
    ibv_state="PORT_ACTIVE",
    link_layer="Ethernet",
    ethtool_link_detected=True,
    carrier_changes=2,
    state_source="ibstat",
)


def port(**changes: Any) -> PortFacts:
    return dataclasses.replace(HEALTHY, **changes)


NO_CARRIER = port(
    operstate="DOWN",
    lower_up=False,
    carrier=False,
    no_carrier=True,
    flags=("NO-CARRIER", "BROADCAST", "MULTICAST", "UP"),
    ethtool_link_detected=False,
)
ADMIN_DOWN = port(
    operstate="DOWN",
    lower_up=False,
    carrier=None,
    admin_up=False,
    flags=("BROADCAST", "MULTICAST"),
)


def assert_style(f: Finding, *parts: str) -> None:
    """A STYLE.md message: node, interface and the given parts, 'expected', and a fix."""
    assert f.level in ("warn", "fail")
    for part in (*parts, "expected"):
        assert part in f.message, (part, f.message)
    fixes = (
        "set ",
        "check",
        "reseat",
        "replace",
        "install",
        "bring",
        "fix",
        "give",
        "put",
        "compare",
        "raise",
    )
    assert any(word in f.message.lower() for word in fixes), f.message


# ------------------------------------------------------------------------------- link up


def test_link_up_passes_on_healthy_port() -> None:
    f = check_link_up(NODE, HEALTHY)
    assert (f.level, f.ok, f.node) == ("pass", True, NODE)


def test_link_up_admin_down_says_ip_link_set_up() -> None:
    f = check_link_up(NODE, ADMIN_DOWN)
    assert (f.level, f.measured, f.expected) == ("fail", "admin-down", "UP")
    assert_style(f, NODE, IF, "administratively down")
    assert f"sudo ip link set {IF} up" in f.message
    assert "cable" not in f.message


def test_link_up_no_carrier_points_at_cable_and_peer() -> None:
    f = check_link_up(NODE, NO_CARRIER)
    assert (f.level, f.measured) == ("fail", "no-carrier")
    assert_style(f, NODE, IF, "NO-CARRIER", "operstate DOWN")
    assert "cable" in f.message and "peer" in f.message
    assert "ip link set" not in f.message
    assert "carrier_changes=2" in f.message


def test_link_up_sysfs_carrier_zero_alone_is_no_carrier() -> None:
    assert check_link_up(NODE, port(carrier=False)).measured == "no-carrier"


def test_link_up_missing_interface() -> None:
    f = check_link_up(NODE, port(exists=False, operstate=None, mtu=None, flags=()))
    assert (f.level, f.measured) == ("fail", "absent")
    assert_style(f, NODE, IF, "absent from ip link")


def test_link_up_unknown_when_ip_link_gave_nothing() -> None:
    f = check_link_up(NODE, port(exists=None, operstate=None, admin_up=None, lower_up=None))
    assert (f.level, f.measured) == ("fail", "unknown")


def test_link_up_other_operstate_fails() -> None:
    f = check_link_up(NODE, port(operstate="LOWERLAYERDOWN"))
    assert (f.level, f.measured) == ("fail", "LOWERLAYERDOWN")
    assert_style(f, NODE, IF, "LOWERLAYERDOWN")


def test_link_up_on_degraded_probe_port() -> None:
    facts = parse_link_probe(read("probe_degraded.txt"))
    assert check_link_up("spark-2", facts.ports["enP2p1s0f1np1"]).measured == "no-carrier"
    assert check_link_up("spark-2", facts.ports["enp1s0f1np1"]).level == "pass"


def test_link_is_usable_names_root_cause() -> None:
    assert link_is_usable(HEALTHY) == (True, "")
    ok, reason = link_is_usable(NO_CARRIER, NODE)
    assert not ok
    assert f"{NODE} {IF}: no carrier" in reason
    assert "link-up check" in reason
    ok, reason = link_is_usable(ADMIN_DOWN)
    assert not ok and "administratively down" in reason


def test_link_rate_short_words_a_slow_link_for_the_checks_that_skip_on_it() -> None:
    # test_allgather_busbw names it first when it skips citing the all-reduce: the fault
    # matrix's 100G row says "link rate 100 Gb/s" is the cause
    slow = port(rate_gbps=100.0, ethtool_speed_mbps=100000)
    reason = link_rate_short(slow, NODE, 200.0)
    assert reason == (
        f"{NODE} {IF}: link rate 100 Gb/s from ibstat (ethtool: 100000Mb/s) "
        "(see the link-rate check)"
    )
    assert link_rate_short(HEALTHY, NODE, 200.0) is None
    down = dataclasses.replace(ADMIN_DOWN, rate_gbps=100.0)
    assert link_rate_short(down, NODE, 200.0) is None  # the link-up check's, not this
    unknown = port(rate_gbps=None, ethtool_speed_mbps=None)
    assert link_rate_short(unknown, NODE, 200.0) is None  # not known: not a cause to cite


def test_dependent_checks_are_named() -> None:
    assert {"check_roce_active", "check_link_rate", "check_ping"} == DEPENDS_ON_LINK_UP
    for name in DEPENDS_ON_LINK_UP:
        assert callable(getattr(links_checks, name, None) or getattr(ping_checks, name))


# ---------------------------------------------------------------------------- RoCE state


def test_roce_active_passes() -> None:
    assert check_roce_active(NODE, HEALTHY).level == "pass"


def test_roce_active_from_rdma_without_ibv() -> None:
    f = check_roce_active(NODE, port(state_source="rdma", ibv_state=None))
    assert f.level == "pass"


def test_roce_polling_fails_with_cable_hint() -> None:
    f = check_roce_active(NODE, port(ib_state="Down", phys_state="Polling", ibv_state="PORT_DOWN"))
    assert (f.level, f.measured) == ("fail", "Down/Polling")
    assert_style(f, NODE, IF, "rocep1s0f1/1", "Polling", "Active/LinkUp")
    assert "cable" in f.message


def test_roce_disabled_fails_with_bring_up_hint() -> None:
    f = check_roce_active(NODE, port(ib_state="Down", phys_state="Disabled"))
    assert f.level == "fail"
    assert f"ip link set {IF} up" in f.message


def test_roce_ibstat_and_ibv_disagree() -> None:
    f = check_roce_active(NODE, port(ibv_state="PORT_DOWN"))
    assert (f.level, f.measured) == ("fail", "Active/LinkUp, PORT_DOWN")
    assert "modprobe" in f.message


def test_roce_state_unknown_fails() -> None:
    f = check_roce_active(NODE, port(ib_state=None, phys_state=None, ibv_state=None))
    assert (f.level, f.measured) == ("fail", "unknown")
    assert_style(f, NODE, IF, "unknown")
    assert "infiniband-diags" in f.message


def test_roce_init_state_fails() -> None:
    f = check_roce_active(NODE, port(ib_state="Initializing", ibv_state="PORT_INIT"))
    assert f.level == "fail"
    assert "Initializing" in f.message


# ----------------------------------------------------------------------------- link rate


@pytest.mark.parametrize(
    ("rate", "level"), [(400.0, "pass"), (200.0, "pass"), (199.9, "fail"), (100.0, "fail")]
)
def test_link_rate_boundaries(rate: float, level: str) -> None:
    f = check_link_rate(NODE, port(rate_gbps=rate), min_gbps=200)
    assert (f.level, f.measured, f.expected, f.unit) == (level, rate, 200, "Gb/s")


def test_link_rate_100_message() -> None:
    f = check_link_rate(NODE, port(rate_gbps=100.0, ethtool_speed_mbps=100000), 200)
    assert f.message.startswith(f"{NODE} {IF}: link rate 100 Gb/s from ibstat")
    assert_style(f, "expected >= 200 Gb/s", "ethtool: 100000Mb/s")
    assert "cable rated for 100G or a switch port forced to 100G" in f.message
    assert "reseat or replace the cable" in f.message
    assert f.evidence == {"ibstat": "Rate: 100", "ethtool": "Speed: 100000Mb/s"}


def test_link_rate_ibstat_is_authoritative_over_virtual_ethtool_speed() -> None:
    # a veth reports a fixed 10000Mb/s while the (simulated) ibstat says 200
    f = check_link_rate(NODE, port(rate_gbps=200.0, ethtool_speed_mbps=10000), 200)
    assert f.level == "pass"


def test_link_rate_ethtool_decides_only_without_ibstat() -> None:
    f = check_link_rate(NODE, port(rate_gbps=None, ethtool_speed_mbps=100000), 200)
    assert (f.level, f.measured) == ("fail", 100.0)
    assert "from ethtool (ibstat gave no rate)" in f.message
    assert check_link_rate(NODE, port(rate_gbps=None, ethtool_speed_mbps=200000)).level == "pass"


def test_link_rate_unknown() -> None:
    f = check_link_rate(NODE, port(rate_gbps=None, ethtool_speed_mbps=None), 200)
    assert (f.level, f.measured) == ("fail", None)
    assert_style(f, NODE, IF, "unknown")


def test_link_rate_on_rate100_probe() -> None:
    facts = parse_link_probe(read("probe_degraded.txt"))
    f = check_link_rate("spark-2", facts.ports["enp1s0f1np1"], 200)
    assert (f.level, f.measured) == ("fail", 100.0)


# ----------------------------------------------------------------------------------- MTU


@pytest.mark.parametrize(
    ("mtu", "level"),
    [(9000, "pass"), (4200, "pass"), (4199, "warn"), (1500, "warn"), (1499, "fail"), (576, "fail")],
)
def test_mtu_boundaries(mtu: int, level: str) -> None:
    f = check_mtu(NODE, port(mtu=mtu), min_mtu=4200, hard_min_mtu=1500)
    assert (f.level, f.measured, f.expected, f.unit) == (level, mtu, 4200, "bytes")


def test_mtu_warning_message_gives_cost_and_fix() -> None:
    f = check_mtu(NODE, port(mtu=1500, active_mtu=1024), 4200, 1500)
    assert f.ok  # a warning does not fail the test
    assert_style(f, NODE, IF, "MTU 1500", "RoCE active_mtu 1024", ">= 4200")
    assert "~5% bandwidth" in f.message
    assert f"sudo ip link set {IF} mtu 9000" in f.message


def test_mtu_fail_message() -> None:
    f = check_mtu(NODE, port(mtu=1499), 4200, 1500)
    assert not f.ok
    assert_style(f, NODE, IF, "MTU 1499", "never below 1500")


def test_mtu_unknown_and_bad_thresholds() -> None:
    assert check_mtu(NODE, port(mtu=None)).level == "fail"
    with pytest.raises(ValueError):
        check_mtu(NODE, HEALTHY, min_mtu=1500, hard_min_mtu=4200)


def test_mtu_consistent_pass() -> None:
    f = check_mtu_consistent({"spark-1": HEALTHY, "spark-2": HEALTHY})
    assert (f.level, f.measured) == ("pass", {"spark-1": 9000, "spark-2": 9000})


def test_mtu_mismatch_names_each_node() -> None:
    f = check_mtu_consistent({"spark-1": HEALTHY, "spark-2": port(mtu=1500)})
    assert (f.level, f.measured, f.expected) == ("fail", {"spark-1": 9000, "spark-2": 1500}, 9000)
    assert_style(f, IF, "spark-1 9000", "spark-2 1500", "dropped")
    assert "set MTU 9000 on spark-2" in f.message


def test_mtu_consistent_unknown_node() -> None:
    f = check_mtu_consistent({"spark-1": HEALTHY, "spark-2": port(mtu=None)})
    assert f.level == "fail"
    assert "spark-2 unknown" in f.message
    with pytest.raises(ValueError):
        check_mtu_consistent({})


# ------------------------------------------------------------------------------- subnets


def _twin_addrs(name: str, ifname: str = IF) -> list[IPv4Interface]:
    return parse_ip_addr_json(read(name))[ifname]


def test_same_subnet_pass_on_fixtures() -> None:
    f = check_same_subnet(
        {
            "spark-1": _twin_addrs("ip_addr_healthy.json"),
            "spark-2": _twin_addrs("ip_addr_peer_healthy.json"),
        },
        twin=IF,
    )
    assert (f.level, f.expected) == ("pass", "192.168.200.0/24")


def test_same_subnet_two_nodes_apart_names_both() -> None:
    f = check_same_subnet(
        {
            "spark-1": _twin_addrs("ip_addr_healthy.json"),
            "spark-2": _twin_addrs("ip_addr_wrong_subnet.json"),
        },
        twin=IF,
    )
    assert f.level == "fail"
    assert_style(f, IF, "spark-1 192.168.200.12/24", "spark-2 192.168.100.13/24")


def test_same_subnet_majority_names_the_odd_node() -> None:
    f = check_same_subnet(
        {
            "spark-1": [IPv4Interface("192.168.200.11/24")],
            "spark-2": [IPv4Interface("192.168.200.12/24")],
            "spark-3": [IPv4Interface("192.168.201.13/24")],
        },
        twin=IF,
    )
    assert (f.level, f.node, f.expected) == ("fail", "spark-3", "192.168.200.0/24")
    assert f.message.startswith("spark-3 192.168.201.13/24:")
    assert_style(f, IF, "spark-1, spark-2", "Fix the address on spark-3")


def test_same_subnet_prefix_mismatch_is_off() -> None:
    f = check_same_subnet(
        {"a": [IPv4Interface("10.0.0.1/24")], "b": [IPv4Interface("10.0.0.2/16")]}
    )
    assert f.level == "fail"


def test_same_subnet_missing_address_names_node() -> None:
    f = check_same_subnet({"spark-1": [IPv4Interface("192.168.200.12/24")], "spark-2": []}, twin=IF)
    assert (f.level, f.node) == ("fail", "spark-2")
    assert "spark-2 no IPv4 address" in f.message
    none = check_same_subnet({"spark-1": [], "spark-2": []}, twin=IF)
    assert none.level == "fail" and "no node has an IPv4 address" in none.message


def test_same_subnet_duplicate_address() -> None:
    same = [IPv4Interface("192.168.200.12/24")]
    f = check_same_subnet({"spark-1": same, "spark-2": same}, twin=IF)
    assert f.level == "fail"
    assert "192.168.200.12 is on spark-1 and spark-2" in f.message
    with pytest.raises(ValueError):
        check_same_subnet({})


def test_twin_subnets_distinct() -> None:
    addrs = parse_ip_addr_json(read("ip_addr_healthy.json"))
    twins = {i: addrs[i] for i in ("enp1s0f1np1", "enP2p1s0f1np1")}
    assert check_twin_subnets_distinct("spark-1", twins).level == "pass"
    shared = {**twins, "enP2p1s0f1np1": [IPv4Interface("192.168.200.22/24")]}
    f = check_twin_subnets_distinct("spark-1", shared)
    assert f.level == "fail"
    assert_style(f, "spark-1", "enp1s0f1np1 and enP2p1s0f1np1", "192.168.200.0/24")


# ---------------------------------------------------------------------------------- ping


def ping(name: str) -> PingResult:
    return parse_ping(read(name))


def _ping(result: PingResult, small: PingResult | None = None) -> Finding:
    return check_ping(NODE, HEALTHY, "spark-head", "192.168.200.12", result, 9000, small_ping=small)


def test_ping_full_mtu_reached() -> None:
    f = _ping(ping("ping_ok_9000.txt"))
    assert (f.level, f.measured, f.expected, f.unit) == ("pass", 0.0, 0.0, "%")
    assert "3/3 replies" in f.message and "8972-byte payload" in f.message


def test_ping_accepts_interface_name() -> None:
    f = check_ping(NODE, IF, "spark-head", "192.168.200.12", ping("ping_no_reply.txt"), 9000)
    assert f.message.startswith(f"{NODE} {IF}:")


def test_ping_message_too_long_is_local_mtu() -> None:
    f = _ping(ping("ping_message_too_long.txt"))
    assert f.level == "fail"
    assert_style(f, NODE, IF, "spark-head", "0/3 replies", "MTU problem", "message too long")
    assert f"sudo ip link set {IF} mtu 9000" in f.message
    assert "(1500)" in f.message


def test_ping_frag_needed_is_path_mtu() -> None:
    f = _ping(ping("ping_frag_needed.txt"))
    assert f.level == "fail"
    assert_style(f, NODE, IF, "MTU problem", "Frag needed", "(1500)")


def test_ping_host_unreachable_is_reachability() -> None:
    f = _ping(ping("ping_unreachable.txt"))
    assert f.level == "fail"
    assert_style(f, NODE, IF, "No reachability", "Destination Host Unreachable")
    assert "not an MTU problem" in f.message


def test_ping_silent_loss_uses_small_ping_to_decide() -> None:
    ambiguous = _ping(ping("ping_no_reply.txt"))
    assert ambiguous.level == "fail" and "default-size ping" in ambiguous.message
    mtu = _ping(ping("ping_no_reply.txt"), small=ping("ping_small_ok.txt"))
    assert "MTU problem" in mtu.message and "small pings reach spark-head" in mtu.message
    dead = _ping(ping("ping_no_reply.txt"), small=ping("ping_no_reply.txt"))
    assert "No reachability (small pings fail too)" in dead.message


def test_ping_network_unreachable() -> None:
    f = _ping(ping("ping_network_unreachable.txt"))
    assert f.level == "fail" and "Network is unreachable" in f.message


def test_ping_partial_loss_warns() -> None:
    f = _ping(ping("ping_partial.txt"))
    assert (f.level, f.measured) == ("warn", 33.3333)
    assert_style(f, NODE, IF, "2/3 replies", "33.3333% loss", "cable")


# --------------------------------------------------------------------------- fabric twins


def test_twin_key() -> None:
    assert twin_key("enP2p1s0f1np1") == twin_key("enp1s0f1np1") == "enp1s0f1np1"
    assert twin_key("roceP2p1s0f1") == "rocep1s0f1"
    assert twin_key("enp1s0f0np0") != twin_key("enp1s0f1np1")


def test_fabric_twins_healthy() -> None:
    facts = parse_link_probe(read("probe_healthy.txt"))
    f = check_fabric_twins("spark-1", discover_fabric_ifs(facts), 2, facts.roce)
    assert (f.level, f.measured, f.expected) == ("pass", 2, 2)


def test_fabric_twins_one_down_names_its_sibling() -> None:
    roce = parse_ibdev2netdev(read("ibdev2netdev_one_twin_down.txt"))
    up = [m.netdev for m in roce if m.up]
    f = check_fabric_twins("spark-2", up, 2, roce)
    assert (f.level, f.measured, f.expected) == ("fail", 1, 2)
    assert_style(f, "spark-2", "1 fabric twin(s) Up (enp1s0f1np1)", "expected 2")
    assert "Down: enP2p1s0f1np1 (twin of enp1s0f1np1)." in f.message
    assert "enp1s0f0np0" not in f.message.split("Down:")[1].split(".")[0]
    assert "sudo ip link set enP2p1s0f1np1 up" in f.message


def test_fabric_twins_none_up_lists_every_down_port() -> None:
    roce = [
        RoceMapping(m.dev, m.port, m.netdev, False, "Down")
        for m in parse_ibdev2netdev(read("ibdev2netdev_healthy.txt"))
    ]
    f = check_fabric_twins("spark-2", [], 2, roce)
    assert (f.level, f.measured) == ("fail", 0)
    assert "Up (none)" in f.message
    for m in roce:
        assert m.netdev in f.message
    assert "cable" in f.message


def test_fabric_twins_mesh_expectation() -> None:
    roce = parse_ibdev2netdev(read("ibdev2netdev_healthy.txt"))
    f = check_fabric_twins("spark-1", [m.netdev for m in roce if m.up], 4, roce)
    assert (f.level, f.expected) == ("fail", 4)
    assert "another QSFP port" in f.message


# ------------------------------------------------------------- every failure is readable

FAILING: list[tuple[str, Callable[[], Finding]]] = [
    ("link_up", lambda: check_link_up(NODE, NO_CARRIER)),
    ("roce", lambda: check_roce_active(NODE, port(ib_state="Down", phys_state="Polling"))),
    ("rate", lambda: check_link_rate(NODE, port(rate_gbps=100.0))),
    ("mtu", lambda: check_mtu(NODE, port(mtu=1500))),
    ("ping", lambda: _ping(ping("ping_unreachable.txt"))),
]


@pytest.mark.parametrize(("name", "make"), FAILING, ids=[n for n, _ in FAILING])
def test_failure_messages_follow_style(name: str, make: Callable[[], Finding]) -> None:
    f = make()
    assert f.level != "pass"
    assert f.node == NODE
    assert f.message.startswith(f"{NODE} {IF}: ")
    assert_style(f)
    assert f.evidence, "failures carry evidence for the report"


def test_no_carrier_caused_by_the_peers_admin_down_end() -> None:
    """On a direct cable, this end's NO-CARRIER is the peer's admin-down: cited, not failed."""
    from pytest_spark.infra.links.check import peer_took_the_link_down
    from pytest_spark.infra.links.probe import PortFacts

    def port(**kw: object) -> PortFacts:
        base = dict.fromkeys(
            ("dev", "roce_up", "ib_state", "phys_state", "rate_gbps", "active_mtu", "mtu"), None
        )
        return PortFacts("enp1s0f1np1", **base, operstate="DOWN", lower_up=None, carrier=None, **kw)  # type: ignore[arg-type]

    mine = port(admin_up=True, no_carrier=True, exists=True)
    assert (
        peer_took_the_link_down(mine, {"spark-worker-1": port(admin_up=False)}) == "spark-worker-1"
    )
    assert (
        peer_took_the_link_down(mine, {"spark-worker-1": port(admin_up=True, no_carrier=True)})
        is None
    )
    # this end administratively down: its own failure, whatever the peer shows
    assert (
        peer_took_the_link_down(port(admin_up=False), {"spark-worker-1": port(admin_up=False)})
        is None
    )


def test_a_link_at_half_rate_is_one_failure_naming_both_ends() -> None:
    """Issue #25 part 4: one link at half rate failed test_link_rate on both ends of the
    cable. A link has one rate: the first end has the failure, naming every end."""
    from pytest_spark.infra.links.check import link_rate_ends

    low = [
        ("spark-head", "enp1s0f1np1", 100.0),
        ("spark-head", "enP2p1s0f1np1", 100.0),
        ("spark-worker-1", "enp1s0f1np1", 100.0),
        ("spark-worker-1", "enP2p1s0f1np1", 100.0),
    ]
    every = [(n, i) for n, i, _ in low]
    for node, ifname, _ in low:
        owner, ends = link_rate_ends(low, node, ifname, direct=True)
        assert owner == ("spark-head", "enp1s0f1np1")
        assert ends == every
    # one end only (the other end's rate fine): its own twins, as before
    one = low[2:]
    assert link_rate_ends(one, "spark-worker-1", "enP2p1s0f1np1", direct=True) == (
        ("spark-worker-1", "enp1s0f1np1"),
        [("spark-worker-1", "enp1s0f1np1"), ("spark-worker-1", "enP2p1s0f1np1")],
    )
    # behind a switch each node's cable is its own: no peer end
    owner, ends = link_rate_ends(low, "spark-worker-1", "enp1s0f1np1", direct=False)
    assert owner == ("spark-worker-1", "enp1s0f1np1") and len(ends) == 2
    # another rate at the far end is not the same reading: each end its own
    mixed = [("spark-head", "enp1s0f1np1", 200.0 - 50), ("spark-worker-1", "enp1s0f1np1", 100.0)]
    assert link_rate_ends(mixed, "spark-worker-1", "enp1s0f1np1", direct=True)[0] == (
        "spark-worker-1",
        "enp1s0f1np1",
    )


def test_no_ibdev2netdev_says_command_not_found_once() -> None:
    """Issue #25 part 3: a reachable node without ibdev2netdev gave 16 identical "check
    cables" errors and "No port has a link partner"; nothing said the tool is missing."""
    from pytest_spark.infra.links.twins_check import fabric_twin_missing

    finding = check_fabric_twins("spark-worker-1", [], 2, [], ("ibdev2netdev",))
    assert not finding.ok
    assert "ibdev2netdev: command not found" in finding.message
    assert "link partner" not in finding.message and "cable" not in finding.message
    assert "--spark-fabric-ifs" in finding.message and "spark-worker-1" in finding.message
    # the twin checks skip citing each short node's twins check, never "check cables"
    fail, text = fabric_twin_missing(0, [], 2, ["spark-worker-1"], verdict=True)
    assert not fail and "(test_fabric_twins_up[spark-worker-1] has the evidence)" in text
    assert "cables" not in text
    # without the twins check in the session (-k mtu_consistent), the failure is here
    fail, text = fabric_twin_missing(1, ["enp1s0f1np1"], 2, ["spark-worker-1"], verdict=False)
    assert fail and "check cables" in text and "fabric twin 1: only 1" in text
    # a tool present and no link: the cable words, as before
    assert "link partner" in check_fabric_twins("spark-head", [], 2, []).message
