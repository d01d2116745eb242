"""Children spawned off the main thread get a snapshot of the environment: with env=None a
vfork'd child execs from the parent's live ``environ``, which the main thread may be
reallocating (pytest sets and deletes PYTEST_CURRENT_TEST around every test phase), and
the exec fails with EFAULT. CI lost a fault-matrix lane's ``spark-sim fault clear`` so."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pytest_spark.access import simcontrol
from pytest_spark.access.simcontrol import SimCluster

SPAWNS = 150  # per thread: the old code failed 2-15 % of spawns in this race here


def test_sim_cli_off_the_main_thread_while_the_environment_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(simcontrol, "_cli", lambda: ["/bin/true"])
    sim = SimCluster(Path("/nonexistent"), {}, owned=False)
    stop = threading.Event()
    errors: list[OSError] = []
    names = [f"SPAWN_ENV_TEST_{i}" for i in range(64)]

    def churn() -> None:  # what pytest does to the environment, and more of it
        i = 0
        while not stop.is_set():
            os.environ["SPAWN_ENV_TEST_CURRENT"] = "x" * (i % 50)
            del os.environ["SPAWN_ENV_TEST_CURRENT"]
            os.environ[names[i % 64]] = "y"  # grows the C array: a realloc
            if i % 64 == 63:
                for name in names:
                    os.environ.pop(name, None)
            i += 1

    def spawn() -> None:
        for _ in range(SPAWNS):
            try:
                assert sim.cli("fault", "clear").returncode == 0
            except OSError as exc:
                errors.append(exc)

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        spawners = [threading.Thread(target=spawn) for _ in range(3)]
        for thread in spawners:
            thread.start()
        for thread in spawners:
            thread.join()
    finally:
        stop.set()
        churner.join()
        for name in [*names, "SPAWN_ENV_TEST_CURRENT"]:
            os.environ.pop(name, None)
    assert not errors, f"{len(errors)} of {3 * SPAWNS} spawns failed: {errors[0]!r}"
