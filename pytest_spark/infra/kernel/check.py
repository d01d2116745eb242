"""Kernel-log checks (preflight) beyond the GPU driver's own lines: the previous boot
(did it end with a clean shutdown; what it logged near its end) and PCIe AER errors on
the ConnectX-7 functions since boot.

Pure: facts (:mod:`pytest_spark.infra.kernel.probe`; this boot's AER lines come with
the GPU health facts, :class:`~pytest_spark.infra.gpuhealth.probe.KernelLog`) and the
profile's ``[gpu_health]`` figures in, a :class:`Finding` (or a :class:`Skip` citing the
check that owns the cause) out.

Decisions (issue #28 part 4):

- An unclean end of the previous boot fails: hard resets and power-offs under load are
  the Spark's known failure (dgx-spark-playbooks#97 and #116, eugr/spark-vllm-docker's
  2026-03-17 firmware note); the message names what the boot logged near its end (an
  NV_ERR_NO_MEMORY burst, an Xid, a PCIe AER error) as the likely cause, or nothing
  logged (#116: "the second boot had no NVRM allocation error").
- A previous boot that ended cleanly but logged such errors warns: it was rebooted,
  which is the fix every one of them names.
- AER: an uncorrectable (fatal or not) error on a CX-7 function or its root port since
  boot fails (MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146: recovery wedged in
  ``mlx5_pci_slot_reset``); correctable ones warn (the link recovered them). AER lines of
  other devices are not this check's.
- A journal without a previous boot (not persistent, or a first boot) warns, with the
  fix that keeps one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pytest_spark.infra.finding import Finding, Skip
from pytest_spark.infra.kernel.parse import clean_shutdown_line
from pytest_spark.infra.kernel.probe import PreviousBoot
from pytest_spark.infra.kernellog import (
    KERNEL_VERDICT,
    NO_MEMORY_FIX,
    XID_CATALOG,
    AerEvent,
    KernelEvent,
    KernelLog,
    line_time,
    no_memory_burst,
    no_memory_text,
)
from pytest_spark.settings.sections import GpuHealthSection

__all__ = [
    "AER_FIX",
    "AER_VERDICT",
    "PREVIOUS_BOOT_VERDICT",
    "BootEndErrors",
    "boot_end_errors",
    "check_pcie_aer",
    "check_previous_boot",
]

PREVIOUS_BOOT_VERDICT = "test_previous_boot_clean"
AER_VERDICT = "test_pcie_aer"
AER_FIX = (
    "stop inference traffic and reboot or power-cycle the node; do not disable AER/ASPM or "
    "flash other firmware without NVIDIA DGX Spark guidance (MiaAI-Lab/DeepSeek-v4-Flash-"
    "DSpark-2x-DGX-Spark#146); if it recurs, reseat the QSFP cable and contact NVIDIA support"
)
RESET_FIX = (
    "a hard reset or power loss under load (dgx-spark-playbooks#97, #116): check the power "
    "brick is the supplied one and firmly seated; if it recurs under heavy inference, lower "
    "the GPU clock (`sudo nvidia-smi -lgc 200,2150`: eugr/spark-vllm-docker's 2026-03-17 "
    "firmware note) and update the DGX OS firmware"
)
_PERSIST = (
    "keep a persistent journal so the next check can read the previous boot: `sudo mkdir -p "
    "/var/log/journal && sudo systemctl restart systemd-journald`"
)


def _aer_text(events: list[AerEvent]) -> str:
    by_dev = Counter((e.source, e.severity, e.fatal) for e in events)
    return ", ".join(
        f"{n} x {sev}{' (fatal)' if fatal else ''} AER on {dev}"
        for (dev, sev, fatal), n in by_dev.items()
    )


@dataclass(frozen=True)
class BootEndErrors:
    """What the previous boot logged near its end (``gpu_health.boot_end_window_s`` before
    its last line): an NV_ERR_NO_MEMORY burst, Xids the profile does not only warn on, and
    uncorrectable PCIe AER errors on a ConnectX-7 function."""

    burst: list[KernelEvent]
    xids: list[KernelEvent]
    aer: list[AerEvent]


def boot_end_errors(prev: PreviousBoot, section: GpuHealthSection) -> BootEndErrors:
    """The previous boot's errors near its end (the verdict's facts; every line when the
    journal gives no times)."""
    end = next((t for t in map(line_time, reversed(prev.tail)) if t is not None), None)
    near = section.boot_end_window_s

    def at_end(at: float | None) -> bool:
        return end is None or at is None or end - at <= near

    nvrm = [
        e for e in prev.nvrm if not e.soft and (e.xid is None or e.xid not in section.warn_xids)
    ]
    burst = [
        e
        for e in no_memory_burst(nvrm, section.nvrm_burst_lines, section.nvrm_burst_window_s)
        if at_end(e.at)
    ]
    xids = [e for e in nvrm if e.xid is not None and at_end(e.at)]
    aer = [e for e in prev.aer if e.on_cx7 and e.severity == "uncorrectable" and at_end(e.at)]
    return BootEndErrors(burst, xids, aer)


def _end_parts(errors: BootEndErrors, section: GpuHealthSection) -> list[str]:
    """The errors near the end, counted by kind, for the message."""
    parts = []
    if errors.burst:
        parts.append(no_memory_text(errors.burst, errors.burst, section))
    parts += [f"{n} x Xid {code}" for code, n in Counter(e.xid for e in errors.xids).items()]
    if errors.aer:
        parts.append(_aer_text(errors.aer))
    return parts


def _end_fixes(errors: BootEndErrors) -> list[str]:
    """The fixes the errors near the end name (none: the hard reset's fix applies)."""
    fixes = []
    if errors.burst:
        fixes.append(NO_MEMORY_FIX)
    for code in dict.fromkeys(e.xid for e in errors.xids):
        info = XID_CATALOG.get(code)  # type: ignore[arg-type]
        if info and info.action and info.action not in fixes:
            fixes.append(info.action)
    if errors.aer:
        fixes.append(AER_FIX)
    return fixes


def _no_previous_boot(node: str, prev: PreviousBoot, expected: str) -> Finding:
    """The warning when the journal cannot be read, or holds no previous boot."""
    if prev.boots is None or prev.error:
        return Finding.warned(
            "not readable",
            expected,
            node=node,
            message=(
                f"{node}: cannot read the previous boot from the journal ({prev.error}); "
                f"expected to read it to see whether {expected.removeprefix('the ')}. Give the "
                "SSH user read access (`sudo usermod -aG systemd-journal USER`)"
            ),
        )
    return Finding.warned(
        f"{len(prev.boots)} boot(s) in the journal",
        expected,
        node=node,
        message=(
            f"{node}: the journal holds no previous boot ({len(prev.boots)} boot listed by "
            f"`journalctl --list-boots`: a first boot, or a journal that is not "
            f"persistent); expected to read the previous one. Fix: {_PERSIST}"
        ),
    )


def check_previous_boot(node: str, prev: PreviousBoot, section: GpuHealthSection) -> Finding:
    """The previous boot ended with a clean shutdown (systemd's or journald's shutdown
    lines among its last lines); the errors it logged near its end name the likely
    cause when it did not."""
    expected = "the previous boot ended with a clean shutdown"
    boot = prev.previous
    if prev.boots is None or prev.error or boot is None:
        return _no_previous_boot(node, prev, expected)
    span = f"{boot.first} to {boot.last}"
    near = section.boot_end_window_s
    errors = boot_end_errors(prev, section)
    parts = _end_parts(errors, section)
    lines = [e.line for e in (*errors.burst, *errors.xids)] + [e.line for e in errors.aer]
    evidence = {"previous boot, last lines": "\n".join(prev.tail)}
    if lines:
        evidence["previous boot, errors near its end"] = "\n".join(lines[-50:])
    logged = (
        f"in its last {near / 60:.0f} min it logged {', '.join(parts)}"
        if parts
        else f"it logged no NVRM, Xid or AER error in its last {near / 60:.0f} min"
    )
    clean = clean_shutdown_line(list(prev.tail))
    if clean is None:
        fixes = _end_fixes(errors)
        last = prev.tail[-1].strip() if prev.tail else "(no lines)"
        return Finding.failed(
            "unclean",
            expected,
            node=node,
            evidence=evidence,
            message=(
                f"{node}: the previous boot ({span}) ended without a clean shutdown: its "
                f"journal stops at `{last}` with no shutdown line in its last "
                f"{len(prev.tail)} lines; {logged}; expected {expected.removeprefix('the ')}. "
                f"Fix: {'; '.join(fixes) or RESET_FIX}"
            ),
        )
    if parts:
        return Finding.warned(
            "clean, with errors",
            expected,
            node=node,
            evidence=evidence,
            message=(
                f"{node}: the previous boot ({span}) ended with a clean shutdown (`{clean}`) "
                f"but {logged.removeprefix('it ')}; the reboot cleared them. If they recur "
                "this boot, test_gpu_kernel_errors and test_pcie_aer fail on them"
            ),
        )
    return Finding.passed(
        "clean",
        expected,
        node=node,
        message=f"{node}: the previous boot ({span}) ended with a clean shutdown (`{clean}`)",
    )


def check_pcie_aer(node: str, kernel: KernelLog) -> Finding | Skip:
    """No uncorrectable PCIe AER error on the ConnectX-7 functions (0000:01:00.x,
    0002:01:00.x) or their root ports since boot; correctable ones warn."""
    expected = "no PCIe AER errors on the ConnectX-7 functions since boot"
    if kernel.source is None:
        return Skip(
            f"{node}: the kernel log since boot is not readable ({KERNEL_VERDICT}[{node}] "
            "says why and how to allow it)"
        )
    cx7 = [e for e in kernel.aer if e.on_cx7]
    where = f"{kernel.source}, {kernel.lines} lines"
    if not cx7:
        return Finding.passed(
            0, expected, "errors", node=node, message=f"{node}: {expected} ({where})"
        )
    bad = [e for e in cx7 if e.severity == "uncorrectable"]
    shown = bad or cx7
    times = [t for t in (e.at for e in shown) if t is not None]
    when = f"first {shown[0].line.split()[0]}, last {shown[-1].line.split()[0]}" if times else ""
    sample = "; ".join(f"`{e.line}`" for e in shown[-3:])
    evidence = {"AER lines": "\n".join(e.line for e in shown[-50:])}
    summary = f"{_aer_text(shown)}{f' ({when})' if when else ''}"
    if bad:
        return Finding.failed(
            len(bad),
            expected,
            "errors",
            node=node,
            evidence=evidence,
            message=(
                f"{node}: the kernel log since boot ({where}) has {summary}: {sample}; "
                "expected no uncorrectable AER errors on the ConnectX-7 functions. "
                f"Fix: {AER_FIX}"
            ),
        )
    return Finding.warned(
        len(shown),
        expected,
        "errors",
        node=node,
        evidence=evidence,
        message=(
            f"{node}: the kernel log since boot ({where}) has {summary} (the link recovered "
            f"them): {sample}. If they keep rising, reseat or replace the QSFP cable"
        ),
    )
