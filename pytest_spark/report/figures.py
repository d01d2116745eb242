"""Figures of a run, read from the JSON results document (pure, tolerant of missing data).

Sources (what the checks attach with ``spark_check.attach`` and what serving recorded):

- NCCL: ``extra.busbw_series`` = ``[{"bytes" | "size_bytes": int, "busbw_gbps": float,
  "algbw_gbps": float}, ...]`` (or ``{"points": [...]}``, checks/nccl.py's
  ``BusbwSeries.to_dict()``) on a check whose ``expected`` is the busbw threshold; a dict
  may say its ``collective`` (``all_gather``: tests_infra/test_nccl.py's all-gather check).
- NCCL latency: ``extra.latency_series`` = ``{"points": [{"size_bytes", "time_us"}, ...],
  "max_latency_us": float | None}`` (checks/collectives.py ``LatencySeries.to_dict()``).
- Throughput: ``extra.sweep`` = ``{"levels": [level, ...]}`` (tests_e2e/test_throughput.py),
  ``extra.throughput_sweep`` = ``[level, ...]``, or the ``extra.level`` of the threshold
  checks; a level is ``{"concurrency", "output_tok_s", "ttft_s": {"median"|"p50", "p90",
  "p99", ...}, "tpot_s": {...}}``.
- Startup: ``doc["serving"]["timeline"]`` (or ``extra.startup_timeline``) =
  ``[{"phase", "start_s", "end_s"}]`` and ``doc["serving"]["ready_s"]``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from pytest_spark.report.samples import enough_for, percentile_text
from pytest_spark.settings.parsers import FAMILIES

# The model's load time is the figure "startup" (``startup``, ``startup.<phase>`` in the
# history); "load" is the category of the open-loop and soak checks. History records written
# before the rename say "load": ``renamed_metric`` reads them under the new name.
OLD_METRIC_NAMES = {"load": "startup"}


def renamed_metric(name: str) -> str:
    """A figure's current name: ``load`` -> ``startup``, ``load.weights`` ->
    ``startup.weights`` (history written before issue #27 §4)."""
    for old, new in OLD_METRIC_NAMES.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return name


@dataclass(frozen=True)
class BusbwSeries:
    label: str
    node: str | None
    points: list[tuple[int, float, float | None]]  # (bytes, busbw GB/s, algbw GB/s)
    threshold: float | None
    collective: str = "all_reduce"

    @property
    def peak(self) -> float:
        return max(p[1] for p in self.points)

    @property
    def largest(self) -> float:
        """busbw at the largest message size: the steady-state figure the check judges."""
        return self.points[-1][1]


@dataclass(frozen=True)
class LatencySeries:
    """Small-message time versus size (µs) and the profile's ceiling."""

    label: str
    node: str | None
    points: list[tuple[int, float]]  # (bytes, µs)
    threshold: float | None

    @property
    def best(self) -> float:
        return min(p[1] for p in self.points)


@dataclass(frozen=True)
class SweepLevel:
    concurrency: int
    output_tok_s: float | None
    ttft: dict[str, float | None]  # p50/p90/p99, seconds
    tpot: dict[str, float | None]
    ttft_n: int | None = None  # the samples behind each (None: not recorded)
    tpot_n: int | None = None

    def count(self, attr: str) -> int | None:
        """The sample count behind ``ttft`` or ``tpot``."""
        return self.ttft_n if attr == "ttft" else self.tpot_n if attr == "tpot" else None


@dataclass(frozen=True)
class RatePoint:
    """One open-loop level: the offered rate, its goodput and TTFT percentiles."""

    rate: float
    goodput_pct: float | None
    met: bool
    ttft: dict[str, float | None]  # p50/p90/p99, seconds
    ttft_n: int | None = None  # the samples behind them


@dataclass(frozen=True)
class OpenLoop:
    """The open-loop sweep (tests_e2e/test_open_loop.py's ``extra.open_loop``)."""

    points: list[RatePoint]
    knee: float | None  # req/s; None: the lowest rate broke the SLOs
    min_goodput_pct: float | None
    slo: str


@dataclass(frozen=True)
class GoodputSlo:
    """The SLOs the goodput gate used (tests_e2e/test_throughput.py ``extra.goodput``):
    ceilings in seconds, each read at its percentile, at ``concurrency`` streams."""

    limits: dict[str, float]  # "ttft" | "tpot" | "e2e" -> seconds
    pcts: dict[str, float]  # the same keys -> the percentile each is read at
    concurrency: int | None

    def label(self, metric: str, scale: float = 1.0, unit: str = "s") -> str:
        pct = self.pcts.get(metric)
        at = f" @{self.concurrency} streams" if self.concurrency else ""
        read = f" p{pct:g}" if pct is not None else ""
        return f"goodput SLO{read} <= {self.limits[metric] * scale:g} {unit}{at}"


@dataclass(frozen=True)
class PhaseSpan:
    phase: str
    start: float
    end: float | None


@dataclass(frozen=True)
class Metric:
    value: float
    unit: str
    better: str  # "higher" | "lower"

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "unit": self.unit, "better": self.better}


@dataclass
class Figures:
    busbw: list[BusbwSeries] = field(default_factory=list)
    sweep: list[SweepLevel] = field(default_factory=list)
    timeline: list[PhaseSpan] = field(default_factory=list)
    ready_s: float | None = None
    # Attached to a running cluster: the suite saw no load, so none is reported (a figure
    # that was not measured says so instead of showing the attach wait as a load time).
    attached: bool = False
    latency: list[LatencySeries] = field(default_factory=list)
    open_loop: OpenLoop | None = None
    roofline: dict[str, Any] | None = None  # test_decode_single_stream's extra.roofline
    spec_decode: dict[str, Any] | None = None  # test_spec_decode_acceptance's extra
    slo: GoodputSlo | None = None

    @property
    def all_reduce(self) -> list[BusbwSeries]:
        return [s for s in self.busbw if s.collective == "all_reduce"]

    def level(self, concurrency: int) -> SweepLevel | None:
        return next((lv for lv in self.sweep if lv.concurrency == concurrency), None)

    @property
    def startup_s(self) -> float | None:
        """The model's load time: launch (or attach) to ready."""
        if self.attached:
            return None
        if self.ready_s is not None:
            return self.ready_s
        ready = [p.start for p in self.timeline if p.phase == "ready"]
        return ready[0] if ready else None

    def phase_durations(self) -> dict[str, float]:
        if self.attached:
            return {}
        return {
            p.phase: round(p.end - p.start, 3)
            for p in self.timeline
            if p.end is not None and p.phase != "ready" and p.end >= p.start
        }


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def number(value: Any) -> float | None:
    """A finite float from a number or from text such as ``">= 21.9"``; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        m = re.search(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", value)
        return float(m.group()) if m else None
    return None


def _extras(doc: dict[str, Any], name: str) -> list[tuple[dict[str, Any], Any]]:
    out = []
    for check in doc.get("checks") or ():
        extra = check.get("extra") or {}
        if isinstance(extra, dict) and name in extra:
            out.append((check, extra[name]))
    return out


def _label(check: dict[str, Any]) -> str:
    nodeid = str(check.get("nodeid") or "")
    name = nodeid.rsplit("::", 1)[-1]
    return name or str(check.get("node") or "series")


def busbw_series(doc: dict[str, Any]) -> list[BusbwSeries]:
    series = []
    for check, data in _extras(doc, "busbw_series"):
        collective = "all_reduce"
        if isinstance(data, dict):  # checks/nccl.py BusbwSeries.to_dict(): {"points": [...]}
            collective = str(data.get("collective") or collective)
            data = data.get("points")
        if not isinstance(data, list):
            continue
        points = []
        for row in data:
            if not isinstance(row, dict):
                continue
            size = number(row.get("bytes", row.get("size_bytes")))
            busbw = number(row.get("busbw_gbps"))
            if size is None or busbw is None or size <= 0:
                continue
            points.append((int(size), busbw, number(row.get("algbw_gbps"))))
        if points:
            series.append(
                BusbwSeries(
                    _label(check),
                    check.get("node"),
                    sorted(points),
                    number(check.get("expected")),
                    collective,
                )
            )
    return series


def latency_series(doc: dict[str, Any]) -> list[LatencySeries]:
    series = []
    for check, data in _extras(doc, "latency_series"):
        if not isinstance(data, dict) or not isinstance(data.get("points"), list):
            continue
        points = []
        for row in data["points"]:
            if not isinstance(row, dict):
                continue
            size, us = number(row.get("size_bytes")), number(row.get("time_us"))
            if size is not None and us is not None and size > 0 and us >= 0:
                points.append((int(size), us))
        if points:
            limit = number(data.get("max_latency_us"))
            series.append(LatencySeries(_label(check), check.get("node"), sorted(points), limit))
    return series


def _summary(data: Any) -> dict[str, float | None]:
    data = data if isinstance(data, dict) else {}
    return {
        "p50": number(data.get("p50", data.get("median"))),
        "p90": number(data.get("p90")),
        "p99": number(data.get("p99")),
    }


def _count(data: Any) -> int | None:
    """The ``count`` of a serving Summary (stats.Summary.to_dict), the samples behind it."""
    n = number(as_dict(data).get("count"))
    return int(n) if n is not None and n >= 0 else None


def goodput_slo(doc: dict[str, Any]) -> GoodputSlo | None:
    for check, data in _extras(doc, "goodput"):
        limits = {
            k: v
            for k, raw in as_dict(as_dict(data).get("slo_s")).items()
            if (v := number(raw)) is not None and v > 0
        }
        if not limits:
            continue
        pcts = {
            k: v
            for k, raw in as_dict(data.get("at_percentile")).items()
            if (v := number(as_dict(raw).get("pct"))) is not None
        }
        c = number(as_dict(as_dict(check.get("extra")).get("level")).get("concurrency"))
        return GoodputSlo(limits, pcts, int(c) if c is not None else None)
    return None


def _level(data: Any) -> SweepLevel | None:
    if not isinstance(data, dict):
        return None
    c = number(data.get("concurrency"))
    if c is None or c < 1:
        return None
    return SweepLevel(
        int(c),
        number(data.get("output_tok_s")),
        _summary(data.get("ttft_s")),
        _summary(data.get("tpot_s")),
        _count(data.get("ttft_s")),
        _count(data.get("tpot_s")),
    )


def sweep_levels(doc: dict[str, Any]) -> list[SweepLevel]:
    raw: list[Any] = []
    for _, data in _extras(doc, "throughput_sweep"):
        raw += data if isinstance(data, list) else []
    for _, data in _extras(doc, "sweep"):
        if isinstance(data, dict):
            data = data.get("levels")
        raw += data if isinstance(data, list) else []
    for _, data in _extras(doc, "level"):
        raw.append(data)
    levels: dict[int, SweepLevel] = {}
    for item in raw:
        level = _level(item)
        if level is not None and level.concurrency not in levels:
            levels[level.concurrency] = level
    return [levels[c] for c in sorted(levels)]


def open_loop_of(doc: dict[str, Any]) -> OpenLoop | None:
    for _, data in _extras(doc, "open_loop"):
        if not isinstance(data, dict) or not isinstance(data.get("levels"), list):
            continue
        points = []
        for lv in data["levels"]:
            rate = number(as_dict(lv).get("rate"))
            if rate is None or rate <= 0:
                continue
            level = as_dict(lv.get("level"))
            points.append(
                RatePoint(
                    rate,
                    number(lv.get("goodput_pct")),
                    lv.get("met") is True,
                    _summary(level.get("ttft_s")),
                    _count(level.get("ttft_s")),
                )
            )
        if points:
            slo = data.get("slo")
            return OpenLoop(
                sorted(points, key=lambda p: p.rate),
                number(data.get("knee_req_s")),
                number(data.get("min_goodput_pct")),
                slo if isinstance(slo, str) else "",
            )
    return None


def timeline(doc: dict[str, Any]) -> list[PhaseSpan]:
    serving = as_dict(doc.get("serving"))
    sources: list[Any] = [serving.get("timeline")]
    sources += [data for _, data in _extras(doc, "startup_timeline")]
    for data in sources:
        if not isinstance(data, list):
            continue
        spans = []
        for row in data:
            if not isinstance(row, dict):
                continue
            start = number(row.get("start_s"))
            if start is None or not row.get("phase"):
                continue
            spans.append(PhaseSpan(str(row["phase"]), start, number(row.get("end_s"))))
        if spans:
            return spans
    return []


def figures_of(doc: dict[str, Any]) -> Figures:
    serving = as_dict(doc.get("serving"))
    return Figures(
        busbw_series(doc),
        sweep_levels(doc),
        timeline(doc),
        number(serving.get("ready_s")),
        attached=serving.get("launched") is False,
        latency=latency_series(doc),
        open_loop=open_loop_of(doc),
        roofline=_first_extra(doc, "roofline"),
        spec_decode=_first_extra(doc, "spec_decode"),
        slo=goodput_slo(doc),
    )


def _first_extra(doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((data for _, data in _extras(doc, name) if isinstance(data, dict)), None)


def roofline_text(roofline: dict[str, Any] | None) -> str:
    """``decode 40 tok/s, 73% of the 54.6 tok/s roofline`` (empty when not known)."""
    data = roofline or {}
    roof, share = number(data.get("roofline_tok_s")), number(data.get("fraction"))
    decode = number(data.get("decode_tok_s"))
    if roof is None or share is None or decode is None:
        return ""
    return f"decode {decode:.4g} tok/s, {100 * share:.0f}% of the {roof:.4g} tok/s roofline"


def spec_decode_text(spec: dict[str, Any]) -> str:
    """``mtp k=3: acceptance 70.6%, mean accepted length 3.12, per position
    0.85/0.70/0.57; 95.2 tok/s single-stream (no drafting: 40)``."""
    acc, mean = number(spec.get("acceptance")), number(spec.get("mean_length"))
    per = "/".join(f"{r:.2f}" for r in spec.get("per_pos") or () if isinstance(r, (int, float)))
    head = " ".join(
        str(x)
        for x in (
            spec.get("method"),
            f"k={spec['num_speculative_tokens']}" if spec.get("num_speculative_tokens") else None,
        )
        if x
    )
    text = f"{head}: " if head else ""
    text += f"acceptance {100 * (acc or 0):.1f}%"
    minimum = number(spec.get("min_acceptance"))
    if minimum is not None:
        text += f" (>= {100 * minimum:g}%)"
    if mean is not None:
        text += f", mean accepted length {mean:.2f}"
    if per:
        text += f", per position {per}"
    decode, no_draft = number(spec.get("decode_tok_s_1")), number(spec.get("no_draft_tok_s"))
    if decode is not None:
        text += f"; {decode:.4g} tok/s single-stream"
        if no_draft is not None:
            text += f" (no drafting: {no_draft:g})"
    return text


def metrics_of(figures: Figures) -> dict[str, Metric]:
    """Flat named figures for the history: ``busbw``, ``tok_s@C``, ``ttft_p50@C``,
    ``ttft_p90@C``, ``ttft_p99@C``, ``tpot_p50@C`` (p90, p99), ``knee``, ``startup``,
    ``startup.<phase>`` (before issue #27: ``load``, ``load.<phase>``). A percentile from
    too few samples (``samples.min_samples``) is left out: it would compare noise."""
    out: dict[str, Metric] = {}
    if figures.all_reduce:
        out["busbw"] = Metric(
            round(max(s.largest for s in figures.all_reduce), 4), "GB/s", "higher"
        )
    gathers = [s for s in figures.busbw if s.collective == "all_gather"]
    if gathers:
        top = round(max(s.largest for s in gathers), 4)
        out["busbw.all_gather"] = Metric(top, "GB/s", "higher")
    for lv in figures.sweep:
        if lv.output_tok_s is not None:
            out[f"tok_s@{lv.concurrency}"] = Metric(round(lv.output_tok_s, 3), "tok/s", "higher")
        for name, summary in (("ttft", lv.ttft), ("tpot", lv.tpot)):
            for pct in ("p50", "p90", "p99"):
                value = summary.get(pct)
                if value is not None and enough_for(pct, lv.count(name)):
                    out[f"{name}_{pct}@{lv.concurrency}"] = Metric(round(value, 6), "s", "lower")
    if figures.open_loop is not None and figures.open_loop.knee is not None:
        out["knee"] = Metric(round(figures.open_loop.knee, 4), "req/s", "higher")
    if figures.startup_s is not None:
        out["startup"] = Metric(round(figures.startup_s, 3), "s", "lower")
    for phase, seconds in figures.phase_durations().items():
        out[f"startup.{phase}"] = Metric(seconds, "s", "lower")
    return out


def metric_family(name: str) -> str:
    """``tok_s@4`` -> ``tok_s``, ``ttft_p90@1`` -> ``ttft``, ``startup.weights`` ->
    ``startup`` (``load.weights``, the old name, too)."""
    name = renamed_metric(name)
    for family in sorted(FAMILIES, key=len, reverse=True):
        if name == family or (name.startswith(family) and name[len(family)] in "._@"):
            return family
    return name


def spec_matches(spec: str, name: str) -> bool:
    """Does ``--spark-compare-fail`` METRIC ``spec`` cover figure ``name``?"""
    spec, name = renamed_metric(spec), renamed_metric(name)
    return spec in (name, metric_family(name), name.split("@", 1)[0])


def key_figures(figures: Figures) -> list[tuple[str, str]]:
    """The few figures an operator looks at first (terminal summary, HTML summary)."""
    out: list[tuple[str, str]] = []
    if figures.all_reduce:
        largest = max(s.largest for s in figures.all_reduce)
        peak = max(s.peak for s in figures.all_reduce)
        limits = sorted({s.threshold for s in figures.all_reduce if s.threshold is not None})
        limit = f" (threshold >= {', '.join(f'{t:g}' for t in limits)} GB/s)" if limits else ""
        text = f"{largest:.4g} GB/s at the largest message"
        if peak > largest * 1.001:
            text += f" (peak {peak:.4g})"
        out.append(("busbw", text + limit))
    else:
        out.append(("busbw", "not measured"))
    if figures.latency:
        best = min(s.best for s in figures.latency)
        limits = sorted({s.threshold for s in figures.latency if s.threshold is not None})
        limit = f" (ceiling <= {', '.join(f'{t:g}' for t in limits)} µs)" if limits else ""
        out.append(("latency", f"{best:.4g} µs, the best small-message all-reduce{limit}"))
    for c in (1, 4):
        level = figures.level(c)
        text = "not measured"
        if level is not None and level.output_tok_s is not None:
            text = f"{level.output_tok_s:.4g} tok/s"
            n = level.ttft_n
            for pct in ("p90", "p99"):
                if level.ttft.get(pct) is not None:
                    shown = percentile_text(pct, level.ttft[pct], n)
                    text += f", TTFT {shown}" if pct == "p90" else f", {shown}"
            roof = roofline_text(figures.roofline) if c == 1 else ""
            text += f"; {roof}" if roof else ""
        out.append((f"tok/s @{c}", text))
    if figures.spec_decode is not None:
        out.append(("spec decode", spec_decode_text(figures.spec_decode)))
    if figures.open_loop is not None:
        ol = figures.open_loop
        top = ol.points[-1].rate
        knee = f"{ol.knee:g} req/s" if ol.knee is not None else "none (the lowest rate broke)"
        broke = next((p.rate for p in ol.points if not p.met), None)
        tail = f", broke at {broke:g} req/s" if broke is not None else f", held to {top:g} req/s"
        out.append(("knee", f"{knee}{tail} under {ol.slo}"))
    startup = figures.startup_s
    if startup is not None:
        phases = ", ".join(f"{p} {s:.0f} s" for p, s in figures.phase_durations().items())
        out.append(("startup", f"{startup:.1f} s" + (f" ({phases})" if phases else "")))
    else:
        attached = "not measured (attached)" if figures.attached else "not measured"
        out.append(("startup", attached))
    return out
