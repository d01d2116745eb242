"""One-round-trip probe of a node's open-file limits, and the facts parsed from it.

``fdlimit_probe_command()`` is one ``sh -c`` command printing marker-framed sections
(:func:`pytest_spark.infra.probe.probe_script`)::

    dockerd   the oldest process named ``dockerd`` (``pgrep -o -x dockerd``): ``pid N``,
              then its ``/proc/N/limits`` (mode 0444: readable by the SSH user, root
              or not). Exit 3 with ``no dockerd process`` on stderr when none runs.
    container the serving container's main process (``docker inspect -f
              '{{.State.Pid}}' NAME``, when it runs): ``pid N``, then its
              ``/proc/N/limits``: what ``--ulimit`` (or dockerd) gave it
    file_max  cat /proc/sys/fs/file-max (the kernel's file handles, system-wide)
    nr_open   cat /proc/sys/fs/nr_open (the ceiling of any process's RLIMIT_NOFILE)

The parsers are in :mod:`pytest_spark.infra.fdlimit.parse`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.fdlimit.parse import OpenFiles, parse_open_files, parse_proc_int
from pytest_spark.infra.hostprobe import HostProbe
from pytest_spark.infra.probe import ProbeSection, probe_script, split_probe

__all__ = [
    "HOST_PROBE",
    "MARKER",
    "NO_PROCESS_RC",
    "NodeFdLimits",
    "fdlimit_probe_command",
    "parse_fdlimit_probe",
]

MARKER = "@@pytest-spark-fdlimit@@"
NO_PROCESS_RC = 3

_BODY = r"""
s dockerd sh -c 'command -v pgrep >/dev/null || { echo "pgrep: command not found" >&2; exit 127; }
  p=$(pgrep -o -x dockerd) || { echo "no dockerd process" >&2; exit @RC@; }
  echo "pid $p"; cat "/proc/$p/limits"'
s container sh -c 'p=$(docker inspect --type container -f "{{.State.Pid}}" "$1" 2>/dev/null)
  case "$p" in ""|0) echo "not running" >&2; exit @RC@;; esac
  echo "pid $p"; cat "/proc/$p/limits"' _ @CONTAINER@
s file_max cat /proc/sys/fs/file-max
s nr_open cat /proc/sys/fs/nr_open
rm -f "$t"
"""


def fdlimit_probe_command(*, container: str, timeout_s: int = 10) -> str:
    """The node probe as one ``sh -c`` command (run it once per node); ``container``: the
    serving container's name."""
    body = _BODY.replace("@RC@", str(NO_PROCESS_RC)).replace("@CONTAINER@", shlex.quote(container))
    return probe_script(MARKER, "fdlimit", timeout_s, body)


@dataclass(frozen=True)
class NodeFdLimits:
    """A node's Docker engine's RLIMIT_NOFILE (None with ``dockerd_error`` when it cannot
    be read; ``dockerd_running`` False when no dockerd process runs), the serving
    container's (None when it does not run or cannot be read) and the kernel's ceilings
    (None where unreadable)."""

    hostname: str | None
    dockerd_pid: int | None
    dockerd: OpenFiles | None
    dockerd_error: str | None
    dockerd_running: bool
    container_pid: int | None
    container: OpenFiles | None
    file_max: int | None
    nr_open: int | None


def _int(section: ProbeSection | None, what: str) -> int | None:
    if section is None or section.rc != 0:
        return None
    try:
        return parse_proc_int(section.stdout, what)
    except ParseError:
        return None


def _process_limits(section: ProbeSection | None) -> tuple[int | None, OpenFiles]:
    """``pid N`` then ``/proc/N/limits``, from a section that exited 0."""
    assert section is not None
    first, _, rest = section.stdout.strip().partition("\n")
    pid = int(first[4:]) if first.startswith("pid ") and first[4:].strip().isdigit() else None
    return pid, parse_open_files(rest)


def parse_fdlimit_probe(text: str) -> NodeFdLimits:
    """Parse :func:`fdlimit_probe_command` output."""
    hostname, sections = split_probe(text, MARKER, "fdlimit probe")
    section = sections.get("dockerd")
    pid = limits = error = None
    running = section is None or section.rc != NO_PROCESS_RC
    if section is not None and section.rc == 0:
        try:
            pid, limits = _process_limits(section)
        except ParseError as exc:
            error = str(exc)
    else:
        problem = section.problem() if section is not None else "dockerd: not probed"
        error = problem or "dockerd: no output"
    serving = sections.get("container")
    container_pid = container = None
    if serving is not None and serving.rc == 0:
        try:
            container_pid, container = _process_limits(serving)
        except ParseError:
            container_pid = container = None
    return NodeFdLimits(
        hostname,
        pid,
        limits,
        error,
        running,
        container_pid,
        container,
        _int(sections.get("file_max"), "/proc/sys/fs/file-max"),
        _int(sections.get("nr_open"), "/proc/sys/fs/nr_open"),
    )


# The open-file limits probe rides the node's one host round trip (infra.roundtrip), with
# the node's own serving container.
HOST_PROBE: HostProbe[NodeFdLimits] = HostProbe(
    key="fdlimit",
    command=lambda settings, container: fdlimit_probe_command(container=container),
    parse=lambda text, settings: parse_fdlimit_probe(text),
)
