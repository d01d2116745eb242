"""Access to the nodes: SSH command execution (``base``, ``ssh``, ``retry``, ``tunnel``,
``testinfra``), the Cluster/Node model (``cluster``), the served API endpoint (``api``) and
the driver of the ``spark-sim`` CLI (``simcontrol``, which never imports sparksim), and the
local files the suite's processes share (``files``: atomic JSON writes).

May import: settings.
"""

from pytest_spark.access.base import (
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
