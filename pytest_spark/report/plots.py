"""The report's plots, drawn with matplotlib (Agg canvas, no display, no pyplot state) into
PNG data URIs. Each plot tolerates missing data: no image, a line saying why."""

from __future__ import annotations

import base64
import io
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_spark.report.figures import (
    BusbwSeries,
    Figures,
    GoodputSlo,
    LatencySeries,
    OpenLoop,
    PhaseSpan,
    SweepLevel,
)
from pytest_spark.report.samples import enough_for, min_samples, pct_of

PHASE_LABELS = {
    "start": "start (containers, Ray, init)",
    "weights": "weights",
    "kv": "KV profiling",
    "graphs": "CUDA graphs",
    "api": "API server",
}
PHASE_COLORS = {
    "start": "#9e9e9e",
    "weights": "#1f77b4",
    "kv": "#ff7f0e",
    "graphs": "#2ca02c",
    "api": "#9467bd",
}
DPI = 100


@dataclass(frozen=True)
class Plot:
    key: str
    title: str
    uri: str | None  # data:image/png;base64,...
    note: str  # why there is no image, or what it shows


def _safe(text: str, limit: int = 60) -> str:
    """Plain text for matplotlib (no mathtext from a '$', no control characters)."""
    text = re.sub(r"[\x00-\x1f\x7f]", " ", str(text))
    return text.replace("\\", "/").replace("$", r"\$")[:limit]


def _render(draw: Callable[[Any], None], size: tuple[float, float]) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI)
    FigureCanvasAgg(fig)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        draw(fig)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _guard(
    key: str, title: str, draw: Callable[[Any], None], size: tuple[float, float], note: str
) -> Plot:
    try:
        return Plot(key, title, _render(draw, size), note)
    except ImportError as exc:
        return Plot(key, title, None, f"no plot: matplotlib is not installed ({exc})")
    except Exception as exc:  # a plot must never cost the report
        return Plot(key, title, None, f"no plot: drawing failed ({type(exc).__name__}: {exc})")


def _bytes_label(n: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"


def threshold_gates(series: list[BusbwSeries]) -> dict[float, str]:
    """Each busbw threshold and the series it gates (``all_reduce``, ``all_gather``), the
    check judging the busbw at the largest message."""
    gates: dict[float, list[str]] = {}
    for s in series:
        if s.threshold is not None:
            gates.setdefault(s.threshold, []).append(s.label)
    return {t: ", ".join(labels) + " (largest message)" for t, labels in sorted(gates.items())}


def busbw_plot(series: list[BusbwSeries]) -> Plot:
    title = "NCCL bus bandwidth vs message size (all-reduce, all-gather)"
    if not series:
        return Plot(
            "busbw",
            title,
            None,
            "no plot: no check attached a busbw series "
            "(the nccl checks did not run, or produced no result rows)",
        )

    def draw(fig: Any) -> None:
        from matplotlib.ticker import FuncFormatter

        ax = fig.add_subplot(1, 1, 1)
        for s in series:
            xs = [p[0] for p in s.points]
            ax.plot(
                xs,
                [p[1] for p in s.points],
                marker="o",
                markersize=3,
                label=_safe(f"busbw {s.label}"),
            )
        for t, gated in threshold_gates(series).items():
            ax.axhline(
                t,
                color="#d62728",
                linestyle="--",
                linewidth=1.2,
                label=_safe(f">= {t:g} GB/s gates {gated}", 90),
            )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _bytes_label(v)))
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        ax.set_title(title, fontsize=10)

    largest = max(s.largest for s in series)
    gates = "; ".join(f">= {t:g} GB/s gates {g}" for t, g in threshold_gates(series).items())
    return _guard(
        "busbw",
        title,
        draw,
        (9, 3.8),
        f"busbw {largest:.4g} GB/s at the largest message, {len(series)} series"
        + (f"; {gates}" if gates else ""),
    )


def latency_plot(series: list[LatencySeries]) -> Plot:
    title = "NCCL small-message all-reduce time vs message size"
    if not series:
        return Plot(
            "latency",
            title,
            None,
            "no plot: no check attached a latency series "
            "(the latency check did not run, or its sweep produced no result rows)",
        )

    def draw(fig: Any) -> None:
        from matplotlib.ticker import FuncFormatter

        ax = fig.add_subplot(1, 1, 1)
        for s in series:
            ax.plot(
                [p[0] for p in s.points],
                [p[1] for p in s.points],
                marker="o",
                markersize=3,
                label=_safe(f"time {s.label}"),
            )
        for t in sorted({s.threshold for s in series if s.threshold is not None}):
            ax.axhline(
                t,
                color="#d62728",
                linestyle="--",
                linewidth=1.2,
                label=f"ceiling <= {t:g} us on the best time (not every size)",
            )
        # the figure the ceiling judges: the best time of each series, marked
        for s in series:
            size, us = min(s.points, key=lambda p: p[1])
            ax.plot(
                [size],
                [us],
                marker="*",
                markersize=12,
                color="#d62728",
                linestyle="none",
                label=_safe(f"best {us:.4g} us ({s.label}): what the ceiling gates", 90),
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _bytes_label(v)))
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("time per all-reduce (us)")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        ax.set_title(title, fontsize=10)

    best = min(s.best for s in series)
    return _guard(
        "latency",
        title,
        draw,
        (9, 3.8),
        f"best {best:.4g} us, {len(series)} series; the ceiling gates the best time (marked), "
        "not every size",
    )


def throughput_plot(levels: list[SweepLevel], slo: GoodputSlo | None = None) -> Plot:
    title = "Output tokens/s and latency vs concurrency"
    usable = [lv for lv in levels if lv.output_tok_s is not None]
    if not usable:
        return Plot(
            "throughput",
            title,
            None,
            "no plot: no throughput sweep was recorded "
            "(the throughput checks did not run, or every level failed)",
        )

    def draw(fig: Any) -> None:
        from matplotlib.ticker import FixedLocator, NullLocator

        xs = [lv.concurrency for lv in usable]
        axes = fig.subplots(1, 3)
        _draw_tok_s(axes[0], xs, [lv.output_tok_s or 0.0 for lv in usable])
        _draw_percentiles(axes[1], usable, "ttft", 1.0, "s", slo)
        _draw_percentiles(axes[2], usable, "tpot", 1000.0, "ms", slo)
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(xs))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([str(x) for x in xs])
            ax.set_xlabel("concurrent streams")
            ax.grid(True, alpha=0.3)

    slo_note = (
        "; the goodput SLO lines: "
        + ", ".join(slo.label(m) for m in ("ttft", "tpot") if m in slo.limits)
        if slo is not None
        else ""
    )
    return _guard(
        "throughput",
        title,
        draw,
        (11, 3.6),
        f"{len(usable)} concurrency level(s): "
        + ", ".join(f"{lv.output_tok_s:.4g} tok/s @{lv.concurrency}" for lv in usable)
        + slo_note,
    )


def _draw_tok_s(ax: Any, xs: list[int], tok: list[float]) -> None:
    """The throughput panel: output tokens/s per concurrency level, each point labelled."""
    ax.plot(xs, tok, marker="o", color="#1f77b4")
    for x, y in zip(xs, tok, strict=True):
        ax.annotate(
            f"{y:.4g}",
            (x, y),
            textcoords="offset points",
            xytext=(0, 5),
            ha="center",
            fontsize=7,
        )
    ax.set_ylabel("output tok/s")
    ax.set_title("throughput", fontsize=9)
    ax.set_ylim(bottom=0, top=max(tok) * 1.2 or 1)


def _draw_percentiles(
    ax: Any,
    usable: list[SweepLevel],
    attr: str,
    scale: float,
    unit: str,
    slo: GoodputSlo | None,
) -> None:
    """A latency panel (``attr``: ttft or tpot, times ``scale`` in ``unit``): p50, p90 and
    p99 per concurrency level with their sample counts, and the goodput SLO's line."""
    for pct, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
        pts = [
            (lv.concurrency, v * scale)
            for lv in usable
            if (v := getattr(lv, attr).get(pct)) is not None
        ]
        if pts:
            ns = sorted({n for lv in usable if (n := lv.count(attr))})
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                style,
                marker="o",
                markersize=3,
                label=_counts_label(pct, ns),
            )
    if slo is not None and attr in slo.limits:
        ax.axhline(
            slo.limits[attr] * scale,
            color="#d62728",
            linestyle="--",
            linewidth=1.2,
            label=_safe(slo.label(attr, scale, unit), 90),
        )
    ax.set_ylabel(f"{attr.upper()} ({unit})")
    ax.set_title(f"{attr.upper()} percentiles", fontsize=9)
    ax.set_ylim(bottom=0)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _counts_label(pct: str, ns: list[int]) -> str:
    """A percentile's legend entry with its sample counts, and a warning where some level
    had too few for it (``samples.min_samples``)."""
    if not ns:
        return pct
    counts = f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}-{ns[-1]}"
    short = [n for n in ns if not enough_for(pct, n)]
    warn = f", too few: needs >= {min_samples(pct_of(pct))}" if short else ""
    return f"{pct} ({counts}{warn})"


def knee_plot(open_loop: OpenLoop | None) -> Plot:
    title = "Open loop: goodput and TTFT vs request rate (the knee)"
    if open_loop is None:
        return Plot(
            "knee",
            title,
            None,
            "no plot: no open-loop sweep was recorded (it runs with --spark-open-loop)",
        )
    points = open_loop.points

    def draw(fig: Any) -> None:
        axes = fig.subplots(1, 2)
        ax = axes[0]
        xs = [p.rate for p in points]
        ys = [p.goodput_pct if p.goodput_pct is not None else 0.0 for p in points]
        ax.plot(xs, ys, marker="o", color="#1f77b4")
        for p, y in zip(points, ys, strict=True):
            ax.plot([p.rate], [y], "o", color="#2ca02c" if p.met else "#d62728")
        if open_loop.min_goodput_pct is not None:
            ax.axhline(open_loop.min_goodput_pct, color="#d62728", linestyle="--", linewidth=1)
        ax.set_ylim(0, 105)
        ax.set_ylabel("goodput (% of requests meeting every SLO)")
        ax.set_title(_safe(f"goodput under {open_loop.slo}"), fontsize=9)
        ax2 = axes[1]
        for pct, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
            pts = [(p.rate, v) for p in points if (v := p.ttft.get(pct)) is not None]
            if pts:
                ns = sorted({n for p in points if (n := p.ttft_n)})
                label = _counts_label(pct, ns)
                ax2.plot([q[0] for q in pts], [q[1] for q in pts], style, marker="o", label=label)
        ax2.set_ylabel("TTFT (s)")
        ax2.set_ylim(bottom=0)
        ax2.set_title("TTFT percentiles", fontsize=9)
        if ax2.get_legend_handles_labels()[0]:
            ax2.legend(fontsize=7)
        for a in axes:
            if open_loop.knee is not None:
                a.axvline(open_loop.knee, color="#2ca02c", linestyle="--", linewidth=1.2)
            a.set_xscale("log", base=2)
            a.set_xlabel("request rate (req/s, Poisson arrivals)")
            a.grid(True, alpha=0.3)

    knee = f"knee {open_loop.knee:g} req/s" if open_loop.knee is not None else "no knee"
    return _guard("knee", title, draw, (10, 3.6), f"{len(points)} rate(s); {knee}")


def timeline_plot(spans: list[PhaseSpan], ready_s: float | None = None) -> Plot:
    title = "Startup phases (Gantt)"
    phases = [s for s in spans if s.phase != "ready"]
    if not phases:
        return Plot(
            "timeline",
            title,
            None,
            "no plot: no startup timeline was recorded "
            "(the serving checks did not run, or attached to a running cluster "
            "without reading its load)",
        )
    known = [t for s in spans for t in (s.start, s.end) if t is not None]
    horizon = max(known) if known else 1.0
    ready = next((s.start for s in spans if s.phase == "ready"), ready_s)

    def draw(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        labels = []
        for i, s in enumerate(phases):
            end = s.end if s.end is not None else horizon
            width = max(end - s.start, horizon * 0.002)
            color = PHASE_COLORS.get(s.phase, "#8c564b")
            ax.barh(
                i,
                width,
                left=s.start,
                color=color,
                edgecolor="black",
                linewidth=0.5,
                hatch="//" if s.end is None else None,
                alpha=0.85,
            )
            note = f"{end - s.start:.1f} s" + (" (unfinished)" if s.end is None else "")
            ax.text(s.start + width, i, f" {note}", va="center", fontsize=8)
            labels.append(_safe(PHASE_LABELS.get(s.phase, s.phase)))
        if ready is not None:
            ax.axvline(ready, color="#2ca02c", linestyle="--", linewidth=1.2)
            ax.text(
                ready,
                -0.45,
                f" ready at {ready:.1f} s",
                color="#2ca02c",
                fontsize=8,
                va="bottom",
                ha="left",
            )
        ax.set_ylim(len(phases) - 0.5, -0.8)
        ax.set_yticks(range(len(phases)))
        ax.set_yticklabels(labels)
        ax.set_xlim(0, horizon * 1.18 or 1)
        ax.set_xlabel("seconds since launch / attach")
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_title(title, fontsize=10)

    total = f"ready after {ready:.1f} s" if ready is not None else "never became ready"
    return _guard(
        "timeline", title, draw, (9, 0.6 * len(phases) + 1.4), f"{len(phases)} phase(s); {total}"
    )


def all_plots(figures: Figures) -> list[Plot]:
    return [
        busbw_plot(figures.busbw),
        latency_plot(figures.latency),
        throughput_plot(figures.sweep, figures.slo),
        knee_plot(figures.open_loop),
        timeline_plot(figures.timeline, figures.ready_s),
    ]
