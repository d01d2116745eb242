"""A node connection that answers each command from a function, recording what it was
asked (the launchers' tests: launch-cluster.sh's and sparkrun's)."""

from __future__ import annotations

from collections.abc import Callable

from pytest_spark.access.base import CommandResult


class FakeConn:
    def __init__(self, name: str, answer: Callable[[str], tuple[int, str, str]]) -> None:
        self.name, self.answer = name, answer
        self.commands: list[str] = []

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        self.commands.append(command)
        rc, out, err = self.answer(command)
        return CommandResult(self.name, command, rc, out, err)

    def close(self) -> None:
        pass
