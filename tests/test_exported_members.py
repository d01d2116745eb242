"""The public surface is exactly ``__all__``; each name resolves."""

from __future__ import annotations

import subprocess
import sys

import pytest_spark


def test_all_names_resolve() -> None:
    for name in pytest_spark.__all__:
        assert getattr(pytest_spark, name) is not None, name


def test_public_surface_is_stable() -> None:
    assert set(pytest_spark.__all__) == {
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
    }


def test_simulator_imports_without_the_plugin_dependencies() -> None:
    code = (
        "import sys; import sparksim.cli; "
        "bad = [m for m in ('paramiko', 'httpx', 'pytest') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
