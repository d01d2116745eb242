"""Faults injected into a running sim as real kernel state (plus state.json for what the
kernel cannot show, e.g. the negotiated rate). Each fault is recorded in DIR/faults.json
so that ``status`` lists it; ``clear`` restores the healthy cluster."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .. import node as nodes_mod
from ..netns import SimError, ip_batch, tbf_line, tc_batch
from ..topology import (
    FABRIC_TWINS,
    HEALTHY_MTU,
    HEALTHY_RATE_MBPS,
    UNPLUGGED,
    UNPLUGGED_MTU,
    NodeSpec,
    Topology,
    resolve_node,
    resolve_twins,
    tbf_mbit,
)
from .common import Kinds, load_faults, positive_int, record, save_faults

KINDS = ("link-down", "link-rate", "mtu", "switch-mtu", "cable-flapping")
# A cable flapping during the run as ethtool -S reads it (fault cable-flapping): the link
# drops and comes back every few seconds, each drop with a burst of CRC and symbol errors.
# (host.py's link-flap is the carrier lost N times before the run: the link checks'.)
FLAP_PER_S = {"link_down_events_phy": 0.5, "rx_crc_errors_phy": 140.0, "rx_symbol_err_phy": 9.0}
TWIN_HELP = "twin: 0, 1 or interface name (default: both)"


def add_parsers(kinds: Kinds) -> None:
    k = kinds.on_node("link-down", "take a fabric link down")
    k.add_argument("twin", metavar="TWIN", nargs="?", help=TWIN_HELP)
    k = kinds.on_node("link-rate", "degrade a link's rate")
    k.add_argument("mbps", metavar="MBPS", type=positive_int, help="rate in Mb/s (healthy: 200000)")
    k.add_argument("twin", metavar="TWIN", nargs="?", help=TWIN_HELP)
    k = kinds.on_node("mtu", "set a fabric port's MTU")
    k.add_argument("mtu", metavar="MTU", type=positive_int, help="MTU (healthy: 9000)")
    k.add_argument("twin", metavar="TWIN", nargs="?", help=TWIN_HELP)
    k = kinds.on_node(
        "cable-flapping", "a cable flapping from now on: a port's link-down and CRC counters rise"
    )
    k.add_argument("twin", metavar="TWIN", nargs="?", default="0", help="twin: 0, 1 or name")
    k = kinds.on_node("switch-mtu", "set the MTU of a node's port on the switch")
    k.add_argument("mtu", metavar="MTU", type=positive_int, help="MTU (healthy: 9000)")
    k.add_argument("twin", metavar="TWIN", nargs="?", help=TWIN_HELP)


def apply(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    if args.kind == "link-down":
        return link_down(state_dir, topo, args.node, args.twin)
    if args.kind == "link-rate":
        return link_rate(state_dir, topo, args.node, args.mbps, args.twin)
    if args.kind == "mtu":
        return mtu(state_dir, topo, args.node, args.mtu, args.twin)
    if args.kind == "cable-flapping":
        return cable_flapping(state_dir, topo, args.node, args.twin)
    return switch_mtu(state_dir, topo, args.node, args.mtu, args.twin)


def _rates(state_dir: Path, topo: Topology) -> dict[tuple[int, int], int]:
    """Advertised rate in Mb/s per (node index, twin) from state.json."""
    rates = {}
    for n in topo.nodes:
        ports = nodes_mod.read_state(state_dir, n)["ports"]
        assert isinstance(ports, dict)
        for p in n.fabric:
            rates[(n.index, p.twin)] = round(float(ports[p.dev]["rate_gbps"]) * 1000)
    return rates


def apply_shaping(state_dir: Path, topo: Topology) -> None:
    """tbf at rate/100 on every fabric link end. A direct cable runs at the slower of
    its two ends; behind the switch a node's port and its switch port share its rate."""
    rates = _rates(state_dir, topo)
    per_ns: dict[str | None, list[str]] = {}
    for n in topo.nodes:
        for p in n.fabric:
            if topo.switched:
                mbit = tbf_mbit(rates[(n.index, p.twin)])
                port = topo.switch_port(n, p.twin)
                per_ns.setdefault(topo.switch_netns, []).append(tbf_line(port, mbit))
            else:
                other = topo.peer(n)
                mbit = tbf_mbit(min(rates[(n.index, p.twin)], rates[(other.index, p.twin)]))
            per_ns.setdefault(n.netns, []).append(tbf_line(p.ifname, mbit))
    for ns, lines in per_ns.items():
        tc_batch(lines, netns=ns)


def _target(topo: Topology, node_spec: str, twin_spec: str | None) -> tuple[NodeSpec, list[int]]:
    try:
        return resolve_node(topo, node_spec), resolve_twins(twin_spec)
    except ValueError as exc:
        raise SimError(str(exc)) from exc


def link_down(state_dir: Path, topo: Topology, node_spec: str, twin: str | None) -> list[str]:
    node, twins = _target(topo, node_spec, twin)
    names = [FABRIC_TWINS[t][0] for t in twins]
    ip_batch([f"link set {name} down" for name in names], netns=node.netns)
    for name in names:
        record(state_dir, "link-down", node.name, name, None)
    return [f"{node.name} {name}: link down (cable pulled)" for name in names]


def cable_flapping(state_dir: Path, topo: Topology, node_spec: str, twin: str) -> list[str]:
    """From now on the twin's ``ethtool -S`` counts a link drop every 2 s and CRC and
    symbol errors with it (state.json ``counter_rise``, tools/links.py). The link itself
    stays up between reads: the flaps are too short for a link check to catch, only the
    counters tell (as on a real port: carrier comes back within a second)."""
    node, twins = _target(topo, node_spec, twin)
    state = nodes_mod.read_state(state_dir, node)
    rise = state.setdefault("counter_rise", {})
    assert isinstance(rise, dict)
    msgs = []
    for t in twins:
        name = FABRIC_TWINS[t][0]
        rise[name] = {"since": time.time(), "per_s": dict(FLAP_PER_S)}
        record(state_dir, "cable-flapping", node.name, name, None)
        msgs.append(f"{node.name} {name}: link flapping (link_down_events_phy, CRC errors rise)")
    nodes_mod.write_state(state_dir, node, state)
    return msgs


def link_rate(
    state_dir: Path, topo: Topology, node_spec: str, mbps: int, twin: str | None
) -> list[str]:
    if mbps <= 0:
        raise SimError(f"link-rate {mbps}: give the rate in Mb/s, e.g. 100000 for 100G")
    node, twins = _target(topo, node_spec, twin)
    # A link has one rate: on a direct cable both ends negotiate it and both report it
    # (ibstat, ethtool); behind the switch the node's cable to its switch port is its own.
    ends = [node] if topo.switched else [node, topo.peer(node)]
    gbps = mbps / 1000
    msgs = []
    for end in ends:
        state = nodes_mod.read_state(state_dir, end)
        ports = state["ports"]
        assert isinstance(ports, dict)
        for t in twins:
            ports[FABRIC_TWINS[t][1]]["rate_gbps"] = int(gbps) if gbps.is_integer() else gbps
        nodes_mod.write_state(state_dir, end, state)
    for t in twins:
        ifname = FABRIC_TWINS[t][0]
        record(state_dir, "link-rate", node.name, ifname, mbps, active=mbps != HEALTHY_RATE_MBPS)
        where = " and ".join(f"{end.name} {ifname}" for end in ends)
        msgs.append(f"{where}: rate {mbps} Mb/s (shaped to {tbf_mbit(mbps)} Mbit/s)")
    apply_shaping(state_dir, topo)
    return msgs


def mtu(state_dir: Path, topo: Topology, node_spec: str, value: int, twin: str | None) -> list[str]:
    if not 68 <= value <= 65535:
        raise SimError(f"mtu {value}: expected 68..65535 (healthy fabric is {HEALTHY_MTU})")
    node, twins = _target(topo, node_spec, twin)
    names = [FABRIC_TWINS[t][0] for t in twins]
    ip_batch([f"link set {name} mtu {value}" for name in names], netns=node.netns)
    for name in names:
        record(state_dir, "mtu", node.name, name, value, active=value != HEALTHY_MTU)
    return [f"{node.name} {name}: mtu {value}" for name in names]


def clear(state_dir: Path, topo: Topology) -> list[str]:
    """All fabric links up at MTU 9000 and 200 Gb/s, unplugged ports as built, no faults."""
    for n in topo.nodes:
        state = nodes_mod.initial_state(n)
        nodes_mod.write_state(state_dir, n, state)
        lines = [f"link set {ifname} mtu {HEALTHY_MTU} up" for ifname, _, _ in FABRIC_TWINS]
        lines += [f"link set {ifname} mtu {UNPLUGGED_MTU} up" for ifname, _ in UNPLUGGED]
        ip_batch(lines, netns=n.netns)
    if topo.switched:
        ip_batch(
            [
                f"link set {topo.switch_port(n, t)} mtu {HEALTHY_MTU} up"
                for n in topo.nodes
                for t in range(len(FABRIC_TWINS))
            ],
            netns=topo.switch_netns,
        )
    apply_shaping(state_dir, topo)
    count = len(load_faults(state_dir))
    save_faults(state_dir, [])
    return [
        f"cleared {count} fault(s): fabric healthy (up, mtu {HEALTHY_MTU}, "
        f"{HEALTHY_RATE_MBPS} Mb/s)"
    ]


# ------------------------------------------------------------ the switch (--topology switch)


def switch_mtu(
    state_dir: Path, topo: Topology, node_spec: str, value: int, twin: str | None
) -> list[str]:
    """The MTU of the switch port a node is cabled to (the node's own port keeps its MTU,
    so `ip link` on every node looks healthy): full-size frames to and from that node
    are dropped at the switch, small ones pass, as with a switch port left at 1500."""
    if not topo.switched:
        raise SimError(
            "switch-mtu: this sim has no switch (direct cables); start it with "
            "`spark-sim up --topology switch`"
        )
    if not 68 <= value <= 65535:
        raise SimError(f"switch-mtu {value}: expected 68..65535 (healthy fabric is {HEALTHY_MTU})")
    node, twins = _target(topo, node_spec, twin)
    ports = [topo.switch_port(node, t) for t in twins]
    ip_batch([f"link set {port} mtu {value}" for port in ports], netns=topo.switch_netns)
    names = [FABRIC_TWINS[t][0] for t in twins]
    for name in names:
        record(state_dir, "switch-mtu", node.name, name, value, active=value != HEALTHY_MTU)
    return [f"{node.name} {name}: its switch port's mtu {value}" for name in names]
