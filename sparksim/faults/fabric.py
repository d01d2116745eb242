"""Fabric faults that NCCL's finer checks catch (GID index, small-message latency):

- ``gid-v1 NODE [--empty]``: on NODE's fabric twins the RoCE v2 GID of the fabric address
  is typed ``IB/RoCE v1`` in ``/sys/class/infiniband/DEV/ports/1/gid_attrs/types/3`` (a
  port in RoCE v1 mode), so the index NCCL auto-selects resolves to RoCE v1; ``--empty``
  removes the address's GIDs instead (rdmasysfs.py);
- ``gid-shift NODE``: on NODE's fabric twins a global IPv6 address's GIDs take index 2/3
  and the fabric address's move to 4/5 (rdmasysfs.py), so NCCL auto-selects index 5 there
  and 3 on every other node: still a RoCE v2 GID, at another index;
- ``pcie-link NODE [--dev DEV] [--width N] [--speed S]``: the ConnectX-7 functions' PCIe
  links (``/sys/class/infiniband/DEV/device/current_link_*``) trained below their Gen5 x4
  capability; the default is both functions of the second link at x2, the ASUS Ascent
  GX10's wiring (rdmasysfs.py). Sysfs only: the sim's fabric bandwidth is the tbf
  shaping's, so a row with this fault runs the link category alone;
- ``link-delay NODE --ms N [--how auto|netem|nfqueue]``: every packet on NODE's fabric
  cable(s) waits N ms each way (a round trip pays 2N), as a congested switch port or a
  long path does: bandwidth holds, each small message pays the delay. ``netem`` (the
  first choice): tc netem as the root qdisc of both ends of each cable, keeping the
  healthy shaping rate. ``nfqueue`` (where the kernel has no sch_netem): in NODE and its
  peer, an iptables rule hands every packet arriving on a fabric twin to netfilter queue
  QUEUE and a delayer (nfqdelay.py, a process in that node's network namespace) lets
  each go N ms later; tbf keeps shaping the egress. The hold is on arrival, after the
  kernel has let go of the sender's socket: held at departure, TCP's small-queue limit
  (about 1 ms of data in the host) would throttle a bulk flow to a few % of the link.
  ``ping`` prints the round trip from the kernel's receive time, taken before the last
  hold: ``ping -U`` (user to user) shows the 2N.

``clear`` writes every node's healthy GID tables and stops the delayers (their rules
first); faults.clear puts the tbf shaping back (over any netem). ``down`` kills every
process of a node's namespace, the delayers with them, and deletes the namespace.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from .. import node as nodes_mod
from .. import rdmasysfs
from ..netns import SimError, pid_alive, run, tc_batch
from ..topology import NodeSpec, Topology, tbf_mbit
from .common import Kinds, load_faults, record, resolve
from .link import _rates, apply_shaping

KINDS = ("gid-v1", "gid-shift", "link-delay", "pcie-link")
DELAYER = Path(__file__).parent.parent / "nfqdelay.py"  # sparksim/nfqdelay.py
QUEUE = 17  # the netfilter queue the delayer binds, in each node's own namespace
RULE_TAG = "sparksim-link-delay"
READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 3.0


def add_parsers(kinds: Kinds) -> None:
    k = kinds.on_node(
        "pcie-link", "a node's ConnectX-7 PCIe links trained below their Gen5 x4 capability"
    )
    k.add_argument(
        "--dev",
        action="append",
        choices=sorted(rdmasysfs.PCI_OF),
        help="the RDMA device(s) whose function trained down (default: both functions of "
        "the second link, 0002:01:00.x, as on an ASUS Ascent GX10)",
    )
    k.add_argument("--width", type=int, default=2, help="the width it trained at (default 2)")
    k.add_argument(
        "--speed", default="32.0 GT/s PCIe", help="the speed it trained at (default Gen5)"
    )
    k = kinds.on_node(
        "gid-v1", "a node's fabric GIDs: the RoCE v2 entry of its address reads RoCE v1"
    )
    k.add_argument(
        "--empty", action="store_true", help="remove the address's GIDs instead (no IPv4 GID)"
    )
    k = kinds.on_node(
        "gid-shift",
        "a node's fabric GIDs: an IPv6 address's pair first, so NCCL picks another index",
    )
    k = kinds.on_node("link-delay", "delay every packet on a node's fabric cables, each way")
    k.add_argument("--ms", type=float, required=True, help="delay each way in milliseconds")
    k.add_argument(
        "--how",
        choices=("auto", "netem", "nfqueue"),
        default="auto",
        help="netem (tc), nfqueue (iptables NFQUEUE and a userspace delayer), or auto: "
        "netem where the kernel has it (default: auto)",
    )


def apply(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    node = resolve(topo, args.node)
    nd = nodes_mod.node_dir(state_dir, node)
    if args.kind == "gid-v1":
        mode = "empty" if args.empty else "v1"
        rdmasysfs.write(nd, node, mode)
        record(state_dir, "gid-v1", node.name, "-", mode)
        what = "no IPv4 GID" if args.empty else "its address's RoCE v2 GID typed IB/RoCE v1"
        return [f"{node.name} {p.dev}: {what}" for p in node.fabric]
    if args.kind == "gid-shift":
        rdmasysfs.write(nd, node, "shift")
        record(state_dir, "gid-shift", node.name, "-", "shift")
        return [
            f"{node.name} {p.dev}: GIDs [2]/[3] {rdmasysfs.extra_ipv6(node, p.dev)} (IPv6), "
            f"[4]/[5] {p.addr}: NCCL auto-selects index 5 (3 on the other nodes)"
            for p in node.fabric
        ]
    if args.kind == "link-delay":
        return link_delay(state_dir, topo, node, args.ms, args.how)
    if args.kind == "pcie-link":
        if args.width not in (1, 2, 4):
            raise SimError(f"pcie-link --width {args.width}: expected 1, 2 or 4 (the lanes)")
        devs = args.dev or ["roceP2p1s0f0", "roceP2p1s0f1"]
        now = rdmasysfs.write_pcie(nd, {d: (args.speed, args.width) for d in devs})
        record(state_dir, "pcie-link", node.name, ",".join(devs), f"{args.speed} x{args.width}")
        return [f"{node.name} {d} ({rdmasysfs.PCI_OF[d]}): {now[d][0]} x{now[d][1]}" for d in devs]
    raise SimError(f"unknown fault {args.kind!r}")


# ------------------------------------------------------------------------- link-delay


def _ends(topo: Topology, node: NodeSpec) -> list[NodeSpec]:
    return [node, topo.peer(node)]


def link_delay(
    state_dir: Path, topo: Topology, node: NodeSpec, ms: float, how: str = "auto"
) -> list[str]:
    if not 0 < ms <= 10_000:
        raise SimError(f"link-delay --ms {ms:g}: expected 0 < ms <= 10000")
    if topo.switched:
        raise SimError("link-delay: direct-cable clusters only (no switch ports shaped)")
    # one delay at a time: a new one replaces the old (delayers stopped, netem replaced)
    _stop_delayers(state_dir, topo)
    if how in ("auto", "netem"):
        try:
            return _netem(state_dir, topo, node, ms)
        except SimError as exc:
            if "qdisc kind is unknown" not in str(exc):
                raise
            if how == "netem":
                raise SimError(
                    "link-delay --how netem needs the kernel's netem qdisc (sch_netem), which "
                    f"this kernel does not have ({str(exc).splitlines()[0]}); --how nfqueue "
                    "delays in userspace instead"
                ) from exc
    apply_shaping(state_dir, topo)  # tbf again where an earlier link-delay put netem
    return _nfqueue(state_dir, topo, node, ms)


def _netem(state_dir: Path, topo: Topology, node: NodeSpec, ms: float) -> list[str]:
    rates = _rates(state_dir, topo)
    peer = topo.peer(node)
    msgs = []
    for end in _ends(topo, node):
        lines = []
        for p in end.fabric:
            mbit = tbf_mbit(min(rates[(node.index, p.twin)], rates[(peer.index, p.twin)]))
            lines.append(
                f"qdisc replace dev {p.ifname} root netem delay {ms:g}ms "
                f"rate {mbit}mbit limit 100000"
            )
            msgs.append(f"{end.name} {p.ifname}: every packet sent delayed {ms:g} ms (netem)")
        tc_batch(lines, netns=end.netns)
    record(state_dir, "link-delay", node.name, "-", {"ms": ms, "how": "netem"})
    return msgs


def _iptables(end: NodeSpec, *args: str, check: bool = True) -> str:
    return run(
        ["nsenter", f"--net=/run/netns/{end.netns}", "iptables", "-w", "5", *args], check=check
    )


def _rule(ifname: str) -> list[str]:
    return [
        "PREROUTING", "-i", ifname, "-m", "comment", "--comment", RULE_TAG,
        "-j", "NFQUEUE", "--queue-num", str(QUEUE), "--queue-bypass",
    ]  # fmt: skip


def _tag(state_dir: Path, end: NodeSpec) -> str:
    """The delayer's --tag: its node's directory, which names this sim and node."""
    return str(nodes_mod.node_dir(state_dir, end))


def _start_delayer(state_dir: Path, end: NodeSpec, ms: float) -> int:
    log = nodes_mod.node_dir(state_dir, end) / "nfqdelay.log"
    argv = [
        "nsenter", f"--net=/run/netns/{end.netns}",
        sys.executable, "-I", str(DELAYER), "--queue", str(QUEUE), "--ms", f"{ms:g}",
        "--tag", _tag(state_dir, end),
    ]  # fmt: skip
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,  # outlives this command; `down` or `clear` ends it
            cwd="/",
        )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
    line = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
    proc.stdout.close()
    if line != "ready":
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=5)
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise SimError(
            f"{end.name}: the link-delay delayer did not start "
            f"({'; '.join(tail) or 'no output within ' + str(READY_TIMEOUT_S) + ' s'}); "
            "it needs the kernel's nfnetlink_queue (CONFIG_NETFILTER_NETLINK_QUEUE)"
        )
    return proc.pid


def _nfqueue(state_dir: Path, topo: Topology, node: NodeSpec, ms: float) -> list[str]:
    pids: dict[str, int] = {}
    msgs = []
    try:
        for end in _ends(topo, node):
            pids[end.name] = _start_delayer(state_dir, end, ms)
            record(
                state_dir, "link-delay", node.name, "-", {"ms": ms, "how": "nfqueue", "pids": pids}
            )
            for p in end.fabric:
                try:
                    _iptables(end, "-t", "mangle", "-A", *_rule(p.ifname))
                except SimError as exc:
                    raise SimError(
                        f"link-delay: the NFQUEUE rule on {end.name} {p.ifname} was refused "
                        "(iptables with the NFQUEUE target, CONFIG_NETFILTER_XT_TARGET_NFQUEUE, "
                        f"is needed where netem is missing): {str(exc).splitlines()[0]}"
                    ) from exc
                msgs.append(
                    f"{end.name} {p.ifname}: every packet arriving delayed {ms:g} ms "
                    f"(NFQUEUE {QUEUE}, delayer pid {pids[end.name]})"
                )
    except BaseException:
        _stop_delayers(state_dir, topo)
        raise
    return msgs


def _delayer_pids() -> dict[str, list[int]]:
    """The running delayers by their --tag (found by argv, so one that faults.json lost is
    found too; each sim's node directories are its own)."""
    out: dict[str, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not any(Path(a).name == DELAYER.name for a in argv) or "--tag" not in argv:
            continue
        at = argv.index("--tag") + 1
        if at < len(argv):
            out.setdefault(argv[at], []).append(int(entry))
    return out


def _stop_delayers(state_dir: Path, topo: Topology) -> list[str]:
    """Remove the NFQUEUE rules, then stop the delayers (SIGTERM: held packets go at once)."""
    msgs = []
    recorded = any(
        f.get("kind") == "link-delay" and (f.get("value") or {}).get("how") == "nfqueue"
        for f in load_faults(state_dir)
    )
    running = _delayer_pids()
    for end in topo.nodes:
        pids = running.get(_tag(state_dir, end), [])
        if not pids and not recorded:
            continue
        if os.path.exists(f"/run/netns/{end.netns}"):
            rules = _iptables(end, "-t", "mangle", "-S", "PREROUTING", check=False)
            for line in rules.splitlines():
                if RULE_TAG in line and line.startswith("-A "):
                    # iptables -S quotes nothing in this rule (no spaces in it)
                    _iptables(end, "-t", "mangle", "-D", *line.split()[1:], check=False)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        for pid in pids:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if pids:
            msgs.append(f"{end.name}: link delayer stopped (pid {', '.join(map(str, pids))})")
    return msgs


def clear(state_dir: Path, topo: Topology) -> list[str]:
    """Healthy GID tables and PCIe links on every node, no delayer (faults.clear restores
    the tbf shaping, which replaces a netem root qdisc)."""
    for n in topo.nodes:
        rdmasysfs.write(nodes_mod.node_dir(state_dir, n), n)
    return _stop_delayers(state_dir, topo)
