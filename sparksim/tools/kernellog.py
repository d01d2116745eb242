"""Fake ``journalctl`` and ``dmesg`` of a node: its kernel log since boot, from state.json.

The nodes share the machine's kernel, whose ring buffer holds every sim's bridges and
veths, so a node's own kernel log is kept in state.json (``kernel_log``: a list of
``{"t": seconds after boot, "msg": ...}`` for the boot lines, ``{"at": epoch, "msg": ...}``
for what faults log later, e.g. ``gpu-xid``'s NVRM Xid line). Boot is the node's: its
``/proc/uptime`` counts from ``spark-sim up`` (a time namespace).

``journalctl -k`` (``-b``, ``--since -24h`` / ``--since @EPOCH``, ``-o short-iso``,
``--no-pager``, ``-q``) prints ``2026-12-01T15:56:05+0000 spark-1 kernel: MSG`` lines,
``-- No entries --`` when none match, as systemd does; without ``-k`` (a unit's journal)
there are no entries. ``dmesg`` prints ``[   12.345678] MSG`` (``-T``/``--ctime``: the
wall-clock form). With ``kernel_log_restricted`` set (the view of an SSH user outside the
adm / systemd-journal groups under ``kernel.dmesg_restrict=1``) both refuse with the real
tools' words.
"""

from __future__ import annotations

import re
import socket
import sys
import time
from typing import Any

from .ports import load_state

HINT = (
    "Hint: You are currently not seeing messages from other users and the system.\n"
    "      Users in groups 'adm', 'systemd-journal' can see all messages.\n"
    "      Pass -q to turn off this notice.\n"
)
NO_PERMISSION = "No journal files were opened due to insufficient permissions.\n"
DMESG_REFUSED = "dmesg: read kernel buffer failed: Operation not permitted\n"


def _boot_epoch() -> float:
    try:
        with open("/proc/uptime") as fh:
            return time.time() - float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time()


def _entries(state: dict[str, Any], boot: float) -> list[tuple[float, str]]:
    """(epoch, message) of every kernel line, in time order (``boot``: the boot epoch)."""
    out = []
    for e in state.get("kernel_log") or ():
        if not isinstance(e, dict) or "msg" not in e:
            continue
        at = float(e["at"]) if "at" in e else boot + float(e.get("t", 0.0))
        out.append((max(at, boot), str(e["msg"])))
    return sorted(out, key=lambda x: x[0])


def _since(value: str, now: float) -> float | None:
    m = re.fullmatch(r"-(\d+)([smhd])", value.strip())
    if m:
        return now - int(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]
    if value.startswith("@"):
        try:
            return float(value[1:])
        except ValueError:
            return None
    return None


def journalctl(node_dir: str, argv: list[str]) -> int:
    state = load_state(node_dir)
    quiet = "-q" in argv or "--quiet" in argv
    if state.get("kernel_log_restricted"):
        if not quiet:
            sys.stderr.write(HINT)
        sys.stderr.write(NO_PERMISSION)
        return 1
    kernel = "-k" in argv or "--dmesg" in argv
    since: float | None = None
    for i, a in enumerate(argv):
        if a == "--since" and i + 1 < len(argv):
            since = _since(argv[i + 1], time.time())
        elif a.startswith("--since="):
            since = _since(a.split("=", 1)[1], time.time())
    host = socket.gethostname()
    lines = []
    if kernel:
        for at, msg in _entries(state, _boot_epoch()):
            if since is not None and at < since:
                continue
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(at))
            lines.append(f"{stamp} {host} kernel: {msg}\n")
    sys.stdout.write("".join(lines) if lines else "-- No entries --\n")
    return 0


def dmesg(node_dir: str, argv: list[str]) -> int:
    state = load_state(node_dir)
    if state.get("kernel_log_restricted"):
        sys.stderr.write(DMESG_REFUSED)
        return 1
    boot = _boot_epoch()
    ctime = "-T" in argv or "--ctime" in argv
    out = []
    for at, msg in _entries(state, boot):
        if ctime:
            out.append(f"[{time.strftime('%a %b %e %H:%M:%S %Y', time.gmtime(at))}] {msg}\n")
        else:
            out.append(f"[{at - boot:12.6f}] {msg}\n")
    sys.stdout.write("".join(out))
    return 0
