"""sparksim and pytest_spark are two products: neither imports the other.

The plugin drives the simulator only through the ``spark-sim`` CLI and the cluster.json it
writes; the simulator runs on a bare machine with the standard library. Each check runs in
a fresh interpreter, so nothing the test session imported counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def loaded_after(imports: list[str], prefix: str) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for name in {imports!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    print(module.__file__)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m == {prefix!r} "
        f"or m.startswith({prefix!r} + '.'))))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert res.returncode == 0, f"importing {imports} failed:\n{res.stderr}"
    *files, last = res.stdout.strip().splitlines()
    outside = [f for f in files if not Path(f).resolve().is_relative_to(REPO)]
    assert not outside, f"{imports} imported from outside this checkout: {outside}"
    loaded: list[str] = json.loads(last)
    return loaded


@pytest.mark.parametrize(
    "imports",
    [["sparksim"], ["sparksim.cli"], ["sparksim.emulator", "sparksim.emulator.server"]],
)
def test_sparksim_loads_no_pytest_spark(imports: list[str]) -> None:
    loaded = loaded_after(imports, "pytest_spark")
    assert loaded == [], f"importing {imports} loaded pytest_spark modules: {loaded}"


@pytest.mark.parametrize("imports", [["pytest_spark"], ["pytest_spark.plugin"]])
def test_pytest_spark_loads_no_sparksim(imports: list[str]) -> None:
    loaded = loaded_after(imports, "sparksim")
    assert loaded == [], f"importing {imports} loaded sparksim modules: {loaded}"


def test_the_check_sees_imports() -> None:
    """The probe reports what it loads: sparksim.cli brings in sparksim itself."""
    assert "sparksim" in loaded_after(["sparksim.cli"], "sparksim")
