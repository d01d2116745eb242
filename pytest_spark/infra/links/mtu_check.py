"""MTU checks: each twin's netdev MTU on one node, and the same MTU on every end of a twin.
Parsed link facts + thresholds -> :class:`Finding`. No I/O, no pytest.

Both read configuration that is meaningful on a down port and always run.
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_spark.infra.finding import Finding
from pytest_spark.infra.links.probe import PortFacts

__all__ = ["check_mtu", "check_mtu_consistent"]


def check_mtu(node: str, port: PortFacts, min_mtu: int = 4200, hard_min_mtu: int = 1500) -> Finding:
    """netdev MTU >= ``min_mtu`` passes; in [``hard_min_mtu``, ``min_mtu``) warns (RoCE
    active_mtu drops from 4096 to 1024, ~5 % all-reduce bandwidth); below fails."""
    if hard_min_mtu > min_mtu:
        raise ValueError(f"hard_min_mtu {hard_min_mtu} is above min_mtu {min_mtu}")
    where, ifname = f"{node} {port.netdev}", port.netdev
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
