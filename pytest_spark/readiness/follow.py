"""The head's ``/health`` followed between the readiness watch's polls, so that ready is
noticed within a fraction of a second, not at the next poll (issue #27 part 5).

The watch polls every node once a second (``wait.POLL_S``): ``docker inspect``, ``docker
logs`` and ``docker top`` per node cost ~150 ms of the nodes' CPU each time, so the poll
stays at a second and a crash is still seen within it. Only the moment ``/health`` turns
200 needs to be seen sooner. :class:`HealthFollower` runs one short loop on the head
itself (``curl`` every ``every_s``, on the host where operators curl it, for at most
``window_s``; then the next), in a thread of its own, on a channel of its own over the
head's SSH connection. The moment it sees 200 it runs the head's poll command there and
then (its container state, its new log lines, its processes: the same round trip as a
poll's) and ends; the wait, which sleeps on the follower's event instead of the clock,
takes that as the head's poll: the last log lines feed the timeline (its api and ready
phases) and the verdict comes through the same rules as any poll (a rank found dead is
never declared ready). Ready is noticed one curl interval and one SSH message after it.

Nothing stays behind: the remote loop ends on its own after its tries (``window_s`` of
sleeps, plus the curls) once the wait no longer asks for another, and the thread with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pytest_spark.access.base import CommandResult, RemoteError
from pytest_spark.access.cluster import Node

READY = "__PYTEST_SPARK_READY__"
# curl every 50 ms: a 200 is seen within 50 ms plus one curl; each loop lasts 5 s at most,
# so a loop still running when the wait has ended is gone 5 s later.
EVERY_S = 0.05
WINDOW_S = 5.0


def follow_command(
    port: int, then: str, every_s: float = EVERY_S, window_s: float = WINDOW_S
) -> str:
    """A shell loop on the head: the moment /health answers 200, print READY, run ``then``
    (the head's poll command) and exit; else exit quietly after ``window_s``. ``curl -m 1``
    bounds each try."""
    tries = max(1, int(window_s / every_s))
    url = f"http://127.0.0.1:{int(port)}/health"
    return (
        f"i=0; while [ $i -lt {tries} ]; do "
        f"c=$(curl -s -o /dev/null -m 1 -w '%{{http_code}}' {url} 2>/dev/null); "
        f'if [ "$c" = 200 ]; then echo {READY}; {then}; exit 0; fi; '
        f"sleep {every_s:g}; i=$((i+1)); done"
    )


class HealthFollower:
    """Follows the head's /health from the head; ``ready`` is set when it answers 200,
    ``result`` then holds the head's poll taken at that moment. ``poll_command()``: the
    head's poll command as the wait would send it now (its log cursor moves)."""

    def __init__(
        self,
        head: Node,
        port: int,
        poll_command: Callable[[], str],
        every_s: float = EVERY_S,
        window_s: float = WINDOW_S,
    ) -> None:
        self.head = head
        self.port = port
        self.poll_command = poll_command
        self.every_s = every_s
        self.window_s = window_s
        self.result: CommandResult | None = None
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-health", daemon=True)

    def start(self) -> HealthFollower:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            command = follow_command(self.port, self.poll_command(), self.every_s, self.window_s)
            try:
                result = self.head.run(command, timeout=self.window_s + 30)
            except RemoteError:
                # The watch's own poll reports a node it cannot reach; try again later.
                self._stop.wait(1.0)
                continue
            if READY in result.stdout:
                self.result = result
                self.ready.set()
                return

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True at once when /health turned 200 (or had)."""
        return self.ready.wait(max(0.0, seconds))

    def stop(self) -> None:
        """No further loop; the one running ends on its own within ``window_s``."""
        self._stop.set()
