"""The terminal summary: verdicts per category and node, key figures, output paths."""

from __future__ import annotations

import html
import json
import re
from xml.etree import ElementTree

import pytest
from report_fakes import KEY, write_suite


def test_summary_table_figures_and_paths(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # a wide terminal: the figures on one line
    write_suite(pytester)
    result = pytester.runpytest("--spark-results=out/results.json", "--spark-history=h")
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            "*- pytest-dgx-spark summary -*",
            "category    spark-head*spark-worker-1*cluster*",
            "link        1 passed *1 passed, 1 failed *-*",
            "nccl        - *- *1 passed*",
            "readiness   - *- *1 passed, 1 failed*",
            "tool_calls  - *- *1 skipped*",
            "throughput  - *- *1 passed*",
            "figures: busbw 0.24 GB/s at the largest message (threshold >= 0.2 GB/s) | "
            "tok/s @1 30 tok/s, TTFT p90 too few (n=8, needs >= 10), p99 too few (n=8, "
            "needs >= 100) | "
            "tok/s @4 90.94 tok/s, TTFT p90 1.2 s (n=32), p99 too few (n=32, needs >= 100) | "
            "startup 300.0 s (start 30 s, weights 150 s, kv 45 s, graphs 60 s, api 15 s)",
            f"results JSON: {pytester.path / 'out' / 'results.json'}",
            f"history:      {pytester.path / 'h'}/dgx-spark-2node-*/0001_nogit_*.json",
        ]
    )
    assert "preflight" not in result.stdout.str().split("pytest-dgx-spark summary")[1]


def test_missing_figures_are_named(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    pytester.makepyfile("""
        import pytest
        from pytest_spark import Finding

        @pytest.mark.preflight
        def test_x(spark_check):
            spark_check.require(Finding.warned(80, 90, "%", node="spark-head", message="low"))
        """)
    result = pytester.runpytest("-W", "ignore", "--spark-history=off")
    result.stdout.fnmatch_lines(
        [
            "preflight   1 passed, 1 warned*",
            "figures: busbw not measured | tok/s @1 not measured | tok/s @4 not measured | "
            "startup not measured",
            "history:      run history off (--spark-history off)",
        ]
    )


def test_no_summary_without_suite_checks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest()
    assert "pytest-dgx-spark summary" not in result.stdout.str()


def test_a_long_category_name_keeps_its_own_column(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest
        from pytest_spark import Finding

        @pytest.mark.structured_output
        def test_x(spark_check):
            spark_check.require(Finding.passed(1, 1, "", message="ok"))
        """)
    result = pytester.runpytest("--spark-results=out/results.json", "--spark-history=off")
    result.stdout.fnmatch_lines(["category           *cluster*", "structured_output  *1 passed*"])


def test_summary_fits_a_narrow_terminal(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #25 §6: the table was 143 columns and the figures line 325 characters,
    whatever the terminal. At 60 columns the node columns go in tables that fit, and the
    figures one a line."""
    monkeypatch.setenv("COLUMNS", "60")
    write_suite(pytester)
    result = pytester.runpytest("--spark-history=off")
    summary = result.stdout.str().split("pytest-dgx-spark summary")[1].split("=" * 10)[0]
    lines = summary.splitlines()[1:]
    table = [line for line in lines if not line.startswith(("figures:", " ", "history:"))]
    assert all(len(line.rstrip()) <= 60 for line in table), table
    result.stdout.fnmatch_lines(
        [
            "category    spark-head*spark-worker-1*",
            "link        1 passed *1 passed, 1 failed*",
            "category    cluster*",
            "figures: busbw 0.24 GB/s at the largest message (threshold >= 0.2 GB/s)",
            "         tok/s @1 30 tok/s, TTFT p90 too few (n=8, needs >= 10), p99 too few (n=8, "
            "needs >= 100)",
            "         tok/s @4 90.94 tok/s, TTFT p90 1.2 s (n=32), p99 too few (n=32, "
            "needs >= 100)",
            "         startup 300.0 s (start 30 s, weights 150 s, kv 45 s, graphs 60 s, api 15 s)",
        ]
    )


def test_collect_only_prints_no_summary(pytester: pytest.Pytester) -> None:
    """``--co`` runs nothing: no verdict table, no "not measured" figures."""
    write_suite(pytester)
    # a cluster given (nothing is contacted while collecting): the summary would show
    result = pytester.runpytest("--co", "--spark-history=off", "--spark-head=192.0.2.1")
    assert result.ret == 0
    out = result.stdout.str()
    assert "pytest-dgx-spark summary" not in out
    assert "not measured" not in out


def test_no_figure_measured_is_one_line_in_a_narrow_terminal(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    pytester.makepyfile("""
        import pytest
        from pytest_spark import Finding

        @pytest.mark.preflight
        def test_x(spark_check):
            spark_check.require(Finding.passed(1, 1, "", node="spark-head", message="ok"))
        """)
    result = pytester.runpytest("--spark-history=off")
    result.stdout.fnmatch_lines(["figures: not measured (busbw, tok/s @1, tok/s @4, startup)"])


def test_summary_shows_the_roofline_and_spec_decoding(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    pytester.makepyfile("""
        import pytest
        from pytest_spark import Finding

        @pytest.mark.throughput
        def test_decode_single_stream(spark_check):
            spark_check.attach("level", {"concurrency": 1, "output_tok_s": 40.0})
            spark_check.attach(
                "roofline",
                {"roofline_tok_s": 54.6, "fraction": 0.7326, "decode_tok_s": 40.0},
            )
            spark_check.require(Finding.passed(40.0, 20.0, "tok/s", message="decode"))

        @pytest.mark.throughput
        def test_spec_decode_acceptance(spark_check):
            spark_check.attach(
                "spec_decode",
                {"acceptance": 0.309, "mean_length": 1.93, "per_pos": [0.5, 0.28, 0.15],
                 "method": "mtp", "num_speculative_tokens": 3, "decode_tok_s_1": 30.8,
                 "no_draft_tok_s": 40.0, "min_acceptance": 0.4},
            )
            spark_check.require(Finding.failed(0.309, 0.4, message="collapsed"))
        """)
    result = pytester.runpytest("-W", "ignore", "--spark-history=off")
    result.stdout.fnmatch_lines(
        [
            "throughput  1 passed, 1 failed*",
            "figures: busbw not measured | tok/s @1 40 tok/s; decode 40 tok/s, 73% of the "
            "54.6 tok/s roofline | tok/s @4 not measured | spec decode mtp k=3: acceptance "
            "30.9% (>= 40%), mean accepted length 1.93, per position 0.50/0.28/0.15; 30.8 "
            "tok/s single-stream (no drafting: 40) | startup not measured",
        ]
    )


def _after_stats(lines: list[str]) -> list[str]:
    """The lines after pytest's own last line (``=== 2 failed, ... in 0.1s ===``)."""
    at = max(i for i, line in enumerate(lines) if re.match(r"=+ .* in [0-9.]+s.* =+$", line))
    return [line for line in lines[at + 1 :] if line.strip()]


def test_the_verdict_is_the_last_line_as_the_html_says_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36 §5: the terminal ended with the table and "2 failed, 5 passed"; the HTML
    report's verdict line now comes after pytest's own last line, the same text, wrapped
    to an 80-column terminal."""
    monkeypatch.setenv("COLUMNS", "80")
    write_suite(pytester)
    path = pytester.path / "r.html"
    result = pytester.runpytest("--spark-history=off", f"--html={path}")
    assert result.ret == 1
    last = _after_stats(result.outlines)
    assert last[0].startswith("Verdict: FAIL (2 of 7 checks run failed, 1 skipped) in "), last
    assert all(len(line) <= 80 for line in last), last
    assert all(line.startswith("  ") for line in last[1:]), last
    said = " ".join(line.strip() for line in last)
    page = html.unescape(path.read_text())
    assert f"{said}</div>" in page, said  # the HTML banner, word for word
    # the first failure led by its figures (it names no node), then its message
    assert "first: test_health_endpoint: 503 / <= 200; GET http://admin:<redacted>@" in said


def test_a_passing_run_ends_with_its_verdict(pytester: pytest.Pytester) -> None:
    write_suite(pytester, failures=False)
    result = pytester.runpytest("--spark-history=off")
    assert result.ret == 0
    assert _after_stats(result.outlines) == ["Verdict: PASS (5 checks run, 1 skipped)"]


def test_the_short_summary_leads_with_what_failed_where(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest's short test summary shows a failure's first line cut to the terminal: it
    showed "Failed: " and the message's start ("Faile..." at 80 columns). A suite check's
    line leads with its node and figures; a plain test's failure stays pytest's own."""
    # pytest cuts the line to the terminal only off CI (_pytest.terminal: running_on_ci()):
    # the project's own CI sets CI=true, and there every line is whole
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("BUILD_NUMBER", raising=False)
    pytester.makepyfile(
        test_plain="def test_plain():\n    assert 1 == 2\n",
        test_suite="""
        import pytest
        from pytest_spark import Finding

        @pytest.mark.link
        def test_link_rate(spark_check):
            spark_check.require(Finding.failed(
                100.0, 200.0, "Gb/s", node="spark-worker-1", bound=">=",
                message="spark-worker-1 enp1s0f1np1: link rate 100 Gb/s from ethtool, "
                "expected >= 200 Gb/s. Likely a cable rated for 100G\\nsecond line"))

        @pytest.mark.readiness
        def test_serving(spark_check):
            pytest.fail("vLLM on spark-head is not serving: container exited (code 137)")
        """,
    )
    monkeypatch.setenv("COLUMNS", "200")
    wide = pytester.runpytest("--spark-history=off", "-p", "no:randomly")
    wide.stdout.fnmatch_lines(
        [
            "FAILED test_plain.py::test_plain - assert 1 == 2",
            "FAILED test_suite.py::test_link_rate - spark-worker-1 enp1s0f1np1: 100 Gb/s / >= "
            "200 Gb/s; link rate 100 Gb/s from ethtool, expected >= 200 Gb/s. Likely a cable "
            "rated for 100G",
            "FAILED test_suite.py::test_serving - vLLM on spark-head is not serving: container "
            "exited (code 137)",
        ]
    )
    # the whole failure, below its short line, where pytest prints every line (-vv)
    verbose = pytester.runpytest("--spark-history=off", "-vv")
    verbose.stdout.fnmatch_lines(
        [
            "FAILED test_suite.py::test_link_rate - spark-worker-1 enp1s0f1np1: 100 Gb/s / >= "
            "200 Gb/s; link rate *",
            "spark-worker-1 enp1s0f1np1: link rate 100 Gb/s from ethtool, expected >= 200 Gb/s."
            " Likely a cable rated for 100G",
            "second line",
        ]
    )
    monkeypatch.setenv("COLUMNS", "80")
    narrow = pytester.runpytest("--spark-history=off")
    narrow.stdout.fnmatch_lines(
        ["FAILED test_suite.py::test_link_rate - spark-worker-1 enp1s0f1np1: 100 Gb/s /..."]
    )
    assert "Faile" not in narrow.stdout.str().split("short test summary info")[1]


def test_under_xdist_the_verdict_and_short_lines_are_the_controllers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("xdist")
    monkeypatch.setenv("COLUMNS", "200")
    pytester.makepyfile(
        test_x="""
        import pytest
        from pytest_spark import Finding

        @pytest.mark.link
        @pytest.mark.parametrize("node", ["spark-head", "spark-worker-1"])
        def test_rate(spark_check, node):
            level = "failed" if node == "spark-worker-1" else "passed"
            spark_check.require(getattr(Finding, level)(
                100.0, 200.0, "Gb/s", node=node, message=f"{node} enp1s0f1np1: rate low",
                bound=">="))
        """
    )
    result = pytester.runpytest("-n", "2", "--spark-history=off")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "FAILED test_x.py::test_rate[[]spark-worker-1] - spark-worker-1 enp1s0f1np1: "
            "100 Gb/s / >= 200 Gb/s; rate low",
        ]
    )
    assert _after_stats(result.outlines) == [
        "Verdict: FAIL (1 of 2 checks run failed) in link; first: test_rate[spark-worker-1]: "
        "spark-worker-1 enp1s0f1np1: 100 Gb/s / >= 200 Gb/s; rate low"
    ]


def test_junit_writes_each_finding_as_json(pytester: pytest.Pytester) -> None:
    """Issue 36 §5: the spark_finding property was a Python repr ('unit': None)."""
    write_suite(pytester)
    path = pytester.path / "junit.xml"
    args = ["--spark-history=off", f"--junitxml={path}", "-o", "junit_family=xunit1"]
    pytester.runpytest(*args, f"--spark-api-key={KEY}")  # redacted inside the JSON too
    found = {
        case.get("name"): json.loads(prop.get("value"))
        for case in ElementTree.parse(path).iter("testcase")
        for prop in case.iter("property")
        if prop.get("name") == "spark_finding"
    }
    degraded = found["test_link_rate_degraded"]
    assert degraded["measured"] == 100.0 and degraded["unit"] == "Gb/s", degraded
    assert degraded["node"] == "spark-worker-1" and degraded["level"] == "fail", degraded
    assert found["test_allreduce_busbw"]["bound"] is None  # null, not None
    assert KEY not in path.read_text()
    assert degraded["message"].endswith("(key <redacted>)"), degraded


def test_the_short_headline_leads_with_where_and_the_figures() -> None:
    from pytest_spark.report.summary import short_headline, verdict_line

    rate = {"node": "spark-head", "measured": 100.0, "expected": 200.0, "unit": "Gb/s"}
    said = "spark-head enp1s0f1np1: link rate 100 Gb/s, expected >= 200 Gb/s\nfix: reseat"
    assert short_headline({**rate, "level": "fail", "bound": ">=", "message": said}) == (
        "spark-head enp1s0f1np1: 100 Gb/s / >= 200 Gb/s; link rate 100 Gb/s, expected >= 200 Gb/s"
    )
    other = "the cable is rated for 100G"  # a message that does not start with the node
    assert short_headline({**rate, "level": "fail", "message": other}) == (
        "spark-head: 100 Gb/s / >= 200 Gb/s; the cable is rated for 100G"
    )
    words = {"node": "spark-head", "level": "fail", "message": "no vllm process"}
    assert short_headline(words) == "spark-head: no vllm process"  # no figures
    assert short_headline({**rate, "level": "pass", "message": "ok\nmore"}) == "ok"
    long = {**words, "message": "word " * 60, "nodeid": "t.py::test_x", "outcome": "failed"}
    line = verdict_line({"checks": [{**long, "category": "link"}]})
    headline = line.split("; first: test_x: ", 1)[1]
    assert headline.startswith("spark-head: word word") and headline.endswith(" word...")
    assert len(headline) <= 200  # cut at a word
