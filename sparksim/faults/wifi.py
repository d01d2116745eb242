"""A node's WiFi, for sparkrun PR #219 (GLOO/NCCL on the default-route WiFi: serving died
when the WiFi dropped):

- ``wifi NODE``: the node gains a netdev named as a DGX Spark's WiFi (``wlP9s9``; its
  wired port is ``enP7s7``), Up with an address, and an ``iw`` in its tools directory
  (first on PATH) whose ``iw dev`` lists it in iw's own format. A job started with
  ``--env GLOO_SOCKET_IFNAME=wlP9s9`` then names a wireless interface that exists.

Modelled with what the sim has: the netdev is one end of a veth pair whose other end,
``spk{k}n{i}w`` in the root namespace (deleted with the node's namespace), is a port of the
management bridge, as a home access point bridges its WiFi with its LAN: the nodes' WiFi
addresses (``198.18.255.(10+i)/24``, a subnet of their own) reach each other, so gloo
bound to them works, as it does over a real WiFi until it drops. It is not a radio (the
kernel here has no wireless, nor dummy, driver): its sysfs has no ``wireless`` /
``phy80211`` entry, and ``iw dev`` is the one place it shows as wireless, as ``iw`` shows a
real one. It is not the node's default route (the management link stays that: the sim's
SSH and HTTP ride on it). ``clear`` removes both.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import node as nodes_mod
from ..netns import ip_batch, link_names
from ..topology import NodeSpec, Topology
from .common import Kinds, load_faults, record, resolve

KINDS = ("wifi",)
WIFI_IF = "wlP9s9"  # a DGX Spark's WiFi netdev, as its hosts name it


def add_parsers(kinds: Kinds) -> None:
    kinds.on_node("wifi", f"a WiFi netdev {WIFI_IF} on a node, Up, listed by its iw dev")


def apply(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    node = resolve(topo, args.node)
    return wifi(state_dir, topo, node)


def _peer(topo: Topology, node: NodeSpec) -> str:
    return f"spk{topo.instance}n{node.index}w"


def _address(node: NodeSpec) -> str:
    return f"198.18.255.{10 + node.index}/24"


IW = r"""#!/bin/sh
# sparksim's iw (faults/wifi.py): `iw dev` in iw's format for the node's WiFi netdev
if [ "$*" != "dev" ]; then
  echo "sparksim's iw answers only 'iw dev'" >&2
  exit 1
fi
i=@IF@
[ -e "/sys/class/net/$i" ] || exit 0
echo "phy#0"
echo "	Interface $i"
echo "		ifindex $(cat "/sys/class/net/$i/ifindex")"
echo "		wdev 0x1"
echo "		addr $(cat "/sys/class/net/$i/address")"
echo "		ssid sparksim"
echo "		type managed"
echo "		channel 36 (5180 MHz), width: 80 MHz, center1: 5210 MHz"
echo "		txpower 22.00 dBm"
"""


def wifi(state_dir: Path, topo: Topology, node: NodeSpec) -> list[str]:
    if any(f.get("kind") == "wifi" and f.get("node") == node.name for f in load_faults(state_dir)):
        return [f"{node.name}: {WIFI_IF} already there"]
    peer = _peer(topo, node)
    ip_batch([f"link add {WIFI_IF} netns {node.netns} type veth peer name {peer}"])
    ip_batch([f"link set {peer} master {topo.bridge} up"])
    ip_batch([f"addr add {_address(node)} dev {WIFI_IF}", f"link set {WIFI_IF} up"], node.netns)
    tool = nodes_mod.node_dir(state_dir, node) / "bin" / "iw"
    nodes_mod.write_atomic(tool, IW.replace("@IF@", WIFI_IF), 0o755)
    record(state_dir, "wifi", node.name, WIFI_IF, _address(node))
    return [f"{node.name}: {WIFI_IF} Up at {_address(node)}, wireless in its iw dev"]


def clear(state_dir: Path, topo: Topology) -> list[str]:
    msgs = []
    for node in topo.nodes:
        tool = nodes_mod.node_dir(state_dir, node) / "bin" / "iw"
        gone = WIFI_IF in link_names(node.netns)
        if gone:
            ip_batch([f"link del {WIFI_IF}"], node.netns)  # its root-namespace end with it
        if tool.exists():
            tool.unlink()
            gone = True
        if gone:
            msgs.append(f"{node.name}: {WIFI_IF} removed")
    return msgs
