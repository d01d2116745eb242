"""p99 beside p50 and p90 in the history's figures, and the open-loop knee in the figures,
the key figures, the history and the HTML's plots (from ``extra.open_loop``)."""

from __future__ import annotations

import base64
from typing import Any

from pytest_spark.report.figures import figures_of, key_figures, metrics_of
from pytest_spark.report.plots import all_plots, knee_plot


def doc_of(**extra: Any) -> dict[str, Any]:
    return {"checks": [{"nodeid": "t.py::test_x", "category": "load", "extra": extra}]}


def rate_level(rate: float, pct: float, met: bool, ttft_p99: float) -> dict[str, Any]:
    return {
        "rate": rate,
        "met": met,
        "goodput_pct": pct,
        "level": {"rate": rate, "ttft_s": {"median": 0.1, "p90": 0.2, "p99": ttft_p99}},
    }


OPEN_LOOP = {
    "slo": "TTFT <= 1 s",
    "min_goodput_pct": 90.0,
    "knee_req_s": 2.0,
    "levels": [
        rate_level(2.0, 100.0, True, 0.3),
        rate_level(1.0, 100.0, True, 0.2),
        rate_level(4.0, 40.0, False, 3.5),
    ],
}
LEVEL = {
    "concurrency": 4,
    "output_tok_s": 120.5,
    "ttft_s": {"count": 120, "median": 0.5, "p90": 0.7, "p99": 0.9},
    "tpot_s": {"count": 120, "median": 0.02, "p90": 0.03, "p99": 0.05},
}


def test_p99_is_a_history_figure_beside_p50_and_p90() -> None:
    metrics = metrics_of(figures_of(doc_of(level=LEVEL)))
    assert {k for k in metrics if k.startswith("ttft")} == {
        "ttft_p50@4",
        "ttft_p90@4",
        "ttft_p99@4",
    }
    assert metrics["tpot_p99@4"].value == 0.05 and metrics["tpot_p99@4"].better == "lower"
    keys = dict(key_figures(figures_of(doc_of(level={**LEVEL, "concurrency": 1}))))
    assert keys["tok/s @1"] == "120.5 tok/s, TTFT p90 0.7 s (n=120), p99 0.9 s (n=120)"


def test_the_knee_is_read_reported_and_kept() -> None:
    figures = figures_of(doc_of(open_loop=OPEN_LOOP))
    ol = figures.open_loop
    assert ol is not None and ol.knee == 2.0 and [p.rate for p in ol.points] == [1.0, 2.0, 4.0]
    assert ol.points[-1].ttft["p99"] == 3.5 and not ol.points[-1].met
    assert dict(key_figures(figures))["knee"] == "2 req/s, broke at 4 req/s under TTFT <= 1 s"
    knee = metrics_of(figures)["knee"]
    assert (knee.value, knee.unit, knee.better) == (2.0, "req/s", "higher")
    none = figures_of(doc_of(open_loop={**OPEN_LOOP, "knee_req_s": None}))
    assert "knee" not in metrics_of(none)
    assert dict(key_figures(none))["knee"].startswith("none (the lowest rate broke)")
    assert figures_of(doc_of(open_loop={"levels": "junk"})).open_loop is None


def test_knee_plot_draws_or_says_why() -> None:
    plot = knee_plot(figures_of(doc_of(open_loop=OPEN_LOOP)).open_loop)
    assert plot.uri is not None
    assert base64.b64decode(plot.uri.split(",", 1)[1])[:4] == b"\x89PNG"
    assert plot.note == "3 rate(s); knee 2 req/s"
    empty = knee_plot(None)
    assert empty.uri is None and "--spark-open-loop" in empty.note
    assert "knee" in [p.key for p in all_plots(figures_of(doc_of()))]
