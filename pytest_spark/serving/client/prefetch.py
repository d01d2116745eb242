"""The functional serving checks' requests, sent ahead together (``--spark-serving-concurrency``).

A functional check (a tool call, a reasoning split, a structured answer, the SDK's twin of
each) asks one question and judges the answer; asked one after another they wait on paced
decode, request after request (83 s of a 153 s sim run; at 31 tok/s on two Sparks, minutes).
The first module of a run of such modules plans, at its first check, the requests every
selected check of the run will read (:func:`ask_ahead`, :meth:`TurnCache.plan`); they go
out on a bounded pool and each check reads its answer (or the ``ServingError`` it raised)
when it runs. Verdicts and their order do not change: a check still judges the same
answer, in the same place in the report.

What must stay alone never overlaps them: :meth:`Prefetch.drain` waits until nothing is in
flight, and the checks that measure (the throughput levels, the soak, the open loop, the
prefix cache's TTFTs, the long-context needle, the accuracy canaries) call it first
(tests_e2e/conftest.py).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

import pytest

from pytest_spark.infra.finding import CheckNote
from pytest_spark.serving.client.stream import ServingError

T = TypeVar("T")
# The ways a request runs out of time (pytest_spark.serving.client.stream): beside the
# plan's other requests a slow cluster may take longer than the request timeout, or a
# server that admits fewer sequences (--max-num-seqs) may hold a queued stream silent past
# the idle timeout, where the same request alone answers in time.
OUT_OF_TIME = frozenset({"timeout", "stall"})


class AskedAloneWarning(CheckNote):
    """A planned request ran out of time beside the others and was judged on its answer
    alone (:meth:`Prefetch.alone_again`): the check passed, the cluster was slow under load."""


def plan_workers(concurrency: int, max_num_seqs: int | None, under_xdist: bool) -> int:
    """How many planned requests go out at once: ``--spark-serving-concurrency``, at most
    the server's ``--max-num-seqs`` where its serve args say it (vLLM queues the rest
    unanswered, so more buys nothing and a queued stream says nothing until a sequence
    frees), and 1 under xdist (the workers are the concurrency: a worker lets go of the
    cluster lock between its tests, and requests still in flight then would overlap
    another worker's measurement)."""
    if under_xdist:
        return 1
    if max_num_seqs is not None and max_num_seqs > 0:
        return max(1, min(concurrency, max_num_seqs))
    return concurrency


class Prefetch:
    """A bounded pool for requests planned ahead; ``workers`` 1 plans nothing (each check
    sends its own request when it runs, as before)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._inflight: set[Future[Any]] = set()
        self.sent = 0  # requests sent ahead this session (the terminal's summary, tests)
        self.planned: set[object] = set()  # the modules whose checks' requests went out
        self.asked_alone = 0  # planned requests that ran out of time, asked again alone
        self._alone_failed = False  # a request ran out of time alone too: ask no more

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

    def alone_again(
        self, error: ServingError, again: Callable[[], T | ServingError]
    ) -> T | ServingError:
        """A planned request's ``error``; when it ran out of time (:data:`OUT_OF_TIME`),
        the same request asked again alone (``again()``, once nothing planned is in
        flight), whose outcome is the check's: our own load must not fail a check of
        what the server answers. A server too slow alone too fails that one check, and
        later checks keep their own errors, not asked again (one more wait at most, not
        one per check on a hung server)."""
        if error.kind not in OUT_OF_TIME:  # a planned request: the pool is concurrent
            return error
        with self._lock:
            if self._alone_failed:
                return error
        self.drain()
        t0 = time.monotonic()
        answer = again()
        took = time.monotonic() - t0
        if isinstance(answer, ServingError):
            with self._lock:
                self._alone_failed = True
            return answer
        self.asked_alone += 1
        warnings.warn(
            AskedAloneWarning(
                f"{error.message}, with up to {self.workers} of the functional checks' "
                f"requests in flight (--spark-serving-concurrency); asked again alone it "
                f"answered in {took:.1f} s, and that answer was judged. A cluster this slow "
                "under load shows in the throughput checks; a lower "
                "--spark-serving-concurrency avoids the second wait"
            ),
            stacklevel=2,
        )
        return answer

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


PLANNER = "plan_ahead"  # a functional module's ``plan_ahead(request, item)``
# A module whose checks send nothing that must stay alone except through a session
# measurement that drains first (the throughput checks read the sweep, measured once and
# alone: tests_e2e/conftest.py's ``_sweep`` drains before it measures): a run of functional
# modules goes on across it, so one plan covers the functional modules on either side.
SPANS = "plan_spans"


def _planner(item: pytest.Item) -> Callable[[pytest.FixtureRequest, pytest.Item], None] | None:
    planner = getattr(getattr(item, "module", None), PLANNER, None)
    return planner if callable(planner) else None


def _in_run(item: pytest.Item) -> bool:
    """Whether ``item`` may run while planned requests are in flight."""
    return _planner(item) is not None or getattr(getattr(item, "module", None), SPANS, False)


def ask_ahead(request: pytest.FixtureRequest) -> Iterator[None]:
    """The functional modules' fixture (module scope, autouse; tests_e2e/conftest.py).

    A functional module defines ``plan_ahead(request, item)``: it sends the requests its
    check ``item`` will read, through session fixtures (``request.getfixturevalue``). The
    first of a run of such modules, consecutive in the session's order, plans every check
    of the run: their requests go out together, and a module waits on its own slowest
    answer while the next modules' answers arrive (four modules one after the other waited
    on four slowest answers). The run goes on across a module that declares ``plan_spans``
    (:data:`SPANS`). At the run's end nothing it sent is left in flight: what comes next
    may measure."""
    module = request.module
    items = request.session.items
    at = [i for i, item in enumerate(items) if getattr(item, "module", None) is module]
    if not at or not _in_run(items[at[0]]):
        yield
        return
    prefetch: Prefetch = request.getfixturevalue("serving_prefetch")
    first = _planner(items[at[0]]) is not None
    if prefetch.concurrent and first and module not in prefetch.planned:
        end = at[0]
        while end < len(items) and _in_run(items[end]):
            end += 1
        for item in items[at[0] : end]:
            planner = _planner(item)
            if planner is None:  # a module the run spans (SPANS): it plans nothing
                continue
            prefetch.planned.add(getattr(item, "module", None))
            try:
                planner(request, item)
            except (Exception, pytest.skip.Exception, pytest.fail.Exception):
                # A fixture the plan needs failed or skipped (the SDK's client, a turn
                # cache): the check sends its own request when it runs and meets the same
                # error in its own place, not in the module that planned for it.
                continue
    try:
        yield
    finally:
        after = at[-1] + 1
        if after >= len(items) or not _in_run(items[after]):
            prefetch.drain()


def item_params(item: pytest.Item) -> dict[str, Any]:
    """A parametrized check's parameters (``{}`` for a plain one)."""
    callspec = getattr(item, "callspec", None)
    return dict(callspec.params) if callspec is not None else {}


def confirmed_alone(prefetch: Prefetch, finding: Any, again: Callable[[], Any]) -> Any:
    """A comparison of two answers that went out together (a streamed answer against its
    plain twin, the SDK's against the raw client's): greedy decoding is the same only for
    the same batch, and vLLM's kernels are not batch-invariant, so two answers sent beside
    different others may part after some tokens with no parser at fault. A comparison that
    failed so is made again on the pair sent alone, one after the other (``again()``): its
    verdict is the check's (a parser that splits the text differently still fails)."""
    if finding.ok or not prefetch.concurrent:
        return finding
    prefetch.drain()  # alone: nothing planned is still in flight beside the pair
    alone = again()
    if alone.ok:
        note = (
            " (sent together with the module's other requests they differed, a batch "
            "effect on greedy decoding; sent alone, one after the other, they agree)"
        )
        return type(alone).passed(alone.measured, alone.expected, message=alone.message + note)
    return alone
