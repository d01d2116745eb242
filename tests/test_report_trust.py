"""Figures a person can trust (issue #27 §4): every percentile with its sample count and
none from too few samples, thresholds with their direction and one unit, plots that say
what each line gates, the goodput SLO lines, "startup" (not "load") for the model's load
time, and the NCCL version and ConnectX firmware in the environment."""

from __future__ import annotations

import types
from typing import Any

import pytest

from pytest_spark.infra.alike.check import nccl_versions
from pytest_spark.infra.alike.parse import ContainerFacts, NcclLibrary
from pytest_spark.infra.finding import Finding
from pytest_spark.infra.links.check import check_link_rate, nic_firmware
from pytest_spark.infra.links.mtu_check import check_mtu
from pytest_spark.infra.links.parse import CaInfo
from pytest_spark.infra.links.probe import PortFacts
from pytest_spark.report.environment import environment
from pytest_spark.report.figures import (
    BusbwSeries,
    LatencySeries,
    figures_of,
    key_figures,
    metrics_of,
)
from pytest_spark.report.plots import latency_plot, threshold_gates, throughput_plot
from pytest_spark.report.results import finding_of, finding_property
from pytest_spark.report.samples import min_samples, percentile_text
from pytest_spark.report.summary import measured_expected


def level(concurrency: int, n: int) -> dict[str, Any]:
    return {
        "concurrency": concurrency,
        "output_tok_s": 30.0,
        "ttft_s": {"count": n, "median": 0.2, "p90": 0.3, "p99": 0.4},
        "tpot_s": {"count": n, "median": 0.03, "p90": 0.035, "p99": 0.04},
    }


def doc_of(*checks: dict[str, Any], **serving: Any) -> dict[str, Any]:
    return {"checks": list(checks), "serving": serving}


def check(name: str, node: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"nodeid": f"t.py::{name}", "category": "x", "node": node, "extra": extra}


@pytest.mark.parametrize(("q", "n"), [(50, 2), (90, 10), (99, 100), (99.9, 1000)])
def test_a_percentile_needs_one_sample_beyond_it(q: float, n: int) -> None:
    assert min_samples(q) == n


def test_every_percentile_is_printed_with_its_count_and_none_from_too_few() -> None:
    assert percentile_text("p90", 0.3, 12) == "p90 0.3 s (n=12)"
    assert percentile_text("p99", 0.4, 4) == "p99 too few (n=4, needs >= 100)"
    assert percentile_text("p99", 0.4, None) == "p99 0.4 s (n=?)"
    doc = doc_of(check("test_sweep", sweep={"levels": [level(1, 4), level(4, 120)]}))
    keys = dict(key_figures(figures_of(doc)))
    assert keys["tok/s @1"] == (
        "30 tok/s, TTFT p90 too few (n=4, needs >= 10), p99 too few (n=4, needs >= 100)"
    )
    assert keys["tok/s @4"] == "30 tok/s, TTFT p90 0.3 s (n=120), p99 0.4 s (n=120)"


def test_a_percentile_from_too_few_samples_is_no_history_figure() -> None:
    doc = doc_of(check("test_sweep", sweep={"levels": [level(1, 4), level(4, 12)]}))
    names = set(metrics_of(figures_of(doc)))
    assert {"ttft_p50@1", "ttft_p50@4", "ttft_p90@4", "tpot_p90@4"} <= names
    assert not {"ttft_p90@1", "ttft_p99@1", "ttft_p99@4", "tpot_p99@4"} & names


@pytest.mark.parametrize(
    ("finding", "cell"),
    [
        ({"measured": 41.0, "expected": "< 90 C", "unit": "C", "level": "pass"}, "41 C / < 90 C"),
        (
            {"measured": 9000, "expected": 4200, "unit": "bytes", "bound": ">="},
            "9000 bytes / >= 4200 bytes",
        ),
        (
            {"measured": 100.0, "expected": 200.0, "unit": "Gb/s", "level": "fail"},
            "100 Gb/s / >= 200 Gb/s",
        ),
        (
            {"measured": 766.4, "expected": 5000.0, "unit": "us", "level": "pass"},
            "766.4 us / <= 5000 us",
        ),
        (
            {"measured": {"1": 33.4}, "expected": "every request completes", "unit": "tok/s"},
            "1=33.4 / every request completes tok/s",
        ),
        ({"measured": 9.88, "expected": "<= 60", "unit": "s", "level": "pass"}, "9.88 s / <= 60 s"),
        ({"measured": 8, "expected": "> 0 tokens", "unit": "tokens"}, "8 tokens / > 0 tokens"),
        ({"measured": "UP", "expected": "UP", "unit": None}, "UP / UP"),
    ],
)
def test_cells_say_the_direction_and_the_unit_once(finding: dict[str, Any], cell: str) -> None:
    assert measured_expected(finding) == cell
    assert not any(f"{u} {u}" in cell for u in ("C", "s", "tok/s", "bytes", "tokens"))


def test_the_link_checks_say_their_floor_and_it_travels_with_the_finding() -> None:
    port = PortFacts(
        "enp1s0f1np1", "rocep1s0f1", True, "Active", "LinkUp", 200.0, 4096, 9000, "UP", True, True
    )
    for finding in (check_link_rate("spark-head", port), check_mtu("spark-head", port)):
        assert finding.bound == ">="
        name, value = finding_property(finding)
        record = finding_of({name: value})
        assert record["bound"] == ">="
    equal = {
        **finding_of(dict([finding_property(check_link_rate("spark-head", port))])),
        "level": "pass",
    }
    assert measured_expected(equal) == "200 Gb/s / >= 200 Gb/s"  # equal: only bound can say
    assert Finding.passed(1, 2).bound is None


def test_the_busbw_plot_names_the_series_each_threshold_gates() -> None:
    series = [
        BusbwSeries("test_allreduce_busbw", None, [(1 << 20, 0.1, None)], 0.09),
        BusbwSeries("test_allgather_busbw", None, [(1 << 20, 0.1, None)], 0.045, "all_gather"),
    ]
    assert threshold_gates(series) == {
        0.045: "test_allgather_busbw (largest message)",
        0.09: "test_allreduce_busbw (largest message)",
    }


def test_the_latency_plot_says_its_ceiling_gates_the_best_time() -> None:
    plot = latency_plot([LatencySeries("lat", None, [(8, 900.0), (1024, 766.4)], 5000.0)])
    assert plot.uri is not None
    assert "the ceiling gates the best time (marked), not every size" in plot.note


GOODPUT = {
    "goodput_pct": 100.0,
    "slo_s": {"ttft": 1.5, "tpot": 0.1, "e2e": 8.0},
    "at_percentile": {"ttft": {"pct": 99.0}, "tpot": {"pct": 99.0}, "e2e": {"pct": 99.0}},
}


def test_the_ttft_and_tpot_plots_draw_the_goodput_slo() -> None:
    doc = doc_of(
        check("test_sweep", sweep={"levels": [level(1, 8), level(4, 32)]}),
        check("test_goodput", goodput=GOODPUT, level=level(4, 32)),
    )
    figures = figures_of(doc)
    assert figures.slo is not None and figures.slo.concurrency == 4
    assert figures.slo.label("ttft") == "goodput SLO p99 <= 1.5 s @4 streams"
    assert figures.slo.label("tpot", 1000.0, "ms") == "goodput SLO p99 <= 100 ms @4 streams"
    plot = throughput_plot(figures.sweep, figures.slo)
    assert plot.uri is not None
    assert "goodput SLO p99 <= 1.5 s @4 streams" in plot.note
    assert "goodput SLO p99 <= 0.1 s @4 streams" in plot.note
    assert "goodput" not in throughput_plot(figures.sweep).note


def test_load_names_the_category_and_startup_the_model_load_time() -> None:
    doc = doc_of(ready_s=99.0, timeline=[{"phase": "weights", "start_s": 10, "end_s": 90}])
    figures = figures_of(doc)
    assert dict(key_figures(figures))["startup"] == "99.0 s (weights 80 s)"
    assert "load" not in dict(key_figures(figures))
    assert set(metrics_of(figures)) == {"startup", "startup.weights"}


class Settings:
    model = None
    serve_args = None
    hostkey_check = "strict"


def test_the_environment_names_the_nccl_version_and_the_connectx_firmware() -> None:
    assert environment(doc_of(), Settings(), None)["NCCL version"].startswith("unknown")
    lib = NcclLibrary("/usr/lib/libnccl.so.2", "libnccl.so.2.27.7", 1, "ab" * 32, "2.27.7+cuda13.0")
    facts = {
        name: types.SimpleNamespace(container=ContainerFacts("3.12", "0.11", "2.9", (lib,)))
        for name in ("spark-head", "spark-worker-1")
    }
    versions = nccl_versions(facts)  # type: ignore[arg-type]
    assert versions == {"spark-head": "2.27.7+cuda13.0", "spark-worker-1": "2.27.7+cuda13.0"}
    ibstat = {
        "rocep1s0f1": CaInfo("MT4129", "28.45.4028"),
        "roceP2p1s0f1": CaInfo("MT4129", "28.45.4028"),
        "mlx5_9": CaInfo("MT4129", None),
    }
    firmware = nic_firmware(ibstat)
    assert firmware == {"roceP2p1s0f1": "28.45.4028", "rocep1s0f1": "28.45.4028"}
    doc = doc_of(
        check("test_serving_image_alike", nccl_version=versions),
        check("test_fabric_twins_up", "spark-head", nic_firmware=firmware),
        check("test_fabric_twins_up", "spark-worker-1", nic_firmware=firmware),
    )
    env = environment(doc, Settings(), None)
    assert env["NCCL version"] == "2.27.7+cuda13.0 (every node)"
    assert env["ConnectX firmware"] == "28.45.4028 (every node)"
    odd = {**firmware, "rocep1s0f1": "28.40.1000"}
    doc["checks"][2] = check("test_fabric_twins_up", "spark-worker-1", nic_firmware=odd)
    shown = environment(doc, Settings(), None)["ConnectX firmware"]
    assert isinstance(shown, dict) and shown["spark-worker-1 rocep1s0f1"] == "28.40.1000"


def test_the_open_loop_percentiles_carry_their_counts() -> None:
    level = {"ttft_s": {"count": 30, "median": 0.2, "p90": 0.3, "p99": 0.4}}
    data = {"levels": [{"rate": 1.0, "goodput_pct": 100.0, "met": True, "level": level}]}
    open_loop = figures_of(doc_of(check("test_open_loop_knee", open_loop=data))).open_loop
    assert open_loop is not None and open_loop.points[0].ttft_n == 30
