"""Parsers of GPU health outputs: ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``,
``nvidia-smi -q`` (its indented ``Key : Value`` text), NVML's clocks event reasons (the
``clocks_event_reasons.active`` bitmask) and the kernel log's ``NVRM`` / ``Xid`` lines
(``journalctl -k`` or ``dmesg``). Pure functions over text.

GB10 reports many fields as ``[N/A]`` (memory, power limit, some temperatures): every value
here is ``None`` when the tool could not read it, never a failure of the parser. Recorded
real outputs: ``fixtures/gpu/`` (each source named in its README).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from pytest_spark.infra.errors import ParseError

__all__ = [
    "QUERY_FIELDS",
    "REASONS",
    "XID_CATALOG",
    "KernelEvent",
    "QueryRow",
    "XidInfo",
    "line_time",
    "no_memory_burst",
    "parse_kernel_log",
    "parse_query_gpu",
    "parse_smi_q",
    "reasons_from_mask",
    "reasons_from_q",
    "to_float",
]

# What the probe asks --query-gpu for, in this order (csv,noheader,nounits).
QUERY_FIELDS = (
    "index",
    "pci.bus_id",
    "temperature.gpu",
    "clocks.sm",
    "clocks.max.sm",
    "power.draw",
    "power.limit",
    "utilization.gpu",
    "pstate",
    "persistence_mode",
    "clocks_event_reasons.active",
)

# NVML's clocks event reasons (nvml.h nvmlClocksEventReason*; "throttle" before driver
# 535): bit -> (query/XML name, the label nvidia-smi -q prints under "Clocks Event Reasons").
REASONS: dict[int, tuple[str, str]] = {
    0x1: ("gpu_idle", "Idle"),
    0x2: ("applications_clocks_setting", "Applications Clocks Setting"),
    0x4: ("sw_power_cap", "SW Power Cap"),
    0x8: ("hw_slowdown", "HW Slowdown"),
    0x10: ("sync_boost", "Sync Boost"),
    0x20: ("sw_thermal_slowdown", "SW Thermal Slowdown"),
    0x40: ("hw_thermal_slowdown", "HW Thermal Slowdown"),
    0x80: ("hw_power_brake_slowdown", "HW Power Brake Slowdown"),
    0x100: ("display_clocks_setting", "Display Clock Setting"),
}
_LABELS = {label.lower(): name for name, label in REASONS.values()}

_NA = {"", "[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "unknown"}


def to_float(text: str | None) -> float | None:
    """``41``, ``4.21 W``, ``3003 MHz``, ``45 C``, ``10 %`` -> the number; N/A -> None."""
    if text is None or text.strip().lower() in _NA:
        return None
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", text)
    return float(m[1]) if m else None


@dataclass(frozen=True)
class QueryRow:
    """One GPU's ``--query-gpu`` answer: field -> raw value (None for N/A)."""

    values: dict[str, str | None]

    def text(self, field: str) -> str | None:
        return self.values.get(field)

    def number(self, field: str) -> float | None:
        return to_float(self.values.get(field))


def parse_query_gpu(text: str, fields: tuple[str, ...] = QUERY_FIELDS) -> list[QueryRow]:
    """``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits``: one row per GPU,
    the values in the order asked. A row with another column count is not this format."""
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise ParseError(
                "nvidia-smi --query-gpu",
                f"expected {len(fields)} columns ({','.join(fields)}), got {len(cells)}",
                line,
                lineno,
            )
        values = {f: (None if c.lower() in _NA else c) for f, c in zip(fields, cells, strict=True)}
        rows.append(QueryRow(values))
    return rows


def parse_smi_q(text: str) -> list[dict[str, str]]:
    """``nvidia-smi -q [-d ...]``: per GPU (each ``GPU 0000000F:01:00.0`` block), its
    ``Section/Sub/Key -> value`` pairs from the indented ``Key : Value`` lines (the
    header lines above the first GPU are left out)."""
    gpus: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("="):
            continue
        if re.match(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d", line):
            current = {"Bus Id": line.split(None, 1)[1].strip()}
            gpus.append(current)
            stack = []
            continue
        if current is None:
            continue
        indent = len(line) - len(line.lstrip(" \t"))
        key, sep, value = line.strip().partition(":")
        key = key.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([s for _, s in stack] + [key])
        if sep and value.strip():
            current[path] = value.strip()
        stack.append((indent, key))  # a keyed line may have children (HW Slowdown)
    return gpus


def reasons_from_mask(text: str | None) -> dict[str, bool] | None:
    """``clocks_event_reasons.active`` (``0x0000000000000001``) -> every known reason ->
    active; None when N/A or not a hex mask."""
    if text is None:
        return None
    try:
        mask = int(text.strip(), 16)
    except ValueError:
        return None
    return {name: bool(mask & bit) for bit, (name, _) in REASONS.items()}


def reasons_from_q(gpu: dict[str, str]) -> dict[str, bool] | None:
    """The ``Clocks Event Reasons`` block of ``-q`` (``Clocks Throttle Reasons`` before
    driver 535; ``HW Thermal Slowdown`` nests under ``HW Slowdown``) -> reason -> active;
    None when the block is absent. A value that is neither Active nor Not Active (N/A)
    leaves that reason out."""
    out: dict[str, bool] = {}
    for path, value in gpu.items():
        parts = path.split("/")
        if parts[0] not in ("Clocks Event Reasons", "Clocks Throttle Reasons"):
            continue
        name = _LABELS.get(parts[-1].lower())
        v = value.strip().lower()
        if name is not None and v in ("active", "not active"):
            out[name] = v == "active"
    return out or None


# ------------------------------------------------------------------------------ kernel log


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
