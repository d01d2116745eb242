"""How a check says its verdict: ``SparkCheck`` records a ``Finding`` on the report and
turns it into pass, warn (``SparkCheckWarning``) or fail; ``verdict_in_session`` says
whether another check owns a root cause (so a dependant may skip citing it);
``require_unless_twin_down`` skips a finding whose root cause is a down fabric twin.

The suite imports these from ``pytest_spark`` (the package root's ``__all__``).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import pytest

from pytest_spark.infra.finding import Finding
from pytest_spark.report.results import DATA_PREFIX, finding_property

if TYPE_CHECKING:
    from pytest_spark.access.cluster import Cluster


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
