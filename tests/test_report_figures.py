"""Figures from the JSON results, verdicts, remediation hints and plots: pure, tolerant."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from pytest_spark.report.figures import (
    PhaseSpan,
    figures_of,
    key_figures,
    metric_family,
    metrics_of,
    spec_matches,
)
from pytest_spark.report.plots import busbw_plot, throughput_plot, timeline_plot
from pytest_spark.report.summary import measured_expected, remediation, verdict_table


def check(
    category: str, outcome: str = "passed", node: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "nodeid": f"t.py::test_{category}",
        "category": category,
        "node": node,
        "outcome": outcome,
        "level": "pass",
        "expected": 0.2,
        "extra": extra,
    }


LEVEL = {
    "concurrency": 4,
    "output_tok_s": 120.5,
    "ttft_s": {"median": 0.5, "p90": 0.7, "p99": 0.9},
    "tpot_s": {"median": 0.02, "p90": 0.03, "p99": None},
}


def test_every_source_shape_is_read() -> None:
    doc = {
        "checks": [
            check(
                "nccl",
                busbw_series=[
                    {"size_bytes": 1024, "busbw_gbps": 0.1},
                    {"bytes": 2048, "busbw_gbps": 0.2, "algbw_gbps": 0.1},
                ],
            ),
            check("throughput", sweep={"levels": [LEVEL]}),
            check(
                "throughput", throughput_sweep=[{**LEVEL, "concurrency": 1, "output_tok_s": 40.0}]
            ),
            check("throughput", level={**LEVEL, "concurrency": 16, "output_tok_s": 200.0}),
        ],
        "serving": {
            "ready_s": 99.0,
            "timeline": [
                {"phase": "start", "start_s": 0, "end_s": 10},
                {"phase": "weights", "start_s": 10, "end_s": 90},
                {"phase": "ready", "start_s": 99, "end_s": 99},
            ],
        },
    }
    figures = figures_of(doc)
    assert [p[0] for p in figures.busbw[0].points] == [1024, 2048]
    assert figures.busbw[0].threshold == 0.2
    assert [lv.concurrency for lv in figures.sweep] == [1, 4, 16]
    assert figures.level(4).ttft == {"p50": 0.5, "p90": 0.7, "p99": 0.9}  # type: ignore[union-attr]
    metrics = metrics_of(figures)
    assert metrics["busbw"].value == 0.2 and metrics["tok_s@16"].value == 200.0
    assert metrics["ttft_p50@4"].better == "lower" and metrics["startup"].value == 99.0
    assert metrics["startup.weights"].value == 80.0 and "startup.ready" not in metrics
    assert dict(key_figures(figures))["startup"] == "99.0 s (start 10 s, weights 80 s)"


def test_nccl_series_dict_shape_and_largest_message() -> None:
    points = [
        {"size_bytes": 1 << 20, "busbw_gbps": 0.25, "algbw_gbps": 0.2},
        {"size_bytes": 1 << 24, "busbw_gbps": 0.24, "algbw_gbps": 0.19},
    ]
    doc = {"checks": [check("nccl", busbw_series={"tool": "x", "unit": "GB/s", "points": points})]}
    figures = figures_of(doc)
    assert metrics_of(figures)["busbw"].value == 0.24
    assert dict(key_figures(figures))["busbw"] == (
        "0.24 GB/s at the largest message (peak 0.25) (threshold >= 0.2 GB/s)"
    )


@pytest.mark.parametrize(
    "junk",
    [
        None,
        "x",
        3,
        [],
        {},
        [None, "a", {"bytes": -1}],
        {"levels": "nope"},
        [{"phase": None, "start_s": "?"}],
    ],
)
def test_junk_is_ignored(junk: Any) -> None:
    doc = {
        "checks": [check("nccl", busbw_series=junk, sweep=junk, startup_timeline=junk, level=junk)],
        "serving": junk,
    }
    figures = figures_of(doc)
    assert (figures.busbw, figures.sweep, figures.timeline) == ([], [], [])
    assert metrics_of(figures) == {}
    assert figures_of({}).busbw == []


def test_metric_names_and_specs() -> None:
    assert metric_family("tok_s@4") == "tok_s" and metric_family("ttft_p90@1") == "ttft"
    assert metric_family("startup.weights") == "startup" and metric_family("busbw") == "busbw"
    # history and --spark-compare-fail from before issue #27 name the load time "load"
    assert metric_family("load.weights") == "startup" and spec_matches("load", "startup.kv")
    assert spec_matches("ttft_p90", "ttft_p90@1") and spec_matches("tok_s@4", "tok_s@4")
    assert not spec_matches("tok_s@4", "tok_s@16") and not spec_matches("tpot", "ttft_p50@1")


def test_verdicts_per_category_and_node() -> None:
    doc = {
        "cluster": {"nodes": [{"name": "spark-head"}, {"name": "spark-worker-1"}]},
        "checks": [
            check("link", node="spark-head"),
            check("link", "failed", node="spark-worker-1"),
            check("nccl"),
            check("preflight", "skipped", node="spark-head"),
            {**check("link", node="spark-head"), "level": "warn"},
            {**check("tool_calls"), "notes": ["asked again alone: answered in 2.5 s"]},
            {**check("tool_calls"), "notes": []},
        ],
    }
    table = verdict_table(doc)
    assert table.nodes == ["spark-head", "spark-worker-1", "cluster"]
    assert table.cell("link", "spark-head").verdict == "warn"
    assert table.cell("link", "spark-head").text() == "2 passed, 1 warned"
    assert table.cell("link", "spark-worker-1").verdict == "fail"
    assert table.cell("nccl", "cluster").verdict == "pass"
    # a note says how a check came to its verdict: counted, the verdict unchanged
    assert table.cell("tool_calls", "cluster").text() == "2 passed, 1 noted"
    assert table.cell("tool_calls", "cluster").verdict == "pass"
    assert table.cell("preflight", "spark-head").verdict == "skip"
    assert table.cell("reasoning", "spark-head").verdict == "none"
    assert table.overall == "fail" and table.category("link").verdict == "fail"


def test_measured_expected_and_remediation() -> None:
    assert measured_expected({"measured": 100.0, "expected": 200.0, "unit": "Gb/s"}) == (
        "100 Gb/s / 200 Gb/s"  # no verdict to read a direction off
    )
    assert measured_expected({"measured": {"nodes": 1, "gpus": 1.0}, "expected": None}) == (
        "nodes=1, gpus=1 / -"
    )
    assert measured_expected({}) == ""
    msg = (
        "spark-worker-1 enp1s0f1np1: link rate 100000 Mb/s, expected 200000 Mb/s. Likely a "
        "cable rated for 100G or a switch port forced to 100G; see ethtool -s."
    )
    assert remediation(msg).startswith("Likely a cable rated for 100G")
    readiness = (
        "vLLM failed to start on spark-head: cuda-oom\n  log: OOM\n  fix: lower "
        "--gpu-memory-utilization\n--- last 1 log lines of spark-head ---\nx"
    )
    assert remediation(readiness) == "lower --gpu-memory-utilization"
    assert remediation("it broke") == ""


def _png(uri: str | None) -> bytes:
    assert uri is not None and uri.startswith("data:image/png;base64,")
    return base64.b64decode(uri.split(",", 1)[1])


def test_plots_without_data_say_why() -> None:
    for plot in (busbw_plot([]), throughput_plot([]), timeline_plot([])):
        assert plot.uri is None and plot.note.startswith("no plot: ")


def test_unfinished_timeline_and_hostile_labels_still_draw() -> None:
    spans = [
        PhaseSpan("start", 0, 5),
        PhaseSpan("weights", 5, None),
        PhaseSpan("$\\frac{<b>}{", 6, 7),
    ]
    plot = timeline_plot(spans)
    assert _png(plot.uri)[:4] == b"\x89PNG" and "never became ready" in plot.note


def test_attached_load_is_not_measured_and_says_why() -> None:
    """Attached, the wait for /health is no load time: terminal, HTML and JSON say so."""
    doc = {
        "checks": [],
        "serving": {
            "launched": False,
            "ready_s": 0.1,
            "timeline": [{"phase": "ready", "start_s": 0.1, "end_s": 0.1}],
        },
    }
    figures = figures_of(doc)
    assert figures.startup_s is None
    assert dict(key_figures(figures))["startup"] == "not measured (attached)"
    assert not any(name.startswith("startup") for name in metrics_of(figures))
    launched = figures_of({"checks": [], "serving": {**doc["serving"], "launched": True}})
    assert dict(key_figures(launched))["startup"] == "0.1 s"


ROOFLINE = {
    "roofline_tok_s": 54.6,
    "fraction": 0.5769,
    "decode_tok_s": 31.5,
    "active_params_b": 10.0,
    "bytes_per_param": 1.0,
    "nodes": 2,
}
SPEC = {
    "acceptance": 0.7062,
    "mean_length": 3.119,
    "per_pos": [0.85, 0.697, 0.5715],
    "method": "mtp",
    "num_speculative_tokens": 3,
    "decode_tok_s_1": 95.2,
    "no_draft_tok_s": 40.0,
    "min_acceptance": 0.4,
}


def test_key_figures_show_the_roofline_fraction_and_spec_decoding() -> None:
    one = {**LEVEL, "concurrency": 1, "output_tok_s": 30.0}
    doc = {
        "checks": [
            check("throughput", level=one, roofline=ROOFLINE),
            check("throughput", spec_decode=SPEC),
        ]
    }
    figures = dict(key_figures(figures_of(doc)))
    assert figures["tok/s @1"] == (
        "30 tok/s, TTFT p90 0.7 s (n=?), p99 0.9 s (n=?); decode 31.5 tok/s, 58% of the "
        "54.6 tok/s roofline"
    )
    assert figures["spec decode"] == (
        "mtp k=3: acceptance 70.6% (>= 40%), mean accepted length 3.12, per position "
        "0.85/0.70/0.57; 95.2 tok/s single-stream (no drafting: 40)"
    )
    plain = dict(key_figures(figures_of({"checks": [check("throughput", level=one)]})))
    assert plain["tok/s @1"] == "30 tok/s, TTFT p90 0.7 s (n=?), p99 0.9 s (n=?)"
    assert "spec decode" not in plain
