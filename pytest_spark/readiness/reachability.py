"""One unreachable node, one error: ``test_node_reachable`` reports it with its evidence,
and every check that needs the node skips citing it (never 25 errors with ``node: null``).

A node lost later (it answered when the session connected, then a check's command met
``NodeUnreachable``) is the same: that check fails once, naming the node, the last error
and what to check (:class:`LostNodes`); every later check that needs the node skips citing
that check.

The reachability verdict runs first and whatever the selection (:class:`VerdictFirst`):
``-m link``, ``-k`` or ``-x`` still reach it, so a dead node is its one failure, never a
cable error. The serving verdict (``test_cluster_serving``) is put back the same way when a
selected check needs the server (``-m tool_calls``, ``-k reasoning`` against a dead head or a
refused API: its one failure, the rest skip citing it), just before the first of them. When
no verdict is collected at all (a path that leaves its file out), the first check that
meets the cause fails with the whole error and the rest skip citing that check
(:class:`verdict.RepeatedSetupFailure`): a missing verdict must not turn a dead node into a
green run, nor into one error per check.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, NoReturn

import pytest

from pytest_spark.access.base import NodeUnreachable, RemoteError

if TYPE_CHECKING:
    from pytest_spark.access.cluster import Cluster, Node

VERDICT = "test_node_reachable"
# Whether a spark_reachability_verdict check (test_node_reachable) runs in this session.
REACHABILITY_VERDICT_KEY: pytest.StashKey[bool] = pytest.StashKey()


class NodeLost(NodeUnreachable):
    """A node that answered when the session connected and stopped answering during the
    check ``during`` (a node id)."""

    def __init__(self, error: RemoteError, during: str) -> None:
        super().__init__(error.node, _bare(error.node, error))
        self.during = during


def _bare(node: str, error: RemoteError | str) -> str:
    text = str(error)
    while text.startswith(f"{node}: "):
        text = text[len(node) + 2 :]
    return text


def unreachable_reason(node: str, error: RemoteError | str) -> str:
    """The skip reason of a check that needs an unreachable node: the node, the error,
    and where its evidence is."""
    if isinstance(error, NodeLost):
        return f"{node} lost during {error.during}: {_bare(node, error)} (that check failed on it)"
    return f"{node} unreachable: {_bare(node, error)} ({VERDICT} has the evidence)"


def through_unreachable_jump(
    node: str, error: RemoteError, unreachable: Iterable[str]
) -> str | None:
    """The skip reason of ``node``'s reachability check when its SSH error is another
    cluster node's, one of ``unreachable`` (the head as its jump host: an unknown head key
    stops every node reached through it): that node's check has the one failure. None
    when the error is the node's own."""
    if error.node == node or error.node not in set(unreachable):
        return None
    return (
        f"{node} is reached through {error.node} (its jump host), which the suite cannot "
        f"reach: {_bare(error.node, error)} ({VERDICT}[{error.node}] has the evidence)"
    )


def unreachable(cluster: Cluster, nodes: Iterable[Node] | None = None) -> list[Node]:
    """The nodes among ``nodes`` (default: all) that the suite cannot reach."""
    return [n for n in (cluster.nodes if nodes is None else nodes) if cluster.unreachable(n)]


def skip_or_fail(config: pytest.Config, node: str, error: RemoteError | str) -> NoReturn:
    """Skip citing the reachability verdict when it runs in this session (or the check
    that lost the node), else fail."""
    if isinstance(error, NodeLost) or config.stash.get(REACHABILITY_VERDICT_KEY, False):
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


def lost_message(node: Node, error: RemoteError) -> str:
    """The failure of the check that lost ``node``: node, last error, what to check."""
    return (
        f"{node.name}: lost during this check: {_bare(node.name, error)}. It answered when "
        f"the session connected. Check its management link (ping {node.address}) and sshd "
        f"on it; every later check that needs {node.name} is skipped citing this one."
    )


class LostNodes:
    """Turns ``NodeUnreachable`` out of a check into one verdict per lost node.

    The first check to meet a node that stopped answering mid-session fails with
    :func:`lost_message` (not a traceback); the node is then marked unreachable
    (``cluster.unreachable(node)`` is a :class:`NodeLost`), so the fixtures skip every
    later check that needs it, citing that check, and a later check that still meets it
    skips the same way."""

    def __init__(self, cluster: Callable[[], Cluster | None]) -> None:
        self._cluster = cluster

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        try:
            return (yield)
        except NodeUnreachable as exc:
            cluster = self._cluster()
            node = _find(cluster, exc.node) if cluster is not None else None
            before = cluster.unreachable(node) if cluster is not None and node else None
            # not a node of this cluster, or unreachable from the start (its verdict says so)
            if node is None or (before is not None and not isinstance(before, NodeLost)):
                raise
            lost = exc
        # outside the except: the verdict alone, not chained to the SSH error's traceback
        assert cluster is not None
        if isinstance(before, NodeLost):
            pytest.skip(unreachable_reason(node.name, before))
        cluster.mark_lost(node, NodeLost(lost, item.nodeid))
        pytest.fail(lost_message(node, lost), pytrace=False)


MARK = "spark_reachability_verdict"
# The serving verdict's marker (test_cluster_serving; SERVING_VERDICT_KEY says it runs).
SERVING_MARK = "spark_serving_verdict"


def verdicts_first(
    items: list[pytest.Item],
    deselected: list[pytest.Item],
    needs_nodes: Callable[[pytest.Item], bool],
    needs_server: Callable[[pytest.Item], bool] | None = None,
) -> list[pytest.Item]:
    """The session's items with the reachability verdicts first, the deselected ones put
    back when a selected check needs the nodes: ``-m link`` or ``-k`` must not leave a
    dead node to 15 errors, and ``-x`` stops on the verdict, not on a consequence. The
    serving verdicts deselected are put back when a selected check needs the server and
    none is selected, just before the first such check (``-m tool_calls`` against a dead
    head: one failure, not 16 setup errors; with ``-m "link or tool_calls"`` the link
    checks still run before a launch)."""
    verdicts = [item for item in items if item.get_closest_marker(MARK)]
    if any(needs_nodes(item) for item in items):
        chosen = set(map(id, verdicts))
        verdicts += [i for i in deselected if i.get_closest_marker(MARK) and id(i) not in chosen]
    chosen = set(map(id, verdicts))
    rest = [item for item in items if id(item) not in chosen]
    if needs_server is not None and not any(i.get_closest_marker(SERVING_MARK) for i in rest):
        serving = [i for i in deselected if i.get_closest_marker(SERVING_MARK)]
        first = next((n for n, item in enumerate(rest) if needs_server(item)), None)
        if serving and first is not None:
            rest[first:first] = serving
    return verdicts + rest


class VerdictFirst:
    """Runs the reachability verdicts whatever the selection, and before every other
    check; the serving verdict whenever a selected check needs the server
    (:func:`verdicts_first`)."""

    def __init__(
        self,
        needs_nodes: Callable[[pytest.Item], bool],
        needs_server: Callable[[pytest.Item], bool] | None = None,
    ) -> None:
        self._needs_nodes = needs_nodes
        self._needs_server = needs_server
        self._deselected: list[pytest.Item] = []

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self._deselected += [
            item
            for item in items
            if item.get_closest_marker(MARK) or item.get_closest_marker(SERVING_MARK)
        ]

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        items[:] = verdicts_first(items, self._deselected, self._needs_nodes, self._needs_server)
        put_back = set(map(id, items)) & set(map(id, self._deselected))
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        stats = getattr(reporter, "stats", None)
        if put_back and isinstance(stats, dict) and stats.get("deselected"):
            # pytest's header and summary count them as deselected: they run
            stats["deselected"] = [i for i in stats["deselected"] if id(i) not in put_back]


def _find(cluster: Cluster, name: str) -> Node | None:
    try:
        return cluster.node(name)
    except KeyError:
        return None
