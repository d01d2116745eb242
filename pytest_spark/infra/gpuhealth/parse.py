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

__all__ = [
    "QUERY_FIELDS",
    "REASONS",
    "parse_smi_q",
    "reasons_from_mask",
    "reasons_from_q",
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
