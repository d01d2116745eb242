"""Parsers of the kernel-log facts that are not the GPU driver's: ``journalctl
--list-boots`` (both forms), and the signature of a clean shutdown at the end of a boot's
journal. Pure functions over text. Recorded real outputs: ``fixtures/kernel/`` (each
source named in its README). The driver's NVRM / Xid lines and the AER
lines are the shared reader's (:mod:`pytest_spark.infra.kernellog`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_spark.infra.errors import ParseError

__all__ = [
    "Boot",
    "clean_shutdown_line",
    "parse_list_boots",
]


@dataclass(frozen=True)
class Boot:
    """One line of ``journalctl --list-boots``: its offset (0 this boot, -1 the one
    before), its ID and its first and last entries as printed."""

    index: int
    boot_id: str
    first: str
    last: str


_BOOT = re.compile(r"^\s*(?P<idx>-?\d+)\s+(?P<id>[0-9a-f]{32})\s+(?P<times>.*)$")
_STAMP = re.compile(r"\w{3} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [A-Za-z]{1,5}| [+-]\d{2}:?\d{2})?")


def parse_list_boots(text: str) -> list[Boot]:
    """``journalctl --list-boots`` -> the boots, oldest first. systemd >= 254 prints a
    ``IDX BOOT ID FIRST ENTRY LAST ENTRY`` header (not a boot: counting it would report
    two boots on a journal that holds one); older ones join the two times with an em
    dash. ``-- No entries --`` (an empty journal) is no boot."""
    boots = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith(("IDX", "--")):
            continue
        m = _BOOT.match(line)
        times = _STAMP.findall(m["times"]) if m else []
        if m is None or len(times) != 2:
            raise ParseError(
                "journalctl --list-boots", "expected `IDX BOOT-ID FIRST-ENTRY LAST-ENTRY`", line
            )
        boots.append(Boot(int(m["idx"]), m["id"], times[0], times[1]))
    return sorted(boots, key=lambda b: b.index)


# The lines a boot's journal ends with when it was shut down on purpose: systemd stopping
# units, reaching the shutdown targets, journald stopping ("Journal stopped"), or the
# kernel's own last words. The journal may close before journald's final line, so an
# orderly ending shows any of them among the last lines.
_CLEAN = re.compile(
    r"Journal stopped|systemd-shutdown|Shutting down\.|"
    r"Reached target .*(?:Shutdown|Power-?Off|Reboot|Halt|Kexec)|"
    r"Stopped target|Unmounted /|reboot: (?:Power down|Restarting system)",
    re.IGNORECASE,
)


def clean_shutdown_line(lines: list[str]) -> str | None:
    """The line among a boot's last ``lines`` that says it was shut down on purpose,
    None when it ended without one (a hard reset, a power loss, a wedge)."""
    for line in reversed(lines):
        if _CLEAN.search(line):
            return line.strip()
    return None
