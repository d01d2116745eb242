"""``pytest_configure`` chooses the process's role once (as xdist's DSession): the
controller's plugin object (it records the results and writes the report) or, in an xdist
worker, the worker's (it shares the measurements and sends redacted reports); never both.
Nothing is contacted: --spark-api-url names a closed port on loopback."""

from __future__ import annotations

import json

import pytest

# Named by the process (not PYTEST_XDIST_WORKER: an outer xdist run sets it for pytester too).
PROBE = """
import json

NAMES = ("spark.controller", "spark.worker", "spark.results", "spark.report",
         "spark.measure", "spark.redact")

def test_roles(request):
    pm = request.config.pluginmanager
    who = getattr(request.config, "workerinput", {}).get("workerid", "main")
    seen = {name: pm.get_plugin(name) is not None for name in NAMES}
    (request.config.rootpath / f"roles-{who}.json").write_text(json.dumps(seen))
"""
ARGS = ("--spark-api-url=http://127.0.0.1:9", "--spark-history=off", "-p", "no:cacheprovider")


def test_the_controller_registers_the_controller_role(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_probe=PROBE)
    pytester.runpytest_subprocess(*ARGS).assert_outcomes(passed=1)
    assert json.loads((pytester.path / "roles-main.json").read_text()) == {
        "spark.controller": True,
        "spark.worker": False,
        "spark.results": True,
        "spark.report": True,
        "spark.measure": False,
        "spark.redact": True,
    }


def test_an_xdist_worker_registers_the_worker_role(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_probe=PROBE)
    pytester.runpytest_subprocess(*ARGS, "-n", "1").assert_outcomes(passed=1)
    assert json.loads((pytester.path / "roles-gw0.json").read_text()) == {
        "spark.controller": False,
        "spark.worker": True,
        "spark.results": False,
        "spark.report": False,
        "spark.measure": True,
        "spark.redact": True,
    }
