"""The HTML report: summary at the top, per-check rows with node and measured / expected,
failure evidence and fix, plots, environment; hostile strings stay text."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from report_fakes import (
    HOSTILE,
    KEY,
    SuiteRun,
    Tags,
    assert_no_injected_markup,
    fake_suite,
    html_fragments,
    report_data,
    run_pytest,
)

from pytest_spark.report.results import CATEGORIES


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[SuiteRun, Path]:
    """One real run of the fake suite, shared by the module (it renders three plots)."""
    root = tmp_path_factory.mktemp("html-report")
    (root / "test_fake_suite.py").write_text(fake_suite())
    out = root / "out"
    run = run_pytest(
        root,
        f"--html={out / 'report.html'}",
        "--self-contained-html",
        f"--spark-results={out / 'results.json'}",
        f"--spark-history={out / 'history'}",
    )
    return run, out / "report.html"


def test_run_fails_on_the_failed_checks(report: tuple[SuiteRun, Path]) -> None:
    run, path = report
    assert run.ret == 1, run.output
    assert "2 failed, 5 passed, 1 skipped" in run.output
    assert path.exists()


def test_summary_table_per_category_and_node(report: tuple[SuiteRun, Path]) -> None:
    text = report[1].read_text()
    tags = Tags(text)
    assert tags.find("div", id="spark-report")
    start = text.index('<table id="spark-verdicts"')
    table = text[start : text.index("</table>", start)]
    rows = Tags(table)
    headers = [t for t in rows.text if t.strip()]
    assert headers[:4] == ["category", "spark-head", "spark-worker-1", "cluster"]
    cells = [a.get("class") for t, a in rows.tags if t == "td"]
    # link: head PASS, worker-1 FAIL; nccl: cluster PASS; tool_calls: cluster SKIP
    row = {
        c: table.split(f"<b>{c}</b>")[1].split("</tr>")[0]
        for c in ("link", "nccl", "readiness", "tool_calls", "preflight")
    }
    assert 'class="spark-pass">PASS' in row["link"] and 'class="spark-fail">FAIL' in row["link"]
    assert "PASS<br><small>1 passed" in row["nccl"]
    assert "FAIL<br><small>1 passed, 1 failed" in row["readiness"]
    assert "SKIP" in row["tool_calls"]
    assert row["preflight"].count("spark-none") == 3
    assert len(cells) == len(CATEGORIES) * 4  # every category, also one with no check
    # the banner's count of checks run is pytest-html's "N tests took" (skips named apart:
    # it said "2 of 8 checks" beside pytest-html's "7 tests")
    banner = text.split("Verdict: FAIL (2 of 7 checks run failed, 1 skipped) in ", 1)[1]
    banner = banner.split("</div>")[0]
    assert re.search(r'class="run-count">7 tests took', text), re.findall("run-count.{40}", text)
    assert {"link", "readiness"} <= set(banner.split(";")[0].split(", ")), banner
    assert "; first: test_" in banner, banner  # the first failure, named, with its headline
    # the summary is drawn before the environment table (CSS order) and is at the top
    assert "body>.summary{order:1}" in text


def test_rows_have_node_category_and_measured_expected(report: tuple[SuiteRun, Path]) -> None:
    data = report_data(report[1].read_text())
    header = " ".join(Tags(report[1].read_text()).text)
    assert "Measured / expected" in header and "Node" in header and "Category" in header
    rows = {nodeid.split("::")[-1]: r[0]["resultsTableRow"] for nodeid, r in data["tests"].items()}
    degraded = " ".join(rows["test_link_rate_degraded"])
    assert '<td class="col-node">spark-worker-1</td>' in degraded
    assert '<td class="col-category">link</td>' in degraded
    assert ">100 Gb/s / &gt;= 200 Gb/s</td>" in degraded
    assert ">0.24 GB/s / &gt;= 0.2 GB/s</td>" in " ".join(rows["test_allreduce_busbw"])


def test_failed_row_carries_evidence_fix_and_log_tails(report: tuple[SuiteRun, Path]) -> None:
    data = report_data(report[1].read_text())
    extras = {
        nodeid.split("::")[-1]: [e["content"] for e in r[0]["extras"] if e["format_type"] == "html"]
        for nodeid, r in data["tests"].items()
    }
    degraded = extras["test_link_rate_degraded"][0]
    assert "What usually fixes it:</b> Likely a cable rated for 100G; see ethtool -s." in degraded
    assert "evidence: ethtool enp1s0f1np1" in degraded and "Speed: 100000Mb/s" in degraded
    health = extras["test_health_endpoint"][0]
    assert "last 2 log lines of spark-head" in health and "INFO bye" in health
    assert "last 1 log lines of spark-worker-1" in health and "worker line" in health
    assert "evidence: response" in health and "evidence: request" in health
    assert "What usually fixes it:</b> Read the head&#39;s container log" in health
    assert "plotted in the summary" in extras["test_allreduce_busbw"][0]


def test_plots_are_inline_png_images(report: tuple[SuiteRun, Path]) -> None:
    tags = Tags(report[1].read_text())
    for key in ("busbw", "throughput", "timeline"):
        assert tags.find("figure", id=f"spark-plot-{key}"), key
    images = [
        a["src"]
        for t, a in tags.tags
        if t == "img" and (a.get("src") or "").startswith("data:image/png;base64,")
    ]
    assert len(images) == 3
    for src in images:
        assert src is not None
        png = base64.b64decode(src.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_environment_names_cluster_software_and_policy(report: tuple[SuiteRun, Path]) -> None:
    env = report_data(report[1].read_text())["environment"]
    assert env["NCCL version"] == "2.27.3"
    assert env["vLLM version"].startswith("&lt;script&gt;")
    assert env["SSH host-key policy"].startswith("strict")
    assert env["Threshold profile"] == "dgx-spark-2node (default)"
    assert "unknown" in env["GPU driver"]


def test_hostile_strings_are_text_everywhere(report: tuple[SuiteRun, Path]) -> None:
    text = report[1].read_text()
    assert_no_injected_markup(text)
    fragments = html_fragments(report_data(text))
    for fragment in fragments:
        assert_no_injected_markup(fragment)
    assert HOSTILE not in text  # never raw
    shown = [f for f in fragments if "&lt;script&gt;alert(" in f]
    assert len(shown) >= 4  # environment, failure block, evidence, log: there, as text


def test_missing_data_gives_a_line_not_a_plot(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest
        from pytest_spark import Finding

        @pytest.mark.nccl
        def test_busbw(spark_check):
            spark_check.attach("busbw_series", [{"bytes": "x"}, "junk"])
            spark_check.require(Finding.passed(1.0, 0.2, "GB/s"))
        """)
    path = pytester.path / "r.html"
    pytester.runpytest(f"--html={path}", "--spark-history=off").assert_outcomes(passed=1)
    tags = Tags(path.read_text())
    notes = {a["id"]: a for a in tags.find("p", **{"class": "spark-noplot"})}
    assert set(notes) == {
        "spark-plot-busbw",
        "spark-plot-latency",
        "spark-plot-throughput",
        "spark-plot-knee",
        "spark-plot-timeline",
    }
    text = " ".join(tags.text)
    assert "no plot: no check attached a busbw series" in text
    assert "no plot: no check attached a latency series" in text
    assert "no plot: no throughput sweep was recorded" in text
    assert "no plot: no open-loop sweep was recorded (it runs with --spark-open-loop)" in text
    assert "no plot: no startup timeline was recorded" in text


def test_hostkey_off_is_said_loudly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest
        from pytest_spark import Finding

        @pytest.mark.link
        def test_x(spark_check):
            spark_check.require(Finding.passed(1, 1))
        """)
    path = pytester.path / "r.html"
    pytester.runpytest(f"--html={path}", "--spark-hostkey-check=off", "--spark-history=off")
    text = path.read_text()
    assert "SSH host keys NOT checked: OFF: ANY HOST KEY IS ACCEPTED" in text
    env = report_data(text)["environment"]
    assert env["SSH host-key policy"].startswith("OFF: ANY HOST KEY IS ACCEPTED")


def test_plain_runs_get_no_spark_summary(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    path = pytester.path / "r.html"
    pytester.runpytest(f"--html={path}").assert_outcomes(passed=1)
    text = path.read_text()
    assert "spark-report" not in text and "SSH host-key policy" not in text
    assert not (pytester.path / ".spark-history").exists()


def test_under_xdist_the_controller_writes_one_report(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("xdist")
    monkeypatch.setenv("SPARK_API_KEY", KEY)
    pytester.makepyfile(f"""
        import pytest
        from pytest_spark import Finding

        @pytest.mark.link
        @pytest.mark.parametrize("node", ["spark-head", "spark-worker-1"])
        def test_rate(spark_check, node):
            level = "failed" if node == "spark-worker-1" else "passed"
            spark_check.require(getattr(Finding, level)(
                100.0, 200.0, "Gb/s", node=node, message="rate low {KEY}", bound=">="))
        """)
    path = pytester.path / "r.html"
    result = pytester.runpytest("-n", "2", f"--html={path}", "--spark-history=off")
    result.assert_outcomes(passed=1, failed=1)
    text = path.read_text()
    assert 'id="spark-verdicts"' in text
    assert (
        "Verdict: FAIL (1 of 2 checks run failed) in link; first: test_rate[spark-worker-1]" in text
    )
    assert KEY not in text
    data = report_data(text)
    rows = [" ".join(r[0]["resultsTableRow"]) for r in data["tests"].values()]
    assert sum('<td class="col-node">spark-worker-1</td>' in r for r in rows) == 1
    assert all(">100 Gb/s / &gt;= 200 Gb/s</td>" in r for r in rows)
    assert KEY not in text and KEY not in result.stdout.str()


def test_a_skipped_row_shows_its_reason_not_pytests_tuple(report: tuple[SuiteRun, Path]) -> None:
    data = report_data(report[1].read_text())
    (row,) = [r[0] for n, r in data["tests"].items() if n.endswith("test_tool_call_skipped")]
    log = row["log"]
    assert log.startswith("tool-call parser not configured\n("), log
    assert "Skipped:" not in log and not log.startswith("("), log
