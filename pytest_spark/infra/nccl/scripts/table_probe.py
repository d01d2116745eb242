#!/usr/bin/env python3
"""nccl-tests' table, as the all-reduce benchmark prints it: the column header, one row per
message size (out-of-place then in-place: time, algbw, busbw, #wrong) and nccl-tests' own
number format (getFloatStr), so one parser reads real nccl-tests and the benchmark alike.

Standalone: stdlib only; shipped with ``allreduce_probe.py`` (pytest_spark bundles them into
one program, :func:`pytest_spark.infra.nccl.command_probe.script_text`) and imported by it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def float_str(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: as many decimals as the width allows."""
    if not math.isfinite(value):
        return f"{value!s:>{width}}"
    power, val = 0, 1
    while value >= val:
        power += 1
        val *= 10
    if power < width - 2:
        return f"{value:{width}.2f}"
    if power < width - 1:
        return f"{value:{width}.1f}"
    if power < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}"


def header_lines() -> list[str]:
    blank = ("", "", "", "", "")
    return [
        "#",
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place"
        "                       in-place          ".format(*blank),
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}"
        "  {:>6} ".format(
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong",
        ),
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}"
        "  {:>6} ".format(
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
        ),
    ]


def bus_factor(collective: str, nranks: int) -> float:
    """nccl-tests' busbw factor (doc/PERFORMANCE.md): all-reduce 2(n-1)/n, all-gather (n-1)/n."""
    if collective == "all_gather":
        return (nranks - 1) / nranks
    return 2 * (nranks - 1) / nranks


def row_line(
    nbytes: int,
    count: int,
    results: Iterable[tuple[float, int]],
    nranks: int,
    collective: str = "all_reduce",
) -> str:
    """One nccl-tests row from (seconds per iteration, wrong elements) per placement.
    all_gather rows, as all_gather_perf prints them: redop ``none``, ``count`` the elements
    each rank sends, ``nbytes`` the whole gathered buffer."""
    redop = "none" if collective == "all_gather" else "sum"
    line = f"{nbytes:12d}  {count:12d}  {'float':>8}  {redop:>6}  {-1:6d}"
    for seconds, wrong in results:
        algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        busbw = algbw * bus_factor(collective, nranks)
        cols = (float_str(seconds * 1e6, 7), float_str(algbw, 6), float_str(busbw, 6))
        line += "  {:>7}  {:>6}  {:>6}".format(*cols) + f"  {float(wrong):>6g}"
    return line
