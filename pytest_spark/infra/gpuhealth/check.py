"""GPU health checks (preflight): temperature, clocks event reasons with the clocks and
power beside them, persistence mode, and the kernel log's Xid / NVRM errors since boot.

Pure: facts (:mod:`pytest_spark.infra.gpuhealth.probe`) and the profile's ``[gpu_health]`` in,
a :class:`Finding` (or a :class:`Skip` citing the check that owns the cause) out. A field
the GPU reports as N/A (GB10 does for several) never fails: the finding warns and says
what could not be read.
"""

from __future__ import annotations

from collections import Counter

from pytest_spark.infra.finding import Finding, Skip
from pytest_spark.infra.gpuhealth.probe import GpuHealth, GpuReading
from pytest_spark.infra.kernellog import (
    NO_MEMORY_FIX,
    POWER_CYCLE,
    XID_CATALOG,
    KernelEvent,
    KernelLog,
    no_memory_burst,
    no_memory_text,
)
from pytest_spark.settings.sections import GpuHealthSection

__all__ = [
    "TEMPERATURE_VERDICT",
    "check_gpu_kernel_log",
    "check_gpu_persistence",
    "check_gpu_temperature",
    "check_gpu_throttle",
    "gpu_lost_in_kernel_log",
    "throttle_problems",
]

TEMPERATURE_VERDICT = "test_gpu_temperature"
LOST_XIDS = (79,)  # the GPU is gone from the bus: nvidia-smi then finds no device
BENIGN = ("gpu_idle", "applications_clocks_setting", "sync_boost", "display_clocks_setting")
THERMAL = ("hw_thermal_slowdown", "sw_thermal_slowdown")
_COOLING = (
    "the GPU is too hot: give the Spark free airflow (vents unobstructed, not stacked on "
    "or against the other Spark), check the room temperature, let it cool before the load"
)
REASON_FIX: dict[str, str] = {
    "hw_slowdown": "HW Slowdown (clocks cut by half or more: a power brake or "
    f"over-temperature signal): {POWER_CYCLE}",
    "hw_power_brake_slowdown": "HW Power Brake Slowdown (the power supply asserts the "
    f"brake): {POWER_CYCLE}",
    "hw_thermal_slowdown": f"HW Thermal Slowdown: {_COOLING}",
    "sw_thermal_slowdown": f"SW Thermal Slowdown (the driver's thermal limit): {_COOLING}",
    "sw_power_cap": "SW Power Cap (the power limit is reached: normal under full load; at "
    "idle it points to a lowered power limit, see `nvidia-smi -q -d POWER`)",
}


def _fmt(value: float | None, unit: str) -> str:
    return "N/A" if value is None else f"{value:g} {unit}"


def _context(g: GpuReading) -> str:
    """Clocks and power beside a verdict: what a person compares the reasons with."""
    sm = (
        f"SM clock {_fmt(g.sm_clock_mhz, 'MHz')} of max {_fmt(g.max_sm_clock_mhz, 'MHz')}"
        if g.max_sm_clock_mhz is not None
        else f"SM clock {_fmt(g.sm_clock_mhz, 'MHz')}"
    )
    return (
        f"{sm}, power {_fmt(g.power_w, 'W')} (limit {_fmt(g.power_limit_w, 'W')}), "
        f"{g.pstate or 'P-state N/A'}, utilisation {_fmt(g.util_pct, '%')}"
    )


def _unread_note(gpus: tuple[GpuReading, ...]) -> str:
    unread = sorted({u for g in gpus for u in g.unread})
    return f"; not readable ([N/A]): {', '.join(unread)}" if unread else ""


def _no_readings(node: str, health: GpuHealth, what: str, expected: str) -> Finding:
    return Finding.warned(
        "not readable",
        expected,
        node=node,
        message=(
            f"{node}: {what} could not be read ({health.error or 'no GPU in the answer'}); "
            f"expected {expected}. Run `nvidia-smi -q` on the node: an older driver may not "
            "know the fields the suite asks for"
        ),
    )


def check_gpu_temperature(node: str, health: GpuHealth, section: GpuHealthSection) -> Finding:
    """Every GPU below ``max_temp_c`` (and below its own slowdown temperature where it
    reports one); a warning from ``warn_temp_c``."""
    expected = f"< {section.max_temp_c:g} C"
    if not health.gpus:
        return _no_readings(node, health, "the GPU temperature", expected)
    known = [g for g in health.gpus if g.temperature_c is not None]
    if not known:
        return Finding.warned(
            "N/A",
            expected,
            "C",
            node=node,
            message=(
                f"{node}: the GPU temperature could not be read (nvidia-smi reports [N/A] "
                f"for temperature.gpu and -q's GPU Current Temp); expected {expected}. "
                "Nothing to act on unless the GPU misbehaves; `nvidia-smi -q -d TEMPERATURE` "
                "shows what the driver reports"
            ),
        )
    hottest = max(known, key=lambda g: g.temperature_c or 0.0)
    temp = hottest.temperature_c or 0.0
    limit, whose = section.max_temp_c, "profile gpu_health.max_temp_c"
    if hottest.slowdown_temp_c is not None and hottest.slowdown_temp_c < limit:
        limit, whose = hottest.slowdown_temp_c, "the GPU's own slowdown temperature"
    where = f"{node} {hottest.name}"
    if temp >= limit:
        return Finding.failed(
            temp,
            f"< {limit:g} C",
            "C",
            node=node,
            message=(
                f"{where}: temperature {temp:g} C, expected < {limit:g} C ({whose}); "
                f"{_context(hottest)}. Fix: {_COOLING}"
            ),
        )
    if temp >= section.warn_temp_c:
        return Finding.warned(
            temp,
            f"< {section.warn_temp_c:g} C",
            "C",
            node=node,
            message=(
                f"{where}: temperature {temp:g} C, above the {section.warn_temp_c:g} C "
                f"warning level (fails at {limit:g} C); {_context(hottest)}. Check the "
                "Spark's airflow before a long load"
            ),
        )
    return Finding.passed(
        temp,
        expected,
        "C",
        node=node,
        message=f"{where}: {temp:g} C ({expected}){_unread_note(health.gpus)}",
    )


def _fails(section: GpuHealthSection, reason: str) -> bool:
    return bool(getattr(section, f"{reason}_fails", False))


def throttle_problems(
    health: GpuHealth, section: GpuHealthSection
) -> list[tuple[str, GpuReading, str]]:
    """The throttle verdict per GPU: ``(level, gpu, reason)`` for every active clocks event
    reason the profile judges (``fail`` where ``<reason>_fails``, else ``warn``; benign and
    unknown reasons left out), and ``("fail", gpu, "low-clock")`` for a GPU busy from
    ``busy_util_pct`` with its SM clock below ``min_busy_sm_clock_mhz``."""
    problems: list[tuple[str, GpuReading, str]] = []
    for g in health.gpus:
        for reason in g.active():
            if reason in BENIGN or reason not in REASON_FIX:
                continue
            level = "fail" if _fails(section, reason) else "warn"
            problems.append((level, g, reason))
        busy = g.util_pct is not None and g.util_pct >= section.busy_util_pct
        if busy and g.sm_clock_mhz is not None and g.sm_clock_mhz < section.min_busy_sm_clock_mhz:
            problems.append(("fail", g, "low-clock"))
    return problems


def _throttle_text(g: GpuReading, reason: str, section: GpuHealthSection, expected: str) -> str:
    """The throttle finding's words for one ``reason`` (or ``low-clock``) on GPU ``g``."""
    if reason == "low-clock":
        return (
            f"SM clock {_fmt(g.sm_clock_mhz, 'MHz')} while {_fmt(g.util_pct, '%')} busy, "
            f"expected >= {section.min_busy_sm_clock_mhz:g} MHz under load; "
            f"{_context(g)}. No reason explains it: the GB10 low-power state. "
            f"Fix: {POWER_CYCLE}"
        )
    return (
        f"clocks event reason {reason} active (active: {', '.join(g.active())}); expected "
        f"{expected}; {_context(g)}. {REASON_FIX[reason]}"
    )


def check_gpu_throttle(
    node: str,
    health: GpuHealth,
    section: GpuHealthSection,
    *,
    temperature_failed: bool = False,
    low_clock_owner: str | None = None,
) -> Finding | Skip:
    """No clocks event reason that the profile fails on is active, and a busy GPU runs its
    SM clock at least at ``min_busy_sm_clock_mhz`` (the GB10 low-power state caps it with
    no reason set). The clocks and power are in every message. A thermal reason while
    the temperature check failed is that check's (``temperature_failed``); a low clock
    while busy is ``low_clock_owner``'s where one is given (in launch mode the
    pre-serving load's check reads the clock under a load of its own)."""
    expected = "no slowdown reason active"
    if not health.gpus:
        return _no_readings(node, health, "the clocks event reasons", expected)
    problems = throttle_problems(health, section)
    failing = [p for p in problems if p[0] == "fail"]
    if failing and temperature_failed and all(r in THERMAL for _, _, r in failing):
        return Skip(
            f"{node}: thermal slowdown active because the GPU is too hot "
            f"({TEMPERATURE_VERDICT}[{node}] has the evidence)"
        )
    if failing and low_clock_owner and all(r == "low-clock" for _, _, r in failing):
        g = failing[0][1]
        return Skip(
            f"{node}: SM clock {_fmt(g.sm_clock_mhz, 'MHz')} while {_fmt(g.util_pct, '%')} "
            f"busy because the GPU runs below its clock under load ({low_clock_owner} has "
            "the evidence, from the pre-serving load)"
        )
    for level, g, reason in failing or problems:
        build = Finding.failed if level == "fail" else Finding.warned
        return build(
            g.sm_clock_mhz if reason == "low-clock" else reason,
            expected,
            node=node,
            message=f"{node} {g.name}: {_throttle_text(g, reason, section, expected)}",
            evidence={"nvidia-smi": health.raw.get("gpu_query", "")},
        )
    if all(g.reasons is None for g in health.gpus):
        return Finding.warned(
            "not readable",
            expected,
            node=node,
            message=(
                f"{node}: the clocks event reasons could not be read (clocks_event_reasons "
                f"[N/A] and no Clocks Event Reasons in nvidia-smi -q); expected {expected}; "
                f"{'; '.join(f'{g.name}: {_context(g)}' for g in health.gpus)}"
            ),
        )
    g = health.gpus[0]
    active = ", ".join(g.active()) or "none"
    return Finding.passed(
        "none",
        expected,
        node=node,
        message=(
            f"{node} {g.name}: active reasons: {active}; {_context(g)}{_unread_note(health.gpus)}"
        ),
    )


def check_gpu_persistence(node: str, health: GpuHealth, section: GpuHealthSection) -> Finding:
    """Persistence mode Enabled on every GPU (``require_persistence``; else a warning)."""
    expected = "Enabled"
    if not health.gpus:
        return _no_readings(node, health, "the persistence mode", expected)
    off = [g for g in health.gpus if g.persistence is False]
    if off:
        g = off[0]
        build = Finding.failed if section.require_persistence else Finding.warned
        return build(
            "Disabled",
            expected,
            node=node,
            message=(
                f"{node} {g.name}: persistence mode Disabled, expected {expected}. Without "
                "it the driver tears the GPU state down whenever no process holds the GPU "
                "(slow first CUDA init, settings lost between runs). Fix: "
                "`sudo systemctl enable --now nvidia-persistenced` (DGX OS runs it), or "
                "`sudo nvidia-smi -pm 1`"
            ),
        )
    if all(g.persistence is None for g in health.gpus):
        return Finding.warned(
            "N/A",
            expected,
            node=node,
            message=(
                f"{node}: the persistence mode could not be read (persistence_mode [N/A]); "
                f"expected {expected}. `nvidia-smi -q | grep -i persistence` shows it; "
                "`systemctl status nvidia-persistenced` whether the daemon runs"
            ),
        )
    return Finding.passed(
        "Enabled", expected, node=node, message=f"{node}: persistence mode Enabled"
    )


def _xid_text(code: int, count: int) -> str:
    info = XID_CATALOG.get(code)
    what = f" ({info.meaning})" if info else ""
    return f"{count} x Xid {code}{what}"


def _fix(events: list[KernelEvent]) -> str:
    """The fixes of the events' kinds; an Xid's catalog action covers the driver's other
    error lines beside it (they are its consequences: "GPU ... has fallen off the bus")."""
    if any(e.xid is not None for e in events):
        events = [e for e in events if e.xid is not None or e.soft]
    fixes = []
    for e in events:
        info = XID_CATALOG.get(e.xid) if e.xid is not None else None
        fix = (
            NO_MEMORY_FIX
            if e.no_memory
            else "a driver assertion: nothing to do unless the GPU misbehaves; if it recurs, "
            "collect `nvidia-bug-report.sh` for NVIDIA"
            if e.soft
            else info.action
            if info and info.action
            else "look the code up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)"
            if e.xid is not None
            else "the driver failed: reboot the node; if it recurs, reinstall the driver "
            "(`nvidia-driver-580-open` on DGX OS) and collect `nvidia-bug-report.sh`"
        )
        if fix not in fixes:
            fixes.append(fix)
    return "; ".join(fixes)


def gpu_lost_in_kernel_log(kernel: KernelLog) -> KernelEvent | None:
    """The kernel line saying the GPU fell off the bus (Xid 79, or the driver's own ``GPU
    ... has fallen off the bus``), if any: then a GPU nvidia-smi cannot see is this
    cause's consequence, and the kernel log check has the evidence."""
    for e in kernel.events:
        if e.xid in LOST_XIDS or (e.xid is None and "fallen off the bus" in e.line):
            return e
    return None


def _kernel_log_parts(
    shown: list[KernelEvent], burst: list[KernelEvent], section: GpuHealthSection
) -> list[str]:
    """What the kernel log holds, counted by kind: each Xid, the NV_ERR_NO_MEMORY lines,
    other NVRM errors and driver assertions."""
    counts = Counter(e.xid for e in shown if e.xid is not None)
    oom = [e for e in shown if e.no_memory]
    others = sum(1 for e in shown if e.xid is None and not e.soft and not e.no_memory)
    asserts = sum(1 for e in shown if e.soft)
    parts = [_xid_text(code, n) for code, n in counts.items()]
    if oom:
        parts.append(no_memory_text(oom, burst, section))
    if others:
        parts.append(f"{others} NVRM error line(s)")
    if asserts:
        parts.append(f"{asserts} driver assertion line(s)")
    return parts


def check_gpu_kernel_log(node: str, kernel: KernelLog, section: GpuHealthSection) -> Finding:
    """No Xid or NVRM error in the kernel log since boot. Xids in ``warn_xids`` (the
    application's own faults) warn; a log the SSH user may not read warns, saying so."""
    expected = "no Xid or NVRM errors since boot"
    if kernel.source is None:
        return Finding.warned(
            "not readable",
            expected,
            node=node,
            message=(
                f"{node}: cannot read the kernel log since boot ({'; '.join(kernel.refused)}); "
                f"expected to read it to find {expected.removeprefix('no ')}. Give the SSH "
                "user read access: add it to the adm or systemd-journal group (`sudo usermod "
                "-aG adm USER`), or allow dmesg (`sudo sysctl kernel.dmesg_restrict=0`)"
            ),
        )
    where = f"{kernel.source}, {kernel.lines} lines"
    if not kernel.events:
        return Finding.passed(
            0,
            expected,
            "errors",
            node=node,
            message=f"{node}: no Xid or NVRM errors since boot ({where})",
        )
    warn_only = set(section.warn_xids)
    burst = no_memory_burst(
        list(kernel.events), section.nvrm_burst_lines, section.nvrm_burst_window_s
    )
    failing = [
        e
        for e in kernel.events
        if (e.xid is None and not e.soft and not e.no_memory)
        or (e.xid is not None and e.xid not in warn_only)
        or (e.no_memory and burst)
    ]
    shown = failing or list(kernel.events)
    parts = _kernel_log_parts(shown, burst, section)
    lines = [e.line for e in shown]
    sample = "; ".join(f"`{ln}`" for ln in lines[-3:])
    evidence = {"kernel log": "\n".join(lines[-50:])}
    if failing:
        return Finding.failed(
            len(failing),
            expected,
            "errors",
            node=node,
            evidence=evidence,
            message=(
                f"{node}: the kernel log since boot ({where}) has {', '.join(parts)}: "
                f"{sample}; expected {expected}. Fix: {_fix(failing)}"
            ),
        )
    return Finding.warned(
        len(shown),
        expected,
        "errors",
        node=node,
        evidence=evidence,
        message=(
            f"{node}: the kernel log since boot ({where}) has {', '.join(parts)} "
            "(application-level Xids in profile gpu_health.warn_xids, driver assertions "
            "a healthy driver may print, or NV_ERR_NO_MEMORY lines fewer than a burst): "
            f"{sample}. If the serving engine crashed then, {_fix(shown)}"
        ),
    )
