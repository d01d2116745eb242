"""Ping checks: one DF ping at full MTU to a peer (an MTU problem told from no
reachability), and every pair of a twin's ping matrix in one verdict. Parsed ping results
-> :class:`Finding`. No I/O, no pytest.

A port whose link is down makes its ping fail too: ``check_ping`` is in
:data:`~pytest_spark.infra.links.check.DEPENDS_ON_LINK_UP`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Literal

from pytest_spark.infra.finding import Finding
from pytest_spark.infra.links.parse import PingResult
from pytest_spark.infra.links.probe import PortFacts

__all__ = [
    "PingCause",
    "check_ping",
    "check_ping_pairs",
    "ping_cause",
    "ping_fix",
    "ping_pairs_culprit",
]


# ---------------------------------------------------------------------------------- ping

PingCause = Literal["ok", "local-mtu", "path-mtu", "peer-mtu", "unreachable", "either", "loss"]
"""What a full-MTU DF ping's answer says: every reply (``ok``); ping's own 'message too
long' (``local-mtu``); 'Frag needed and DF set' from a hop (``path-mtu``); no reply while
small pings pass (``peer-mtu``); no reply and a reachability error, or small pings fail
too (``unreachable``); no reply and nothing to tell those apart (``either``); some replies
lost (``loss``)."""


def _unreachable_errors(r: PingResult) -> list[str]:
    return [e for e in r.errors if e != "Frag needed"]


def ping_cause(r: PingResult, small_ping: PingResult | None = None) -> PingCause:
    """The verdict on one DF ping at full MTU (see :data:`PingCause`); ``small_ping`` is a
    default-size ping of the same peer, which tells an MTU problem from no reachability
    when the big ping just gets no answer."""
    if r.transmitted > 0 and r.received == r.transmitted:
        return "ok"
    if "message too long" in r.errors:
        return "local-mtu"
    if "Frag needed" in r.errors:
        return "path-mtu"
    if r.received > 0:
        return "loss"
    unreachable = _unreachable_errors(r)
    if small_ping is not None and small_ping.received > 0 and not unreachable:
        return "peer-mtu"
    if unreachable or small_ping is not None:
        return "unreachable"
    return "either"


def ping_fix(
    cause: PingCause,
    r: PingResult,
    node: str,
    ifname: str,
    peer_node: str,
    peer_addr: str | ipaddress.IPv4Address,
    mtu: int,
) -> str:
    """The words after "expected all replies." for a ping that failed with ``cause``."""
    if cause == "local-mtu":
        local = f" ({r.error_mtu})" if r.error_mtu else ""
        return (
            f"MTU problem: ping says 'message too long', the local MTU of {ifname}{local} "
            f"is below {mtu}; set `sudo ip link set {ifname} mtu {mtu}` on {node} and "
            f"persist it."
        )
    if cause == "path-mtu":
        hop = f" ({r.error_mtu})" if r.error_mtu else ""
        return (
            f"MTU problem: 'Frag needed and DF set', a hop between {node} and {peer_node} "
            f"has a smaller MTU{hop}; raise the switch port or {peer_node}'s MTU to {mtu}."
        )
    if cause == "peer-mtu":
        return (
            f"MTU problem: small pings reach {peer_node} but full-size frames do not, so "
            f"{peer_node}'s MTU (or a switch port's) is below {mtu}; compare `ip link show` "
            f"on both ends and set the same MTU."
        )
    if cause == "unreachable":
        unreachable = _unreachable_errors(r)
        why = ", ".join(unreachable) if unreachable else "small pings fail too"
        return (
            f"No reachability ({why}), not an MTU problem: check the link is up on both "
            f"ends, that both addresses are in one subnet and that {peer_addr} is "
            f"{peer_node}'s address on this twin."
        )
    if cause == "either":
        return (
            f"Either {peer_node} is unreachable on this twin or frames of {mtu} bytes are "
            f"dropped (peer MTU smaller); a default-size ping tells them apart. Check link "
            f"state and the MTU on both ends."
        )
    return (
        f"Intermittent loss on a direct link points to a marginal cable or transceiver; "
        f"check `ethtool -S {ifname}` for symbol/FEC errors and reseat the cable."
    )


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
    r = ping_result
    head = (
        f"{node} {ifname}: DF ping of {peer_node} {peer_addr} at MTU {mtu} "
        f"({mtu - 28}-byte payload): {r.received}/{r.transmitted} replies"
    )
    cause = ping_cause(r, small_ping)
    if cause == "ok":
        avg = f", rtt avg {r.rtt_avg_ms} ms" if r.rtt_avg_ms is not None else ""
        return Finding.passed(r.loss_pct, 0.0, "%", node=node, message=head + avg)
    evidence = {
        "ping": (
            f"{r.transmitted} transmitted, {r.received} received, "
            f"{r.loss_pct:g}% loss; errors: {', '.join(r.errors) or 'none'}"
        )
    }
    fix = ping_fix(cause, r, node, ifname, peer_node, peer_addr, mtu)
    if cause == "loss":
        message = f"{head} ({r.loss_pct:g}% loss), expected all replies. {fix}"
        return Finding.warned(r.loss_pct, 0.0, "%", node=node, message=message, evidence=evidence)
    message = f"{head}, expected all replies. {fix}"
    return Finding.failed(r.loss_pct, 0.0, "%", node=node, message=message, evidence=evidence)


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
    where = f"{node} {ifname}"
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
