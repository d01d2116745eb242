"""Names and addresses of one sparksim instance: pure functions, no I/O.

Instance ``k`` owns the management subnet ``198.18.k.0/24`` on the root-namespace bridge
``spk{k}br`` and the namespaces ``spk{k}-n{i}``. Node ``i`` (1-based) is ``spark-i`` at
``198.18.k.(10+i)``. Every root-namespace link name starts with ``spk{k}`` so that
``down`` (and ``down --all``) can find what an instance left behind.

Fabric topologies (``spark-sim up --topology``):

- ``direct`` (two nodes, the default for two): one cable per twin, node to node, as
  the two-Spark playbook cables them;
- ``switch`` (the default for more than two): every node's twins on one switched fabric,
  as in NVIDIA's multi-Sparks-through-a-switch playbook (NVIDIA/dgx-spark-playbooks,
  ``nvidia/multi-sparks-through-switch``: every Spark's QSFP ports cabled to one switch,
  all of them in one RoCE subnet per twin). The switch is a namespace of its own,
  ``spk{k}-sw``, holding one Linux bridge per twin (``br0``, ``br1``) and one port per
  node and twin (``n{i}f{t}``, the switch's end of that node's cable).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_INSTANCES = 16
MAX_NODES = 32
MGMT_IF = "mgmt0"
HEALTHY_MTU = 9000
HEALTHY_RATE_MBPS = 200_000
UNPLUGGED_MTU = 1500

# (netdev, rdma device, fabric subnet third octet) of the two cabled twins.
FABRIC_TWINS: tuple[tuple[str, str, int], ...] = (
    ("enp1s0f1np1", "rocep1s0f1", 0),
    ("enP2p1s0f1np1", "roceP2p1s0f1", 1),
)
# The ports without a cable: persistent tap devices with nothing attached, admin up, so
# that ip shows NO-CARRIER and operstate DOWN as on a Spark.
UNPLUGGED: tuple[tuple[str, str], ...] = (
    ("enp1s0f0np0", "rocep1s0f0"),
    ("enP2p1s0f0np0", "roceP2p1s0f0"),
)
# Every RDMA device of a Spark's ConnectX-7, in PCI order (domain 0 before domain 2).
ALL_PORTS: tuple[tuple[str, str], ...] = (
    ("rocep1s0f0", "enp1s0f0np0"),
    ("rocep1s0f1", "enp1s0f1np1"),
    ("roceP2p1s0f0", "enP2p1s0f0np0"),
    ("roceP2p1s0f1", "enP2p1s0f1np1"),
)

TOPOLOGIES = ("direct", "switch")
NETNS_RE = re.compile(r"^spk(\d+)-(?:n(\d+)|sw)$")
LINK_RE = re.compile(r"^spk(\d+)(?:br|n\d+m|n\d+w|f\d|n\d+f\d)$")  # n\d+w: faults/wifi.py


@dataclass(frozen=True)
class FabricPort:
    twin: int
    ifname: str
    dev: str
    addr: str  # without prefix length

    def as_json(self) -> dict[str, str]:
        return {"if": self.ifname, "dev": self.dev, "addr": self.addr}


@dataclass(frozen=True)
class NodeSpec:
    index: int  # 1-based
    name: str
    role: str
    netns: str
    mgmt: str
    host_veth: str
    fabric: tuple[FabricPort, ...]

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "role": self.role,
            "mgmt": self.mgmt,
            "netns": self.netns,
            "fabric": [p.as_json() for p in self.fabric],
        }


@dataclass(frozen=True)
class Topology:
    instance: int
    nodes: tuple[NodeSpec, ...]
    kind: str = "direct"  # one of TOPOLOGIES

    @property
    def bridge(self) -> str:
        return bridge_name(self.instance)

    @property
    def gateway(self) -> str:
        return f"198.18.{self.instance}.1"

    @property
    def switched(self) -> bool:
        """True when the fabric goes through the switch (a bridge per twin)."""
        return self.kind == "switch"

    @property
    def switch_netns(self) -> str:
        """The switch's namespace: its bridges and ports live there."""
        return f"spk{self.instance}-sw"

    def twin_bridge(self, twin: int) -> str:
        """The twin's bridge, in :attr:`switch_netns`."""
        return f"br{twin}"

    def switch_port(self, node: NodeSpec, twin: int) -> str:
        """The switch's end of the node's cable for this twin, in :attr:`switch_netns`."""
        return f"n{node.index}f{twin}"

    def peer(self, node: NodeSpec) -> NodeSpec:
        """The other node of a two-node (direct cable) cluster."""
        (other,) = [n for n in self.nodes if n.index != node.index]
        return other


def bridge_name(instance: int) -> str:
    return f"spk{instance}br"


def default_topology(count: int) -> str:
    """Two nodes: a direct cable per twin (today's default); more: the switch."""
    return "direct" if count == 2 else "switch"


def build(instance: int, count: int, kind: str | None = None) -> Topology:
    if not 0 <= instance < MAX_INSTANCES:
        raise ValueError(f"instance {instance} out of range 0..{MAX_INSTANCES - 1}")
    if not 2 <= count <= MAX_NODES:
        raise ValueError(f"--nodes {count} out of range 2..{MAX_NODES}")
    kind = kind or default_topology(count)
    if kind not in TOPOLOGIES:
        raise ValueError(f"--topology {kind!r}: expected one of {', '.join(TOPOLOGIES)}")
    if kind == "direct" and count != 2:
        raise ValueError(
            f"--topology direct joins exactly two nodes (a cable per twin), not {count}: "
            "use --topology switch"
        )
    nodes = []
    for i in range(1, count + 1):
        fabric = tuple(
            FabricPort(twin=t, ifname=ifname, dev=dev, addr=f"198.19.{octet}.{i}")
            for t, (ifname, dev, octet) in enumerate(FABRIC_TWINS)
        )
        nodes.append(
            NodeSpec(
                index=i,
                name=f"spark-{i}",
                role="head" if i == 1 else "worker",
                netns=f"spk{instance}-n{i}",
                mgmt=f"198.18.{instance}.{10 + i}",
                host_veth=f"spk{instance}n{i}m",
                fabric=fabric,
            )
        )
    return Topology(instance=instance, nodes=tuple(nodes), kind=kind)


def tbf_mbit(rate_mbps: int) -> int:
    """Shaped rate of a link: 1/200 of the advertised rate, at least 1 Mbit/s.

    1/200 (200 Gb/s -> 1 Gbit/s), not 1/100: gloo reduces on the CPU, and at 2 Gbit/s a
    healthy link measured 0.11-0.14 GB/s against its 0.25 in CI (2 cores at load 7-10,
    three suites side by side), the figure a 100G link gives. At 1 Gbit/s the ranks need
    half the CPU for the same share of the link (REFERENCE section 7: 0.118-0.120 GB/s).
    """
    return max(1, rate_mbps // 200)


def resolve_node(topo: Topology, spec: str) -> NodeSpec:
    """NODE as the CLI accepts it: index (1-based), hostname, ``head``, ``worker-N``,
    namespace name or management address."""
    s = spec.strip()
    for node in topo.nodes:
        if s in (str(node.index), node.name, node.netns, node.mgmt):
            return node
    if s == "head":
        return topo.nodes[0]
    m = re.fullmatch(r"(?:spark-)?worker-(\d+)", s)
    if m and 1 <= int(m.group(1)) < len(topo.nodes):
        return topo.nodes[int(m.group(1))]
    names = ", ".join(n.name for n in topo.nodes)
    raise ValueError(
        f"unknown node {spec!r}: use an index 1..{len(topo.nodes)}, a hostname ({names}), "
        f"'head' or 'worker-1'..'worker-{len(topo.nodes) - 1}'"
    )


def resolve_twins(spec: str | None) -> list[int]:
    """TWIN as the CLI accepts it: 0, 1, an interface or device name; None means both."""
    if spec is None or spec in ("both", "all"):
        return [t for t in range(len(FABRIC_TWINS))]
    for t, (ifname, dev, _) in enumerate(FABRIC_TWINS):
        if spec in (str(t), ifname, dev):
            return [t]
    choices = ", ".join(f"{t} ({ifname})" for t, (ifname, _, _) in enumerate(FABRIC_TWINS))
    raise ValueError(f"unknown twin {spec!r}: use {choices}")
