"""Port facts for the fake RDMA tools: the node's real netdev state (sysfs, read at call
time inside the node's network namespace) plus DIR/nodes/<name>/state.json."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

SYS_NET = "/sys/class/net"
State = dict[str, Any]  # state.json
IFF_UP = 0x1
# IB MTU enum as ibv_devinfo prints it: value -> (bytes, enum).
IB_MTUS = ((4096, 5), (2048, 4), (1024, 3), (512, 2), (256, 1))
# RoCE headers the kernel subtracts from the netdev MTU (ib_verbs.h iboe_get_mtu).
ROCE_OVERHEAD = 40 + 8 + 12 + 4 + 28 + 4


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:  # e.g. carrier reads EINVAL while the link is admin down
        return None


@dataclass(frozen=True)
class Port:
    dev: str
    netdev: str
    admin_up: bool
    carrier: bool
    mtu: int
    rate_gbps: float
    ifindex: int
    cable: bool

    @property
    def active(self) -> bool:
        return self.admin_up and self.carrier

    @property
    def ibstat_state(self) -> str:
        return "Active" if self.active else "Down"

    @property
    def phys(self) -> str:
        """LinkUp; Polling while enabled with a cable but no peer; else Disabled."""
        if self.active:
            return "LinkUp"
        return "Polling" if self.admin_up and self.cable else "Disabled"

    @property
    def rate_text(self) -> str:
        """ibstat ``Rate:``; a down port reports 40 as a real ConnectX-7 does."""
        if not self.active:
            return "40"
        rate = self.rate_gbps
        return str(int(rate)) if float(rate).is_integer() else f"{rate:g}"

    @property
    def active_mtu(self) -> tuple[int, int]:
        payload = self.mtu - ROCE_OVERHEAD
        for size, enum in IB_MTUS:
            if payload >= size:
                return size, enum
        return 256, 1


def load_state(node_dir: str) -> State:
    with open(os.path.join(node_dir, "state.json")) as fh:
        state: State = json.load(fh)
    return state


def ports(state: State) -> list[Port]:
    """The node's RDMA ports in PCI order; a port whose netdev is gone is left out."""
    result = []
    for dev, info in state["ports"].items():
        netdev = info["netdev"]
        base = os.path.join(SYS_NET, netdev)
        flags = _read(os.path.join(base, "flags"))
        if flags is None:
            continue
        admin_up = bool(int(flags, 16) & IFF_UP)
        carrier = admin_up and _read(os.path.join(base, "carrier")) == "1"
        result.append(
            Port(
                dev=dev,
                netdev=netdev,
                admin_up=admin_up,
                carrier=carrier,
                mtu=int(_read(os.path.join(base, "mtu")) or 1500),
                rate_gbps=float(info.get("rate_gbps", 200)),
                ifindex=int(_read(os.path.join(base, "ifindex")) or 0),
                cable=bool(info.get("cable", True)),
            )
        )
    return result


def rdma_loaded(state: State) -> bool:
    """Whether the node's RDMA drivers are loaded (mlx5_ib, ib_core): not under fault
    no-rdma (faults/rdma.py), which also removes /sys/class/infiniband."""
    return state.get("rdma") is not False


def rdma_ports(state: State) -> list[Port]:
    """The ports as the RDMA tools see them: none without the RDMA drivers (the netdevs,
    mlx5_core's, are still there for ethtool and ip)."""
    return ports(state) if rdma_loaded(state) else []


def operstate(netdev: str) -> str | None:
    return _read(os.path.join(SYS_NET, netdev, "operstate"))


def guid(state: State, dev: str) -> int:
    """A stable fake GUID per node and device (ConnectX-7 OUI 0x58a2e1)."""
    node = sum(ord(c) for c in state.get("node", "")) & 0xFFFF
    idx = list(state["ports"]).index(dev)
    return (0x58A2E1 << 40) | (0x03 << 32) | (node << 8) | idx
