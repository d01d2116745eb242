"""Each node's ``/sys/class/infiniband``: the RDMA devices' GID tables, as NCCL reads them.

A ConnectX port's GID table lists, per address of its netdev, one ``IB/RoCE v1`` and one
``RoCE v2`` GID: index 0/1 the link-local address (``fe80::`` + the port GUID ibstat
prints), 2/3 the fabric IPv4 address as an IPv4-mapped GID (``::ffff:198.19.0.1``); the
other entries of the table (255 on a ConnectX-7) are all zero and their type cannot be
read. The tree lives in DIR/nodes/<name>/infiniband and is bound over
``/sys/class/infiniband`` in the node's mount namespace (node.py): the node's sysfs has
no RDMA class, so ``/sys/class`` becomes a tmpfs holding a bind of every real class
directory plus this one, and ``cat`` or ``grep`` on the node read it where they would on a
Spark.

Fault ``gid-v1 NODE [--empty]``: the RoCE v2 GID of each fabric twin's address becomes
``IB/RoCE v1`` (a port in RoCE v1 mode: NCCL's auto-selection then lands on a v1 GID), or
with ``--empty`` the IPv4 GIDs vanish (the address gone from the GID table).

Fault ``gid-shift NODE``: a global IPv6 address's pair of GIDs sits at index 2/3, before
the fabric IPv4 address's (now 4/5), as when the interface got an IPv6 address (SLAAC, a
netplan ``addresses:`` entry) while its IPv4 address was away, e.g. across a ``netplan
apply``: a freed pair of slots is reused by the next address added. NCCL's
auto-selection (an IPv4 RoCE v2 GID) then picks index 5 on that node and 3 on the others.
The IPv6 address is one of RFC 5180's benchmarking range (2001:2::/48, the IPv6 twin of
198.18.0.0/15); it is in the GID table only, not configured on the sim's interface (the
sim's fabric carries its IPv4 addresses alone; no check reads GIDs from ``ip addr``).

Each port also has ``hw_counters`` (mlx5's RoCE counters, :data:`HW_COUNTERS`: steady, as
on a healthy link), ``state`` / ``phys_state`` / ``link_layer`` as mlx5 writes them (a
cabled twin ``4: ACTIVE`` / ``5: LinkUp``, an unplugged port ``1: DOWN`` / ``3: Disabled``;
written at ``up``, not rewritten by link faults), and each device its ``device/net/<netdev>``:
sparkrun's RDMA detection (its ``ib_detect.sh``) reads these two to find the active HCAs and
their netdevs, as on a Spark, and sets NCCL's and Gloo's interfaces from them.
Each device's ``device/`` also holds its PCI function's ``uevent`` (``PCI_SLOT_NAME``)
and PCIe link attributes (``current_link_speed``/``_width``, ``max_link_speed``/``_width``,
as drivers/pci/pci-sysfs.c prints them): Gen5 x4 on every function, as on a DGX Spark FE.
Fault ``pcie-link NODE [--dev DEV] [--width N] [--speed S]`` (faults/fabric.py): the
functions trained narrower or slower than their capability, as an ASUS Ascent GX10's
second ConnectX-7 link trains at x2 (NVIDIA developer forum thread 367853).

``clear`` writes the healthy tables again.
"""

from __future__ import annotations

import ipaddress
import shlex
from pathlib import Path

from .topology import ALL_PORTS, NodeSpec

DIRNAME = "infiniband"
TABLE_LEN = 255  # gid_tbl_len of a ConnectX-7 RoCE port
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
V1, V2 = "IB/RoCE v1", "RoCE v2"
KIND = "gid-v1"
MODES = ("healthy", "v1", "empty", "shift")
# ports/1/hw_counters of mlx5 (drivers/infiniband/hw/mlx5/counters.c names): one decimal
# a file, as a healthy port reads after traffic (flushes and congestion marks are normal).
HW_COUNTERS = {
    "duplicate_request": 0,
    "implied_nak_seq_err": 0,
    "local_ack_timeout_err": 0,
    "np_cnp_sent": 1204,
    "np_ecn_marked_roce_packets": 1311,
    "out_of_buffer": 0,
    "out_of_sequence": 0,
    "packet_seq_err": 0,
    "req_cqe_error": 0,
    "req_cqe_flush_error": 12,
    "req_remote_access_errors": 0,
    "req_remote_invalid_request": 0,
    "resp_cqe_error": 0,
    "resp_cqe_flush_error": 9,
    "resp_local_length_error": 0,
    "resp_remote_access_errors": 0,
    "rnr_nak_retry_err": 0,
    "roce_adp_retrans": 0,
    "roce_adp_retrans_to": 0,
    "roce_slow_restart": 0,
    "rp_cnp_handled": 1187,
    "rx_atomic_requests": 0,
    "rx_read_requests": 48211,
    "rx_write_requests": 1876533,
}


def tree(node_dir: Path) -> Path:
    return node_dir / DIRNAME


def _port_guid(node: NodeSpec, dev: str) -> int:
    """ibstat's Port GUID of ``dev`` (tools/ports.py guid, with the port bit ibstat sets)."""
    devs = [d for d, _ in ALL_PORTS]
    name = sum(ord(c) for c in node.name) & 0xFFFF
    node_guid = (0x58A2E1 << 40) | (0x03 << 32) | (name << 8) | devs.index(dev)
    return node_guid ^ 0x0200_0000_0000_0000


def _gid(addr: ipaddress.IPv6Address) -> str:
    h = addr.packed.hex()
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def extra_ipv6(node: NodeSpec, dev: str) -> ipaddress.IPv6Address:
    """The global IPv6 address ``gid-shift`` puts before the IPv4 one: 2001:2:0:TWIN::N."""
    devs = [d for d, _ in ALL_PORTS]
    return ipaddress.IPv6Address(f"2001:2:0:{devs.index(dev)}::{node.index}")


def entries(node: NodeSpec, dev: str, mode: str = "healthy") -> list[tuple[str, str]]:
    """``[(gid, type)]`` by index for one device: ``healthy``, ``v1`` (v2 entry typed v1),
    ``empty`` (no IPv4 GIDs) or ``shift`` (an IPv6 address's GIDs before the IPv4 ones)."""
    if mode not in MODES:
        raise ValueError(f"GID table mode {mode!r}: expected one of {', '.join(MODES)}")
    guid = _port_guid(node, dev)
    link_local = _gid(ipaddress.IPv6Address((0xFE80 << 112) | guid))
    out = [(link_local, V1), (link_local, V2)]
    addr = next((p.addr for p in node.fabric if p.dev == dev), None)
    if addr is not None and mode == "shift":
        extra = _gid(extra_ipv6(node, dev))
        out += [(extra, V1), (extra, V2)]
    if addr is not None and mode != "empty":
        mapped = _gid(ipaddress.IPv6Address(f"::ffff:{addr}"))
        out += [(mapped, V1), (mapped, V1 if mode == "v1" else V2)]
    return out


PORT_UP = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "link_layer": "Ethernet"}
PORT_UNPLUGGED = {"state": "1: DOWN", "phys_state": "3: Disabled", "link_layer": "Ethernet"}


# Each RDMA device's PCI function (its ``device`` directory: uevent's PCI_SLOT_NAME) and
# its PCIe link as the kernel's pci-sysfs.c prints it: a DGX Spark's ConnectX-7 sits
# behind two Gen5 x4 links, 0000:01:00.x and 0002:01:00.x (one per twin of each port).
PCI_OF = {
    "rocep1s0f0": "0000:01:00.0",
    "rocep1s0f1": "0000:01:00.1",
    "roceP2p1s0f0": "0002:01:00.0",
    "roceP2p1s0f1": "0002:01:00.1",
}
GEN5_X4 = ("32.0 GT/s PCIe", 4)


def write_pcie(
    node_dir: Path, links: dict[str, tuple[str, int]] | None = None
) -> dict[str, tuple[str, int]]:
    """Each device's ``device/uevent`` and PCIe link attributes: every link at its
    capability (Gen5 x4), except the devices in ``links`` (dev -> the speed text and width
    it trained at: fault ``pcie-link``). Returns what each device now reads."""
    now = {}
    for dev, _ in ALL_PORTS:
        device = tree(node_dir) / dev / "device"
        device.mkdir(parents=True, exist_ok=True)
        (device / "uevent").write_text(f"DRIVER=mlx5_core\nPCI_SLOT_NAME={PCI_OF[dev]}\n")
        speed, width = (links or {}).get(dev, GEN5_X4)
        for name, value in (
            ("current_link_speed", speed),
            ("current_link_width", width),
            ("max_link_speed", GEN5_X4[0]),
            ("max_link_width", GEN5_X4[1]),
        ):
            (device / name).write_text(f"{value}\n")
        now[dev] = (speed, width)
    return now


def write(node_dir: Path, node: NodeSpec, mode: str = "healthy") -> None:
    """(Re)write the node's tree: every RDMA device, its netdev, port 1, its state and its
    whole GID table; healthy, every device's PCIe link at its capability too (a GID fault
    leaves the links as they are)."""
    cabled = {p.dev for p in node.fabric}
    if mode == "healthy":
        write_pcie(node_dir)
    for dev, netdev in ALL_PORTS:
        net = tree(node_dir) / dev / "device" / "net" / netdev
        net.mkdir(parents=True, exist_ok=True)
        port = tree(node_dir) / dev / "ports" / "1"
        port.mkdir(parents=True, exist_ok=True)
        for field, text in (PORT_UP if dev in cabled else PORT_UNPLUGGED).items():
            (port / field).write_text(text + "\n")
        gids, types = port / "gids", port / "gid_attrs" / "types"
        gids.mkdir(parents=True, exist_ok=True)
        types.mkdir(parents=True, exist_ok=True)
        table = entries(node, dev, mode if any(p.dev == dev for p in node.fabric) else "healthy")
        for i in range(TABLE_LEN):
            gid, kind = table[i] if i < len(table) else (ZERO, None)
            (gids / str(i)).write_text(gid + "\n")
            t = types / str(i)
            if kind is None:
                t.unlink(missing_ok=True)
            else:
                t.write_text(kind + "\n")
        counters = port / "hw_counters"
        counters.mkdir(exist_ok=True)
        for name, value in HW_COUNTERS.items():
            (counters / name).write_text(f"{value}\n")


def mount_steps(node_dir: Path, infiniband: bool = True) -> list[str]:
    """Shell steps (after the node's sysfs is mounted on /sys) that lay the tree at
    /sys/class/infiniband: /sys/class as a tmpfs of binds, the real classes kept. Not
    ``infiniband``: no such directory (a node without RDMA drivers, faults/rdma.py)."""
    q = shlex.quote
    park = q(str(node_dir / "sysclass"))
    src = q(str(tree(node_dir)))
    steps = [
        f"mkdir -p {park}",
        f"mount --bind /sys/class {park}",
        "mount -t tmpfs -o mode=755,nosuid,nodev,noexec sparksim-sysclass /sys/class",
        f'for c in {park}/*; do n="${{c##*/}}"; mkdir "/sys/class/$n" && '
        f'mount --bind "$c" "/sys/class/$n" || exit 1; done',
    ]
    if infiniband:
        steps += [f"mkdir /sys/class/{DIRNAME}", f"mount --bind {src} /sys/class/{DIRNAME}"]
    return steps
