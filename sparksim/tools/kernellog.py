"""Fake ``journalctl`` and ``dmesg`` of a node: its kernel log since boot, from state.json.

The nodes share the machine's kernel, whose ring buffer holds every sim's bridges and
veths, so a node's own kernel log is kept in state.json (``kernel_log``: a list of
``{"t": seconds after boot, "msg": ...}`` for the boot lines, ``{"at": epoch, "msg": ...}``
for what faults log later, e.g. ``gpu-xid``'s NVRM Xid line). Boot is the node's: its
``/proc/uptime`` counts from ``spark-sim up`` (a time namespace).

``journalctl -k`` (``-b``, ``--since -24h`` / ``--since @EPOCH``, ``-o short-iso``,
``--no-pager``, ``-q``, ``-n N``) prints ``2026-12-01T15:56:05+0000 spark-1 kernel: MSG``
lines, ``-- No entries --`` when none match, as systemd does; without ``-k`` this boot has
no entries (the units' journal is not kept). The journal is persistent: it also holds the
previous boot (state.json ``previous_boot``, every unit's lines, ending with a clean
shutdown unless the ``unclean-shutdown`` fault cut it), read with ``-b -1``, listed by
``--list-boots`` (systemd >= 254's table with its header). ``dmesg`` prints
``[   12.345678] MSG`` (``-T``/``--ctime``: the wall-clock form). With
``kernel_log_restricted`` set (the view of an SSH user outside the adm / systemd-journal
groups under ``kernel.dmesg_restrict=1``) both refuse with the real tools' words.
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
    """(epoch, message) of every kernel line of this boot, in time order (``boot``: the
    boot epoch)."""
    out = []
    for e in state.get("kernel_log") or ():
        if not isinstance(e, dict) or "msg" not in e:
            continue
        at = float(e["at"]) if "at" in e else boot + float(e.get("t", 0.0))
        out.append((max(at, boot), str(e["msg"])))
    return sorted(out, key=lambda x: x[0])


def _previous(state: dict[str, Any], boot: float) -> list[tuple[float, str, str]]:
    """(epoch, identifier, message) of the previous boot's lines, every unit's, in time
    order: state.json ``previous_boot.log`` entries ``{"t": seconds from this boot's
    start (negative), "ident": "kernel" | "systemd[1]" | ..., "msg": ...}``."""
    prev = state.get("previous_boot")
    if not isinstance(prev, dict):
        return []
    out = [
        (boot + float(e.get("t", -1.0)), str(e.get("ident") or "kernel"), str(e["msg"]))
        for e in prev.get("log") or ()
        if isinstance(e, dict) and "msg" in e
    ]
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


def _option(argv: list[str], short: str, long: str) -> tuple[bool, str | None]:
    """Whether ``-b``-like option is given, and its value when it has one (``-b -1``,
    ``-b=-1``, ``--boot=-1``, ``-n 15``, ``-n15``); an option-looking next word is not
    its value unless it is a negative number."""
    for i, a in enumerate(argv):
        if a in (short, long):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is not None and (re.fullmatch(r"-?\d+|[0-9a-f]{32}", nxt)):
                return True, nxt
            return True, None
        if a.startswith(long + "="):
            return True, a.split("=", 1)[1]
        if a.startswith(short) and len(a) > 2 and not a.startswith("--"):
            return True, a[2:].lstrip("=")
    return False, None


def _day(at: float) -> str:
    return time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def _list_boots(state: dict[str, Any], boot: float) -> int:
    """systemd >= 254's table: a header, then one line a boot, oldest first."""
    rows = []
    prev = _previous(state, boot)
    if prev:
        prev_id = str((state.get("previous_boot") or {}).get("id", "0" * 32))
        rows.append(f" -1 {prev_id} {_day(prev[0][0])} {_day(prev[-1][0])}")
    rows.append(f"  0 {state.get('boot_id', 'f' * 32)} {_day(boot)} {_day(time.time())}")
    header = "IDX BOOT ID                          FIRST ENTRY                 LAST ENTRY"
    sys.stdout.write("\n".join([header, *rows]) + "\n")
    return 0


def journalctl(node_dir: str, argv: list[str]) -> int:
    state = load_state(node_dir)
    quiet = "-q" in argv or "--quiet" in argv
    if state.get("kernel_log_restricted"):
        if not quiet:
            sys.stderr.write(HINT)
        sys.stderr.write(NO_PERMISSION)
        return 1
    boot = _boot_epoch()
    if "--list-boots" in argv:
        return _list_boots(state, boot)
    kernel = "-k" in argv or "--dmesg" in argv
    since: float | None = None
    for i, a in enumerate(argv):
        if a == "--since" and i + 1 < len(argv):
            since = _since(argv[i + 1], time.time())
        elif a.startswith("--since="):
            since = _since(a.split("=", 1)[1], time.time())
    has_boot, which = _option(argv, "-b", "--boot")
    if kernel and not has_boot:
        has_boot, which = True, "0"  # -k implies -b (journalctl(1))
    prev = [
        (at, ident, msg)
        for at, ident, msg in _previous(state, boot)
        if not kernel or ident == "kernel"
    ]
    this = [(at, "kernel", msg) for at, msg in _entries(state, boot)] if kernel else []
    if not has_boot:
        entries = prev + this
    elif which in (None, "0", state.get("boot_id")):
        entries = this
    elif which in ("-1", (state.get("previous_boot") or {}).get("id")) and prev:
        entries = prev
    else:
        sys.stderr.write(
            f"Data from the specified boot ({which}) is not available: No such boot ID in journal\n"
        )
        return 1
    if since is not None:
        entries = [e for e in entries if e[0] >= since]
    has_n, n = _option(argv, "-n", "--lines")
    if has_n:
        entries = entries[-int(n or 10) :] if int(n or 10) > 0 else []
    host = socket.gethostname()
    lines = [
        f"{time.strftime('%Y-%m-%dT%H:%M:%S+0000', time.gmtime(at))} {host} {ident}: {msg}\n"
        for at, ident, msg in entries
    ]
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
