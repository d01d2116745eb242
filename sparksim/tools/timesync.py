"""Fake ``timedatectl`` of a node: the NTP state comes from state.json (``time`` key:
``ntp``, the NTP service enabled, and ``synchronized``, the kernel's synchronised flag
as systemd-timesyncd or chronyd set it); the clock itself is the machine's (or the
``clock`` fault's offset). ``show`` prints systemd's ``KEY=VALUE`` form, no argument (or
``status``) the human table, as systemd 252+ does; ``set-ntp`` is refused as it is
without polkit rights over SSH."""

from __future__ import annotations

import sys
import time

from .ports import load_state


def _yes(flag: object) -> str:
    return "yes" if flag else "no"


def timedatectl(node_dir: str, argv: list[str]) -> int:
    state = load_state(node_dir)
    sync = state.get("time") or {}
    ntp = bool(sync.get("ntp", True))
    synced = bool(sync.get("synchronized", True))
    now = time.time() + float(state.get("clock_offset_s") or 0.0)
    stamp = time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime(now))
    verb = argv[0] if argv else "status"
    if verb == "show":
        sys.stdout.write(
            "Timezone=Etc/UTC\nLocalRTC=no\nCanNTP=yes\n"
            f"NTP={_yes(ntp)}\nNTPSynchronized={_yes(synced)}\n"
            f"TimeUSec={stamp}\nRTCTimeUSec={stamp}\n"
        )
        return 0
    if verb == "status":
        sys.stdout.write(
            f"               Local time: {stamp}\n"
            f"           Universal time: {stamp}\n"
            f"                 RTC time: {stamp[4:-4]}\n"
            "                Time zone: Etc/UTC (UTC, +0000)\n"
            f"System clock synchronized: {_yes(synced)}\n"
            f"              NTP service: {'active' if ntp else 'inactive'}\n"
            "          RTC in local mode: no\n"
        )
        return 0
    sys.stderr.write(f"Failed to {verb}: Access denied\n")
    return 1
