"""One-round-trip memory probe of a node, and the facts parsed from its output.

``memory_probe_command()`` is one ``sh -c`` command printing marker-framed sections (the
link probe's framing, :func:`pytest_spark.infra.probe.probe_script`)::

    meminfo   cat /proc/meminfo
    procs     the largest processes by resident size: PID, VmRSS (kB), Name and the
              command line, read from /proc/PID/status and /proc/PID/cmdline (one cat
              of every status file into one awk, then the command line of the largest
              only). A process that exits between the glob and the read is skipped:
              ``cat`` goes on past a file gone, where ``mawk`` (Debian's and Ubuntu's
              awk) given the files stops at the first it cannot open, and the listing
              lost every process after it, the holder too (a flake of the sim tier)
    gpu_mem   nvidia-smi --query-compute-apps=pid,process_name,used_memory (GB10 may
              print [N/A] for used_memory: unified memory)

The parsers are in :mod:`pytest_spark.infra.memory.parse`. Nothing here reads nvidia-smi's
device memory fields: on GB10 they are ``[N/A]``, the pool is ``/proc/meminfo``'s.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.hostprobe import HostProbe
from pytest_spark.infra.memory.parse import (
    ComputeAppMemory,
    ContainerMemory,
    MemInfo,
    ProcessMemory,
    parse_compute_app_memory,
    parse_meminfo,
    parse_process_memory,
)
from pytest_spark.infra.probe import ProbeSection, probe_script, split_probe
from pytest_spark.infra.servecmd import MARK as SERVER_MARK
from pytest_spark.infra.servecmd import parse_probe as parse_server_probe
from pytest_spark.infra.servecmd import probe as server_probe
from pytest_spark.infra.servecmd import probe_parts

__all__ = [
    "HOST_PROBE",
    "MARKER",
    "TOP_PROCESSES",
    "NodeMemory",
    "memory_probe_command",
    "parse_memory_probe",
]

MARKER = "@@pytest-spark-memory@@"
TOP_PROCESSES = 12  # listed with their command lines; the check names the few it needs

_BODY = r"""
s meminfo cat /proc/meminfo
s procs sh -c 'tab=$(printf "\t")
  cat "$2"/[0-9]*/status 2>/dev/null |
  awk -v OFS="$tab" "/^Name:/ { n = substr(\$0, 7); gsub(/^[ \t]+/, \"\", n); p = \"\" }
    /^Pid:/ { p = \$2 }
    /^VmRSS:/ && p != \"\" { print p, \$2, n }" |
  sort -t "$tab" -k2,2nr | head -n "$1" |
  while IFS="$tab" read -r pid rss name; do
    args=$(tr "\000\t\n" "   " <"$2/$pid/cmdline" 2>/dev/null)
    printf "%s\t%s\t%s\t%s\n" "$pid" "$rss" "$name" "$args"
  done' _ @TOP@ @PROC@
s gpu_mem nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
rm -f "$t"
"""


def memory_probe_command(top: int = TOP_PROCESSES, timeout_s: int = 20, proc: str = "/proc") -> str:
    """The node probe as one ``sh -c`` command (run it once per node); ``proc``: where the
    proc filesystem is mounted."""
    if top <= 0:
        raise ValueError(f"top must be positive, got {top}")
    body = _BODY.replace("@TOP@", str(int(top))).replace("@PROC@", shlex.quote(proc))
    return probe_script(MARKER, "memory", timeout_s, body)


@dataclass(frozen=True)
class NodeMemory:
    """A node's memory: ``meminfo`` (None with ``meminfo_error`` when it cannot be read),
    the largest processes by resident size, and the GPU compute apps (None with
    ``apps_error`` when nvidia-smi did not answer)."""

    hostname: str | None
    meminfo: MemInfo | None
    meminfo_error: str | None
    processes: tuple[ProcessMemory, ...]
    apps: tuple[ComputeAppMemory, ...] | None
    apps_error: str | None = None


def _why(section: ProbeSection | None, what: str) -> str:
    if section is None:
        return f"{what} was not probed"
    if section.missing:
        return f"{what}: command not found"
    text = (section.stderr.strip() or section.stdout.strip()).splitlines()
    return f"{what}: {text[0].strip() if text else f'exit {section.rc}'}"


def parse_memory_probe(text: str) -> NodeMemory:
    """Parse :func:`memory_probe_command` output."""
    hostname, sections = split_probe(text, MARKER, "memory probe")
    meminfo = meminfo_error = None
    section = sections.get("meminfo")
    if section is not None and section.rc == 0:
        try:
            meminfo = parse_meminfo(section.stdout)
        except ParseError as exc:
            meminfo_error = str(exc)
    else:
        meminfo_error = _why(section, "cat /proc/meminfo")
    procs = sections.get("procs")
    processes = tuple(parse_process_memory(procs.stdout)) if procs is not None else ()
    gpu = sections.get("gpu_mem")
    apps: tuple[ComputeAppMemory, ...] | None = None
    apps_error = None
    if gpu is not None and gpu.rc == 0:
        apps = tuple(parse_compute_app_memory(gpu.stdout))
    else:
        apps_error = _why(gpu, "nvidia-smi --query-compute-apps")
    return NodeMemory(hostname, meminfo, meminfo_error, processes, apps, apps_error)


# The memory probe rides the node's one host round trip (infra.roundtrip).
HOST_PROBE: HostProbe[NodeMemory] = HostProbe(
    key="memory",
    command=lambda settings, container: memory_probe_command(),
    parse=lambda text, settings: parse_memory_probe(text),
)


NO_LIMIT = 2**62  # cgroup v1 prints ~2^63 for "no limit"; v2 prints "max"


def container_limit_probe(container: str) -> str:
    """One command: the serving container's processes and command (the server topic's
    probe: its ``vllm serve`` line), its ``HostConfig.Memory`` (docker inspect; 0: no
    limit) and the limit the kernel holds it to, from inside (cgroup v2 ``memory.max``,
    else v1 ``memory.limit_in_bytes``)."""
    c = shlex.quote(container)
    return (
        f"{server_probe(container)}; echo '{SERVER_MARK}limit'; "
        f"docker inspect -f '{{{{.HostConfig.Memory}}}}' {c} 2>&1; echo '{SERVER_MARK}cgroup'; "
        f"docker exec {c} sh -c 'cat /sys/fs/cgroup/memory.max 2>/dev/null || "
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes' 2>&1"
    )


def _limit(text: str) -> int | None:
    word = text.strip().split("\n")[0].strip()
    if not word.isdigit():
        return None
    value = int(word)
    return value if 0 < value < NO_LIMIT else None


def parse_container_limit(node: str, text: str) -> ContainerMemory:
    """:func:`container_limit_probe` output: the limit (the kernel's, else docker's) and
    the rank's ``vllm serve`` line (None when the container runs none)."""
    parts = probe_parts(text)
    cgroup, inspect = _limit(parts.get("cgroup", "")), _limit(parts.get("limit", ""))
    limit: int | None = cgroup if cgroup is not None else inspect
    source = (
        "the container's cgroup memory limit, read inside it"
        if cgroup is not None
        else "docker inspect HostConfig.Memory"
    )
    found = parse_server_probe(text, None)
    line = (
        found.line if found is not None and found.source != "vLLM's non-default args line" else None
    )
    return ContainerMemory(node, limit, source, line)
