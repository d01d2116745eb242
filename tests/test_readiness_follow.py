"""The head's /health followed between the watch's polls (pytest_spark.readiness.follow):
its loop runs on the head (here: a local bash, the command as the head gets it) against a
real HTTP server; nothing is set while /health answers 503, and the moment it answers 200
the event is set with the head's poll taken there and then."""

from __future__ import annotations

import http.server
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_spark.access.base import CommandResult
from pytest_spark.readiness.follow import READY, HealthFollower, follow_command

pytestmark = pytest.mark.unit


class LocalHead:
    """A node whose commands run in a local bash (the head's shell)."""

    name = "spark-head"

    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        self.commands.append(command)
        proc = subprocess.run(
            ["bash", "-c", command], capture_output=True, text=True, timeout=timeout
        )
        return CommandResult(self.name, command, proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def health() -> Iterator[tuple[int, dict[str, int]]]:
    """A /health that answers ``state["code"]``; (port, state)."""
    state = {"code": 503}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(state["code"])
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], state
    finally:
        server.shutdown()
        server.server_close()


def test_the_follower_fires_when_health_turns_200_with_the_heads_poll_taken_then(
    health: tuple[int, dict[str, int]],
) -> None:
    port, state = health
    head = LocalHead()
    polled: list[int] = []

    def poll_command() -> str:
        polled.append(1)
        return "echo HEAD-POLL-OUTPUT"

    follower = HealthFollower(head, port, poll_command, every_s=0.02, window_s=0.5)  # type: ignore[arg-type]
    follower.start()
    try:
        assert not follower.wait(1.2)  # 503: nothing, loop after loop
        assert follower.result is None and head.commands
        state["code"] = 200
        assert follower.wait(10)
        assert follower.result is not None
        out = follower.result.stdout
        assert READY in out and "HEAD-POLL-OUTPUT" in out
        assert out.index(READY) < out.index("HEAD-POLL-OUTPUT")
    finally:
        follower.stop()


def test_the_follow_loop_ends_on_its_own_after_its_window(
    health: tuple[int, dict[str, int]],
) -> None:
    """Nothing stays behind on the head: a loop nobody reads ends within its window."""
    port, _ = health
    command = follow_command(port, "echo never", every_s=0.05, window_s=0.3)
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0 and proc.stdout == ""
