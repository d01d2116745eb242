"""Hook specifications of pytest-dgx-spark (``pytest_spark_*``).

As in pytest-benchmark's ``hookspec.py``: a ``generate_*`` hook is ``firstresult`` (one
implementation supplies the value; the plugin's own default runs last, so a conftest's
replaces it), an ``update_*`` hook runs every implementation, each amending the value in
place. Implement them in a ``conftest.py`` or a plugin; they run on the controller only
(not in xdist workers), except ``pytest_spark_cluster_ready``, which runs in every process
that uses the cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_spark.access.cluster import Cluster


@pytest.hookspec
def pytest_spark_cluster_ready(cluster: Cluster) -> None:
    """Called once per process (each xdist worker has its own) when the ``spark_cluster``
    fixture has connected to every node, before any test uses it.

    A node that could not be reached is still in ``cluster.nodes``;
    ``cluster.unreachable(node)`` says why (``None`` when it was reached), so check it
    before running a command on a node:

    .. code-block:: python

        def pytest_spark_cluster_ready(cluster):
            for node in cluster.nodes:
                if cluster.unreachable(node) is None:
                    node.run("logger pytest-dgx-spark session start")
    """


@pytest.hookspec(firstresult=True)
def pytest_spark_generate_results(
    config: pytest.Config,
    checks: list[dict[str, Any]],
    cluster: dict[str, Any],
    serving: dict[str, Any] | None,
    exitstatus: int,
) -> dict[str, Any] | None:
    """Build the JSON results document (schema version 1) at the end of the session.

    ``checks`` has one record per suite check, ``cluster`` is what the settings say about
    the cluster, ``serving`` what the session's launch or attach found (``None`` when it
    did not get that far), ``exitstatus`` the session's exit status. The built-in
    implementation runs last and returns ``{"version": 1, "started": ..., "duration_s":
    ..., "cluster": cluster, "checks": checks, "exitstatus": exitstatus, "serving":
    serving}`` (``serving`` only when known). Return a dict to replace it wholly; to add
    or change fields, implement ``pytest_spark_update_results`` instead. The report
    (figures, history, comparison, HTML) reads the checks, not this document.
    """


def pytest_spark_update_results(config: pytest.Config, results: dict[str, Any]) -> None:
    """Amend the generated results document in place; every implementation runs, in
    pytest's hook order. It runs whether or not ``--spark-results`` writes a file, so it
    is also the place to ship the results elsewhere (give no ``--spark-results`` to write
    no file).

    The plugin's own implementation wraps the others: before them it redacts secrets and
    adds the ``report`` block (figures, comparison), so yours see the document as it will
    be written; after them it redacts again, so what yours add is redacted too:

    .. code-block:: python

        def pytest_spark_update_results(config, results):
            results["ci_job"] = os.environ.get("CI_JOB_ID")
    """
