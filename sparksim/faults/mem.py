"""A node whose memory another process holds (the memory headroom preflight catches it):

- ``memory-held NODE --gib N``: a process (``python3``, a leftover job's stand-in) runs in
  the node, and N GiB are held by it: the node's /proc/meminfo (sim/meminfo.py: a GB10's,
  bound over /proc/meminfo) loses N GiB of MemFree and MemAvailable, and the process's
  ``/proc/PID/status`` (VmRSS, RssAnon, VmHWM) says it holds them, bound over that file in
  the node's mount namespace, so ``ps``, ``top`` and a read of /proc/PID/status agree.
  The machine running sparksim cannot hold 100 GiB per node; the process is real, its size
  is the node's view of it. The simulated engine claims none of the node's memory, so a
  serving node keeps an idle node's MemAvailable: attached, N must eat into the OS
  headroom itself (about 113 of 116.5 GiB) for the check to see a short node.

``clear`` unmounts the status file, stops the process and writes the idle meminfo back.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shlex
from pathlib import Path
from typing import Any

from .. import node as nodes_mod
from ..meminfo import GIB_KB, write_meminfo
from ..netns import SimError
from ..topology import NodeSpec, Topology
from . import host
from .common import Kinds, load_faults, record, resolve

KINDS = ("memory-held",)
HOLDER = "import signal; signal.pause()"


def add_parsers(kinds: Kinds) -> None:
    k = kinds.on_node("memory-held", "a process on a node holds N GiB of its memory")
    k.add_argument(
        "--gib", type=float, required=True, metavar="N", help="GiB the process holds (> 0)"
    )


def apply(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    node = resolve(topo, args.node)
    if args.kind == "memory-held":
        return memory_held(state_dir, node, args.gib)
    raise SimError(f"unknown fault {args.kind!r}")


def _status_with_rss(status: str, rss_kb: int) -> str:
    """The process's real status text with its resident figures set to ``rss_kb``."""
    out = []
    for line in status.splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmRSS", "RssAnon", "VmHWM"):
            line = f"{key}:\t{rss_kb:>8} kB"
        out.append(line)
    return "\n".join(out) + "\n"


def memory_held(state_dir: Path, node: NodeSpec, gib: float) -> list[str]:
    if not 0 < gib < 119:
        raise SimError(f"--gib {gib:g}: expected more than 0 and less than 119")
    if any(
        f.get("kind") == "memory-held" and f.get("node") == node.name for f in _faults(state_dir)
    ):
        _clear_node(state_dir, node)
    nd = nodes_mod.node_dir(state_dir, node)
    held_kb = int(gib * GIB_KB)
    holder = shlex.join(["python3", "-c", HOLDER])
    pid_text = host.in_node_mounts(
        state_dir, node, f"cd /; setsid {holder} </dev/null >/dev/null 2>&1 & echo $!"
    ).strip()
    if not pid_text.isdigit():
        raise SimError(f"{node.name}: the holder did not start ({pid_text!r})")
    pid = int(pid_text)
    status_file = nd / "memory-held-status"
    status = host.in_node_mounts(state_dir, node, f"cat /proc/{pid}/status")
    status_file.write_text(_status_with_rss(status, held_kb))
    host.in_node_mounts(
        state_dir, node, f"mount --bind {shlex.quote(str(status_file))} /proc/{pid}/status"
    )
    write_meminfo(nd / "meminfo", held_kb)
    record(state_dir, "memory-held", node.name, "-", {"gib": gib, "pid": pid})
    return [f"{node.name}: pid {pid} python3 holds {gib:g} GiB (/proc/meminfo, /proc/{pid}/status)"]


def _faults(state_dir: Path) -> list[dict[str, Any]]:
    return [f for f in load_faults(state_dir) if f.get("kind") in KINDS]


def _clear_node(state_dir: Path, node: NodeSpec) -> list[str]:
    msgs = []
    for f in _faults(state_dir):
        if f.get("node") != node.name:
            continue
        value = f.get("value") or {}
        pid = value.get("pid") if isinstance(value, dict) else None
        if isinstance(pid, int) and re.fullmatch(r"\d+", str(pid)):
            with contextlib.suppress(SimError):  # a node that is down took them with it
                host.in_node_mounts(
                    state_dir,
                    node,
                    f"umount -l /proc/{pid}/status 2>/dev/null; kill {pid} 2>/dev/null; true",
                    check=False,
                )
            msgs.append(f"{node.name}: pid {pid} stopped, its memory back")
    write_meminfo(nodes_mod.node_dir(state_dir, node) / "meminfo")
    return msgs


def clear(state_dir: Path, topo: Topology) -> list[str]:
    """Undo memory-held on every node (before the sim core's clear resets faults.json)."""
    held = {f.get("node") for f in _faults(state_dir)}
    msgs: list[str] = []
    for node in topo.nodes:
        if node.name in held:
            msgs += _clear_node(state_dir, node)
    return msgs
