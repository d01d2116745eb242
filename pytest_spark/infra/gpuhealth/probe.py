"""GPU health facts of a node: its probe (riding the node's one host round trip, beside
the preflight probe: :data:`HOST_PROBE`) and the facts parsed from its sections.

:func:`gpuhealth_probe_command` frames :data:`PROBE_BODY` (``s NAME CMD`` sections of
:func:`pytest_spark.infra.probe.probe_script`) with its own marker:

- ``gpu_query``: ``nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits``
  (temperature, SM clock and its maximum, power draw and limit, utilisation, P-state,
  persistence mode, the clocks event reasons bitmask); drivers before 535 know the
  bitmask as ``clocks_throttle_reasons.active``, asked for when the first query fails;
- ``gpu_q``: ``nvidia-smi -q -d PERFORMANCE,TEMPERATURE``: the clocks event reasons by
  name and the GPU's own slowdown and shutdown temperatures where it reports them;
- ``kernel_log``: the kernel log since boot, ``journalctl -k -b`` when it can be read
  (a user outside the adm / systemd-journal groups gets no kernel lines), else
  ``dmesg`` (refused to a non-root user under ``kernel.dmesg_restrict=1``). It prints
  ``source NAME lines N`` and the NVRM / Xid and PCIe AER lines only (the last 400;
  the AER lines are :mod:`pytest_spark.infra.kernel`'s); why a source could not be read
  goes to stderr, one ``refused NAME: WHY`` line each.

Nothing here fails on ``[N/A]``: a GB10 reports its power limit (and memory) that way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.gpuhealth.parse import (
    QUERY_FIELDS,
    parse_smi_q,
    reasons_from_mask,
    reasons_from_q,
)
from pytest_spark.infra.hostprobe import HostProbe
from pytest_spark.infra.kernellog import KernelLog, kernel_log_of
from pytest_spark.infra.probe import ProbeSection, probe_script, split_probe
from pytest_spark.infra.smi import QueryRow, parse_query_gpu, to_float

__all__ = [
    "HOST_PROBE",
    "MARKER",
    "PROBE_BODY",
    "GpuHealth",
    "GpuReading",
    "gpuhealth_probe_command",
    "parse_gpu_health",
    "parse_gpuhealth_probe",
]

MARKER = "@@pytest-spark-gpuhealth@@"

_OLD_FIELDS = ",".join(QUERY_FIELDS).replace("clocks_event_reasons", "clocks_throttle_reasons")

PROBE_BODY = r"""
s gpu_query sh -c 'nvidia-smi --query-gpu=@FIELDS@ --format=csv,noheader,nounits 2>/dev/null ||
  nvidia-smi --query-gpu=@OLDFIELDS@ --format=csv,noheader,nounits'
s gpu_q nvidia-smi -q -d PERFORMANCE,TEMPERATURE
s kernel_log sh -c 'if command -v journalctl >/dev/null 2>&1; then
    out=$(journalctl -k -b --no-pager -o short-iso 2>&1); rc=$?
    n=$(printf "%s\n" "$out" | grep -c " kernel: ")
    if [ "$rc" -eq 0 ] && [ "$n" -gt 0 ]; then
      echo "source journalctl lines $n"
      printf "%s\n" "$out" | grep -E "NVRM|Xid|AER:|PCIe Bus Error" | tail -n 400
      exit 0
    fi
    why=$(printf "%s\n" "$out" | grep -v "^ " | grep -v "^Hint" | grep . | tail -n 1)
    echo "refused journalctl: exit $rc, $n kernel lines${why:+: $why}" >&2
  else
    echo "refused journalctl: command not found" >&2
  fi
  out=$(dmesg 2>&1); rc=$?
  if [ "$rc" -eq 0 ] && [ -n "$out" ]; then
    echo "source dmesg lines $(printf "%s\n" "$out" | grep -c .)"
    printf "%s\n" "$out" | grep -E "NVRM|Xid|AER:|PCIe Bus Error" | tail -n 400
    exit 0
  fi
  echo "refused dmesg: exit $rc${out:+: $(printf "%s\n" "$out" | tail -n 1)}" >&2
  exit 1'
rm -f "$t"
""".replace("@FIELDS@", ",".join(QUERY_FIELDS)).replace("@OLDFIELDS@", _OLD_FIELDS)


def gpuhealth_probe_command(*, timeout_s: int = 20) -> str:
    """The node probe as one ``sh -c`` command (run it once per node)."""
    return probe_script(MARKER, "gpuhealth", timeout_s, PROBE_BODY)


@dataclass(frozen=True)
class GpuReading:
    """One GPU's health readings; a value is None where the GPU reports N/A (``unread``
    lists those by the name a person reads)."""

    index: int | None
    bus_id: str | None
    temperature_c: float | None
    sm_clock_mhz: float | None
    max_sm_clock_mhz: float | None
    power_w: float | None
    power_limit_w: float | None
    util_pct: float | None
    pstate: str | None
    persistence: bool | None  # Enabled / Disabled; None for N/A
    reasons: dict[str, bool] | None  # clocks event reason -> active; None: not readable
    slowdown_temp_c: float | None = None  # nvidia-smi -q "GPU Slowdown Temp"
    shutdown_temp_c: float | None = None
    unread: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"GPU {self.index if self.index is not None else '?'}"

    def active(self) -> list[str]:
        return sorted(r for r, on in (self.reasons or {}).items() if on)


@dataclass(frozen=True)
class GpuHealth:
    """``error`` says why nvidia-smi gave no readings (None when it answered)."""

    gpus: tuple[GpuReading, ...]
    error: str | None
    kernel: KernelLog
    query_error: str | None = None  # the -q half, when only it failed
    raw: dict[str, str] = field(default_factory=dict)  # section -> stdout, for evidence


def _problem(section: ProbeSection | None, what: str) -> str:
    if section is None:
        return f"{what} was not probed"
    text = (section.stdout + "\n" + section.stderr).strip()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if section.missing:
        return "nvidia-smi: command not found"
    return f"{what}: exit {section.rc}" + (f": {first}" if first else "")


def _persistence(text: str | None) -> bool | None:
    if text is None:
        return None
    low = text.strip().lower()
    return True if low == "enabled" else False if low == "disabled" else None


_LABELS = {
    "temperature.gpu": "temperature",
    "clocks.sm": "SM clock",
    "clocks.max.sm": "max SM clock",
    "power.draw": "power draw",
    "power.limit": "power limit",
    "utilization.gpu": "utilisation",
    "pstate": "P-state",
    "persistence_mode": "persistence mode",
    "clocks_event_reasons.active": "clocks event reasons",
}


def _reading(row: QueryRow, q: dict[str, str] | None) -> GpuReading:
    index = row.number("index")
    reasons = reasons_from_q(q) if q else None
    if reasons is None:
        reasons = reasons_from_mask(row.text("clocks_event_reasons.active"))
    temp = row.number("temperature.gpu")
    if temp is None and q:
        temp = to_float(q.get("Temperature/GPU Current Temp"))
    unread = [label for f, label in _LABELS.items() if row.text(f) is None]
    if reasons is not None and "clocks event reasons" in unread:
        unread.remove("clocks event reasons")  # read from -q instead
    if temp is not None and "temperature" in unread:
        unread.remove("temperature")
    return GpuReading(
        index=int(index) if index is not None else None,
        bus_id=row.text("pci.bus_id"),
        temperature_c=temp,
        sm_clock_mhz=row.number("clocks.sm"),
        max_sm_clock_mhz=row.number("clocks.max.sm"),
        power_w=row.number("power.draw"),
        power_limit_w=row.number("power.limit"),
        util_pct=row.number("utilization.gpu"),
        pstate=row.text("pstate"),
        persistence=_persistence(row.text("persistence_mode")),
        reasons=reasons,
        slowdown_temp_c=to_float(q.get("Temperature/GPU Slowdown Temp")) if q else None,
        shutdown_temp_c=to_float(q.get("Temperature/GPU Shutdown Temp")) if q else None,
        unread=tuple(unread),
    )


def parse_gpu_health(sections: dict[str, ProbeSection]) -> GpuHealth:
    """The facts from the probe's ``gpu_query``, ``gpu_q`` and ``kernel_log`` sections."""
    kernel = kernel_log_of(sections.get("kernel_log"))
    query = sections.get("gpu_query")
    raw = {n: s.stdout for n in ("gpu_query", "gpu_q") if (s := sections.get(n)) is not None}
    if query is None or query.rc != 0:
        return GpuHealth((), _problem(query, "nvidia-smi --query-gpu"), kernel, raw=raw)
    try:
        rows = parse_query_gpu(query.stdout, QUERY_FIELDS)
    except ParseError as exc:
        return GpuHealth((), str(exc), kernel, raw=raw)
    q_section = sections.get("gpu_q")
    q_gpus: list[dict[str, str]] = []
    q_error = None
    if q_section is not None and q_section.rc == 0:
        q_gpus = parse_smi_q(q_section.stdout)
    else:
        q_error = _problem(q_section, "nvidia-smi -q")
    by_bus = {g.get("Bus Id", "").upper(): g for g in q_gpus}
    readings = []
    for i, row in enumerate(rows):
        bus = (row.text("pci.bus_id") or "").upper()
        q = by_bus.get(bus) or (q_gpus[i] if i < len(q_gpus) else None)
        readings.append(_reading(row, q))
    return GpuHealth(tuple(readings), None, kernel, q_error, raw)


def parse_gpuhealth_probe(text: str) -> GpuHealth:
    """Parse :func:`gpuhealth_probe_command` output."""
    _, sections = split_probe(text, MARKER, "GPU health probe")
    return parse_gpu_health(sections)


# The GPU health probe rides the node's one host round trip (infra.roundtrip).
HOST_PROBE: HostProbe[GpuHealth] = HostProbe(
    key="gpuhealth",
    command=lambda settings, container: gpuhealth_probe_command(),
    parse=lambda text, settings: parse_gpuhealth_probe(text),
    what="GPU health",
)
