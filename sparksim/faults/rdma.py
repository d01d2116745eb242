"""A node whose RDMA drivers are not loaded (mlx5_ib / ib_core absent), its netdevs up:

- ``no-rdma NODE|all``: the node's ``/sys/class/infiniband`` is gone (the bind of its GID
  tables, rdmasysfs.py, unmounted and the directory removed from the node's /sys/class),
  and state.json's ``rdma`` is false, so the fake tools see no RDMA device, as the real
  ones do without the drivers: ``ibdev2netdev`` prints nothing and exits 255 (Mellanox's
  script: ``if [ ! -d /sys/class/infiniband ]; then exit -1``), ``ibstat`` and
  ``rdma link`` print nothing, ``ibv_devinfo`` says "No IB devices found" (exit 255) and
  ``ibv_devices`` lists its header alone. The fabric netdevs (enp1s0f1np1 ...) stay up
  with their addresses: mlx5_core, the Ethernet driver, is loaded. NCCL finds no HCA and
  falls back to TCP sockets. A node booted while the fault holds comes up without the
  tree too (node.py reads ``rdma`` from state.json).

``clear`` binds every node's tree back (link.clear rewrites state.json after it).
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
from pathlib import Path

from .. import node as nodes_mod
from .. import rdmasysfs
from ..netns import SimError
from ..topology import NodeSpec, Topology
from . import host
from .common import NODE_HELP, Kinds, load_faults, record, resolve

KINDS = ("no-rdma",)
SYSFS = f"/sys/class/{rdmasysfs.DIRNAME}"


def add_parsers(kinds: Kinds) -> None:
    k = kinds.add("no-rdma", "a node without RDMA drivers: no /sys/class/infiniband, netdevs up")
    k.add_argument("node", metavar="NODE|all", help=f"{NODE_HELP}, or 'all'")


def _targets(topo: Topology, spec: str) -> list[NodeSpec]:
    return list(topo.nodes) if spec == "all" else [resolve(topo, spec)]


def apply(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    if args.kind != "no-rdma":
        raise SimError(f"unknown fault {args.kind!r}")
    msgs = []
    for node in _targets(topo, args.node):
        _set_rdma(state_dir, node, False)
        host.in_node_mounts(
            state_dir, node, f"if [ -d {SYSFS} ]; then umount {SYSFS} && rmdir {SYSFS}; fi"
        )
        record(state_dir, "no-rdma", node.name, "-", None)
        msgs.append(
            f"{node.name}: RDMA drivers unloaded ({SYSFS} gone, no RDMA device); fabric netdevs up"
        )
    return msgs


def _set_rdma(state_dir: Path, node: NodeSpec, loaded: bool) -> None:
    state = nodes_mod.read_state(state_dir, node)
    state["rdma"] = loaded
    nodes_mod.write_state(state_dir, node, state)


def clear(state_dir: Path, topo: Topology) -> list[str]:
    """Load the drivers again on every node that lost them: the tree bound back."""
    hit = {f.get("node") for f in load_faults(state_dir) if f.get("kind") in KINDS}
    msgs = []
    for node in topo.nodes:
        if node.name not in hit:
            continue
        src = shlex.quote(str(rdmasysfs.tree(nodes_mod.node_dir(state_dir, node))))
        _set_rdma(state_dir, node, True)
        with contextlib.suppress(SimError):  # a node that is down gets it when it boots
            host.in_node_mounts(
                state_dir,
                node,
                f"if [ ! -d {SYSFS} ]; then mkdir {SYSFS} && mount --bind {src} {SYSFS}; fi",
            )
        msgs.append(f"{node.name}: RDMA drivers loaded ({SYSFS} back)")
    return msgs
