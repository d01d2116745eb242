"""The readiness wait's one time source (``Clock``: ``now`` and ``sleep``), the real one, and
a node's own clock read over SSH (``remote_now``)."""

from __future__ import annotations

import time
from typing import Protocol

from pytest_spark.access.cluster import Node


def remote_now(node: Node) -> str:
    result = node.run("date -u +%Y-%m-%dT%H:%M:%S.%NZ", timeout=10)
    return result.stdout.strip() or "1970-01-01T00:00:00Z"


class Clock(Protocol):
    """The wait's one time source: what time it is, and the pause between two polls. Every
    time limit of the wait (ready, hang, placement, the missing-container and
    nothing-serving graces, the retry backoff) is measured on ``now``; ``sleep`` is the
    only way the wait passes time. Tests give a clock whose ``sleep`` advances ``now``."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` and ``time.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


REAL_CLOCK: Clock = MonotonicClock()
