"""pytest-dgx-spark: check multi-node vLLM clusters on NVIDIA DGX Spark with pytest.

Import name ``pytest_spark`` (PyPI's unrelated ``pytest-spark`` PySpark plugin uses the
same import name: do not install both in one environment).

The public names below are imported lazily, so the simulator (``sparksim``, which
needs only the standard library) starts without loading paramiko, httpx or pytest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Cluster": "pytest_spark.access.cluster",
    "Node": "pytest_spark.access.cluster",
    "CommandFailed": "pytest_spark.access.base",
    "CommandResult": "pytest_spark.access.base",
    "CommandTimeout": "pytest_spark.access.base",
    "HostKeyError": "pytest_spark.access.base",
    "NodeUnreachable": "pytest_spark.access.base",
    "RemoteError": "pytest_spark.access.base",
    "Finding": "pytest_spark.infra.finding",
    "CheckNote": "pytest_spark.infra.finding",
    "SparkCheck": "pytest_spark.verdict",
    "SparkCheckWarning": "pytest_spark.verdict",
    "require_once_across_nodes": "pytest_spark.verdict",
    "require_unless_twin_down": "pytest_spark.verdict",
    "verdict_in_session": "pytest_spark.verdict",
    "progress_line_writer": "pytest_spark.report.live",
    "Profile": "pytest_spark.settings.profiles",
    "load_profile": "pytest_spark.settings.profiles",
    "Settings": "pytest_spark.settings.resolve",
}

__all__ = [
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
]

if TYPE_CHECKING:
    from pytest_spark.access.base import (
        CommandFailed,
        CommandResult,
        CommandTimeout,
        HostKeyError,
        NodeUnreachable,
        RemoteError,
    )
    from pytest_spark.access.cluster import Cluster, Node
    from pytest_spark.infra.finding import CheckNote, Finding
    from pytest_spark.report.live import progress_line_writer
    from pytest_spark.settings.profiles import Profile, load_profile
    from pytest_spark.settings.resolve import Settings
    from pytest_spark.verdict import (
        SparkCheck,
        SparkCheckWarning,
        require_once_across_nodes,
        require_unless_twin_down,
        verdict_in_session,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_spark' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
