"""GPU health and kernel-log faults (the preflight's tests_infra/test_gpuhealth.py and
tests_infra/test_kernel.py catch them), all state.json changes that the node's
nvidia-smi, journalctl and dmesg report:

- ``gpu-xid NODE [--xid N]``: the driver logs Xid N (default 79) in the node's kernel
  log now, in the driver's words (``NVRM: Xid (PCI:000f:01:00): 79, pid=..., GPU has
  fallen off the bus.``); nvidia-smi still answers, as after a GPU that recovered.
- ``gpu-throttle NODE [--reason R]``: clocks event reason R active (default
  ``hw_slowdown``; any NVML reason name) and the SM clock down to 504 MHz, as the GB10
  low-power state reads under load.
- ``gpu-low-clock NODE [--mhz M]``: the GB10 USB-PD low-power state under load: the GPU
  busy (100 %, P0) with its SM clock at M MHz (default 504) and ~10 W drawn, and no clocks
  event reason set (hoesing/spark-gpu-throttle-check's readings: 481-858 MHz at 5.8-15.8 W
  under load, no error reported). Idle, the same Spark reads as a healthy idle one, so the
  fault is the node read while a load runs on it.
- ``gpu-persistence-off NODE``: persistence mode Disabled (nvidia-persistenced stopped).
- ``gpu-temp NODE CELSIUS``: the GPU temperature.
- ``kernel-log-restricted NODE``: the kernel log as an SSH user outside the adm /
  systemd-journal groups sees it under ``kernel.dmesg_restrict=1``: journalctl opens no
  journal files, dmesg is refused.
- ``nvrm-oom NODE [--lines N]``: the driver logs N (default 40) ``NVRM:
  nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] ...`` lines
  (dgx-spark-playbooks#97's words) over the last 2N seconds of this boot; ``--lines 1`` is
  the transient warm-up one.
- ``pcie-aer NODE [--domain 0000|0002] [--correctable]``: the kernel logs a PCIe AER error
  from the ConnectX-7 function DOMAIN:01:00.0 at its root port DOMAIN:00:00.0, uncorrectable
  (fatal, Transaction Layer; MiaAI-Lab DSpark#146) unless ``--correctable`` (Physical
  Layer, recovered).
- ``unclean-shutdown NODE [--nvrm N]``: the previous boot ended without a clean shutdown
  (its journal's shutdown lines gone), after a burst of N (default 60) NV_ERR_NO_MEMORY
  lines in its last two minutes; ``--nvrm 0``: with nothing logged (a power loss).

``clear`` (the sim core's) resets state.json: readings healthy, the kernel log as booted.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from .. import node as nodes_mod
from ..netns import SimError
from ..topology import NodeSpec, Topology
from .common import Kinds, record, resolve

KINDS = (
    "gpu-xid",
    "gpu-throttle",
    "gpu-low-clock",
    "gpu-persistence-off",
    "gpu-temp",
    "kernel-log-restricted",
    "nvrm-oom",
    "pcie-aer",
    "unclean-shutdown",
)
NO_MEMORY_LINE = (  # dgx-spark-playbooks#97 (fixtures/kernel/nvrm_no_memory_gb10.txt)
    "NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) "
    "returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1359"
)
REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clocks_setting",
)
THROTTLED_SM_MHZ = 504  # hoesing/spark-gpu-throttle-check: 481-858 MHz in the capped state
CAPPED_POWER_W = 9.8  # the same tool: 5.8-15.8 W drawn in the capped state under load


def low_clock_health(mhz: int = THROTTLED_SM_MHZ) -> dict[str, Any]:
    """The readings of a GB10 in the low-power state while a load runs: busy, P0, the SM
    clock capped, little power, and no clocks event reason to explain it."""
    return {
        "sm_clock_mhz": mhz,
        "util_pct": 100,
        "pstate": "P0",
        "power_w": CAPPED_POWER_W,
        "reasons": [],
    }


# What the driver appends after "NVRM: Xid (PCI:...): N, pid=..., name=..., " for a few
# codes (NVIDIA's Xid catalog wording); others get the catalog's mnemonic-like text.
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Illegal Instruction Parameter",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC0 GPCCLIENT_T1_0 faulted "
    "@ 0x7f00_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU",
    79: "GPU has fallen off the bus.",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP!",
}


def add_parsers(kinds: Kinds) -> None:
    k = kinds.on_node("gpu-xid", "the driver logs an Xid on a node")
    k.add_argument("--xid", type=int, default=79, metavar="N", help="Xid code (default: 79)")
    k = kinds.on_node("gpu-throttle", "a clocks event reason active, clocks down")
    k.add_argument(
        "--reason",
        default="hw_slowdown",
        choices=REASONS,
        metavar="R",
        help="NVML clocks event reason (default: hw_slowdown)",
    )
    k = kinds.on_node(
        "gpu-low-clock", "the GB10 low-power state under load: busy, SM clock capped, no reason set"
    )
    k.add_argument(
        "--mhz",
        type=int,
        default=THROTTLED_SM_MHZ,
        metavar="M",
        help=f"the capped SM clock (default: {THROTTLED_SM_MHZ})",
    )
    k = kinds.on_node("gpu-persistence-off", "persistence mode Disabled on a node")
    k = kinds.on_node("gpu-temp", "the GPU temperature of a node")
    k.add_argument("celsius", metavar="CELSIUS", type=int, help="e.g. 93")
    k = kinds.on_node(
        "kernel-log-restricted",
        "journalctl and dmesg refuse the kernel log (a non-root user's view)",
    )
    k = kinds.on_node("nvrm-oom", "the driver logs NV_ERR_NO_MEMORY lines on a node")
    k.add_argument("--lines", type=int, default=40, metavar="N", help="how many (default: 40)")
    k = kinds.on_node("pcie-aer", "a PCIe AER error on a node's ConnectX-7 function")
    k.add_argument("--domain", default="0000", choices=("0000", "0002"), help="CX-7 PCI domain")
    k.add_argument("--correctable", action="store_true", help="a corrected error, not fatal")
    k = kinds.on_node("unclean-shutdown", "the previous boot ended without a clean shutdown")
    k.add_argument(
        "--nvrm",
        type=int,
        default=60,
        metavar="N",
        help="NV_ERR_NO_MEMORY lines in its last two minutes (default: 60; 0: none)",
    )


def _state(state_dir: Path, node: NodeSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    state = nodes_mod.read_state(state_dir, node)
    gpu = state["gpu"]
    assert isinstance(gpu, dict)
    health = gpu.setdefault("health", dict(nodes_mod.GPU_HEALTH))
    assert isinstance(health, dict)
    return state, health


def _pci(state: dict[str, Any]) -> str:
    """``0000000F:01:00.0`` -> ``000f:01:00``, as NVRM prints the GPU."""
    gpus = state["gpu"]["gpus"]
    bus = str(gpus[0]["pci_bus_id"]) if gpus else "0000000F:01:00.0"
    domain, rest = bus.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.rsplit('.', 1)[0].lower()}"


def _aer_lines(domain: str, correctable: bool) -> list[str]:
    """A PCIe AER report from the CX-7 function DOMAIN:01:00.0 in the kernel's words
    (fixtures/kernel/aer_*.txt); 15b3:1021 is a ConnectX-7."""
    port, dev = f"{domain}:00:00.0", f"{domain}:01:00.0"
    if correctable:
        return [
            f"pcieport {port}: AER: Correctable error message received from {dev}",
            f"mlx5_core {dev}: PCIe Bus Error: severity=Correctable, type=Physical Layer, "
            "(Receiver ID)",
            f"mlx5_core {dev}:   device [15b3:1021] error status/mask=00000001/00000000",
            f"mlx5_core {dev}:    [ 0] RxErr                  (First)",
        ]
    return [
        f"pcieport {port}: AER: Uncorrectable (Fatal) error received: {dev}",
        f"mlx5_core {dev}: PCIe Bus Error: severity=Uncorrectable (Fatal), "
        "type=Transaction Layer, (Requester ID)",
        f"mlx5_core {dev}:   device [15b3:1021] error status/mask=00004000/00000000",
        f"mlx5_core {dev}:    [14] CmpltTO                (First)",
    ]


def _kernel_fault(
    state: dict[str, Any], node: NodeSpec, args: argparse.Namespace
) -> tuple[Any, str]:
    """The kernel-log faults that are not an Xid: state.json ``kernel_log`` (this boot)
    or ``previous_boot`` (tools/kernellog.py)."""
    log = state.setdefault("kernel_log", [])
    assert isinstance(log, list)
    now = time.time()
    if args.kind == "nvrm-oom":
        if args.lines <= 0:
            raise SimError(f"nvrm-oom --lines {args.lines}: expected a positive count")
        log += [
            {"at": now - 2 * (args.lines - i), "msg": NO_MEMORY_LINE} for i in range(args.lines)
        ]
        return args.lines, f"{node.name}: kernel log: {args.lines} x NVRM NV_ERR_NO_MEMORY"
    if args.kind == "pcie-aer":
        log += [{"at": now, "msg": m} for m in _aer_lines(args.domain, args.correctable)]
        how = "correctable" if args.correctable else "uncorrectable (fatal)"
        return args.domain, f"{node.name}: kernel log: {how} AER on {args.domain}:01:00.0"
    if args.nvrm < 0:
        raise SimError(f"unclean-shutdown --nvrm {args.nvrm}: expected 0 or more")
    prev = state.setdefault("previous_boot", nodes_mod.previous_boot(node))
    assert isinstance(prev, dict)
    tail = {msg for _, _, msg in nodes_mod.SHUTDOWN_TAIL}
    kept = [e for e in prev.get("log") or () if e.get("msg") not in tail]
    end = nodes_mod.SHUTDOWN_TAIL[0][0]
    kept += [
        {"t": end - 2 * (args.nvrm - i), "ident": "kernel", "msg": NO_MEMORY_LINE}
        for i in range(args.nvrm)
    ]
    prev["log"] = kept
    return args.nvrm, (
        f"{node.name}: the previous boot ended without a clean shutdown"
        + (f", after {args.nvrm} x NVRM NV_ERR_NO_MEMORY" if args.nvrm else "")
    )


def apply(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    node = resolve(topo, args.node)
    state, health = _state(state_dir, node)
    if args.kind == "gpu-xid":
        if args.xid <= 0:
            raise SimError(f"gpu-xid --xid {args.xid}: expected a positive Xid code")
        text = XID_TEXT.get(args.xid, "Graphics Exception")
        pci = _pci(state)
        log = state.setdefault("kernel_log", [])
        assert isinstance(log, list)
        now = time.time()
        log.append(
            {"at": now, "msg": f"NVRM: Xid (PCI:{pci}): {args.xid}, pid=4242, name=python3, {text}"}
        )
        if args.xid == 79:
            log.append({"at": now, "msg": f"NVRM: GPU {pci}.0: GPU has fallen off the bus."})
        value: Any = args.xid
        msg = f"{node.name}: kernel log: NVRM Xid {args.xid} ({text})"
    elif args.kind == "gpu-throttle":
        reasons = [r for r in health.get("reasons") or () if r != "gpu_idle"]
        health["reasons"] = sorted({*reasons, args.reason})
        if args.reason != "gpu_idle":
            health["sm_clock_mhz"] = THROTTLED_SM_MHZ
            health["pstate"] = "P0"
        value = args.reason
        msg = f"{node.name}: clocks event reason {args.reason} active"
        if args.reason != "gpu_idle":
            msg += f", SM clock {THROTTLED_SM_MHZ} MHz"
    elif args.kind == "gpu-low-clock":
        if args.mhz <= 0:
            raise SimError(f"gpu-low-clock --mhz {args.mhz}: expected a positive clock")
        health.update(low_clock_health(args.mhz))
        value = args.mhz
        msg = f"{node.name}: GPU busy at SM clock {args.mhz} MHz, no clocks event reason"
    elif args.kind == "gpu-persistence-off":
        health["persistence"] = False
        value = False
        msg = f"{node.name}: persistence mode Disabled"
    elif args.kind == "gpu-temp":
        health["temperature_c"] = args.celsius
        value = args.celsius
        msg = f"{node.name}: GPU temperature {args.celsius} C"
    elif args.kind in ("nvrm-oom", "pcie-aer", "unclean-shutdown"):
        value, msg = _kernel_fault(state, node, args)
    elif args.kind == "kernel-log-restricted":
        state["kernel_log_restricted"] = True
        value = True
        msg = f"{node.name}: journalctl and dmesg refuse the kernel log"
    else:
        raise SimError(f"unknown fault {args.kind!r}")
    nodes_mod.write_state(state_dir, node, state)
    record(state_dir, args.kind, node.name, "-", value)
    return [msg]
