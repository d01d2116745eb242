"""Live lines in the terminal while the suite waits: the launch's progress (rewritten in
place on a terminal, throttled in a log), notices (connection lost, retrying) and the
progress of long measurements; all written under capture too, flushed as they go."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest

from pytest_spark.readiness.watch import StartupWatch


def progress_writer(config: pytest.Config) -> Callable[[StartupWatch, float], None]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    last: dict[str, Any] = {"phase": None, "t": 0.0}

    def write(watch: StartupWatch, now: float) -> None:
        if reporter is None:
            return
        line = watch.status_line(now)
        tty = reporter.isatty() if callable(getattr(reporter, "isatty", None)) else False
        if not tty and watch.phase == last["phase"] and now - last["t"] < 10:
            return
        last.update(phase=watch.phase, t=now)
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            if tty:
                reporter.write(f"\r{line:<78}", flush=True)
            else:
                reporter.write_line(line)
                reporter.flush()  # live in a CI log too: a pipe is block-buffered

    return write


def notice_writer(config: pytest.Config) -> Callable[[str], None]:
    """A line of its own in the terminal (connection lost, retrying), under capture too."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")

    def write(text: str) -> None:
        if reporter is None:
            return
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            reporter.ensure_newline()
            reporter.write_line(f"pytest-dgx-spark: {text}", yellow=True)
            reporter.flush()

    return write


def progress_line_writer(config: pytest.Config, every_s: float = 10.0) -> Callable[[str], None]:
    """A progress line flushed to the terminal as it goes, under capture too: rewritten in
    place on a terminal; in a log (a pipe) one line per ``every_s`` and the last (100%)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    last = {"t": float("-inf")}

    def write(line: str) -> None:
        if reporter is None:
            return
        tty = reporter.isatty() if callable(getattr(reporter, "isatty", None)) else False
        now = time.monotonic()
        final = " 100% " in f" {line} "
        if not tty and not final and now - last["t"] < every_s:
            return
        last["t"] = now
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            if tty:
                reporter.write(f"\r{line:<78}" + ("\n" if final else ""), flush=True)
            else:
                reporter.ensure_newline()
                # under -q the dots of the tests so far have no path before them, so
                # ensure_newline leaves them: the line starts after them unless ended here
                if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
                    reporter.write("\n")
                reporter.write_line(line)
                reporter.flush()  # live in a CI log too: a pipe is block-buffered

    return write


def progress_done(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and getattr(reporter, "isatty", lambda: False)():
        reporter.write("\n")
