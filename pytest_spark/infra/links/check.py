"""Link-state checks: parsed link facts + thresholds -> :class:`Finding`. No I/O, no pytest.

Every failure message names the node and interface, what was measured, what was
expected and what usually fixes it (STYLE.md).

Dependencies: a port whose link is down makes its RoCE state, rate and ping fail too.
:data:`DEPENDS_ON_LINK_UP` names those checks; the suite asks :func:`link_is_usable`
first and skips them with the root cause instead of reporting four failures for one
unplugged cable. MTU, MTU consistency, subnet and twin-count checks read configuration
that is meaningful on a down port and always run.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Mapping, Sequence

from pytest_spark.infra.finding import Finding
from pytest_spark.infra.links.parse import CaInfo, PingResult, RoceMapping
from pytest_spark.infra.links.probe import PortFacts

__all__ = [
    "DEPENDS_ON_LINK_UP",
    "check_fabric_twins",
    "check_link_rate",
    "check_link_up",
    "check_mtu",
    "check_mtu_consistent",
    "check_ping",
    "check_ping_pairs",
    "check_roce_active",
    "check_same_subnet",
    "check_twin_subnets_distinct",
    "fabric_twin_missing",
    "link_is_usable",
    "link_rate_ends",
    "link_rate_short",
    "ping_pairs_culprit",
    "twin_key",
]

DEPENDS_ON_LINK_UP: frozenset[str] = frozenset(
    {"check_roce_active", "check_link_rate", "check_ping"}
)
"""Checks that only make sense on a port whose link is up (see :func:`link_is_usable`)."""

"""netdev MTU minus the largest RoCE active_mtu it allows: 4096 needs an MTU >= 4200."""


def _num(value: float) -> str:
    return f"{value:g}"


def _where(node: str, ifname: str) -> str:
    return f"{node} {ifname}"


# ------------------------------------------------------------------------------- link up


def check_link_up(node: str, port: PortFacts) -> Finding:
    """The netdev exists, is admin up, has carrier (LOWER_UP) and operstate UP.

    Admin-down (fix: ``ip link set IF up``) is told apart from NO-CARRIER (fix: cable,
    transceiver or the peer's port).
    """
    where, ifname = _where(node, port.netdev), port.netdev
    evidence = {
        "ip link": f"flags {','.join(port.flags) or '?'}; operstate "
        f"{port.operstate or '?'}; mtu {port.mtu}"
    }
    if port.ethtool_link_detected is not None:
        evidence["ethtool"] = f"Link detected: {'yes' if port.ethtool_link_detected else 'no'}"
    if port.exists is False or (port.exists is None and port.operstate is None):
        state = "absent from ip link" if port.exists is False else "unknown (ip link gave nothing)"
        return Finding.failed(
            "absent" if port.exists is False else "unknown",
            "UP",
            node=node,
            message=(
                f"{where}: interface {state}, expected UP with carrier. The netdev was "
                f"renamed (udev/netplan) or the mlx5_core driver did not load; compare "
                f"`ip link` with `ibdev2netdev` on {node}."
            ),
            evidence=evidence,
        )
    if port.admin_up is False:
        return Finding.failed(
            "admin-down",
            "UP",
            node=node,
            message=(
                f"{where}: link administratively down (flags "
                f"{','.join(port.flags) or 'none'}, operstate {port.operstate}), expected "
                f"UP with carrier. Bring it up with `sudo ip link set {ifname} up` and "
                f"make it persistent in the netplan config."
            ),
            evidence=evidence,
        )
    if port.no_carrier or port.lower_up is False or port.carrier is False:
        changes = (
            f" carrier_changes={port.carrier_changes}." if port.carrier_changes is not None else ""
        )
        return Finding.failed(
            "no-carrier",
            "UP",
            node=node,
            message=(
                f"{where}: no carrier (NO-CARRIER, operstate {port.operstate}), expected "
                f"UP with carrier (LOWER_UP). The port is up but sees no link partner: "
                f"reseat the QSFP cable/transceiver at both ends and check that the peer "
                f"node's port is up; `ethtool {ifname}` should say Link detected: yes."
                f"{changes}"
            ),
            evidence=evidence,
        )
    if port.operstate != "UP":
        return Finding.failed(
            port.operstate,
            "UP",
            node=node,
            message=(
                f"{where}: operstate {port.operstate}, expected UP (carrier present). "
                f"A lower layer or the driver holds it down; check "
                f"`ip -d link show {ifname}` and `dmesg | grep mlx5` on {node}."
            ),
            evidence=evidence,
        )
    return Finding.passed(
        "UP", "UP", node=node, message=f"{where}: link up (operstate UP, LOWER_UP)"
    )


def link_is_usable(port: PortFacts, node: str | None = None) -> tuple[bool, str]:
    """``(True, "")`` when the port's link is up; otherwise ``(False, reason)`` where the
    reason names the root cause, for skipping the checks in :data:`DEPENDS_ON_LINK_UP`."""
    finding = check_link_up(node or "node", port)
    if finding.ok:
        return True, ""
    first = finding.message.split(". ", 1)[0]
    return False, f"link not usable: {first} (see the link-up check)"


def link_rate_short(port: PortFacts, node: str, min_gbps: float) -> str | None:
    """The link-rate check's words for an up port whose known rate is below ``min_gbps``
    (``spark-worker-1 enP2p1s0f1np1: link rate 100 Gb/s from ibstat ... (see the
    link-rate check)``), for a check that skips citing it; None when the rate is fine, not
    known, or the link is down (the link-up check's)."""
    if not link_is_usable(port, node)[0]:
        return None
    if port.rate_gbps is None and port.ethtool_speed_mbps is None:
        return None
    finding = check_link_rate(node, port, min_gbps)
    if finding.ok:
        return None
    return f"{finding.message.split(', expected', 1)[0]} (see the link-rate check)"


# --------------------------------------------------------------------------- RoCE state


def check_roce_active(node: str, port: PortFacts) -> Finding:
    """The RoCE port is ``Active``/``LinkUp`` (ibstat or rdma link) and, where
    ibv_devinfo answered, ``PORT_ACTIVE``. Depends on link up."""
    where = _where(node, port.netdev)
    dev = f"{port.dev}/{port.ib_port or 1}" if port.dev else "(no RDMA device)"
    evidence = {
        "state": f"{port.ib_state}/{port.phys_state} (from {port.state_source}); "
        f"ibv_devinfo {port.ibv_state}"
    }
    measured = f"{port.ib_state}/{port.phys_state}"
    if port.ib_state is None and port.ibv_state is None:
        return Finding.failed(
            "unknown",
            "Active/LinkUp",
            node=node,
            message=(
                f"{where}: RoCE port state unknown (ibstat, rdma link and ibv_devinfo "
                f"said nothing about {dev}), expected Active/LinkUp. Install "
                f"infiniband-diags and rdma-core on {node}, and check that "
                f"`ibdev2netdev` maps an RDMA device to {port.netdev}."
            ),
            evidence=evidence,
        )
    ib_ok = port.ib_state in (None, "Active") and port.phys_state in (None, "LinkUp")
    ibv_ok = port.ibv_state in (None, "PORT_ACTIVE")
    if ib_ok and ibv_ok:
        return Finding.passed(
            "Active/LinkUp",
            "Active/LinkUp",
            node=node,
            message=f"{where}: RoCE {dev} Active/LinkUp",
        )
    if port.phys_state == "Polling":
        hint = (
            "Polling means the port is trying to train and hears no partner: reseat or "
            "replace the cable and check the peer's port; a cable or FEC setting the "
            "other end does not support also keeps it polling"
        )
    elif port.phys_state == "Disabled":
        hint = (
            f"the port is disabled, which follows the netdev being down: bring "
            f"{port.netdev} up (`sudo ip link set {port.netdev} up`) and check the cable"
        )
    elif ib_ok and not ibv_ok:
        measured = f"{port.ib_state}/{port.phys_state}, {port.ibv_state}"
        hint = (
            "ibstat and ibv_devinfo disagree: the verbs layer has not caught up; reload "
            "the driver (`sudo modprobe -r mlx5_ib && sudo modprobe mlx5_ib`) or reboot"
        )
    else:
        hint = (
            f"check `ibstat {port.dev}` and `dmesg | grep mlx5` on {node}; a port stuck "
            "in Init/Armed usually recovers after `ip link set` down/up"
        )
    return Finding.failed(
        measured,
        "Active/LinkUp",
        node=node,
        message=(
            f"{where}: RoCE {dev} State {port.ib_state}, Physical state "
            f"{port.phys_state}, expected Active/LinkUp. Likely cause: {hint}."
        ),
        evidence=evidence,
    )


# ----------------------------------------------------------------------------- link rate


def check_link_rate(node: str, port: PortFacts, min_gbps: float = 200.0) -> Finding:
    """ibstat ``Rate`` >= ``min_gbps``. Depends on link up.

    ibstat's rate is authoritative: a virtual link may report a fixed ethtool speed
    (a veth says 10000Mb/s). ethtool's speed is quoted as supporting evidence when it
    reports a real value, and only decides when ibstat gave no rate at all.
    """
    where = _where(node, port.netdev)
    speed = port.ethtool_speed_mbps
    evidence: dict[str, str] = {}
    if port.rate_gbps is not None:
        evidence["ibstat"] = f"Rate: {_num(port.rate_gbps)}"
    if speed is not None:
        evidence["ethtool"] = f"Speed: {speed}Mb/s"
    if port.rate_gbps is not None:
        rate, source = port.rate_gbps, "ibstat"
    elif speed is not None:
        rate, source = speed / 1000, "ethtool (ibstat gave no rate)"
    else:
        return Finding.failed(
            None,
            min_gbps,
            "Gb/s",
            bound=">=",
            node=node,
            message=(
                f"{where}: link rate unknown (no ibstat Rate, ethtool Speed: Unknown!), "
                f"expected >= {_num(min_gbps)} Gb/s. Install infiniband-diags (ibstat) "
                f"on {node} and check that the link is up."
            ),
            evidence=evidence,
        )
    support = ""
    if speed is not None and source == "ibstat":
        support = f" (ethtool: {speed}Mb/s)"
    if rate >= min_gbps:
        return Finding.passed(
            rate,
            min_gbps,
            "Gb/s",
            bound=">=",
            node=node,
            message=(
                f"{where}: link rate {_num(rate)} Gb/s from {source}"
                f"{support}, expected >= {_num(min_gbps)} Gb/s"
            ),
        )
    return Finding.failed(
        rate,
        min_gbps,
        "Gb/s",
        bound=">=",
        node=node,
        message=(
            f"{where}: link rate {_num(rate)} Gb/s from {source}{support}, expected >= "
            f"{_num(min_gbps)} Gb/s. Likely a cable rated for {_num(rate)}G or a switch "
            f"port forced to {_num(rate)}G; check ibstat and ethtool, reseat or replace "
            f"the cable."
        ),
        evidence=evidence,
    )


def link_rate_ends(
    low: Sequence[tuple[str, str, float]], node: str, ifname: str, *, direct: bool
) -> tuple[tuple[str, str], list[tuple[str, str]]]:
    """Which link-rate check reports the slow link ``node`` ``ifname`` is an end of, and
    every end it covers: ``(owner, ends)``, each an ``(node, ifname)``.

    ``low`` is every (node, ifname, rate) below the floor, in the suite's order (nodes as
    the cluster lists them, twins as discovered). The two twins of one QSFP port share its
    rate, and on a direct cable (``direct``: two nodes, no switch) both nodes' ends of it
    report the same rate: a link has one rate, so the first of them has the one failure
    naming every end, and the others skip citing it."""
    rate = next((r for n, i, r in low if (n, i) == (node, ifname)), None)
    ends = [
        (n, i)
        for n, i, r in low
        if r == rate and twin_key(i) == twin_key(ifname) and (direct or n == node)
    ]
    if not ends:
        return (node, ifname), [(node, ifname)]
    return ends[0], ends


# ----------------------------------------------------------------------------------- MTU


def check_mtu(node: str, port: PortFacts, min_mtu: int = 4200, hard_min_mtu: int = 1500) -> Finding:
    """netdev MTU >= ``min_mtu`` passes; in [``hard_min_mtu``, ``min_mtu``) warns (RoCE
    active_mtu drops from 4096 to 1024, ~5 % all-reduce bandwidth); below fails."""
    if hard_min_mtu > min_mtu:
        raise ValueError(f"hard_min_mtu {hard_min_mtu} is above min_mtu {min_mtu}")
    where, ifname = _where(node, port.netdev), port.netdev
    active = f" (RoCE active_mtu {port.active_mtu})" if port.active_mtu is not None else ""
    evidence = {"ip link": f"mtu {port.mtu}"}
    if port.active_mtu is not None:
        evidence["ibv_devinfo"] = f"active_mtu: {port.active_mtu}"
    fix = (
        f"set MTU 9000 on this twin on every node (`sudo ip link set {ifname} mtu 9000`) "
        f"and persist it in netplan"
    )
    if port.mtu is None:
        return Finding.failed(
            None,
            min_mtu,
            "bytes",
            bound=">=",
            node=node,
            message=(
                f"{where}: MTU unknown (not in ip link), expected >= {min_mtu}. Check that "
                f"the interface exists on {node} (`ip link show {ifname}`)."
            ),
            evidence=evidence,
        )
    if port.mtu >= min_mtu:
        return Finding.passed(
            port.mtu,
            min_mtu,
            "bytes",
            bound=">=",
            node=node,
            message=f"{where}: MTU {port.mtu}{active}, expected >= {min_mtu}",
        )
    if port.mtu >= hard_min_mtu:
        return Finding.warned(
            port.mtu,
            min_mtu,
            "bytes",
            bound=">=",
            node=node,
            message=(
                f"{where}: MTU {port.mtu}{active}, expected >= {min_mtu} for RoCE "
                f"active_mtu 4096. RoCE falls back to 1024-byte frames and all-reduce "
                f"loses ~5% bandwidth; {fix}."
            ),
            evidence=evidence,
        )
    return Finding.failed(
        port.mtu,
        min_mtu,
        "bytes",
        bound=">=",
        node=node,
        message=(
            f"{where}: MTU {port.mtu}{active}, expected >= {min_mtu} and never below "
            f"{hard_min_mtu}. Frames a normal Ethernet peer sends are dropped; {fix}."
        ),
        evidence=evidence,
    )


def check_mtu_consistent(ports_by_node: Mapping[str, PortFacts]) -> Finding:
    """Every end of one twin has the same MTU. A mismatch makes the larger end send frames
    the smaller end drops (a full-MTU DF ping fails, NCCL stalls or crawls)."""
    if not ports_by_node:
        raise ValueError("check_mtu_consistent needs at least one node")
    names = sorted({p.netdev for p in ports_by_node.values()})
    twin = names[0] if len(names) == 1 else "/".join(names)
    mtus = {node: port.mtu for node, port in ports_by_node.items()}
    listing = ", ".join(
        f"{node} {mtu if mtu is not None else 'unknown'}" for node, mtu in mtus.items()
    )
    unknown = [node for node, mtu in mtus.items() if mtu is None]
    known = [mtu for mtu in mtus.values() if mtu is not None]
    target = max(known) if known else None
    if unknown:
        return Finding.failed(
            dict(mtus),
            target,
            "bytes",
            message=(
                f"{twin}: MTU per node {listing}; expected the same MTU on every node. "
                f"{', '.join(unknown)} reported no MTU for {twin}: check that the "
                f"interface exists there (`ip link`)."
            ),
            evidence={"mtu": listing},
        )
    if len(set(known)) == 1:
        return Finding.passed(
            dict(mtus), target, "bytes", message=f"{twin}: MTU {target} on every node ({listing})"
        )
    low = [node for node, mtu in mtus.items() if mtu != target]
    return Finding.failed(
        dict(mtus),
        target,
        "bytes",
        message=(
            f"{twin}: MTU differs between nodes: {listing}; expected the same MTU on "
            f"every node ({target}). Frames larger than the smallest MTU are dropped by "
            f"the receiving end; set MTU {target} on {', '.join(low)} "
            f"(`sudo ip link set {twin} mtu {target}`, persist in netplan)."
        ),
        evidence={"mtu": listing},
    )


# ------------------------------------------------------------------------------- subnets


def check_same_subnet(
    addresses_by_node: Mapping[str, Sequence[ipaddress.IPv4Interface]], twin: str = "fabric twin"
) -> Finding:
    """Each node has an IPv4 address on this twin and all of them share one subnet (and no
    two nodes share an address). The failure names the node whose address is off; with
    no majority (two nodes, two subnets) it names every node's address."""
    if not addresses_by_node:
        raise ValueError("check_same_subnet needs at least one node")

    def show(node: str) -> str:
        addrs = addresses_by_node[node]
        return f"{node} {', '.join(str(a) for a in addrs) if addrs else 'no IPv4 address'}"

    listing = "; ".join(show(n) for n in addresses_by_node)
    measured = {n: [str(a) for a in addrs] for n, addrs in addresses_by_node.items()}
    counts: Counter[ipaddress.IPv4Network] = Counter()
    for addrs in addresses_by_node.values():
        counts.update({a.network for a in addrs})
    nodes = list(addresses_by_node)
    ranked = counts.most_common()
    best = ranked[0][0] if ranked else None
    majority = bool(ranked) and (len(ranked) == 1 or ranked[0][1] > ranked[1][1])
    bare = [n for n in nodes if not addresses_by_node[n]]
    if bare and len(bare) == len(nodes):
        return Finding.failed(
            measured,
            "one subnet",
            message=(
                f"{twin}: no node has an IPv4 address ({listing}), expected one per node "
                f"in one subnet. Assign the fabric addresses in netplan "
                f"(e.g. 192.168.200.N/24 on every node) and apply it."
            ),
            evidence={"addresses": listing},
        )
    if best is not None and majority and counts[best] == len(nodes):
        owners: dict[ipaddress.IPv4Address, list[str]] = {}
        for node, addrs in addresses_by_node.items():
            for a in addrs:
                if a.network == best:
                    owners.setdefault(a.ip, []).append(node)
        dup = {ip: ns for ip, ns in owners.items() if len(ns) > 1}
        if dup:
            ip, ns = next(iter(dup.items()))
            return Finding.failed(
                measured,
                "one subnet, distinct addresses",
                message=(
                    f"{twin}: address {ip} is on {' and '.join(ns)} ({listing}), expected "
                    f"a distinct address per node in {best}. Duplicate addresses break "
                    f"ARP and NCCL bootstrap; give each node its own address in netplan."
                ),
                evidence={"addresses": listing},
            )
        return Finding.passed(
            measured, str(best), message=f"{twin}: all nodes in {best} ({listing})"
        )
    if best is not None and majority:
        off = [n for n in nodes if best not in {a.network for a in addresses_by_node[n]}]
        good = [n for n in nodes if n not in off]
        return Finding.failed(
            measured,
            str(best),
            node=off[0] if len(off) == 1 else None,
            message=(
                f"{'; '.join(show(n) for n in off)}: {twin} address outside the subnet "
                f"{best} of {', '.join(good)}; expected an address in {best}. Fix the "
                f"address on {', '.join(off)} in netplan (or `ip addr` for a quick test)."
            ),
            evidence={"addresses": listing},
        )
    return Finding.failed(
        measured,
        "one subnet",
        message=(
            f"{twin}: nodes are in different subnets ({listing}), expected one subnet "
            f"for every node. Put both ends of the twin in one subnet (same prefix, "
            f"e.g. 192.168.200.0/24) on the node whose address is off."
        ),
        evidence={"addresses": listing},
    )


def check_twin_subnets_distinct(
    node: str, addresses_by_if: Mapping[str, Sequence[ipaddress.IPv4Interface]]
) -> Finding:
    """On one node, each fabric twin has its own subnet (autodiscover.sh refuses two Up
    RoCE interfaces sharing one: the kernel then routes both twins' traffic through one
    of them)."""
    seen: dict[ipaddress.IPv4Network, list[str]] = {}
    for ifname, addrs in addresses_by_if.items():
        for net in dict.fromkeys(a.network for a in addrs):
            seen.setdefault(net, []).append(ifname)
    listing = "; ".join(
        f"{i} {', '.join(str(a) for a in addrs) or 'no IPv4'}"
        for i, addrs in addresses_by_if.items()
    )
    shared = {net: ifs for net, ifs in seen.items() if len(ifs) > 1}
    measured = {i: [str(a) for a in addrs] for i, addrs in addresses_by_if.items()}
    if not shared:
        return Finding.passed(
            measured,
            "one subnet per twin",
            node=node,
            message=f"{node}: fabric twins in distinct subnets ({listing})",
        )
    net, ifs = next(iter(shared.items()))
    return Finding.failed(
        measured,
        "one subnet per twin",
        node=node,
        message=(
            f"{node} {' and '.join(ifs)}: both in {net}, expected one subnet per twin. "
            f"The kernel sends traffic for {net} out of one interface only, so one twin "
            f"carries everything (~13.5 GB/s busbw); give each twin its own subnet "
            f"(e.g. 192.168.200.0/24 and 192.168.201.0/24)."
        ),
        evidence={"addresses": listing},
    )


# ---------------------------------------------------------------------------------- ping


def check_ping(
    node: str,
    port: PortFacts | str,
    peer_node: str,
    peer_addr: str | ipaddress.IPv4Address,
    ping_result: PingResult,
    mtu: int,
    *,
    small_ping: PingResult | None = None,
) -> Finding:
    """A don't-fragment ping filling ``mtu`` reached the peer. On loss, tells an MTU or
    fragmentation problem from no reachability (pass ``small_ping``, a default-size ping
    of the same peer, to tell them apart when the big ping just gets no answer).
    Depends on link up."""
    ifname = port.netdev if isinstance(port, PortFacts) else port
    where = _where(node, ifname)
    r = ping_result
    evidence = {
        "ping": (
            f"{r.transmitted} transmitted, {r.received} received, "
            f"{_num(r.loss_pct)}% loss; errors: {', '.join(r.errors) or 'none'}"
        )
    }
    head = (
        f"{where}: DF ping of {peer_node} {peer_addr} at MTU {mtu} "
        f"({mtu - 28}-byte payload): {r.received}/{r.transmitted} replies"
    )
    if r.transmitted > 0 and r.received == r.transmitted:
        avg = f", rtt avg {r.rtt_avg_ms} ms" if r.rtt_avg_ms is not None else ""
        return Finding.passed(r.loss_pct, 0.0, "%", node=node, message=head + avg)
    if "message too long" in r.errors:
        local = f" ({r.error_mtu})" if r.error_mtu else ""
        return Finding.failed(
            r.loss_pct,
            0.0,
            "%",
            node=node,
            message=(
                f"{head}, expected all replies. MTU problem: ping says 'message too "
                f"long', the local MTU of {ifname}{local} is below {mtu}; set "
                f"`sudo ip link set {ifname} mtu {mtu}` on {node} and persist it."
            ),
            evidence=evidence,
        )
    if "Frag needed" in r.errors:
        hop = f" ({r.error_mtu})" if r.error_mtu else ""
        return Finding.failed(
            r.loss_pct,
            0.0,
            "%",
            node=node,
            message=(
                f"{head}, expected all replies. MTU problem: 'Frag needed and DF set', a "
                f"hop between {node} and {peer_node} has a smaller MTU{hop}; raise the "
                f"switch port or {peer_node}'s MTU to {mtu}."
            ),
            evidence=evidence,
        )
    if r.received == 0:
        small_ok = small_ping is not None and small_ping.received > 0
        unreachable = [e for e in r.errors if e != "Frag needed"]
        if small_ok and not unreachable:
            return Finding.failed(
                r.loss_pct,
                0.0,
                "%",
                node=node,
                message=(
                    f"{head}, expected all replies. MTU problem: small pings reach "
                    f"{peer_node} but full-size frames do not, so {peer_node}'s MTU (or a "
                    f"switch port's) is below {mtu}; compare `ip link show` on both ends "
                    f"and set the same MTU."
                ),
                evidence=evidence,
            )
        if unreachable or small_ping is not None:
            why = ", ".join(unreachable) if unreachable else "small pings fail too"
            return Finding.failed(
                r.loss_pct,
                0.0,
                "%",
                node=node,
                message=(
                    f"{head}, expected all replies. No reachability ({why}), not an MTU "
                    f"problem: check the link is up on both ends, that both addresses "
                    f"are in one subnet and that {peer_addr} is {peer_node}'s address "
                    f"on this twin."
                ),
                evidence=evidence,
            )
        return Finding.failed(
            r.loss_pct,
            0.0,
            "%",
            node=node,
            message=(
                f"{head}, expected all replies. Either {peer_node} is unreachable on this "
                f"twin or frames of {mtu} bytes are dropped (peer MTU smaller); a "
                f"default-size ping tells them apart. Check link state and the MTU on "
                f"both ends."
            ),
            evidence=evidence,
        )
    return Finding.warned(
        r.loss_pct,
        0.0,
        "%",
        node=node,
        message=(
            f"{head} ({_num(r.loss_pct)}% loss), expected all replies. Intermittent loss "
            f"on a direct link points to a marginal cable or transceiver; check "
            f"`ethtool -S {ifname}` for symbol/FEC errors and reseat the cable."
        ),
        evidence=evidence,
    )


# ---------------------------------------------------------------------- every pair


def ping_pairs_culprit(failing: Sequence[tuple[str, str]]) -> str | None:
    """The one node in every failing pair of the ping matrix (sender, receiver), or None
    when no single node is: with two or more failing pairs all through one node, its
    port (or its switch port) is the cause and the others' pings only meet it."""
    pairs = {frozenset(p) for p in failing if p[0] != p[1]}
    if len(pairs) < 2:
        return None  # one pair (or none): its two ends are equally suspect
    common = frozenset.intersection(*pairs)
    return next(iter(common)) if len(common) == 1 else None


def check_ping_pairs(
    node: str, ifname: str, findings: Mapping[str, Finding], culprit: str | None = None
) -> Finding:
    """The node's DF pings at full MTU to every peer on one twin (a ping matrix: every
    pair, both ways), one verdict naming each pair that failed, with that pair's own
    finding. ``culprit`` (see :func:`ping_pairs_culprit`) is the node every failing pair
    goes through; when it is this node, the message says so. Depends on link up."""
    where = _where(node, ifname)
    failed = {peer: f for peer, f in findings.items() if not f.ok}
    warned = {peer: f for peer, f in findings.items() if f.ok and f.level == "warn"}
    total = len(findings)
    evidence = {f"{node} -> {peer}": f.message for peer, f in findings.items()}
    if failed:
        pairs = ", ".join(f"{node} <-> {peer}" for peer in failed)
        if culprit == node:
            first = next(iter(failed.values()))
            detail = (
                f" Every failing pair of this twin's ping matrix goes through {node} (the "
                f"other nodes' pings of each other pass), so {node}'s end is the cause: "
                f"its MTU or the switch port it is cabled to (a port left at 1500 drops "
                f"full-size frames both ways); compare `ip link show {ifname}` on {node} "
                f"with the others and check that switch port's MTU and state. First pair: "
                f"{first.message}"
            )
        else:
            detail = " " + " ".join(f.message for f in failed.values())
        return Finding.failed(
            len(failed),
            0,
            "pairs",
            node=node,
            message=(
                f"{where}: DF pings at full MTU failed on {len(failed)} of {total} pair(s) "
                f"({pairs}), expected every pair to answer.{detail}"
            ),
            evidence=evidence,
        )
    if warned:
        return Finding.warned(
            len(warned),
            0,
            "pairs",
            node=node,
            message=f"{where}: {len(warned)} of {total} pair(s) lost some replies: "
            + " ".join(f.message for f in warned.values()),
            evidence=evidence,
        )
    peers = ", ".join(findings)
    return Finding.passed(
        0,
        0,
        "pairs",
        node=node,
        message=f"{where}: DF pings at full MTU answered by every peer ({peers})",
    )


# --------------------------------------------------------------------------- fabric twins


_TWIN_PREFIX = re.compile(r"^(en|roce)P\d+p")


def twin_key(name: str) -> str:
    """The physical-port key two twins share: ``enP2p1s0f1np1`` and ``enp1s0f1np1`` both
    give ``enp1s0f1np1`` (the PCI-domain prefix ``P2`` dropped)."""
    return _TWIN_PREFIX.sub(lambda m: f"{m[1]}p", name)


def check_fabric_twins(
    node: str,
    discovered_ifs: Sequence[str],
    expected_count: int = 2,
    candidates: Sequence[RoceMapping] = (),
    missing_tools: Sequence[str] = (),
) -> Finding:
    """At least ``expected_count`` fabric twins are Up (``discover_fabric_ifs``). On
    failure lists the Down ones from ``candidates`` (the ibdev2netdev lines): the Down
    sibling of an Up twin first (same cable, so the netdev is down or unconfigured),
    otherwise every Down port (no cable or no peer). No twin found on a node without
    ``ibdev2netdev`` (``missing_tools``) says that, not "check cables"."""
    up = list(dict.fromkeys(discovered_ifs))
    if len(up) >= expected_count:
        return Finding.passed(
            len(up),
            expected_count,
            "twins",
            bound=">=",
            node=node,
            message=f"{node}: {len(up)} fabric twins Up ({', '.join(up)})",
        )
    if not up and not candidates and "ibdev2netdev" in missing_tools:
        rdma = " and `rdma link` is missing too" if "rdma_link" in missing_tools else ""
        return Finding.failed(
            0,
            expected_count,
            "twins",
            bound=">=",
            node=node,
            message=(
                f"{node}: no fabric twin found, expected {expected_count}: ibdev2netdev: "
                f"command not found{rdma} (nor an RDMA netdev Up in `rdma link`). The suite "
                "and launch-cluster.sh find the twins with it: install it on "
                f"{node} (the DOCA-host / MLNX_OFED package, or mlnx-tools), or name the "
                "twins with --spark-fabric-ifs"
            ),
            evidence={"missing tools": ", ".join(missing_tools)},
        )
    down = [m for m in candidates if not m.up and m.netdev not in up]
    up_keys = {twin_key(i) for i in up}
    siblings = [m for m in down if twin_key(m.netdev) in up_keys]
    evidence = {
        "ibdev2netdev": "; ".join(f"{m.dev} ==> {m.netdev} ({m.state})" for m in candidates)
    }
    up_text = ", ".join(up) if up else "none"
    if siblings:
        names = ", ".join(
            f"{m.netdev} (twin of {next(i for i in up if twin_key(i) == twin_key(m.netdev))})"
            for m in siblings
        )
        first = siblings[0].netdev
        fix = (
            "Both twins ride one QSFP cable and its sibling is Up, so the cable is seated: "
            f"check that {first} is administratively up (`sudo ip link set {first} up`) and "
            "configured in netplan; its link-up check names the exact cause. With one twin "
            "NCCL reaches only ~13.5 GB/s instead of ~22."
        )
    else:
        names = ", ".join(m.netdev for m in down) or "none listed by ibdev2netdev"
        if up:
            fix = (
                "The Down ports are on another QSFP port, which has no link partner: cable "
                "it to the peer, or expect fewer twins in the profile (link.fabric_twins)."
            )
        else:
            fix = (
                "No port has a link partner: check the QSFP cable is seated at both ends, "
                "the peer node is powered and its ports are up."
            )
    return Finding.failed(
        len(up),
        expected_count,
        "twins",
        bound=">=",
        node=node,
        message=(
            f"{node}: {len(up)} fabric twin(s) Up ({up_text}), expected {expected_count}."
            f" Down: {names}. {fix}"
        ),
        evidence=evidence,
    )


def fabric_twin_missing(
    twin: int, found: Sequence[str], expected: int, short: Sequence[str], *, verdict: bool
) -> tuple[bool, str]:
    """What a check of fabric twin ``twin`` says when only ``found`` twins were found on any
    node: ``(fail, text)``. ``short`` are the reachable nodes where fewer than ``expected``
    are Up: each one's ``test_fabric_twins_up`` has the cause (a missing ibdev2netdev, no
    cable), so with that check in the session (``verdict``) this skips citing it; the 16
    per-twin checks never repeat "check cables"."""
    where = f"fabric twin {twin}: only {len(found)} fabric interface(s) found on any node " + (
        f"({', '.join(found) or 'none'}), expected {expected}"
    )
    if short and verdict:
        cites = ", ".join(f"test_fabric_twins_up[{node}]" for node in short)
        return False, f"{where} ({cites} has the evidence)"
    return True, (
        f"{where}. ibdev2netdev shows no Up RoCE port for it: check cables and `ibdev2netdev` "
        "on every node, or name the interfaces with --spark-fabric-ifs"
    )


def peer_took_the_link_down(port: PortFacts, peers: Mapping[str, PortFacts]) -> str | None:
    """On a direct cable (two nodes), why this port sees no carrier: the peer whose end of
    the same twin is administratively down or absent (its link-up check is the root cause;
    this end is fine). None when this port's own state is the problem."""
    if port.admin_up is False or port.exists is False:
        return None
    if not (port.no_carrier or port.lower_up is False or port.carrier is False):
        return None
    for name, other in peers.items():
        if other.admin_up is False or other.exists is False:
            return name
    return None


def nic_firmware(ibstat: Mapping[str, CaInfo]) -> dict[str, str]:
    """ConnectX firmware per RDMA device, as ``ibstat`` prints it (``Firmware version``),
    for the report's environment; devices without one are left out."""
    return {ca: info.firmware for ca, info in sorted(ibstat.items()) if info.firmware}
