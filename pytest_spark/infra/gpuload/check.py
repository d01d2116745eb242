"""The SM clock under the pre-serving GPU load (preflight, launch mode).

Pure: the node's samples (:class:`~pytest_spark.infra.gpuload.probe.NodeLoad`), the other
nodes' busy clocks and the profile's ``[gpu_health]`` in, a :class:`Finding` out.

The rule. A sample is *busy* when the GPU's utilisation is at least
``gpu_health.busy_util_pct``. The node's clock under load is the median SM clock of its
busy samples (one late or early sample does not decide). It fails below
``gpu_health.min_busy_sm_clock_mhz`` (1400 MHz: hoesing/spark-gpu-throttle-check's
threshold; a busy GB10 runs 2424-2483 MHz, the USB-PD low-power state 481-858 MHz with no
reason set, cleared only by a power cycle: model-serving-minefield trap 124). A node that
passes but runs below ``gpu_health.peer_clock_ratio`` of the fastest node's clock warns:
the Sparks are the same machine under the same load, and eugr's firmware note lowers one
unit's clock on purpose (``sudo nvidia-smi -lgc 200,2150``: 2150 of the default 2411 MHz,
89 %), so a peer gap is a hint, not a fault. No busy sample at all warns: the load did not
reach the GPU (its program says what it ran on).
"""

from __future__ import annotations

from statistics import median

from pytest_spark.infra.finding import Finding
from pytest_spark.infra.gpuload.parse import GpuSample
from pytest_spark.infra.gpuload.probe import NodeLoad
from pytest_spark.infra.kernellog import POWER_CYCLE
from pytest_spark.settings.sections import GpuHealthSection

__all__ = ["LOAD_VERDICT", "behind_peer", "busy_clock", "check_gpu_clock_under_load"]

LOAD_VERDICT = "test_gpu_clock_under_load"


def _busy(load: NodeLoad, section: GpuHealthSection) -> list[GpuSample]:
    return [
        s
        for s in load.samples
        if s.util_pct is not None
        and s.util_pct >= section.busy_util_pct
        and s.sm_clock_mhz is not None
    ]


def busy_clock(load: NodeLoad, section: GpuHealthSection) -> float | None:
    """The median SM clock of the node's busy samples, or None without one."""
    busy = _busy(load, section)
    return median(s.sm_clock_mhz for s in busy if s.sm_clock_mhz is not None) if busy else None


def _span(values: list[float | None], unit: str) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "N/A"
    low, high = min(known), max(known)
    return f"{low:g} {unit}" if low == high else f"{low:g}-{high:g} {unit}"


def _readings(samples: list[GpuSample]) -> str:
    return (
        f"power {_span([s.power_w for s in samples], 'W')}, "
        f"temperature {_span([s.temperature_c for s in samples], 'C')}, "
        f"utilisation {_span([s.util_pct for s in samples], '%')}, "
        f"P-state {'/'.join(sorted({s.pstate for s in samples if s.pstate})) or 'N/A'}"
    )


def _ran(load: NodeLoad) -> str:
    s = load.summary
    if s is None:
        return "the load program's summary is missing"
    where = "the serving image" if s.where != "host" else "the host's python3"
    text = f"{s.seconds:g} s on {s.device} ({where}, {s.work} units of work)"
    return text + (f"; {s.why}" if s.why else "")


def behind_peer(
    clock: float, peers: dict[str, float | None], ratio: float
) -> tuple[str, float] | None:
    """The fastest node and its busy clock when ``clock`` is below ``ratio`` of it (the
    peer comparison's verdict); None when it is not, or no node's clock is known."""
    known = {name: c for name, c in peers.items() if c is not None}
    if not known:
        return None
    fastest = max(known, key=lambda n: known[n])
    return (fastest, known[fastest]) if clock < ratio * known[fastest] else None


def _never_busy_text(node: str, load: NodeLoad, section: GpuHealthSection, expected: str) -> str:
    top = _span([s.util_pct for s in load.samples], "%")
    return (
        f"{node}: the GPU never reached {section.busy_util_pct:g} % utilisation under "
        f"the pre-serving load (utilisation {top} over {len(load.samples)} samples; "
        f"load: {_ran(load)}), so its clock under load is unknown; expected the SM "
        f"clock {expected}. The load did not reach the GPU: check the serving image "
        "has torch with CUDA (`docker run --rm --gpus all IMAGE python3 -c 'import "
        "torch; print(torch.cuda.is_available())'`)"
    )


def _seen_text(clock: float, busy: list[GpuSample], load: NodeLoad) -> str:
    """What the node's GPU did under the load: the median busy clock, its span and the
    readings beside it, and what the load ran."""
    clocks = _span([s.sm_clock_mhz for s in busy], "MHz")
    max_clock = _span([s.max_sm_clock_mhz for s in busy], "MHz")
    return (
        f"median SM clock {clock:g} MHz over {len(busy)} busy samples ({clocks}, max clock "
        f"{max_clock}), {_readings(busy)}; load: {_ran(load)}"
    )


def check_gpu_clock_under_load(
    node: str, load: NodeLoad, peers: dict[str, float | None], section: GpuHealthSection
) -> Finding:
    """The node's SM clock while the load ran (see the module docstring for the rule);
    ``peers``: every node's busy clock (:func:`busy_clock`), this one's included."""
    floor = section.min_busy_sm_clock_mhz
    expected = f">= {floor:g} MHz while busy"
    evidence = {"nvidia-smi samples": load.raw}
    if not load.samples:
        return Finding.warned(
            "not readable",
            expected,
            node=node,
            message=(
                f"{node}: no GPU readings under the pre-serving load ({load.error}); "
                f"expected the SM clock {expected}. Run `nvidia-smi --query-gpu=clocks.sm,"
                "utilization.gpu --format=csv` on the node while a load runs"
            ),
            evidence=evidence,
        )
    busy = _busy(load, section)
    if not busy:
        message = _never_busy_text(node, load, section, expected)
        return Finding.warned("never busy", expected, node=node, message=message, evidence=evidence)
    clock = busy_clock(load, section)
    assert clock is not None
    seen = _seen_text(clock, busy, load)
    if clock < floor:
        return Finding.failed(
            clock,
            expected,
            "MHz",
            node=node,
            message=(
                f"{node}: GPU clock-locked below expectation under the pre-serving load: "
                f"{seen}; expected {expected} (profile gpu_health.min_busy_sm_clock_mhz; a "
                "busy GB10 runs ~2400 MHz). No clocks event reason explains it: the GB10 "
                "low-power state, which a model load would meet only after it loaded. "
                f"Fix: {POWER_CYCLE}"
            ),
            evidence=evidence,
        )
    gap = behind_peer(clock, peers, section.peer_clock_ratio)
    if gap is not None:
        fastest, top = gap
        return Finding.warned(
            clock,
            f">= {section.peer_clock_ratio:g} x {fastest}'s {top:g} MHz",
            "MHz",
            node=node,
            message=(
                f"{node}: SM clock under the pre-serving load {clock:g} MHz, below "
                f"{section.peer_clock_ratio:g} x {fastest}'s {top:g} MHz under the "
                f"same load ({seen}). A unit locked on purpose (`nvidia-smi -lgc`, eugr's "
                "firmware note: 2150 MHz) explains it; else check its cooling and power "
                "(`nvidia-smi -q -d PERFORMANCE` while a load runs)"
            ),
            evidence=evidence,
        )
    others = ", ".join(f"{n} {c:g} MHz" for n, c in peers.items() if c is not None and n != node)
    return Finding.passed(
        clock,
        expected,
        "MHz",
        node=node,
        message=f"{node}: {seen}" + (f"; peers: {others}" if others else ""),
    )
