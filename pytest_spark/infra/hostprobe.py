"""A topic's declaration of one probe of a node (:class:`HostProbe`): the key its facts are
cached under, the command the node runs, the parser of its output, the name messages give
it, and whether it rides the node's shared host round trip.

A topic declares its probes in its own ``probe`` module, as module-level values::

    HOST_PROBE: HostProbe[NodeMemory] = HostProbe(
        key="memory",
        command=lambda settings, container: memory_probe_command(),
        parse=lambda text, settings: parse_memory_probe(text),
    )

and its gatherer reads them with :func:`pytest_spark.infra.roundtrip.gather_probe`, which
collects every topic's declarations (no topic is named there) and runs the shared ones as
one command per node. Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from pytest_spark.settings.resolve import Settings

__all__ = ["HostProbe"]

T = TypeVar("T")


@dataclass(frozen=True, eq=False)  # compared by identity: the declaration is the probe
class HostProbe(Generic[T]):
    """One probe of a node, declared by its topic.

    ``key``: its facts are cached per node under ``(f"{key}-facts", node)``; unique across
    topics. ``command(settings, container)``: the ``sh -c`` command a node runs, where
    ``container`` is that node's serving container (``Cluster.container(node)``: a
    sparkrun job's rank container differs per node). ``parse(text, settings)``: the facts
    from the command's output (the whole round trip's output when shared: each parser
    reads its own marker's sections), raising ``ParseError`` on text it cannot read.
    ``what``: the probe's name in a message (default ``key``). ``shared``: it rides the
    node's one host round trip beside the other shared probes; False for a probe that
    runs alone (a slow one, or one read at its own moment), with ``timeout_s``."""

    key: str
    command: Callable[[Settings, str], str]
    parse: Callable[[str, Settings], T]
    what: str = ""
    shared: bool = True
    timeout_s: float = 120.0

    @property
    def name(self) -> str:
        """The probe's name in a message."""
        return self.what or self.key
