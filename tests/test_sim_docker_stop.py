"""``spark-sim down`` stops each node's dockerd with SIGTERM and waits for it. dockerd 20.10
logs "Daemon shutdown complete", then stops the containerd it supervises and polls it
once a second (libcontainerd ``stopDaemon``): a second per ``down`` with nothing left to
do. Once that line is logged and its containerd is gone, the sim kills it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparksim import docker

# A dockerd as 20.10 stops: on SIGTERM it logs the end of its shutdown, stops its
# containerd, then sits out its supervisor's poll (here far longer than 1 s).
FAKE_DOCKERD = """
import signal, subprocess, sys, time
log = open(sys.argv[1], "a")
containerd = subprocess.Popen(["sleep", "60"])
def term(*_):
    log.write('level=info msg="Daemon shutdown complete"\\n'); log.flush()
    containerd.terminate(); containerd.wait()
    time.sleep(30)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def _engine(tmp_path: Path) -> docker.Engine:
    engine = docker.Engine(tmp_path / "nodes" / "spark-1", "spk0-n1")
    engine.dir.mkdir(parents=True)
    return engine


def test_shut_down_needs_the_line_after_the_signal_and_containerd_gone(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    engine.log.write_text('level=info msg="Daemon shutdown complete"\n')  # an earlier dockerd
    since = engine.log.stat().st_size
    containerd = subprocess.Popen(["sleep", "60"])
    try:
        assert docker._children(0) == set()  # no such process
        assert not docker._shut_down(engine, {containerd.pid}, since)  # nothing new logged
        with engine.log.open("a") as fh:
            fh.write('level=info msg="Daemon shutdown complete"\n')
        assert not docker._shut_down(engine, {containerd.pid}, since)  # containerd still runs
    finally:
        containerd.kill()
        containerd.wait()
    assert docker._shut_down(engine, {containerd.pid}, since)
    assert not docker._shut_down(engine, set(), since)  # no containerd seen: wait it out


def test_stop_engines_does_not_sit_out_the_supervisor_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(docker, "_remove_run_dirs", lambda: None)  # the host's /run: not ours
    monkeypatch.setattr(docker, "remove_all_containers", lambda engine: 0)  # no API here
    engine = _engine(tmp_path)
    fake = subprocess.Popen(
        [sys.executable, "-c", FAKE_DOCKERD, str(engine.log)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert fake.stdout is not None and fake.stdout.readline() == "ready\n"
        assert len(docker._children(fake.pid)) == 1  # its containerd
        engine.host_pidfile.write_text(f"{fake.pid}\n")
        start = time.monotonic()
        done = docker.stop_engines([engine])
        assert time.monotonic() - start < 10  # not the fake's 30 s
        assert done == ["dockerd on spark-1"]
        assert fake.wait(timeout=5) != 0  # killed after its shutdown, not exited
        assert not engine.dir.exists()
    finally:
        fake.kill()
        fake.wait()
        if fake.stdout is not None:
            fake.stdout.close()
