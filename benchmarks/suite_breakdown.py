#!/usr/bin/env python3
"""Where a whole-suite run's wall time goes: one ``pytest --spark-sim`` session (as the
README runs it) with this file loaded as a plugin, which times every fixture setup and
every check's call, each net of what ran inside it (a fixture that another fixture's setup
asked for counts once, as its own), and the parent times what lies outside the session
(process start, sim up, serving stop, sim down). Prints the largest parts, then the sum.

    sudo .venv/bin/python benchmarks/suite_breakdown.py [--top N] [pytest args...]

The parts that measure (the throughput sweep, the NCCL sweep, the needle, the prefix
cache, the canaries alone, the GPU load) must run alone; what is left beside them is what
concurrency or less waiting can still take (issue #27's whole-suite target).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
OUT_ENV = "SPARK_BREAKDOWN_OUT"


class _Clock:
    """A stack of timed frames (fixture setups, check calls); each frame's time net of
    the frames opened inside it."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = defaultdict(float)
        self._stack: list[list[float]] = []  # [start, time of the frames inside]
        self.first = self.last = None  # type: float | None

    def frame(self, name: str) -> Iterator[None]:
        now = time.monotonic()
        self.first = now if self.first is None else self.first
        self._stack.append([now, 0.0])
        try:
            yield
        finally:
            start, inner = self._stack.pop()
            took = time.monotonic() - start
            self.parts[name] += took - inner
            if self._stack:
                self._stack[-1][1] += took
            self.last = time.monotonic()


_clock = _Clock()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Iterator[None]:
    yield from _clock.frame(f"fixture {fixturedef.argname} ({fixturedef.scope})")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _clock.frame(f"checks of {item.path.name}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _clock.frame("teardowns")


def pytest_unconfigure(config: pytest.Config) -> None:
    out = os.environ.get(OUT_ENV)
    if out:
        Path(out).write_text(
            json.dumps(
                {
                    "parts": _clock.parts,
                    "first": _clock.first,
                    "last": _clock.last,
                    "clock_at_exit": time.monotonic(),
                }
            )
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=18)
    args, extra = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "parts.json"
        env = {
            **os.environ,
            OUT_ENV: str(out),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p
            ),
        }
        argv = [
            str(REPO / ".venv" / "bin" / "pytest"),
            "-p",
            "no:cacheprovider",
            "-p",
            Path(__file__).stem,
            "-q",
            "--spark-sim",
            f"--spark-results={Path(tmp) / 'results.json'}",
            "--spark-history=off",
            *extra,
        ]
        t0 = time.monotonic()
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env)
        wall = time.monotonic() - t0
        if not out.exists():
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
            return 1
        data = json.loads(out.read_text())
    parts: dict[str, float] = dict(data["parts"])
    # CLOCK_MONOTONIC is one clock for every process of the machine.
    parts["before the first fixture (start, sim up)"] = data["first"] - t0
    parts["after the last check (serving stop, sim down, exit)"] = (t0 + wall) - data["last"]
    ranked = sorted(parts.items(), key=lambda kv: -kv[1])
    # pytest's own last line ("1 failed, 24 passed in 5.10s"; the verdict line follows it)
    lines = proc.stdout.strip().splitlines() or ["(no output)"]
    last = next(
        (ln for ln in reversed(lines) if re.search(r" in [0-9.]+s( \([0-9:]+\))?( =+)?$", ln)),
        lines[-1],
    )
    print(f"whole suite {wall:.1f} s, exit {proc.returncode}: {last}")
    for name, took in ranked[: args.top]:
        print(f"  {took:6.1f} s  {100 * took / wall:4.1f}%  {name}")
    rest = sum(took for _, took in ranked[args.top :])
    print(f"  {rest:6.1f} s  {100 * rest / wall:4.1f}%  the other {len(ranked) - args.top} parts")
    print(f"  {sum(parts.values()):6.1f} s in all the parts (the wall: {wall:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
