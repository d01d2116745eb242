"""all_gather and small-message latency: the parser on recorded all_gather_perf output, the
sections of one launch, the checks' boundaries and messages, the report's figures."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_spark.infra.nccl.collectives_check import (
    all_gather_floor,
    check_all_gather,
    check_latency,
    latency_series,
)
from pytest_spark.infra.nccl.command_probe import mpirun_chain
from pytest_spark.infra.nccl.parse import bus_factor, parse_nccl_tests, split_sections
from pytest_spark.infra.nccl.probe import CollectiveRun, RankOutput, Section
from pytest_spark.infra.nccl.scripts.table_probe import header_lines, row_line
from pytest_spark.report.figures import figures_of, key_figures, metrics_of
from pytest_spark.report.plots import latency_plot
from pytest_spark.settings.profiles import load_profile

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"
SPARK = load_profile("dgx-spark-2node")
SIM = load_profile("sim")


def table(collective: str, rows: list[tuple[int, float]], wrong: int = 0) -> str:
    """An nccl-tests table of (bytes, seconds per iteration) rows, as the script prints it."""
    lines = [f"# Collective test starting: {collective}_perf", *header_lines()]
    for nbytes, seconds in rows:
        count = nbytes // 4 // 2 if collective == "all_gather" else nbytes // 4
        lines.append(row_line(nbytes, count, [(seconds, wrong), (seconds, 0)], 2, collective))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ parser


def test_real_all_gather_perf_output_of_two_sparks() -> None:
    out = parse_nccl_tests((FIXTURES / "all_gather_spark_1g_4g.txt").read_text())
    assert out.collective == "all_gather_perf"
    assert [r.size_bytes for r in out.rows] == [1 << 30, 2 << 30, 4 << 30]
    assert {r.redop for r in out.rows} == {"none"}
    top = out.largest
    assert top is not None and top.busbw_gbps == 22.46 and top.algbw_gbps == 44.92
    # nccl-tests' all-gather factor: busbw = algbw * (n-1)/n (doc/PERFORMANCE.md)
    for row in out.rows:
        assert row.in_place.busbw_gbps == pytest.approx(row.in_place.algbw_gbps * 0.5, abs=0.01)
        assert row.count * 4 * 2 == row.size_bytes  # count: the elements each rank sends
    assert out.avg_busbw_gbps == 21.4033 and out.out_of_bounds == 0
    assert [d.host for d in out.devices] == ["spark-fb97", "spark-4440"]


def test_bus_factor_follows_nccl_tests() -> None:
    assert bus_factor("all_gather_perf", 2) == 0.5
    assert bus_factor("all_gather", 8) == 7 / 8
    assert bus_factor("all_reduce_perf", 2) == 1.0
    assert bus_factor(None, 4) == 1.5


def test_the_script_prints_all_gather_rows_as_all_gather_perf_does() -> None:
    real = parse_nccl_tests((FIXTURES / "all_gather_spark_1g_4g.txt").read_text()).rows[0]
    seconds = real.in_place.time_us / 1e6
    ours = parse_nccl_tests(table("all_gather", [(real.size_bytes, seconds)])).rows[0]
    assert (ours.size_bytes, ours.count, ours.redop) == (real.size_bytes, real.count, "none")
    assert ours.in_place.algbw_gbps == real.in_place.algbw_gbps
    assert ours.in_place.busbw_gbps == real.in_place.busbw_gbps


def test_split_sections_of_one_launch() -> None:
    text = (
        "# pytest_spark allreduce: rendezvous complete: 2 ranks in 0.64 s\n"
        + table("all_reduce", [(1 << 20, 0.004)])
        + "# pytest_spark: section all_gather\n"
        + table("all_gather", [(1 << 20, 0.004)])
        + "# pytest_spark: section latency\n"
        + table("all_reduce", [(8, 20e-6), (16, 21e-6)])
        + "# pytest_spark allreduce: rank 0 done in 3.0 s\n"
    )
    parts = split_sections(text)
    assert list(parts) == ["all_reduce", "all_gather", "latency"]
    assert "rendezvous complete" in parts["all_reduce"]
    main = parse_nccl_tests(parts["all_reduce"])
    assert [r.size_bytes for r in main.rows] == [1 << 20] and main.init_complete
    assert parse_nccl_tests(parts["all_gather"]).collective == "all_gather_perf"
    assert [r.size_bytes for r in parse_nccl_tests(parts["latency"]).rows] == [8, 16]


def test_split_sections_without_markers_is_the_all_reduce() -> None:
    text = (FIXTURES / "all_reduce_sweep_healthy.txt").read_text()
    assert split_sections(text) == {"all_reduce": text}


def test_mpirun_chain_runs_each_sweep_with_its_binary() -> None:
    cmd = mpirun_chain(
        hosts=["192.168.200.12", "192.168.200.13"],
        env={"NCCL_SOCKET_IFNAME": "enp1s0f1np1"},
        token="pytest-spark-nccl-x",
        min_bytes=1 << 20,
        max_bytes=1 << 30,
        iters=20,
        warmup=5,
        collectives=("all_reduce", "all_gather", "latency"),
        latency_max_bytes=1 << 20,
    )
    assert cmd.count("mpirun") == 3
    assert "/tmp/pytest-spark-nccl-x.mpi/all_gather_perf -b 1048576 -e 1073741824" in cmd
    assert "/tmp/pytest-spark-nccl-x.mpi/all_reduce_perf -b 8 -e 1048576" in cmd
    assert cmd.index("section all_gather") < cmd.index("all_gather_perf -b")
    assert cmd.index("section latency") < cmd.index("-b 8 ")
    assert "no all_gather_perf beside all_reduce_perf" in cmd  # an nccl-tests build without it


# ------------------------------------------------------------------------------ checks


def test_all_gather_floor_is_a_share_of_the_all_reduce_floor() -> None:
    assert all_gather_floor(SPARK) == pytest.approx(21.875 * 0.85)
    lowered = dataclasses.replace(SPARK.nccl, min_busbw_gbps=0.02)
    assert all_gather_floor(dataclasses.replace(SPARK, nccl=lowered)) == pytest.approx(0.017)


def test_healthy_sparks_all_gather_passes_the_spark_floor() -> None:
    out = parse_nccl_tests((FIXTURES / "all_gather_spark_1g_4g.txt").read_text())
    finding = check_all_gather(out, SPARK, where="spark-head <-> spark-worker-1")
    assert finding.ok and finding.measured == 22.46
    assert finding.message.startswith("spark-head <-> spark-worker-1: all-gather busbw 22.46 GB/s")


def test_slow_all_gather_reads_as_tcp_fallback() -> None:
    # the same two Sparks after a cable swap: 2.8 GB/s busbw (the TCP-socket signature)
    out = parse_nccl_tests((FIXTURES / "all_gather_spark_1g_4g_slow.txt").read_text())
    finding = check_all_gather(out, SPARK, where="spark-head <-> spark-worker-1")
    assert not finding.ok and finding.measured == 2.83
    assert "all-gather busbw 2.83 GB/s at 4 GiB" in finding.message
    assert "expected >= 18.5938 GB/s" in finding.message
    assert "TCP socket fallback" in finding.message and "NET/IB" in finding.message


def test_all_gather_wrong_elements_fail() -> None:
    out = parse_nccl_tests(table("all_gather", [(1 << 20, 1e-4)], wrong=3))
    finding = check_all_gather(out, SPARK, where="a <-> b")
    assert not finding.ok and finding.measured == 3
    assert "all-gather returned 3 wrong elements at 1 MiB" in finding.message


def test_all_gather_check_refuses_another_collective() -> None:
    out = parse_nccl_tests(table("all_reduce", [(1 << 30, 0.04)]))
    finding = check_all_gather(out, SPARK, where="a <-> b")
    assert not finding.ok and "all_reduce_perf's, expected all_gather_perf's" in finding.message


def test_latency_is_the_best_time_of_the_sweep() -> None:
    out = parse_nccl_tests(table("all_reduce", [(8, 30e-6), (16, 19e-6), (1 << 20, 70e-6)]))
    finding = check_latency(out, SPARK, where="spark-head <-> spark-worker-1")
    assert finding.ok and finding.measured == 19.0 and finding.expected == 80
    assert "small-message latency 19.0 us" in finding.message and "at 16 B" in finding.message


def test_latency_above_the_ceiling_fails_naming_the_fix() -> None:
    out = parse_nccl_tests(table("all_reduce", [(8, 0.0102), (1 << 20, 0.0125)]))
    finding = check_latency(out, SIM, where="spark-head <-> spark-worker-1")
    assert not finding.ok and finding.measured == 10200.0 and finding.expected == 5000
    msg = finding.message
    assert msg.startswith("spark-head <-> spark-worker-1: small-message latency 10200 us")
    assert "expected <= 5000 us" in msg and "tc qdisc show dev" in msg
    assert "iptables -t mangle -S" in msg  # a userspace delayer (sparksim without netem)
    assert "8 B" in finding.evidence["latency series"]


def test_latency_without_rows_fails_with_what_the_run_said() -> None:
    out = parse_nccl_tests("# pytest_spark allreduce: error: all-reduce failed on rank 0: boom\n")
    finding = check_latency(out, SPARK, where="a <-> b")
    assert not finding.ok and "produced no result rows" in finding.message
    assert "boom" in finding.message


def test_latency_without_a_ceiling_passes_saying_so() -> None:
    unbounded = dataclasses.replace(
        SPARK, collectives=dataclasses.replace(SPARK.collectives, max_latency_us=None)
    )
    finding = check_latency(parse_nccl_tests(table("all_reduce", [(8, 1.0)])), unbounded)
    assert finding.ok and "no ceiling" in finding.message


def test_a_run_finds_its_sections() -> None:
    parsed = parse_nccl_tests(table("all_gather", [(1 << 20, 1e-3)]))
    rank = RankOutput(
        "spark-head", 0, "cmd", 0, "", "", 1.0, sections=(Section("all_gather", parsed),)
    )
    run = CollectiveRun(
        "python", "t", 2, (rank,), None, False, 1.0,
        collectives=("all_reduce", "all_gather", "latency"),
    )  # fmt: skip
    gather = run.section("all_gather")
    assert gather is not None and gather.parsed is parsed
    missing = run.section("latency")
    assert (
        missing is not None
        and missing.parsed is None
        and "ended before" in (missing.parse_error or "")
    )
    assert run.section("nothing") is None


# ------------------------------------------------------------------------------ report


def test_latency_series_plots_with_its_ceiling() -> None:
    out = parse_nccl_tests(table("all_reduce", [(8, 20e-6), (1 << 20, 60e-6)]))
    data = latency_series(out, 80).to_dict()
    gather = {"points": [{"size_bytes": 1 << 20, "busbw_gbps": 0.2}], "collective": "all_gather"}
    doc = {
        "checks": [
            {"nodeid": "t::test_small_message_latency", "extra": {"latency_series": data}},
            {"nodeid": "t::test_allgather_busbw", "expected": 0.15,
             "extra": {"busbw_series": gather}},
        ]
    }  # fmt: skip
    figures = figures_of(doc)
    assert [s.points for s in figures.latency] == [[(8, 20.0), (1 << 20, 60.0)]]
    assert figures.latency[0].threshold == 80
    assert dict(key_figures(figures))["latency"].startswith("20 µs")
    # all-gather is its own figure, not the all-reduce busbw of the history
    metrics = metrics_of(figures)
    assert "busbw" not in metrics and metrics["busbw.all_gather"].value == 0.2
    plot = latency_plot(figures.latency)
    assert plot.uri is not None and plot.uri.startswith("data:image/png;base64,")
    assert latency_plot([]).uri is None


def test_mpirun_chain_output_splits_into_its_sweeps(tmp_path: Path) -> None:
    """The chain run by a real shell, with stand-ins for mpirun and the nccl-tests binaries
    (each prints a recorded table): every sweep lands in its own parsed section."""
    import os
    import secrets
    import shlex
    import subprocess

    from pytest_spark.infra.nccl.command_probe import TOKEN_PREFIX
    from pytest_spark.infra.nccl.result_probe import parse_all

    token = TOKEN_PREFIX + secrets.token_hex(6)
    mpi = Path(f"/tmp/{token}.mpi")
    mpi.mkdir()
    try:
        reduce = FIXTURES / "all_reduce_sweep_healthy.txt"
        gather = FIXTURES / "all_gather_spark_1g_4g.txt"
        for name, text in (("all_reduce_perf", reduce), ("all_gather_perf", gather)):
            (mpi / name).write_text(f"#!/bin/sh\ncat {shlex.quote(str(text))}\n")
            (mpi / name).chmod(0o755)
        bindir = tmp_path / "bin"
        bindir.mkdir()
        (bindir / "mpirun").write_text(
            '#!/bin/sh\nwhile [ $# -gt 0 ]; do case "$1" in */*_perf) exec "$@";; esac; '
            "shift; done; exit 2\n"
        )
        (bindir / "mpirun").chmod(0o755)
        cmd = mpirun_chain(
            hosts=["192.168.200.12", "192.168.200.13"], env={}, token=token,
            min_bytes=1 << 20, max_bytes=1 << 30, iters=20, warmup=5,
            collectives=("all_reduce", "all_gather", "latency"), latency_max_bytes=1 << 20,
        )  # fmt: skip
        env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
        proc = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        main, error, sections = parse_all(proc.stdout)
        assert error is None and main is not None and len(main.rows) == 28
        by_name = {s.name: s.parsed for s in sections}
        assert list(by_name) == ["all_gather", "latency"]
        gathered = by_name["all_gather"]
        assert gathered is not None and gathered.collective == "all_gather_perf"
        assert gathered.largest is not None and gathered.largest.busbw_gbps == 22.46
        # without all_gather_perf beside all_reduce_perf the sweep says so and fails
        (mpi / "all_gather_perf").unlink()
        proc = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env)
        assert proc.returncode == 4
        _, _, sections = parse_all(proc.stdout)
        missing = sections[0].parsed
        assert missing is not None and missing.rows == ()
        assert any("no all_gather_perf beside all_reduce_perf" in e for e in missing.errors)
    finally:
        for path in mpi.iterdir():
            path.unlink()
        mpi.rmdir()


def test_html_report_shows_the_latency_plot(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest
        from pytest_spark import Finding

        @pytest.mark.nccl
        def test_small_message_latency(spark_check):
            spark_check.attach("latency_series", {
                "max_latency_us": 80,
                "points": [{"size_bytes": 8, "time_us": 21.0}, {"size_bytes": 64, "time_us": 22.5}],
            })
            spark_check.require(Finding.passed(21.0, 80, "us"))
        """)
    path = pytester.path / "r.html"
    pytester.runpytest(f"--html={path}", "--spark-history=off").assert_outcomes(passed=1)
    html = path.read_text()
    figure = html[html.index('id="spark-plot-latency"') :]
    assert figure.split(">", 1)[1].lstrip().startswith('<img alt="NCCL small-message')
    assert "data:image/png;base64," in figure.split("</figure>", 1)[0]
    assert "21 µs, the best small-message all-reduce (ceiling &lt;= 80 µs)" in html
