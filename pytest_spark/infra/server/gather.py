"""The server's command line, read from the serving container on the head in one round
trip (:func:`pytest_spark.infra.servecmd.probe`)."""

from __future__ import annotations

from pytest_spark.access.cluster import Node
from pytest_spark.infra.servecmd import ServerCommand, parse_probe, probe

__all__ = ["read_server_command"]


def read_server_command(
    head: Node, container: str, serve_args: str | None, serve_log: str | None = None
) -> ServerCommand | None:
    """What the server on ``head`` was started with, or None when nothing says
    (``serve_log``: where vLLM's output is inside the container, when not docker logs)."""
    result = head.run(probe(container, serve_log), timeout=30)
    return parse_probe(result.stdout, serve_args)
