"""The pytest_spark_* hooks, each implemented by a conftest in a pytester run.

generate (firstresult): a conftest sees the arguments, and what it returns replaces the
built-in document. update: every implementation runs, in pytest's hook order, each seeing
the previous ones' changes. cluster_ready: called once, with the connected cluster, before
the first test using it. Nothing is contacted but closed ports on loopback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

SUITE = """
import pytest
from pytest_spark import Finding

@pytest.mark.preflight
def test_ok(spark_check):
    spark_check.require(Finding.passed(512.0, 100.0, "GiB", node="spark-head"))

@pytest.mark.preflight
def test_bad(spark_check):
    spark_check.require(Finding.failed(3.0, 100.0, "GiB", node="spark-worker-1",
                                       message="spark-worker-1: 3 GiB free on /, expected 100"))
"""

# Records the arguments it is given in seen.json, returns None: the built-in runs.
SEES_GENERATE = """
import json

def pytest_spark_generate_results(config, checks, cluster, serving, exitstatus):
    seen = {
        "config": type(config).__name__,
        "checks": sorted((c["nodeid"].split("::")[1], c["outcome"]) for c in checks),
        "cluster": cluster,
        "serving": serving,
        "exitstatus": exitstatus,
    }
    (config.rootpath / "seen.json").write_text(json.dumps(seen))
"""


def run_suite(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, Path]:
    pytester.makepyfile(test_suite=SUITE)
    path = pytester.path / "results.json"
    result = pytester.runpytest(f"--spark-results={path}", "--spark-history=off", *args)
    result.assert_outcomes(passed=1, failed=1)
    return result, path


def read(path: Path) -> Any:
    return json.loads(path.read_text())


def test_generate_results_sees_checks_cluster_and_exitstatus(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SEES_GENERATE)
    _, path = run_suite(pytester)
    seen = read(pytester.path / "seen.json")
    assert seen["config"] == "Config"
    assert seen["checks"] == [["test_bad", "failed"], ["test_ok", "passed"]]
    assert seen["cluster"]["profile"] == "dgx-spark-2node"
    assert seen["serving"] is None  # nothing was launched or attached
    assert seen["exitstatus"] == int(pytest.ExitCode.TESTS_FAILED)
    # it returned None: the built-in document is written, built from the same arguments
    doc = read(path)
    assert doc["version"] == 1
    assert doc["exitstatus"] == seen["exitstatus"]
    assert doc["cluster"] == seen["cluster"]
    assert sorted(c["nodeid"].split("::")[1] for c in doc["checks"]) == ["test_bad", "test_ok"]
    assert "serving" not in doc


def test_generate_results_implementation_replaces_the_default(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
        def pytest_spark_generate_results(config, checks, cluster, serving, exitstatus):
            return {"format": "flat", "failed": [c["nodeid"] for c in checks
                                                 if c["outcome"] == "failed"]}
        """
    )
    _, path = run_suite(pytester)
    doc = read(path)
    assert doc["format"] == "flat"
    assert doc["failed"] == ["test_suite.py::test_bad"]
    # the default's fields are gone; the update hooks still ran on the replacement
    assert not {"version", "checks", "cluster", "exitstatus"} & set(doc)
    assert set(doc) == {"format", "failed", "report"}


UPDATE_CONFTEST = """
import pytest

def pytest_spark_update_results(config, results):
    results.setdefault("order", []).append("conftest")
    # the plugin's own update (tryfirst) has already added the report block
    results["report_seen_by_conftest"] = "report" in results

class Late:
    @pytest.hookimpl(trylast=True)
    def pytest_spark_update_results(self, config, results):
        results.setdefault("order", []).append("late")
        results["late_saw"] = list(results["order"])

def pytest_configure(config):
    config.pluginmanager.register(Late(), "late")
"""

UPDATE_PLUGIN = """
def pytest_spark_update_results(config, results):
    results.setdefault("order", []).append("plugin")
"""


def test_update_results_runs_every_implementation_in_hook_order(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(UPDATE_CONFTEST)
    pytester.makepyfile(spark_update_plugin=UPDATE_PLUGIN)
    pytester.syspathinsert()
    _, path = run_suite(pytester, "-p", "spark_update_plugin")
    doc = read(path)
    # pytest's order: tryfirst (the plugin's redaction + report), then plain implementations
    # last registered first (the conftest after the -p plugin), then trylast
    assert doc["order"] == ["conftest", "plugin", "late"]
    assert doc["late_saw"] == ["conftest", "plugin", "late"]
    assert doc["report_seen_by_conftest"] is True
    assert doc["version"] == 1 and len(doc["checks"]) == 2  # amended, not replaced


def test_update_results_see_redacted_results_and_what_they_add_is_redacted(
    pytester: pytest.Pytester,
) -> None:
    """The plugin's own update wraps the others: they see the document redacted, and
    what they add is redacted before it is written."""
    pytester.makeconftest(
        """
        def pytest_spark_generate_results(config, checks, cluster, serving, exitstatus):
            return {"note": "served with --api-key=sekrit-4711"}

        def pytest_spark_update_results(config, results):
            results["seen"] = results["note"]
            results["added"] = "curl -H 'Authorization: Bearer sekrit-4711'"
        """
    )
    _, path = run_suite(pytester, "--spark-api-key=sekrit-4711")
    text = path.read_text()
    assert "sekrit" not in text
    doc = json.loads(text)
    assert doc["seen"] == "served with --api-key=<redacted>"
    assert doc["added"] == "curl -H 'Authorization: Bearer <redacted>'"


def test_update_results_runs_without_a_results_file(pytester: pytest.Pytester) -> None:
    """Shipping results elsewhere: an update implementation gets them even when
    --spark-results writes no file."""
    pytester.makeconftest(
        """
        import json

        def pytest_spark_update_results(config, results):
            (config.rootpath / "shipped.json").write_text(json.dumps(results))
        """
    )
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("--spark-history=off")
    result.assert_outcomes(passed=1, failed=1)
    shipped = read(pytester.path / "shipped.json")
    assert shipped["version"] == 1
    assert shipped["exitstatus"] == int(pytest.ExitCode.TESTS_FAILED)
    assert sorted(c["outcome"] for c in shipped["checks"]) == ["failed", "passed"]
    assert not list(pytester.path.glob("*results*.json"))


def test_old_results_hook_is_refused_by_name(pytester: pytest.Pytester) -> None:
    """pytest_spark_results is gone (generate/update replace it): a conftest still
    implementing it stops the run naming the hook, instead of being silently ignored."""
    pytester.makeconftest(
        """
        def pytest_spark_results(config, results):
            return True
        """
    )
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("--spark-history=off")
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["*unknown hook 'pytest_spark_results' in plugin*conftest.py*"])


CLUSTER_READY_CONFTEST = """
import json

CALLS = []

def pytest_spark_cluster_ready(cluster):
    CALLS.append({
        "head": cluster.head.name,
        "nodes": [[n.name, n.role, n.address] for n in cluster.nodes],
        "unreachable": {n.name: str(cluster.unreachable(n)) for n in cluster.nodes
                        if cluster.unreachable(n) is not None},
    })
    (cluster.settings.results.parent / "ready.json").write_text(json.dumps(CALLS))
"""

CLUSTER_TESTS = """
import json

def calls(cluster):
    return json.loads((cluster.settings.results.parent / "ready.json").read_text())

def test_first(spark_cluster):
    assert len(calls(spark_cluster)) == 1  # called before the first test using the cluster

def test_second(spark_cluster):
    assert len(calls(spark_cluster)) == 1  # and only once per session
"""


def test_cluster_ready_called_once_with_the_connected_cluster(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CLUSTER_READY_CONFTEST)
    pytester.makepyfile(test_cluster=CLUSTER_TESTS)
    # closed loopback ports: both connections are refused at once, so the nodes carry
    # their errors; the hook is still called, and says which node could not be reached
    result = pytester.runpytest(
        "--spark-head=127.0.0.1:9",
        "--spark-workers=127.0.0.1:7",
        f"--spark-ssh-config={pytester.path / 'no-ssh-config'}",
        "--spark-connect-timeout=2",
        f"--spark-results={pytester.path / 'results.json'}",
        "--spark-history=off",
    )
    result.assert_outcomes(passed=2)
    calls = read(pytester.path / "ready.json")
    assert len(calls) == 1
    call = calls[0]
    assert call["head"] == "spark-head"
    assert call["nodes"] == [
        ["spark-head", "head", "127.0.0.1:9"],
        ["spark-worker-1", "worker", "127.0.0.1:7"],
    ]
    assert set(call["unreachable"]) == {"spark-head", "spark-worker-1"}
    assert "spark-head" in call["unreachable"]["spark-head"]


def test_cluster_ready_not_called_when_no_test_uses_the_cluster(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CLUSTER_READY_CONFTEST)
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = pytester.runpytest(
        "--spark-head=127.0.0.1:9",
        f"--spark-ssh-config={pytester.path / 'no-ssh-config'}",
        f"--spark-results={pytester.path / 'results.json'}",
        "--spark-history=off",
    )
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "ready.json").exists()


def test_hooks_known_but_not_called_when_the_plugin_is_not_asked_for(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conftest implementing the hooks works in a run that asks nothing of the plugin
    (the specs are always registered); the plugin stays inert and calls none of them."""
    for name in ("SPARK_HEAD", "SPARK_API_URL", "SPARK_SIM"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(
        SEES_GENERATE
        + """
def pytest_spark_update_results(config, results):
    (config.rootpath / "updated").write_text("")

def pytest_spark_cluster_ready(cluster):
    (cluster.settings.results.parent / "ready").write_text("")
"""
    )
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    assert not [n for n in ("seen.json", "updated", "ready") if (pytester.path / n).exists()]


def test_a_verdict_reached_while_handling_an_error_is_printed_once(
    pytester: pytest.Pytester,
) -> None:
    """A check that fails inside ``except`` (the SDK raised, the verdict is the failure)
    shows its message once: not the handled error again above it with "During handling of
    the above exception, another exception occurred"."""
    pytester.makepyfile("""
        import pytest
        from pytest_spark import Finding

        @pytest.mark.tool_calls
        def test_sdk(spark_check):
            try:
                raise ValueError("the raw error")
            except ValueError:
                spark_check.require(Finding.failed(1, 2, message="the verdict, once"))
        """)
    result = pytester.runpytest("--spark-history=off", "--spark-api-url=http://127.0.0.1:9")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "the verdict, once" in out
    assert "During handling" not in out and "the raw error" not in out, out
