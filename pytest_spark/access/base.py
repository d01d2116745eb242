"""Command results and the errors that tell "node unreachable" from "command failed"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class CommandResult:
    """One remote command's outcome."""

    node: str
    command: str
    rc: int
    stdout: str
    stderr: str
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def evidence(self, limit: int = 4000) -> str:
        """The command and its output, for a report."""
        text = f"$ {self.command}\n(exit {self.rc})\n{self.stdout}"
        if self.stderr.strip():
            text += f"\n--- stderr ---\n{self.stderr}"
        return text if len(text) <= limit else text[: limit - 20] + "\n... (truncated)"


class RemoteError(Exception):
    """Base of every error raised by node access."""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"{node}: {message}")
        self.node = node


class NodeUnreachable(RemoteError):
    """Cannot connect or authenticate: the node itself, not a check, is the problem."""


class HostKeyError(NodeUnreachable):
    """The node's host key is unknown or changed: never silently accepted."""


class CommandTimeout(RemoteError):
    """A remote command outlived its timeout; the channel was closed."""

    def __init__(self, node: str, command: str, timeout: float, partial: str = "") -> None:
        super().__init__(node, f"command timed out after {timeout:g} s: {command}")
        self.command, self.timeout, self.partial = command, timeout, partial


class CommandFailed(RemoteError):
    """A command that had to succeed exited non-zero."""

    def __init__(self, result: CommandResult) -> None:
        first = (result.stderr.strip() or result.stdout.strip()).splitlines()[:3]
        super().__init__(result.node, f"`{result.command}` exited {result.rc}: {' | '.join(first)}")
        self.result = result


class Runner(Protocol):
    """What checks need from a node: run a command, get a result."""

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult: ...
