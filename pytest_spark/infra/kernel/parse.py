"""Parsers of the kernel-log facts that are not the GPU driver's: ``journalctl
--list-boots`` (both forms), PCIe AER lines (``pcieport ...: AER: ...``, ``... PCIe Bus
Error: severity=...``) and the signature of a clean shutdown at the end of a boot's
journal. Pure functions over text. Recorded real outputs: ``fixtures/kernel/`` (each
source named in its README). The driver's NVRM / Xid lines are
:func:`pytest_spark.infra.gpuhealth.parse.parse_kernel_log`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.gpuhealth.parse import line_time

__all__ = [
    "CX7_PCI",
    "AerEvent",
    "Boot",
    "clean_shutdown_line",
    "is_aer_line",
    "parse_aer",
    "parse_list_boots",
]

# The DGX Spark's two ConnectX-7 functions and their root ports: 0000:01:00.x behind
# 0000:00:00.0 (enp1s0f*, rocep1s0f*) and 0002:01:00.x behind 0002:00:00.0 (enP2p1s0f*,
# roceP2p1s0f*) (MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146). The GPU is
# 000f:01:00.0: its errors are the driver's (Xid), not these.
CX7_PCI = re.compile(r"^000[02]:(?:00:00\.0|01:00\.[0-7])$")


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


@dataclass(frozen=True)
class AerEvent:
    """One PCIe AER kernel line: the device that logged it, the device the error came
    from (``received: 0000:01:00.0``; the logger's own otherwise), its severity
    (``uncorrectable`` / ``correctable``, the kernels' two spellings each folded into
    one), ``fatal`` for an uncorrectable fatal one, and when (:func:`line_time`)."""

    line: str
    device: str
    source: str
    severity: str
    fatal: bool = False
    at: float | None = None

    @property
    def on_cx7(self) -> bool:
        return bool(CX7_PCI.match(self.source) or CX7_PCI.match(self.device))


_AER_DEV = re.compile(
    r"(?P<dev>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]):\s+(?:AER:|PCIe Bus Error)"
)
_SEVERITY = re.compile(r"\b(Uncorrect(?:ed|able)|Correct(?:ed|able))\b(?:\s*\((\w[\w-]*)\))?")
_FROM = re.compile(r"(?:received|from):?\s+(?:id=)?([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])")


def is_aer_line(line: str) -> bool:
    return _AER_DEV.search(line) is not None


def parse_aer(text: str) -> list[AerEvent]:
    """Kernel lines (any prefix: ``journalctl -o short-iso``, ``dmesg``) -> the AER
    lines that carry a severity, in order: ``AER: Uncorrected (Fatal) error received:
    DEV``, ``AER: Correctable error message received from DEV``, ``PCIe Bus Error:
    severity=Corrected, ...``. The detail lines (``device [15b3:1021] error
    status/mask=...``, ``[ 0] RxErr``) carry none and are left out."""
    events = []
    for raw in text.splitlines():
        line = raw.strip()
        m = _AER_DEV.search(line)
        if m is None:
            continue
        sev = _SEVERITY.search(line[m.end() :])
        if sev is None:
            continue
        src = _FROM.search(line[m.end() :])
        severity = "uncorrectable" if sev[1].startswith("Uncorrect") else "correctable"
        fatal = severity == "uncorrectable" and (sev[2] or "").lower() == "fatal"
        events.append(
            AerEvent(line, m["dev"], src[1] if src else m["dev"], severity, fatal, line_time(line))
        )
    return events


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
