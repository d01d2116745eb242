"""Installed but not asked for, the plugin imports only its options, its activation check,
the stash keys and where the suite is: none of paramiko, httpx, the fixtures or the
cluster model (benchmarks/plugin_import.py times it). Asked for, the same run loads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pytest_spark.report.results import CATEGORIES
from pytest_spark.suitedir import CATEGORY_MARKERS

HEAVY = (
    "paramiko",
    "httpx",
    "pytest_spark.fixtures",
    "pytest_spark.verdict",
    "pytest_spark.readiness.serving",
    "pytest_spark.report.live",
    "pytest_spark.access.cluster",
    "pytest_spark.access.ssh",
    "pytest_spark.readiness.launch",
    "pytest_spark.report.results",
)
# Run in a fresh interpreter: which modules a pytest session imported, once configured.
PROBE = """
import json, sys
import pytest

class Probe:
    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config):
        self.loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("paramiko", "httpx")
                             or m.startswith("pytest_spark"))

probe = Probe()
code = pytest.main(["--co", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[probe])
print("@@" + json.dumps({"code": int(code), "loaded": probe.loaded}))
"""


def _loaded(tmp_path: Path, *args: str) -> list[str]:
    (tmp_path / "test_tiny.py").write_text("def test_tiny():\n    assert True\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("@@"))
    result = json.loads(line[2:])
    assert result["code"] == 0, proc.stdout + proc.stderr
    return list(result["loaded"])


# What the inert plugin may import: its options, the activation check, the stash keys and
# where the suite is (the package root and the settings package around them).
INERT = ("pytest_spark", "pytest_spark.plugin", "pytest_spark.hooks", "pytest_spark.state")
INERT_PARTS = ("pytest_spark.suitedir", "pytest_spark.settings")


def test_inert_plugin_imports_none_of_the_heavy_parts(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path)
    assert "pytest_spark.plugin" in loaded  # installed: the entry point was loaded
    assert not [m for m in HEAVY if m in loaded], loaded
    others = [m for m in loaded if m.startswith("pytest_spark")]
    extra = [m for m in others if m not in INERT and not m.startswith(INERT_PARTS)]
    assert not extra, (
        f"the inert plugin imports more than settings, state, hooks, suitedir: {extra}"
    )


def test_asked_for_the_same_run_loads_them(tmp_path: Path) -> None:
    """The other side: the probe sees the heavy parts once a cluster is asked for
    (--spark-api-url alone: nothing is contacted at configure)."""
    loaded = _loaded(tmp_path, "--spark-api-url=http://127.0.0.1:9")
    assert "pytest_spark.fixtures" in loaded and "pytest_spark.report.results" in loaded


def test_the_markers_declared_while_inert_are_the_reports_categories(tmp_path: Path) -> None:
    """One table (suitedir.CATEGORY_MARKERS): the inert plugin declares each of the report's
    categories as a marker, with its meaning."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--markers", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    declared = dict(
        line.removeprefix("@pytest.mark.").split(": ", 1)
        for line in proc.stdout.splitlines()
        if line.startswith("@pytest.mark.") and ": " in line
    )
    assert CATEGORIES, "the report has categories"
    assert {c: declared.get(c) for c in CATEGORIES} == {c: CATEGORY_MARKERS[c] for c in CATEGORIES}
