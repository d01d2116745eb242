"""A node that cannot be reached on the management network, the two ways it happens:

- ``unreachable NODE --how cut`` (the default): the node's namespace is cut from the
  management bridge and every packet to it is silently dropped, so a connect TIMES OUT and
  an open SSH connection hangs, as when a node hangs, loses power behind a router or a
  firewall drops its traffic. The node's port on the bridge (its host-side veth) goes
  down; the runner and the other nodes keep a permanent neighbour entry for the node's
  address, so they do not learn that it is gone through ARP (which would turn the timeout
  into ``No route to host`` after ~3 s) and keep sending frames that nobody receives.
  The fabric links stay as they are.
- ``unreachable NODE --how sshd``: sshd stopped: a new connection to the node's port 22 is
  refused (the SYN is answered with a reset by an nftables rule in the node's network
  namespace). The node's sshd process stays, because it is the node's PID 1 and its
  Docker engine lives in that PID namespace; like ``systemctl stop ssh``, sessions that
  are already open live on.

``unreachable NODE --restore`` undoes it for one node; ``fault clear`` and ``down`` undo
every one. Each is recorded in faults.json (kind ``unreachable``, value ``cut``/``sshd``).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from ..netns import SimError, ip_batch, run
from ..topology import MGMT_IF, NodeSpec, Topology
from .common import Kinds, forget, load_faults, record, resolve

KIND = "unreachable"
KINDS = (KIND,)
HOWS = ("cut", "sshd")
NFT_TABLE = "sparksim_unreachable"


def add_parsers(kinds: Kinds) -> None:
    k = kinds.on_node(
        KIND,
        "a node unreachable on the management network: blackholed (cut: connects "
        "time out) or sshd stopped (sshd: connection refused)",
    )
    k.add_argument(
        "--how",
        choices=HOWS,
        default="cut",
        help="cut (default): the namespace cut from the management bridge, packets dropped; "
        "sshd: new SSH connections refused",
    )
    k.add_argument(
        "--restore", action="store_true", help="make the node reachable again (this fault only)"
    )


def apply(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    node = resolve(topo, args.node)
    if args.restore:
        msgs = _undo(topo, [f for f in load_faults(state_dir) if _is_ours(f, node)])
        forget(state_dir, lambda f: _is_ours(f, node))
        return msgs or [f"{node.name}: was reachable"]
    if args.how == "cut":
        _cut(topo, node)
        what = (
            f"{node.name} ({node.mgmt}) cut from the management bridge: packets dropped, "
            "connects time out"
        )
    else:
        _refuse_ssh(node)
        what = f"{node.name} ({node.mgmt}): sshd stopped, SSH connections refused"
    record(
        state_dir,
        KIND,
        node.name,
        MGMT_IF,
        args.how,
        replaces=lambda f: _is_ours(f, node) and f.get("value") == args.how,
    )
    return [what]


def clear(state_dir: Path, topo: Topology) -> list[str]:
    """Every node reachable again (before the sim core's clear empties faults.json)."""
    return _undo(topo, [f for f in load_faults(state_dir) if f.get("kind") == KIND])


# ----------------------------------------------------------------------------- cut


def _mac(node: NodeSpec) -> str:
    out = run(["ip", "-n", node.netns, "-j", "link", "show", MGMT_IF])
    try:
        return str(json.loads(out)[0]["address"])
    except (ValueError, LookupError) as exc:
        raise SimError(f"{node.name}: no {MGMT_IF} in {node.netns}: {out.strip()}") from exc


def _cut(topo: Topology, node: NodeSpec) -> None:
    mac = _mac(node)
    pin = f"neigh replace {node.mgmt} lladdr {mac} nud permanent dev"
    ip_batch([f"{pin} {topo.bridge}"])
    for other in topo.nodes:
        if other.index != node.index:
            ip_batch([f"{pin} {MGMT_IF}"], netns=other.netns)
    ip_batch([f"link set {node.host_veth} down"])


def _uncut(topo: Topology, node: NodeSpec) -> None:
    ip_batch([f"link set {node.host_veth} up"])
    ip_batch([f"neigh del {node.mgmt} dev {topo.bridge}"], force=True)
    for other in topo.nodes:
        if other.index != node.index:
            ip_batch([f"neigh del {node.mgmt} dev {MGMT_IF}"], netns=other.netns, force=True)


# ---------------------------------------------------------------------------- sshd


def _nft(node: NodeSpec, script: str, check: bool = True) -> None:
    if shutil.which("nft") is None:
        raise SimError("nft not found: apt-get install nftables (the sshd fault uses it)")
    run(["nsenter", f"--net=/run/netns/{node.netns}", "nft", "-f", "-"], input=script, check=check)


def _refuse_ssh(node: NodeSpec) -> None:
    _nft(
        node,
        f"table inet {NFT_TABLE} {{}}\n"
        f"flush table inet {NFT_TABLE}\n"
        f"table inet {NFT_TABLE} {{\n"
        "  chain input {\n"
        "    type filter hook input priority 0; policy accept;\n"
        "    tcp dport 22 tcp flags & (syn | ack) == syn reject with tcp reset\n"
        "  }\n"
        "}\n",
    )


def _unrefuse_ssh(node: NodeSpec) -> None:
    _nft(node, f"delete table inet {NFT_TABLE}\n", check=False)


# --------------------------------------------------------------------------- state


def _is_ours(entry: dict[str, Any], node: NodeSpec) -> bool:
    return entry.get("kind") == KIND and entry.get("node") == node.name


def _undo(topo: Topology, entries: list[dict[str, Any]]) -> list[str]:
    msgs = []
    for entry in entries:
        node = next((n for n in topo.nodes if n.name == entry.get("node")), None)
        if node is None:
            continue
        if entry.get("value") == "sshd":
            _unrefuse_ssh(node)
            msgs.append(f"{node.name}: sshd accepts connections again")
        else:
            _uncut(topo, node)
            msgs.append(f"{node.name}: back on the management bridge")
    return msgs
