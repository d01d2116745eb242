"""How a check says its verdict: ``SparkCheck`` records a ``Finding`` on the report and
turns it into pass, warn (``SparkCheckWarning``) or fail; ``verdict_in_session`` says
whether another check owns a root cause (so a dependant may skip citing it);
``require_unless_twin_down`` skips a finding whose root cause is a down fabric twin;
``require_once_across_nodes`` makes a per-node check that fails the same way on several
nodes (the same measured value, expected and fix) one failure, on the first of them;
``RepeatedSetupFailure`` reports a failure that several checks' setups meet (a session
fixture's error, which pytest raises again for every check that uses it) once, the other
checks skipping citing the first.

The suite imports these from ``pytest_spark`` (the package root's ``__all__``).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Generator, Hashable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from pytest_spark.infra.finding import Finding
from pytest_spark.infra.finding import Skip
from pytest_spark.report.results import DATA_PREFIX, finding_property

if TYPE_CHECKING:
    from pytest_spark.access.cluster import Cluster, Node


class SparkCheckWarning(UserWarning):
    """A check passed with a warning (e.g. MTU 1500: works, ~5% all-reduce cost)."""


class SparkCheck:
    """Records a check's finding on the report and turns it into a verdict."""

    def __init__(self, item: pytest.Item) -> None:
        self._item = item

    def record(self, finding: Finding) -> Finding:
        self._item.user_properties.append(finding_property(finding))
        return finding

    def attach(self, name: str, data: Any) -> None:
        """Keep JSON-able evidence or figures with the check (results ``extra``, report
        plots): e.g. ``attach("busbw_series", [{"bytes": ..., "busbw_gbps": ...}])``."""
        self._item.user_properties.append((f"{DATA_PREFIX}{name}", data))

    def require(self, finding: Finding) -> Finding:
        """Record, then fail on ``fail`` and warn on ``warn``."""
        self.record(finding)
        if finding.level == "fail":
            # from None: a verdict reached while handling an error (a request that raised)
            # is the whole message; pytest would print that error again above it
            raise pytest.fail.Exception(finding.message, pytrace=False) from None
        if finding.level == "warn":
            warnings.warn(SparkCheckWarning(finding.message), stacklevel=2)
        return finding


def require_unless_twin_down(cluster: Cluster, finding: Finding, check: SparkCheck) -> None:
    """Record and assert ``finding``; when it fails and a fabric twin is down, skip
    instead, naming the down link: the launcher and NCCL leave a Down twin out of
    NCCL_IB_HCA and the transport, so the config is then right and the root cause is the
    link (its link-up check fails)."""
    from pytest_spark.infra.links.gather import unusable_fabric_links

    if not finding.ok:
        down = unusable_fabric_links(cluster)
        if down:
            pytest.skip(f"{'; '.join(down)}: {finding.message}")
    check.require(finding)


def verdict_in_session(session: pytest.Session, name: str) -> bool:
    """Whether the check ``name`` (a test function's name, or one parametrised item's,
    ``test_tool_call[auto-stream]``) runs in this session: only then may a dependent check
    skip citing it (else it must report the problem itself)."""
    return any(name in (getattr(item, "originalname", None), item.name) for item in session.items)


class RepeatedSetupFailure:
    """One setup failure, one error: a ``pytest.fail`` out of a check's setup whose message
    another check's setup already failed with (a session fixture that failed, which pytest
    raises again, the same exception, for every check that uses it: ``-m tool_calls`` on a
    dead server without its verdict in the session gave 16 identical errors) skips citing
    that check instead. Only failures (``pytest.fail``, a verdict) are folded; an
    exception that is not one still errors every time (a crash must stay visible)."""

    def __init__(self) -> None:
        self._first: dict[str, str] = {}  # the failure's message -> the check that met it first

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        try:
            return (yield)
        except pytest.fail.Exception as exc:
            message = str(exc.msg)
            first = self._first.setdefault(message, item.nodeid)
            if first == item.nodeid:
                raise
        reason = repeated_reason(message, first)
        raise pytest.skip.Exception(reason, _use_item_location=True)


def repeated_reason(message: str, first: str) -> str:
    """The skip reason of a check whose setup met the failure that ``first`` (a node id)
    reported: the failure's first line, and where its evidence is."""
    headline = next((line.strip() for line in message.splitlines() if line.strip()), message)
    if len(headline) > 300:
        headline = headline[:297] + "..."
    name = first.rsplit("::", 1)[-1]
    return f"{headline} ({name} failed on it at setup: one cause, that failure)"


# The per-node parametrisation's argument (roles.Active.pytest_generate_tests).
NODE_PARAM = "_spark_node"
_PID = re.compile(r"\bpid (\d+)")
# check (file, name, its other parameters) -> {node: the signature of its failure there}
_ACROSS_KEY: pytest.StashKey[dict[Hashable, dict[str, Hashable | None]]] = pytest.StashKey()


def cause_signature(finding: Finding, node: str) -> Hashable:
    """What makes two nodes' failures of one check the same cause: the measured value,
    the expected one, the unit and the message (which carries the fix), with the node's
    own name and its process ids (a dockerd's pid differs on every node, never the cause)
    left out. Evidence is each node's own and is not compared, except its ``cause`` when the
    check names one (e.g. the stray sparkrun job whose rank container differs per node):
    then that is the signature."""
    if finding.evidence.get("cause"):
        return json.dumps([finding.level, finding.evidence["cause"]])
    measured = finding.measured
    if isinstance(measured, dict):
        measured = {k: v for k, v in measured.items() if not str(k).endswith("pid")}
    text = json.dumps(
        [finding.level, measured, finding.expected, finding.unit, finding.message],
        sort_keys=True,
        default=str,
    )
    return _PID.sub("pid N", text.replace(node, "{node}"))


def _node_twin(item: pytest.Item, node: str) -> pytest.Item | None:
    """The same check on ``node`` (its other parameters the same), when it runs in this
    session."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or NODE_PARAM not in callspec.params:
        return None
    want = {**callspec.params, NODE_PARAM: node}
    for other in item.session.items:
        spec = getattr(other, "callspec", None)
        if (
            spec is not None
            and getattr(other, "originalname", None) == getattr(item, "originalname", None)
            and other.path == item.path
            and spec.params == want
        ):
            return other
    return None


def require_once_across_nodes(
    request: pytest.FixtureRequest,
    check: SparkCheck,
    cluster: Cluster,
    node: Node,
    judge: Callable[[Node], Finding | Skip],
) -> Finding:
    """A per-node check's verdict on ``node``, one failure per cause: ``judge(node)`` is
    the check's finding there (a ``Skip`` skips), asserted as ``check.require`` does; when
    it fails the same way (:func:`cause_signature`) on several nodes, the first of them
    whose check runs in this session fails naming the others ("spark-head (and
    spark-worker-1, the same: one cause, this failure ...)"), and the others skip citing
    it; a node alone with its failure fails as before. ``judge(other)`` must give what the
    check's own item on ``other`` would (from the same cached facts); a node that cannot be
    reached, or whose judging raises or skips, is not the same cause. Each node's
    signature is taken once per check, so every node's item sees the same grouping."""
    finding = judge(node)
    if isinstance(finding, Skip):
        raise pytest.skip.Exception(finding.reason, _use_item_location=True)
    item = request.node
    callspec = getattr(item, "callspec", None)
    if finding.level != "fail" or callspec is None or NODE_PARAM not in callspec.params:
        return check.require(finding)
    others = {k: v for k, v in callspec.params.items() if k != NODE_PARAM}
    key = (str(item.path), getattr(item, "originalname", item.name), repr(sorted(others.items())))
    table = request.config.stash.setdefault(_ACROSS_KEY, {})
    if key not in table:
        signatures: dict[str, Hashable | None] = {}
        for other in cluster.nodes:
            if other.name == node.name:
                signatures[other.name] = cause_signature(finding, node.name)
                continue
            signatures[other.name] = None
            if cluster.unreachable(other) is not None:
                continue
            try:
                theirs = judge(other)
            except (Exception, pytest.skip.Exception, pytest.fail.Exception):
                continue
            if isinstance(theirs, Finding) and theirs.level == "fail":
                signatures[other.name] = cause_signature(theirs, other.name)
        table[key] = signatures
    signatures = table[key]
    mine = signatures.get(node.name)
    same = [n for n, sig in signatures.items() if sig is not None and sig == mine]
    running = [n for n in same if n == node.name or _node_twin(item, n) is not None]
    if len(same) < 2 or not running:
        return check.require(finding)
    owner = running[0]
    if owner == node.name:
        also = ", ".join(n for n in same if n != node.name)
        said = f"{node.name} (and {also}, the same: one cause, this failure; fix it there too)"
        told = finding.message
        text = (
            f"{said}: {told.removeprefix(f'{node.name}: ')}"
            if told.startswith(f"{node.name}: ")
            else f"{said}: {told}"
        )
        return check.require(
            replace(finding, message=text, evidence={**finding.evidence, "the same on": also})
        )
    twin = _node_twin(item, owner)
    name = twin.name if twin is not None else owner
    what = finding.message.removeprefix(f"{node.name}: ")
    if len(what) > 200:
        what = what[:197] + "..."
    raise pytest.skip.Exception(
        f"{node.name}: the same failure as on {owner} ({what}): one cause, {name} has the evidence",
        _use_item_location=True,
    )
