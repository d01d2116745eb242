"""The ``contacts`` fixture: every connection, name lookup or process a pytester run
attempts, each refused (a local ``git`` aside: the report reads the checkout's commit), for
tests that hold the plugin to contacting nothing (issue #36: --spark-show-profile and the
setting mistakes). Timing-free: an attempt is recorded whether or not anything would have
answered it."""

from __future__ import annotations

import socket
import subprocess
from typing import Any

import pytest

CLEARED = ("SPARK_HEAD", "SPARK_API_URL", "SPARK_SIM", "SPARK_THRESHOLD", "PYTEST_ADDOPTS")


@pytest.fixture
def contacts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []

    def refuse(what: str) -> Any:
        def attempt(*args: Any, **kwargs: Any) -> Any:
            seen.append(f"{what} {args[1:] if what.startswith('socket.') else args}")
            raise OSError(f"{what}: no contact allowed in this test")

        return attempt

    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("socket.connect_ex"))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    spawn, refused = subprocess.Popen.__init__, refuse("spawn")

    def popen(self: subprocess.Popen[Any], argv: Any, *args: Any, **kwargs: Any) -> None:
        program = str(argv[0] if isinstance(argv, list | tuple) else argv).split()[0]
        if program.rpartition("/")[2] == "git":  # the report reads the checkout's commit
            spawn(self, argv, *args, **kwargs)
            return
        refused(self, argv)

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    return seen
