"""Measurements once per session and in isolation under xdist (pytest_spark.measure.once): the
cross-process readers/writer lock with real processes, the once-per-session computation,
and the JSON round trip of what a measurement shares."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_spark.infra.nccl.parse import parse_nccl_tests
from pytest_spark.infra.nccl.probe import CollectiveRun, RankOutput
from pytest_spark.measure.codec import CodecError, dump, load, load_as
from pytest_spark.measure.once import Measurements
from pytest_spark.measure.rwlock import RWFileLock

NCCL = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"
HOLDER = """
import sys
from pathlib import Path
from pytest_spark.measure.rwlock import RWFileLock
lock = RWFileLock(Path(sys.argv[1]))
for line in sys.stdin:
    what = line.strip()
    if what == "shared":
        lock.acquire_shared()
    elif what == "exclusive":
        lock.acquire_exclusive()
    elif what == "release":
        lock.release()
    print(what, flush=True)
"""


class Holder:
    """Another process that takes and lets go of the lock when told (one line a step)."""

    def __init__(self, directory: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def send(self, what: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()

    def done(self) -> str:
        """Wait until the step sent last is done (a blocked acquire: until it is granted)."""
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def do(self, what: str) -> None:
        self.send(what)
        assert self.done() == what

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for holder in made:
        holder.kill()


def wait_until(condition, what: str, limit_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    """Wait for another process to reach a state (a bound on a hang, not a timing check)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.02)


def turnstile_taken(directory: Path) -> bool:
    fd = os.open(directory / "cluster.turnstile", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_readers_share_and_keep_a_writer_out(tmp_path: Path, holders: list[Holder]) -> None:
    reader = Holder(tmp_path)
    holders.append(reader)
    reader.do("shared")
    lock = RWFileLock(tmp_path)
    assert lock.acquire_shared(blocking=False), "two readers at once"
    lock.release()
    assert not lock.acquire_exclusive(blocking=False), "a writer while a test runs"
    reader.do("release")
    assert lock.acquire_exclusive(blocking=False)
    assert not RWFileLock(tmp_path).acquire_shared(blocking=False), "a reader while measuring"
    lock.close()


def test_waiting_writer_is_not_starved(tmp_path: Path, holders: list[Holder]) -> None:
    reader, writer = Holder(tmp_path), Holder(tmp_path)
    holders += [reader, writer]
    reader.do("shared")
    writer.send("exclusive")  # blocks: a test is running
    wait_until(lambda: turnstile_taken(tmp_path), "the writer waits at the turnstile")
    late = RWFileLock(tmp_path)
    # Only a reader holds the lock, yet a new reader must wait behind the waiting writer.
    assert not late.acquire_shared(blocking=False)
    reader.do("release")
    assert writer.done() == "exclusive"
    assert not late.acquire_shared(blocking=False)
    writer.do("release")
    assert late.acquire_shared(blocking=False)
    late.close()


@pytest.mark.parametrize("mode", ["shared", "exclusive"])
def test_a_crashed_holder_releases_the_lock(
    tmp_path: Path, holders: list[Holder], mode: str
) -> None:
    holder = Holder(tmp_path)
    holders.append(holder)
    holder.do(mode)
    lock = RWFileLock(tmp_path)
    assert not lock.acquire_exclusive(blocking=False)
    holder.kill()  # SIGKILL: no release, no cleanup; flock goes with the process's files
    assert lock.acquire_exclusive(blocking=False)
    lock.close()


def test_exclusive_from_a_shared_holder_does_not_deadlock(tmp_path: Path) -> None:
    lock = RWFileLock(tmp_path)
    with lock.shared():
        assert lock.mode == "shared"
        with lock.exclusive():
            assert lock.mode == "exclusive"
            assert not RWFileLock(tmp_path).acquire_shared(blocking=False)
        assert lock.mode == "shared"
    assert lock.mode is None
    lock.close()


ONCE = """
import json, sys
from pathlib import Path
from pytest_spark.measure.codec import dump, load_as
from pytest_spark.infra.nccl.probe import CollectiveRun
from pytest_spark.measure.once import Measurements
run_dir, who, value = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
sys.stdin.readline()  # start together

def compute():
    with open(run_dir / "computed", "a") as f:
        f.write(who + "\\n")
    return load_as(CollectiveRun, json.loads(value.read_text()))

m = Measurements(run_dir, who, shared=True)
got = m.once("collective-run", compute, dump, lambda d: load_as(CollectiveRun, d))
print(json.dumps({"value": dump(got.value), "record": got.record}))
"""


def test_once_per_session_across_processes(tmp_path: Path) -> None:
    run = collective_run_of("all_reduce_sweep_healthy.txt")
    value = tmp_path / "value.json"
    value.write_text(json.dumps(dump(run)))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ONCE, str(tmp_path), f"gw{i}", str(value)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    outs = [p.communicate("go\n", timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    got = [json.loads(out) for out in outs]
    assert len((tmp_path / "computed").read_text().splitlines()) == 1
    assert len({g["record"]["id"] for g in got}) == 1
    assert all(load_as(CollectiveRun, g["value"]) == run for g in got)


def test_once_without_xdist_just_computes(tmp_path: Path) -> None:
    calls = []
    m = Measurements(tmp_path, "main", shared=False)
    got = m.once("x", lambda: calls.append(1) or 42, dump, int)
    assert got.value == 42 and got.record["by"] == "main" and calls == [1]
    assert list(tmp_path.iterdir()) == []  # nothing written, no lock taken


def collective_run_of(*names: str) -> CollectiveRun:
    ranks = []
    for rank, name in enumerate(names):
        text = (NCCL / name).read_text()
        ranks.append(
            RankOutput(
                node=f"spark-{rank + 1}",
                rank=rank,
                command="python3 - --min-bytes 1024",
                rc=0,
                stdout=text,
                stderr="",
                duration_s=1.25,
                parsed=parse_nccl_tests(text),
            )
        )
    return CollectiveRun(
        launcher="container",
        token="pytest-spark-nccl-0123abcd",
        world_size=len(ranks),
        ranks=tuple(ranks),
        result=ranks[0].parsed,
        timed_out=False,
        duration_s=3.5,
        notes=("container vllm_node: torch 2.13",),
    )


@pytest.mark.parametrize("name", sorted(p.name for p in NCCL.glob("*.txt")))
def test_collective_run_json_round_trip(name: str) -> None:
    run = collective_run_of(name, "all_reduce_sweep_healthy.txt")
    data = json.loads(json.dumps(dump(run)))
    back = load(CollectiveRun | str, data)
    assert back == run
    assert back.transports == run.transports and back.hung_at_init == run.hung_at_init


def test_collective_run_reason_round_trip() -> None:
    reason = "no all-reduce launcher works on every node"
    assert load(CollectiveRun | str, json.loads(json.dumps(dump(reason)))) == reason


def test_codec_refuses_data_of_another_shape() -> None:
    with pytest.raises(CodecError):
        load(CollectiveRun, ["not", "an", "object"])
    with pytest.raises(CodecError):
        load(int | None, "3")
    with pytest.raises(CodecError):
        dump({1: "non-str key"})
