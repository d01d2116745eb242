"""The kernel log, read once per node and shared by the checks that judge it: the GPU
driver's NVRM / Xid lines (this boot: infra.gpuhealth; the previous boot: infra.kernel),
PCIe AER lines (infra.kernel), when a line was logged, the NVRM out-of-memory burst, and
the fixes NVIDIA's catalog and the field name for them.

Pure functions and types over text (``journalctl -k -o short-iso``, ``dmesg``, a syslog
file: the message is found by its prefix). Recorded real outputs: ``fixtures/gpu/`` and
``fixtures/kernel/`` (each source named in its README).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from pytest_spark.infra.probe import ProbeSection
from pytest_spark.settings.sections import GpuHealthSection

__all__ = [
    "CX7_PCI",
    "KERNEL_VERDICT",
    "NO_MEMORY_FIX",
    "POWER_CYCLE",
    "XID_CATALOG",
    "AerEvent",
    "KernelEvent",
    "KernelLog",
    "XidInfo",
    "is_aer_line",
    "kernel_log_of",
    "line_time",
    "no_memory_burst",
    "no_memory_text",
    "parse_aer",
    "parse_kernel_log",
]

# The check that reads this boot's kernel log; a check that needs the same log cites it.
KERNEL_VERDICT = "test_gpu_kernel_errors"

NO_MEMORY_FIX = (
    "the driver ran out of GB10 unified memory: lower the engine's claim "
    "(--gpu-memory-utilization) so the OS keeps its headroom (test_memory_headroom) and "
    "stop other GPU processes; a burst of these wedged hosts until a power cycle "
    "(open-gpu-kernel-modules#1358, dgx-spark-playbooks#97): reboot the node before serving"
)
POWER_CYCLE = (
    "power-cycle the Spark: unplug its USB-C power brick from the wall and the Spark for "
    "60 s, then reconnect (a fresh power negotiation); check the brick and cable are the "
    "supplied ones and fully seated"
)

# The DGX Spark's two ConnectX-7 functions and their root ports: 0000:01:00.x behind
# 0000:00:00.0 (enp1s0f*, rocep1s0f*) and 0002:01:00.x behind 0002:00:00.0 (enP2p1s0f*,
# roceP2p1s0f*) (MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146). The GPU is
# 000f:01:00.0: its errors are the driver's (Xid), not these.
CX7_PCI = re.compile(r"^000[02]:(?:00:00\.0|01:00\.[0-7])$")


@dataclass(frozen=True)
class XidInfo:
    """What NVIDIA's Xid catalog says about one code (docs.nvidia.com/deploy/xid-errors):
    its meaning and the catalog's immediate action, as an operator's fix."""

    meaning: str
    action: str


_RESTART_APP = "restart the application (vLLM); if it recurs, reset the GPU (reboot the node)"
_RESET = "reset the GPU: drain the node and reboot it; if it recurs, contact NVIDIA support"
_REBOOT = "power-cycle the node (a cold reboot); if it recurs, check power delivery and RMA"
XID_CATALOG: dict[int, XidInfo] = {
    8: XidInfo("GPU stopped processing", _RESTART_APP),
    13: XidInfo("graphics engine exception (usually the application's fault)", _RESTART_APP),
    31: XidInfo("GPU memory page fault (usually the application's fault)", _RESTART_APP),
    32: XidInfo("invalid or corrupted push buffer stream", _RESET),
    38: XidInfo("driver firmware error", _RESET),
    43: XidInfo("GPU stopped processing (a user application fault)", _RESTART_APP),
    45: XidInfo("preemptive cleanup, after an earlier error or an application killed", ""),
    46: XidInfo("GPU stopped processing", _RESET),
    48: XidInfo("double-bit ECC error", _RESET),
    56: XidInfo("display engine error", _RESET),
    61: XidInfo("internal micro-controller breakpoint/warning", _RESET),
    62: XidInfo("internal micro-controller halt", _RESET),
    63: XidInfo("ECC page retirement or row remapping recorded", _RESET),
    64: XidInfo("ECC page retirement or row remapping failure", _RESET),
    68: XidInfo("video processor exception", _RESTART_APP),
    69: XidInfo("graphics engine class error", _RESET),
    74: XidInfo("NVLink error", _RESET),
    79: XidInfo("GPU has fallen off the bus", _REBOOT),
    92: XidInfo("high single-bit ECC error rate", _RESET),
    94: XidInfo("contained ECC error", _RESTART_APP),
    95: XidInfo("uncontained ECC error", _RESET),
    109: XidInfo("context switch timeout", _RESTART_APP),
    119: XidInfo("GSP RPC timeout", _RESET),
    120: XidInfo("GSP error", _RESET),
    121: XidInfo("C2C link error", _RESET),
    140: XidInfo("unrecovered ECC error", _RESET),
    143: XidInfo("GPU initialization failure", _REBOOT),
    154: XidInfo("GPU recovery action changed (reset or reboot required)", _REBOOT),
    169: XidInfo("GSP/firmware fault at initialisation", _REBOOT),
}

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<code>\d+)(?P<rest>.*)$")
# NVRM lines that are errors (the healthy driver prints NVRM lines too: "loading NVIDIA
# UNIX Open Kernel Module", "GPU at PCI:... : GPU-<uuid>", "Persistence mode is ...").
_NVRM_ERROR = re.compile(
    r"NVRM: .*(fallen off the bus|RmInitAdapter failed|rm_init_adapter failed|"
    r"failed to|\bfailed\b|error|timeout|timed out|crash dump|assertion|"
    r"not responding|lost|unrecoverable|reset required)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class KernelEvent:
    """One NVRM error line: ``xid`` (the code) for an Xid line, None for another NVRM
    error (``RmInitAdapter failed``, ``GPU ... has fallen off the bus``). ``soft``: a
    driver assertion (``nvAssertFailedNoLog: Assertion failed``), which healthy drivers
    also print now and then: worth a look, not a failed GPU."""

    line: str
    xid: int | None = None
    pci: str | None = None
    detail: str = ""
    soft: bool = False
    at: float | None = None  # line_time(): epoch (journal) or seconds since boot (dmesg)

    @property
    def no_memory(self) -> bool:
        """The driver's allocation failure on GB10 unified memory (``NVRM:
        nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY]``,
        dgx-spark-playbooks#97): one during warm-up is a transient probe, a burst wedges
        the host (open-gpu-kernel-modules#1358)."""
        return "NV_ERR_NO_MEMORY" in self.line


_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?)([+-]\d\d:?\d\d|Z)?\s")
_MONO = re.compile(r"^\[\s*(\d+\.\d+)\]")


def line_time(line: str) -> float | None:
    """When a kernel line was logged: epoch seconds of a ``journalctl -o short-iso``
    stamp (``2026-08-12T10:11:12+0000``), seconds since boot of a ``dmesg`` one
    (``[  123.456789]``), None for another form (only compared within one boot's lines)."""
    m = _ISO.match(line.strip())
    if m:
        zone = (m[2] or "+0000").replace("Z", "+0000").replace(":", "")
        stamp = m[1].replace(",", ".")
        fmt = "%Y-%m-%dT%H:%M:%S.%f%z" if "." in stamp else "%Y-%m-%dT%H:%M:%S%z"
        try:
            return datetime.strptime(stamp + zone, fmt).timestamp()
        except ValueError:
            return None
    m = _MONO.match(line.strip())
    return float(m[1]) if m else None


def no_memory_burst(events: list[KernelEvent], lines: int, window_s: float) -> list[KernelEvent]:
    """The ``NV_ERR_NO_MEMORY`` lines of the densest ``window_s`` when they are ``lines``
    or more (a burst), else none: one or two during warm-up are the driver's allocation
    probes (MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#32), a burst of them wedged
    hosts (open-gpu-kernel-modules#1358: 202 lines). Lines without a time count as one
    window."""
    oom = [e for e in events if e.no_memory]
    if any(e.at is None for e in oom):
        return oom if len(oom) >= lines else []
    best: list[KernelEvent] = []
    start = 0
    for end, e in enumerate(oom):
        while e.at - oom[start].at > window_s:  # type: ignore[operator]
            start += 1
        if end + 1 - start > len(best):
            best = oom[start : end + 1]
    return best if len(best) >= lines else []


def parse_kernel_log(text: str) -> list[KernelEvent]:
    """Kernel log lines (``journalctl -k -o short-iso``, ``dmesg``, ``dmesg --ctime``, a
    syslog file) -> the NVRM errors among them, in order. Any line format: the message is
    found by its ``NVRM:`` prefix."""
    events = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if "NVRM:" not in line:
            continue
        m = _XID.search(line)
        if m:
            rest = m["rest"].lstrip(", ")
            at = line_time(line)
            events.append(KernelEvent(line.strip(), int(m["code"]), m["pci"], rest, at=at))
        elif _NVRM_ERROR.search(line):
            detail = line.split("NVRM:", 1)[1].strip()
            soft = re.search(r"\bassert", detail, re.IGNORECASE) is not None
            events.append(KernelEvent(line.strip(), detail=detail, soft=soft, at=line_time(line)))
    return events


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


@dataclass(frozen=True)
class KernelLog:
    """The kernel log since boot: ``source`` (``journalctl -k -b`` or ``dmesg``) and how
    many lines it held, or None with ``refused`` saying why no source could be read."""

    source: str | None
    lines: int
    events: tuple[KernelEvent, ...] = ()
    refused: tuple[str, ...] = ()
    aer: tuple[AerEvent, ...] = ()  # PCIe AER lines (infra.kernel.check reads them)


def kernel_log_of(section: ProbeSection | None) -> KernelLog:
    """The ``kernel_log`` section of a probe (:data:`KERNEL_LOG_BODY`-style output:
    ``source NAME lines N``, then the lines) as a :class:`KernelLog`."""
    if section is None:
        return KernelLog(None, 0, refused=("the kernel log was not probed",))
    refused = tuple(
        ln.strip().removeprefix("refused ")
        for ln in section.stderr.splitlines()
        if ln.startswith("refused ")
    )
    lines = section.stdout.splitlines()
    m = re.match(r"^source (\S+) lines (\d+)$", lines[0].strip()) if lines else None
    if section.rc != 0 or m is None:
        why = refused or (f"exit {section.rc}",)
        return KernelLog(None, 0, refused=why)
    source = "journalctl -k -b" if m[1] == "journalctl" else "dmesg"
    text = "\n".join(lines[1:])
    return KernelLog(
        source, int(m[2]), tuple(parse_kernel_log(text)), refused, tuple(parse_aer(text))
    )


def _clock(at: float | None) -> str:
    """A line's time as a person reads it: UTC for a journal's epoch, seconds since boot
    for dmesg's."""
    if at is None:
        return "?"
    if at > 1e9:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{at:.0f} s after boot"


def no_memory_text(
    oom: list[KernelEvent], burst: list[KernelEvent], section: GpuHealthSection
) -> str:
    """``N x NV_ERR_NO_MEMORY (first ..., last ...; a burst: M within W s)`` for a
    message."""
    span = f"first {_clock(oom[0].at)}, last {_clock(oom[-1].at)}"
    if burst:
        how = f"a burst: {len(burst)} within {section.nvrm_burst_window_s:.0f} s"
    else:
        how = (
            f"fewer than a burst of {section.nvrm_burst_lines} within "
            f"{section.nvrm_burst_window_s:.0f} s: a transient allocation failure"
        )
    return f"{len(oom)} x NVRM NV_ERR_NO_MEMORY ({span}; {how})"
