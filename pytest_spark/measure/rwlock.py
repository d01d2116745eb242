"""A readers/writer lock across processes, writers first (``fcntl.flock`` on two files).

Under xdist every test holds it shared while it runs; a measurement (the all-reduce sweep,
the throughput sweep) holds it exclusive, so no other worker sends load to the cluster
while it measures. Writers are not starved: a writer first takes the *turnstile* and keeps
it until it is done, and every reader passes through the turnstile before taking its
shared hold, so once a writer waits no new reader gets in; it waits only for the tests
already running.

``flock`` locks belong to the open file description: a process that dies (a crashed or
killed xdist worker) releases what it held, and a second ``open`` of the same file in one
process would conflict with the first. So a :class:`RWFileLock` opens each file once and
is used by one thread; a process takes the exclusive hold while holding the shared one by
letting go of the shared one first (:meth:`RWFileLock.exclusive`).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

Mode = Literal["shared", "exclusive"]


class RWFileLock:
    """Shared (readers) / exclusive (writer) lock in ``directory``, writer preferred."""

    def __init__(self, directory: Path, name: str = "cluster") -> None:
        self.directory = Path(directory)
        self._paths = (self.directory / f"{name}.turnstile", self.directory / f"{name}.rwlock")
        self._fds: tuple[int, int] | None = None
        self.mode: Mode | None = None

    def _open(self) -> tuple[int, int]:
        if self._fds is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            fds = tuple(
                os.open(p, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600) for p in self._paths
            )
            self._fds = (fds[0], fds[1])
        return self._fds

    # -- acquire / release ---------------------------------------------------------------
    def acquire_shared(self, blocking: bool = True) -> bool:
        return self._acquire("shared", blocking)

    def acquire_exclusive(self, blocking: bool = True) -> bool:
        return self._acquire("exclusive", blocking)

    def _acquire(self, mode: Mode, blocking: bool) -> bool:
        if self.mode is not None:
            raise RuntimeError(f"this process already holds the lock {self.mode}")
        turnstile, lock = self._open()
        nb = 0 if blocking else fcntl.LOCK_NB
        if not _flock(turnstile, fcntl.LOCK_EX | nb):
            return False  # a writer holds or waits at the turnstile
        # A writer keeps the turnstile until it is done: no new reader gets in while the
        # current ones finish. A reader lets go of it as soon as it holds the lock shared.
        if not _flock(lock, (fcntl.LOCK_SH if mode == "shared" else fcntl.LOCK_EX) | nb):
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            return False
        if mode == "shared":
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        self.mode = mode
        return True

    def release(self) -> None:
        if self.mode is None or self._fds is None:
            return
        turnstile, lock = self._fds
        fcntl.flock(lock, fcntl.LOCK_UN)
        if self.mode == "exclusive":
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        self.mode = None

    def close(self) -> None:
        self.release()
        if self._fds is not None:
            for fd in self._fds:
                os.close(fd)
            self._fds = None

    # -- context managers ----------------------------------------------------------------
    @contextmanager
    def shared(self) -> Iterator[None]:
        """Held shared for the block (a no-op when this process already holds it)."""
        if self.mode is not None:
            yield
            return
        self.acquire_shared()
        try:
            yield
        finally:
            self.release()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Held exclusive for the block; a shared hold of this process is let go first and
        taken again afterwards (waiting on others while holding it could deadlock)."""
        if self.mode == "exclusive":
            yield
            return
        with self.suspended():
            self.acquire_exclusive()
            try:
                yield
            finally:
                self.release()

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """Not held for the block (e.g. while waiting for another process's measurement);
        the hold this process had is taken again afterwards."""
        had = self.mode
        self.release()
        try:
            yield
        finally:
            if had == "shared":
                self.acquire_shared()
            elif had == "exclusive":
                self.acquire_exclusive()


def _flock(fd: int, op: int) -> bool:
    try:
        fcntl.flock(fd, op)
    except BlockingIOError:
        return False
    return True
