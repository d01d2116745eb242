"""Access to the nodes: SSH command execution behind a small interface."""

from pytest_spark.remote.base import (
    CommandFailed,
    CommandResult,
    CommandTimeout,
    HostKeyError,
    NodeUnreachable,
    RemoteError,
)

__all__ = [
    "CommandFailed",
    "CommandResult",
    "CommandTimeout",
    "HostKeyError",
    "NodeUnreachable",
    "RemoteError",
]
