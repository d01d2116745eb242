"""The JSON results file: schema v1, one record per suite check, written on interrupt too."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

SUITE = """
import pytest
from pytest_spark import Finding

pytestmark = pytest.mark.link

def test_ok(spark_check):
    spark_check.require(Finding.passed(200.0, 200.0, "Gb/s", node="spark-head"))

def test_bad(spark_check):
    spark_check.require(Finding.failed(100.0, 200.0, "Gb/s", node="spark-worker-1",
                                       message="spark-worker-1 enp1s0f1np1: rate 100 Gb/s"))

def test_skip(spark_check):
    pytest.skip("link not usable: see the link-up check")

def test_crash(spark_check):
    {}["no such key"]

@pytest.fixture
def broken():
    raise ConnectionResetError("peer went away")

def test_setup_crash(broken):
    pass

def test_noted(spark_check):
    import warnings
    from pytest_spark import CheckNote
    warnings.warn(CheckNote("asked again alone: answered in 2.0 s"))
    spark_check.require(Finding.passed(200.0, 200.0, "Gb/s", node="spark-head"))

@pytest.mark.nccl
def test_series(spark_check):
    spark_check.attach("busbw_series", [{"bytes": 1048576, "busbw_gbps": 0.24}])
    spark_check.require(Finding.passed(0.24, 0.18, "GB/s"))
"""
CHECK_KEYS = {
    "nodeid",
    "category",
    "node",
    "outcome",
    "measured",
    "expected",
    "unit",
    "message",
    "crashed",
    "notes",
}


def test_results_match_schema(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE, test_plain="def test_not_a_suite_check():\n    pass\n")
    path = pytester.path / "out" / "results.json"
    result = pytester.runpytest(f"--spark-results={path}", "--spark-history=off")
    result.assert_outcomes(passed=4, failed=2, skipped=1, errors=1)
    doc = json.loads(path.read_text())
    assert doc["version"] == 1
    datetime.fromisoformat(doc["started"])
    assert isinstance(doc["duration_s"], float)
    assert set(doc["cluster"]) >= {"head", "nodes", "sim", "profile"}
    assert doc["cluster"]["sim"] is False and doc["cluster"]["profile"] == "dgx-spark-2node"
    checks = {c["nodeid"].split("::")[1]: c for c in doc["checks"]}
    assert set(checks) == {
        "test_ok",
        "test_bad",
        "test_skip",
        "test_crash",
        "test_setup_crash",
        "test_noted",
        "test_series",
    }
    for check in checks.values():
        assert set(check) >= CHECK_KEYS
        assert check["category"] in (
            "preflight",
            "link",
            "nccl",
            "readiness",
            "tool_calls",
            "reasoning",
            "throughput",
        )
        assert check["outcome"] in ("passed", "failed", "skipped", "error")
    assert (
        checks["test_ok"]["outcome"],
        checks["test_ok"]["measured"],
        checks["test_ok"]["unit"],
        checks["test_ok"]["node"],
    ) == ("passed", 200.0, "Gb/s", "spark-head")
    bad = checks["test_bad"]
    assert (bad["outcome"], bad["node"], bad["expected"]) == ("failed", "spark-worker-1", 200.0)
    assert bad["message"] == "spark-worker-1 enp1s0f1np1: rate 100 Gb/s"
    assert checks["test_skip"]["message"] == "link not usable: see the link-up check"
    # a verdict (failed check, skip) is not a crash; an exception in a test or fixture is
    assert [n for n, c in checks.items() if c["crashed"]] == ["test_crash", "test_setup_crash"]
    assert checks["test_crash"]["crashed"] == "KeyError"
    assert checks["test_setup_crash"]["crashed"] == "ConnectionResetError"
    assert checks["test_setup_crash"]["outcome"] == "error"
    # a CheckNote is kept with its check, and still in pytest's warnings summary
    assert checks["test_noted"]["notes"] == ["asked again alone: answered in 2.0 s"]
    assert checks["test_noted"]["outcome"] == "passed" and checks["test_ok"]["notes"] == []
    result.stdout.fnmatch_lines(["*CheckNote: asked again alone: answered in 2.0 s*"])
    assert checks["test_series"]["category"] == "nccl"
    assert checks["test_series"]["extra"]["busbw_series"][0]["busbw_gbps"] == 0.24
