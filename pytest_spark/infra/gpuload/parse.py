"""Parsers of the pre-serving GPU load's output: the ``nvidia-smi --query-gpu`` samples
taken while it ran, and the load program's own summary line. Pure: text in, values out."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.smi import parse_query_gpu

__all__ = ["SAMPLE_FIELDS", "GpuSample", "LoadSummary", "parse_load_summary", "parse_samples"]

# What one sample asks nvidia-smi; GB10 answers each (rwlove/home-ops PR #13238: SM_CLOCK,
# POWER_USAGE, GPU_TEMP, GPU_UTIL work; memory fields do not).
SAMPLE_FIELDS = (
    "index",
    "clocks.sm",
    "clocks.max.sm",
    "power.draw",
    "temperature.gpu",
    "utilization.gpu",
    "pstate",
)


@dataclass(frozen=True)
class GpuSample:
    """One GPU's readings at one instant of the load; None where nvidia-smi said N/A."""

    index: int | None
    sm_clock_mhz: float | None
    max_sm_clock_mhz: float | None
    power_w: float | None
    temperature_c: float | None
    util_pct: float | None
    pstate: str | None


def parse_samples(text: str) -> list[GpuSample]:
    """Every row of repeated ``nvidia-smi --query-gpu=SAMPLE_FIELDS
    --format=csv,noheader,nounits`` calls, in order (one row per GPU per call)."""
    samples = []
    for row in parse_query_gpu(text, SAMPLE_FIELDS):
        index = row.number("index")
        samples.append(
            GpuSample(
                index=int(index) if index is not None else None,
                sm_clock_mhz=row.number("clocks.sm"),
                max_sm_clock_mhz=row.number("clocks.max.sm"),
                power_w=row.number("power.draw"),
                temperature_c=row.number("temperature.gpu"),
                util_pct=row.number("utilization.gpu"),
                pstate=row.text("pstate"),
            )
        )
    return samples


@dataclass(frozen=True)
class LoadSummary:
    """What the load program says it ran: ``device`` is ``cuda`` (matmuls on the GPU) or
    ``cpu`` (no torch with CUDA where it ran: the GPU was not loaded by it), ``why`` the
    reason it fell back, ``where`` the container image or ``host``."""

    device: str
    seconds: float
    work: int
    where: str
    why: str = ""


_SUMMARY = re.compile(
    r"^load device=(?P<device>\S+) seconds=(?P<seconds>[\d.]+) work=(?P<work>\d+)"
    r" where=(?P<where>\S+)(?: why=(?P<why>.*))?$"
)


def parse_load_summary(text: str) -> LoadSummary:
    """The load program's last ``load device=... seconds=... work=... where=...`` line."""
    for line in reversed(text.splitlines()):
        m = _SUMMARY.match(line.strip())
        if m:
            return LoadSummary(
                m["device"], float(m["seconds"]), int(m["work"]), m["where"], m["why"] or ""
            )
    raise ParseError(
        "GPU load program", "a line `load device=D seconds=S work=N where=W`", text[-300:]
    )
