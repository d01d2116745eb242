"""Measurements once per session and in isolation, also under xdist.

Without xdist a measurement (the all-reduce sweep, the throughput sweep) is computed where
it is first needed, as any session fixture is. Under xdist each worker would compute its
own, at the same time as the others, on the same nodes: they collide, and a figure taken
while other workers send requests is not a measurement. So, in a worker:

- the first worker to need a measurement computes it under a FileLock in the run
  directory and writes it there (``measure-<name>.json``, typed dataclasses through
  :mod:`pytest_spark.measure.codec`); the others wait on the lock and read it;
- every test holds the cluster lock (:class:`pytest_spark.measure.rwlock.RWFileLock`) shared while
  it runs, and a measurement holds it exclusive, writer first: while it measures, no test
  on any worker sends load to the cluster.

Each measurement carries a record (name, id, which process computed it) that the checks
attach to the report, so a run shows that one sweep served every check.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest
from filelock import FileLock

from pytest_spark.access.files import write_json
from pytest_spark.measure.rwlock import RWFileLock

T = TypeVar("T")


@dataclass(frozen=True)
class Measured(Generic[T]):
    """A measurement's value and its record (``name``, ``id``, ``by``, ``duration_s``)."""

    value: T
    record: dict[str, Any]


class Measurements:
    """The session's measurements; a pytest plugin (holding the cluster lock shared around
    each test) when registered in an xdist worker."""

    def __init__(self, run_dir: Path, who: str, *, shared: bool) -> None:
        self.run_dir = Path(run_dir)
        self.who = who
        self.lock = RWFileLock(self.run_dir) if shared else None

    def once(
        self,
        name: str,
        compute: Callable[[], T],
        encode: Callable[[T], Any],
        decode: Callable[[Any], T],
    ) -> Measured[T]:
        """``compute()`` once per session: here, or read from the worker that did."""
        if self.lock is None:
            return self._compute(name, compute)
        path = self.run_dir / f"measure-{name}.json"
        with self.lock.suspended(), FileLock(str(self.run_dir / f"measure-{name}.lock")):
            doc = json.loads(path.read_text()) if path.exists() else None
            if doc is None:
                with self.lock.exclusive():
                    measured = self._compute(name, compute)
                write_json(path, {"record": measured.record, "value": encode(measured.value)})
                return measured
        return Measured(decode(doc["value"]), doc["record"])

    def _compute(self, name: str, compute: Callable[[], T]) -> Measured[T]:
        t0 = time.monotonic()
        value = compute()
        record = {
            "name": name,
            "id": uuid.uuid4().hex[:12],
            "by": self.who,
            "pid": os.getpid(),
            "duration_s": round(time.monotonic() - t0, 3),
        }
        return Measured(value, record)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        """Each test (setup, call, teardown) runs holding the cluster lock shared."""
        if self.lock is None:
            return (yield)
        with self.lock.shared():
            return (yield)

    def close(self) -> None:
        if self.lock is not None:
            self.lock.close()


# The session's Measurements (set by the plugin at configure, in every process).
MEASURE_KEY: pytest.StashKey[Measurements] = pytest.StashKey()


def measure_once(
    config: pytest.Config,
    name: str,
    compute: Callable[[], T],
    encode: Callable[[T], Any],
    decode: Callable[[Any], T],
) -> Measured[T]:
    """Compute a measurement once per session, in isolation under xdist (see the module)."""
    measurements = config.stash.get(MEASURE_KEY, None)
    if measurements is None:  # the plugin is not configured (e.g. -p no:spark in a test)
        measurements = Measurements(Path("."), "main", shared=False)
    return measurements.once(name, compute, encode, decode)


def measure_dir(config: pytest.Config) -> Path | None:
    """The session's run directory, where the measurements are kept (``measure-<name>.json``)
    and what is read around them (``counters-<name>.json``); None when the plugin is not
    configured."""
    measurements = config.stash.get(MEASURE_KEY, None)
    return measurements.run_dir if measurements is not None else None
