"""The public surface is exactly ``__all__``; each name resolves."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest_spark

REPO = Path(__file__).resolve().parents[1]
SUITE = ("tests_infra", "tests_e2e")
# The wiring's modules (pytest_spark/*.py): the suite reaches them through the root only.
WIRING = {f"pytest_spark.{p.stem}" for p in (REPO / "pytest_spark").glob("*.py")} - {
    "pytest_spark.__init__"
}


def test_all_names_resolve() -> None:
    for name in pytest_spark.__all__:
        assert getattr(pytest_spark, name) is not None, name


def test_public_surface_is_stable() -> None:
    assert set(pytest_spark.__all__) == {
        "CheckNote",
        "Cluster",
        "CommandFailed",
        "CommandResult",
        "CommandTimeout",
        "Finding",
        "HostKeyError",
        "Node",
        "NodeUnreachable",
        "Profile",
        "RemoteError",
        "Settings",
        "SparkCheck",
        "SparkCheckWarning",
        "__version__",
        "load_profile",
        "progress_line_writer",
        "require_once_across_nodes",
        "require_unless_twin_down",
        "verdict_in_session",
    }


def test_simulator_imports_without_the_plugin_dependencies() -> None:
    code = (
        "import sys; import sparksim.cli; "
        "bad = [m for m in ('paramiko', 'httpx', 'pytest') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_version_is_the_installed_distributions() -> None:
    """One version: the report reads it through importlib.metadata, the root says the same."""
    assert pytest_spark.__version__ == importlib.metadata.version("pytest-dgx-spark")


def suite_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, module, name) of every ``from pytest_spark... import name`` and
    ``import pytest_spark...`` in the suite (module level and inside functions)."""
    found = []
    for path in sorted(p for d in SUITE for p in (REPO / d).rglob("*.py")):
        rel = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pytest_spark"):
                found += [(rel, node.lineno, node.module or "", a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                found += [
                    (rel, node.lineno, a.name, "")
                    for a in node.names
                    if a.name.startswith("pytest_spark")
                ]
    return found


def test_the_suite_imports_the_public_api_from_the_root() -> None:
    """tests_infra/ and tests_e2e/ take the plugin's API (``__all__``) from ``pytest_spark``
    and never import its wiring modules (fixtures, plugin, verdict, state...) directly."""
    found = suite_imports()
    assert any(module == "pytest_spark" for _, _, module, _ in found)  # the walk sees imports
    bad = [
        f"{rel}:{line}: from {module} import {name or '...'}"
        for rel, line, module, name in found
        if module in WIRING or (module != "pytest_spark" and name in pytest_spark.__all__)
    ]
    assert not bad, (
        "the suite imports the plugin's API from a submodule: import it from pytest_spark "
        f"(its __all__): {bad}"
    )
