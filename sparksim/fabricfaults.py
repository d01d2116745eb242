"""Fabric faults that NCCL's finer checks catch (GID index, small-message latency):

- ``gid-v1 NODE [--empty]``: on NODE's fabric twins the RoCE v2 GID of the fabric address
  is typed ``IB/RoCE v1`` in ``/sys/class/infiniband/DEV/ports/1/gid_attrs/types/3`` (a
  port in RoCE v1 mode), so the index NCCL auto-selects resolves to RoCE v1; ``--empty``
  removes the address's GIDs instead (rdmasysfs.py);
- ``link-delay NODE --ms N``: every packet NODE sends on its fabric twins waits N ms (tc
  netem as the root qdisc, keeping the healthy shaping rate), as a congested switch port or
  a long path does: bandwidth holds, each small message pays the delay. It needs the
  kernel's sch_netem; without it the fault is refused, saying so.

``clear`` writes every node's healthy GID tables; faults.clear puts the tbf shaping back.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import hostfaults, rdmasysfs
from . import node as nodes_mod
from .faults import _rates
from .netns import SimError, tc_batch
from .topology import Topology, tbf_mbit

KINDS = ("gid-v1", "link-delay")


def add_parsers(kinds: Any, common: argparse.ArgumentParser, node_help: str) -> None:
    k = kinds.add_parser(
        "gid-v1",
        parents=[common],
        help="a node's fabric GIDs: the RoCE v2 entry of its address reads RoCE v1",
    )
    k.add_argument("node", metavar="NODE", help=node_help)
    k.add_argument(
        "--empty", action="store_true", help="remove the address's GIDs instead (no IPv4 GID)"
    )
    k = kinds.add_parser(
        "link-delay", parents=[common], help="delay every packet a node sends on the fabric"
    )
    k.add_argument("node", metavar="NODE", help=node_help)
    k.add_argument("--ms", type=float, required=True, help="delay in milliseconds")


def apply(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    node = hostfaults._node(topo, args.node)
    nd = nodes_mod.node_dir(state_dir, node)
    if args.kind == "gid-v1":
        mode = "empty" if args.empty else "v1"
        rdmasysfs.write(nd, node, mode)
        hostfaults._record(state_dir, "gid-v1", node, "-", mode)
        what = "no IPv4 GID" if args.empty else "its address's RoCE v2 GID typed IB/RoCE v1"
        return [f"{node.name} {p.dev}: {what}" for p in node.fabric]
    if args.kind == "link-delay":
        if not 0 < args.ms <= 10_000:
            raise SimError(f"link-delay --ms {args.ms:g}: expected 0 < ms <= 10000")
        if topo.switched:
            raise SimError("link-delay: direct-cable clusters only (no switch ports shaped)")
        rates = _rates(state_dir, topo)
        peer = topo.peer(node)
        lines = []
        for p in node.fabric:
            mbit = tbf_mbit(min(rates[(node.index, p.twin)], rates[(peer.index, p.twin)]))
            lines.append(
                f"qdisc replace dev {p.ifname} root netem delay {args.ms:g}ms "
                f"rate {mbit}mbit limit 100000"
            )
        try:
            tc_batch(lines, netns=node.netns)
        except SimError as exc:
            if "qdisc kind is unknown" in str(exc):
                raise SimError(
                    "link-delay needs the kernel's netem qdisc (sch_netem), which this "
                    f"kernel does not have: {str(exc).splitlines()[0]}"
                ) from exc
            raise
        hostfaults._record(state_dir, "link-delay", node, "-", args.ms)
        return [f"{node.name} {p.ifname}: every packet delayed {args.ms:g} ms" for p in node.fabric]
    raise SimError(f"unknown fault {args.kind!r}")


def clear(state_dir: Path, topo: Topology) -> list[str]:
    """Healthy GID tables on every node (faults.clear restores the tbf shaping)."""
    for n in topo.nodes:
        rdmasysfs.write(nodes_mod.node_dir(state_dir, n), n)
    return []
