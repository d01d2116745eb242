"""The functional serving checks' requests, sent ahead together (``--spark-serving-concurrency``).

A functional check (a tool call, a reasoning split, a structured answer, the SDK's twin of
each) asks one question and judges the answer; asked one after another they wait on paced
decode, request after request (83 s of a 153 s sim run; at 31 tok/s on two Sparks, minutes).
Each module that holds such checks plans, at its first check, the requests its selected
checks will read (:meth:`TurnCache.plan`); they go out on a bounded pool and each check
reads its answer (or the ``ServingError`` it raised) when it runs. Verdicts and their order
do not change: a check still judges the same answer, in the same place in the report.

What must stay alone never overlaps them: :meth:`Prefetch.drain` waits until nothing is in
flight, and the checks that measure (the throughput levels, the soak, the open loop, the
prefix cache's TTFTs, the long-context needle, the accuracy canaries) call it first
(tests_e2e/conftest.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


class Prefetch:
    """A bounded pool for requests planned ahead; ``workers`` 1 plans nothing (each check
    sends its own request when it runs, as before)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._inflight: set[Future[Any]] = set()
        self.sent = 0  # requests sent ahead this session (the terminal's summary, tests)

    @property
    def concurrent(self) -> bool:
        return self.workers > 1

    def submit(self, fn: Callable[[], T]) -> Future[T] | None:
        """``fn`` on the pool (None when concurrency is 1: the caller runs it itself)."""
        if not self.concurrent:
            return None
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="spark-ahead")
            future = self._pool.submit(fn)
            self._inflight.add(future)
            self.sent += 1
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future[Any]) -> None:
        with self._lock:
            self._inflight.discard(future)

    def drain(self) -> None:
        """Wait until no planned request is in flight (a measurement must run alone)."""
        with self._lock:
            pending = set(self._inflight)
        if pending:
            wait(pending)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class Planned:
    """Answers planned by key: ``plan`` sends once, ``get`` waits for the answer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[Hashable, Future[object]] = {}

    def plan(self, key: Hashable, prefetch: Prefetch, fn: Callable[[], object]) -> None:
        with self._lock:
            if key in self._futures:
                return
            future = prefetch.submit(fn)
            if future is not None:
                self._futures[key] = future

    def take(self, key: Hashable) -> Future[object] | None:
        with self._lock:
            return self._futures.pop(key, None)


def ask_ahead(
    request: pytest.FixtureRequest, plan: Callable[[pytest.Item], None]
) -> Iterator[None]:
    """A functional module's own fixture (module scope, autouse): ``plan(item)`` sends the
    requests each of its selected checks will read, before the first of them runs; at the
    module's end nothing it sent is left in flight (what comes next may measure)."""
    prefetch: Prefetch = request.getfixturevalue("serving_prefetch")
    if prefetch.concurrent:
        for item in request.session.items:
            if getattr(item, "module", None) is request.module:
                plan(item)
    try:
        yield
    finally:
        prefetch.drain()


def item_params(item: pytest.Item) -> dict[str, Any]:
    """A parametrized check's parameters (``{}`` for a plain one)."""
    callspec = getattr(item, "callspec", None)
    return dict(callspec.params) if callspec is not None else {}
