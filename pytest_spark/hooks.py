"""Hook specifications of pytest-dgx-spark (``pytest_spark_*``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_spark.cluster import Cluster


@pytest.hookspec
def pytest_spark_cluster_ready(cluster: Cluster) -> None:
    """Called once the cluster fixture has connected to (or stood up) the cluster."""


@pytest.hookspec(firstresult=True)
def pytest_spark_results(config: pytest.Config, results: dict[str, Any]) -> object | None:
    """Called with the JSON results before they are written; return non-None to stop
    the default writer (e.g. to ship them elsewhere)."""
