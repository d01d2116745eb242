"""The docker-logs cursor: each log line (and each ``\\r`` segment of a tqdm line) is fed to
the startup watch once, so a progress bar that stops moving is silence.

``docker logs --since TS`` is inclusive: the newest line comes back on every poll. Its
``\\r`` continuation segments carry no timestamp of their own; re-feeding them refreshed
the watch's last activity on every poll, and a load stuck under a progress bar was never
called stalled. The polls below are the readiness loop's: the node's probe output ->
``parse_probe`` -> ``LogCursor.new_lines`` -> ``StartupWatch.feed``, then ``check_stall``."""

from __future__ import annotations

from pytest_spark.access.base import CommandResult
from pytest_spark.readiness.parse import LogCursor, parse_probe
from pytest_spark.readiness.probe import SEP
from pytest_spark.readiness.watch import StartupWatch

POLL_S = 0.5  # the polls of these tests, half a second apart (the watch's own: 1 s)

SINCE = "2026-11-29T20:00:00.000000000Z"
NODE = "spark-worker-1"


def bar(k: int, n: int = 39) -> str:
    return (
        f"Loading safetensors checkpoint shards: {100 * k // n:3d}% Completed | {k}/{n} "
        f"[{k // 3:02d}:{k % 60:02d}<11:00, 18.00s/it]"
    )


def stamp(i: int) -> str:
    return f"2026-11-29T20:{i // 60:02d}:{i % 60:02d}.000000000Z"


class DockerLog:
    """A container's log as ``docker logs --timestamps --since`` prints it."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def write(self, second: int, text: str) -> None:
        self.lines.append((stamp(second), text))

    def probe(self, since: str) -> CommandResult:
        logs = "".join(f"{ts} {text}\n" for ts, text in self.lines if ts >= since)
        out = f"{SEP} state\nrunning 0\n{SEP} logs\n{logs}"
        return CommandResult(NODE, "probe", 0, out, "")


def poll(log: DockerLog, cursor: LogCursor, watch: StartupWatch, now: float) -> list[str]:
    fed = cursor.new_lines(parse_probe(log.probe(cursor.since), with_health=False).lines)
    watch.feed(NODE, fed, now)
    watch.check_stall(now)
    return fed


def test_continuation_segments_carry_their_lines_timestamp() -> None:
    log = DockerLog()
    log.write(1, bar(0) + "\r" + bar(1) + "\r" + bar(2))
    assert parse_probe(log.probe(SINCE), with_health=False).lines == [
        f"{stamp(1)} {bar(0)}",
        f"{stamp(1)} {bar(1)}",
        f"{stamp(1)} {bar(2)}",
    ]


def test_a_stuck_progress_bar_is_a_stall_after_the_hang_timeout() -> None:
    log = DockerLog()
    log.write(1, "(RayWorkerWrapper pid=455) INFO Starting to load model /models/x...")
    log.write(2, bar(0) + "\r" + bar(1) + "\r" + bar(2))  # then the load hangs
    watch = StartupWatch(hang_timeout=20, placement_timeout=120, started=0.0)
    cursor = LogCursor(SINCE)
    assert poll(log, cursor, watch, 0.5) == [log.lines[0][1], bar(0), bar(1), bar(2)]
    now = 0.5
    while now < 20.0:
        now += POLL_S
        assert poll(log, cursor, watch, now) == []  # the same bar again: nothing new
        assert watch.failure is None
    now += POLL_S
    poll(log, cursor, watch, now)
    assert watch.failure is not None and watch.failure.kind == "stalled"
    assert "no log progress for 20 s in phase weights" in watch.failure.message()
    assert watch.progress["weights"] == (2, 39, "11:00")


def test_a_moving_progress_bar_is_no_stall() -> None:
    log = DockerLog()
    watch = StartupWatch(hang_timeout=20, placement_timeout=120, started=0.0)
    cursor = LogCursor(SINCE)
    for k in range(39):  # one shard every 10 s, 18 polls apart
        log.write(10 * k + 1, bar(k) + "\r" + bar(k) + "\r" + bar(k + 1))
        for i in range(20):
            fed = poll(log, cursor, watch, 10.0 * k + 1 + i * POLL_S)
            assert fed == ([bar(k), bar(k), bar(k + 1)] if i == 0 else [])
        assert watch.failure is None, watch.failure.message()
    assert watch.progress["weights"] == (39, 39, "11:00")


def test_lines_sharing_the_newest_timestamp_are_each_fed_once() -> None:
    """docker stamps in nanoseconds, but two lines may share one; the cursor counts them."""
    log = DockerLog()
    log.write(3, "INFO a")
    log.write(3, "INFO a")
    cursor = LogCursor(SINCE)
    watch = StartupWatch(hang_timeout=20, placement_timeout=120, started=0.0)
    assert poll(log, cursor, watch, 1.0) == ["INFO a", "INFO a"]
    log.write(3, "INFO a")
    log.write(3, "INFO b")
    assert poll(log, cursor, watch, 1.5) == ["INFO a", "INFO b"]
    assert poll(log, cursor, watch, 2.0) == []
    log.write(4, "INFO a")
    assert poll(log, cursor, watch, 2.5) == ["INFO a"]
    assert cursor.since == stamp(4)
