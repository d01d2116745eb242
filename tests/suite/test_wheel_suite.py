"""Installed from the wheel into a fresh venv, run from an empty directory with
``pytest --spark-sim``, the suite gives the verdicts (node id -> outcome) of the
in-checkout run. One selection keeps it cheap: link, preflight and readiness (the last
launches serving on the sim, so the sim's image, launcher and tools come from the wheel).
Node ids named on the command line select from the installed suite too, unless the path
exists where pytest runs (listed with ``--co``: nothing is contacted). One wheel and venv
serve the whole module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Installed:
    bin_dir: Path
    empty: Path


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel, built once, in a fresh venv; an empty directory to run it from."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(root / "build")
    bin_dir = fresh_venv(root / "venv", wheel)
    empty = root / "empty"
    empty.mkdir()
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import pytest_spark; print(pytest_spark.__file__)"],
        cwd=empty,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(root / "venv")), where  # the wheel's, not the checkout's
    return Installed(bin_dir, empty)


def test_installed_wheel_gives_the_checkouts_verdicts(installed: Installed, tmp_path: Path) -> None:
    bin_dir, empty = installed.bin_dir, installed.empty
    installed_verdicts, output = verdicts(bin_dir, empty, tmp_path / "installed.json")
    checkout, checkout_output = verdicts(REPO / ".venv" / "bin", REPO, tmp_path / "checkout.json")
    assert installed_verdicts, output
    assert any(n.startswith("tests_infra/test_links.py::") for n in installed_verdicts)
    assert any(n.startswith("tests_e2e/test_readiness.py::") for n in installed_verdicts)
    assert installed_verdicts == checkout, (output, checkout_output)


HEAD = "--spark-head=198.18.0.99"  # asked for; --co contacts nothing


def listing(bin_dir: Path, cwd: Path, *args: str) -> tuple[int, list[str], str]:
    """``pytest --co -q ARGS``: exit code, the node ids listed, the whole output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
    proc = subprocess.run(
        [str(bin_dir / "python"), "-m", "pytest", "-p", "no:cacheprovider", "--co", "-q", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    return proc.returncode, [x for x in proc.stdout.splitlines() if "::" in x], output


def test_node_ids_from_an_empty_directory_select_from_the_installed_suite(
    installed: Installed,
) -> None:
    """``pytest tests_infra/test_links.py`` and ``...::test_x[spark-head]`` from an empty
    directory list what the checkout lists, with the same node ids."""
    rc, link, output = listing(REPO / ".venv" / "bin", REPO, HEAD, "tests_infra/test_links.py")
    assert rc == 0 and len(link) > 2, output
    one = next(n for n in link if n.endswith("[spark-head-twin0]"))
    for args in (["tests_infra/test_links.py"], [one], [one, "tests_e2e/test_readiness.py"]):
        want = listing(REPO / ".venv" / "bin", REPO, HEAD, *args)
        got = listing(installed.bin_dir, installed.empty, HEAD, *args)
        assert got[0] == 0 and got[1] == want[1], (args, got[2], want[2])
    rc, _, output = listing(installed.bin_dir, installed.empty, HEAD, f"{one[:-1]}-nope]")
    assert rc == 4 and f"not found: {one[:-1]}-nope]" in output, output


def test_a_local_path_of_the_same_name_is_the_users(installed: Installed, tmp_path: Path) -> None:
    (tmp_path / "tests_infra").mkdir()
    (tmp_path / "tests_infra" / "test_links.py").write_text(
        "def test_mine(spark_settings):\n    pass\n"
    )
    rc, ids, output = listing(installed.bin_dir, tmp_path, HEAD, "tests_infra/test_links.py")
    assert rc == 0 and ids == ["tests_infra/test_links.py::test_mine"], output
