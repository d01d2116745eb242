"""A node connection that answers each command from a function, recording what it was
asked (the launchers' tests: launch-cluster.sh's and sparkrun's), and the settings a host
probe's command reads (the round trip's tests)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

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


def probe_settings(container: str = "vllm_node") -> Any:
    """The settings the host probes' commands read (``Settings`` has more): the serving
    container and no image, model directory, serve args or recipe."""
    return SimpleNamespace(
        container=container,
        image=None,
        model_dir=None,
        serve_args=None,
        recipe=None,
        source=lambda attr: "default",
    )
