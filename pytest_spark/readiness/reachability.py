"""One unreachable node, one error: ``test_node_reachable`` reports it with its evidence,
and every check that needs the node skips citing it (never 25 errors with ``node: null``).

When the reachability check is not in the session (``-m link`` alone), a check that needs
an unreachable node fails with the whole error instead: a deselected verdict must not turn
a dead node into a green run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NoReturn

import pytest

from pytest_spark.access.base import RemoteError

if TYPE_CHECKING:
    from pytest_spark.access.cluster import Cluster, Node

VERDICT = "test_node_reachable"
# Whether a spark_reachability_verdict check (test_node_reachable) runs in this session.
REACHABILITY_VERDICT_KEY: pytest.StashKey[bool] = pytest.StashKey()


def unreachable_reason(node: str, error: RemoteError | str) -> str:
    """The skip reason of a check that needs an unreachable node: the node, the error,
    and where its evidence is."""
    text = str(error)
    while text.startswith(f"{node}: "):
        text = text[len(node) + 2 :]
    return f"{node} unreachable: {text} ({VERDICT} has the evidence)"


def unreachable(cluster: Cluster, nodes: Iterable[Node] | None = None) -> list[Node]:
    """The nodes among ``nodes`` (default: all) that the suite cannot reach."""
    return [n for n in (cluster.nodes if nodes is None else nodes) if cluster.unreachable(n)]


def skip_or_fail(config: pytest.Config, node: str, error: RemoteError | str) -> NoReturn:
    """Skip citing the reachability verdict when it runs in this session, else fail."""
    if config.stash.get(REACHABILITY_VERDICT_KEY, False):
        pytest.skip(unreachable_reason(node, error))
    pytest.fail(f"node unreachable: {error}", pytrace=False)


def require_reachable(
    config: pytest.Config, cluster: Cluster, nodes: Iterable[Node] | None = None
) -> None:
    """Return when every node of ``nodes`` (default: the whole cluster) is reachable, else
    skip (or fail) naming the first one that is not."""
    for node in unreachable(cluster, nodes):
        error = cluster.unreachable(node)
        assert error is not None
        skip_or_fail(config, node.name, error)
