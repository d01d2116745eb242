"""Installed from the wheel into a fresh venv, run from an empty directory with
``pytest --spark-sim``, the suite gives the verdicts (node id -> outcome) of the
in-checkout run. One selection keeps it cheap: link, preflight and readiness (the last
launches serving on the sim, so the sim's image, launcher and tools come from the wheel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO, _missing  # type: ignore[import-not-found]

sys.path.insert(0, str(REPO / "tests"))
from test_packaging import build_wheel  # type: ignore[import-not-found]

pytestmark = [pytest.mark.sim, pytest.mark.slow]
SELECT = "link or preflight or readiness"
PIP = [sys.executable, "-m", "pip"]


def fresh_venv(root: Path, wheel: Path) -> Path:
    """A venv holding only the wheel; its dependencies are read from the project's venv
    (a .pth line: no index needed, seconds instead of a minute of installing)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    subprocess.run(
        [*PIP, "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
    )
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "project-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return root / "bin"


def verdicts(bin_dir: Path, cwd: Path, results: Path) -> tuple[dict[str, str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
    proc = subprocess.run(
        [
            str(bin_dir / "python"),
            *("-m", "pytest", "-p", "no:cacheprovider", "-q", "--spark-sim", "-m", SELECT),
            f"--spark-results={results}",
            "--spark-history=off",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert results.exists(), output
    checks = json.loads(results.read_text())["checks"]
    return {c["nodeid"]: c["outcome"] for c in checks}, output


def test_installed_wheel_gives_the_checkouts_verdicts(tmp_path: Path) -> None:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    wheel = build_wheel(tmp_path / "build")
    bin_dir = fresh_venv(tmp_path / "venv", wheel)
    empty = tmp_path / "empty"
    empty.mkdir()
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import pytest_spark; print(pytest_spark.__file__)"],
        cwd=empty,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(tmp_path / "venv")), where  # the wheel's, not the checkout's
    installed, output = verdicts(bin_dir, empty, tmp_path / "installed.json")
    checkout, checkout_output = verdicts(REPO / ".venv" / "bin", REPO, tmp_path / "checkout.json")
    assert installed, output
    assert any(n.startswith("tests_infra/test_link.py::") for n in installed), installed
    assert any(n.startswith("tests_e2e/test_readiness.py::") for n in installed), installed
    assert installed == checkout, (output, checkout_output)
