"""The report's "Depth x concurrency" table: the --spark-depth-sweep figures
(tests_e2e/test_depth_sweep.py ``extra.depth_sweep``, llama-benchy's report fields), one row
per cell with the Spark Arena's columns, so a run reads beside a published Arena result."""

from __future__ import annotations

from typing import Any

from pytest_spark.report.figures import as_dict
from pytest_spark.report.templating import render

COLUMNS = ("depth", "concurrency", "pp tok/s", "tg tok/s", "tg tok/s per request", "TTFT ms")


def _show(m: Any, digits: int = 1) -> str:
    m = as_dict(m)
    if not isinstance(m.get("mean"), int | float):
        return "-"
    std = m.get("std") if isinstance(m.get("std"), int | float) else 0.0
    n = len(m.get("values") or ())
    return f"{m['mean']:.{digits}f} ± {std:.{digits}f} (n={n})"


def depth_report(doc: dict[str, Any]) -> dict[str, Any] | None:
    for check in doc.get("checks") or ():
        report = as_dict(as_dict(check.get("extra")).get("depth_sweep"))
        if isinstance(report.get("benchmarks"), list):
            return report
    return None


def table_rows(report: dict[str, Any]) -> list[dict[str, str]]:
    """One row per cell: mean ± std (n) in tok/s or ms, its place in the heat-aware order
    and its failed requests."""
    rows = []
    for raw in report.get("benchmarks") or ():
        b = as_dict(raw)
        rows.append(
            {
                "depth": str(b.get("context_size")),
                "concurrency": str(b.get("concurrency")),
                "pp tok/s": _show(b.get("pp_throughput")),
                "tg tok/s": _show(b.get("tg_throughput")),
                "tg tok/s per request": _show(b.get("tg_req_throughput")),
                "TTFT ms": _show(b.get("e2e_ttft"), 0),
                "order": str(b.get("run_order", "-")),
                "failed": str(b.get("failed", 0)),
            }
        )
    return rows


def depth_html(doc: dict[str, Any]) -> str:
    report = depth_report(doc)
    if report is None:
        return ""
    return render(
        "depth.html",
        rows=table_rows(report),
        columns=(*COLUMNS, "order", "failed"),
        model=report.get("model"),
        order=report.get("heat_order") or [],
        busting=report.get("prefix_cache_busting"),
    )
