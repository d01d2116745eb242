"""Subnet checks: every node's address on a twin in one subnet, and each twin of one node
in its own subnet. Parsed addresses -> :class:`Finding`. No I/O, no pytest.

Both read configuration that is meaningful on a down port and always run.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Mapping, Sequence

from pytest_spark.infra.finding import Finding

__all__ = [
    "check_same_subnet",
    "check_twin_subnets_distinct",
    "majority_subnet",
    "shared_address",
]


def majority_subnet(
    addresses_by_node: Mapping[str, Sequence[ipaddress.IPv4Interface]],
) -> tuple[ipaddress.IPv4Network | None, int]:
    """The subnet more nodes have an address in than any other, and how many nodes:
    ``(None, 0)`` when no node has an address or two subnets tie (no majority)."""
    counts: Counter[ipaddress.IPv4Network] = Counter()
    for addrs in addresses_by_node.values():
        counts.update({a.network for a in addrs})
    ranked = counts.most_common()
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return None, 0
    return ranked[0]


def shared_address(
    addresses_by_node: Mapping[str, Sequence[ipaddress.IPv4Interface]],
    net: ipaddress.IPv4Network,
) -> tuple[ipaddress.IPv4Address, list[str]] | None:
    """The first address in ``net`` that two or more nodes hold, with those nodes; None
    when every node's address is its own."""
    owners: dict[ipaddress.IPv4Address, list[str]] = {}
    for node, addrs in addresses_by_node.items():
        for a in addrs:
            if a.network == net:
                owners.setdefault(a.ip, []).append(node)
    return next(((ip, ns) for ip, ns in owners.items() if len(ns) > 1), None)


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
    nodes = list(addresses_by_node)
    best, count = majority_subnet(addresses_by_node)
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
    if best is not None and count == len(nodes):
        dup = shared_address(addresses_by_node, best)
        if dup:
            ip, ns = dup
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
    if best is not None:
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
