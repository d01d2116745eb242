"""Fake nvidia-smi for a GB10 (unified memory: memory fields are ``[N/A]``/Not Supported).

GPUs, driver version and the fake GPU processes come from state.json (``gpu`` key);
faults may add processes there (``{"pid", "name", "type", "used_memory_mib"}``). An empty
GPU list gives ``No devices were found`` and exit status 6, as the real tool does.

Health readings (``gpu.health``: temperature, SM clock and its maximum, power draw,
utilisation, P-state, persistence mode, the active clocks event reasons) answer
``--query-gpu`` (``clocks_event_reasons.*`` and the pre-535 ``clocks_throttle_reasons.*``
names) and ``-q [-d PERFORMANCE,TEMPERATURE,...]`` in driver 580's layout; what GB10
reports as N/A (power limit, slowdown temperatures, memory) is N/A here too
(fixtures/gpu/README.md). The faults.gpu module changes the readings.

Under load: on a node of a running sim (its dir holds ``gpu-follows-load``), while a
process of the node runs hot (:func:`node_busy`: the node's own PID namespace, so its
containers' processes count), the readings are a loaded GB10's (P0,
2483 MHz, 86 W, 100 %), as a load's kernels make a real GPU read; a fault that already
describes the GPU under load (P0: gpu-throttle, gpu-low-clock) is read as it is.
"""

from __future__ import annotations

import os
import sys
import time

from .ports import State, load_state

W = 89  # inner width of the table
NA = "[N/A]"

# query field -> (csv header, unit that nounits strips)
Fields = dict[str, tuple[str, str | None]]
GPU_FIELDS: Fields = {
    "index": ("index", None),
    "name": ("name", None),
    "gpu_name": ("name", None),
    "uuid": ("uuid", None),
    "gpu_uuid": ("uuid", None),
    "driver_version": ("driver_version", None),
    "count": ("count", None),
    "pci.bus_id": ("pci.bus_id", None),
    "gpu_bus_id": ("pci.bus_id", None),
    "serial": ("serial", None),
    "persistence_mode": ("persistence_mode", None),
    "pstate": ("pstate", None),
    "compute_cap": ("compute_cap", None),
    "compute_mode": ("compute_mode", None),
    "display_active": ("display_active", None),
    "memory.total": ("memory.total [MiB]", " MiB"),
    "memory.used": ("memory.used [MiB]", " MiB"),
    "memory.free": ("memory.free [MiB]", " MiB"),
    "memory.reserved": ("memory.reserved [MiB]", " MiB"),
    "utilization.gpu": ("utilization.gpu [%]", " %"),
    "utilization.memory": ("utilization.memory [%]", " %"),
    "temperature.gpu": ("temperature.gpu", None),
    "power.draw": ("power.draw [W]", " W"),
    "power.limit": ("power.limit [W]", " W"),
    "fan.speed": ("fan.speed [%]", " %"),
    "mig.mode.current": ("mig.mode.current", None),
    "ecc.mode.current": ("ecc.mode.current", None),
    "clocks.sm": ("clocks.current.sm [MHz]", " MHz"),
    "clocks.current.sm": ("clocks.current.sm [MHz]", " MHz"),
    "clocks.gr": ("clocks.current.graphics [MHz]", " MHz"),
    "clocks.current.graphics": ("clocks.current.graphics [MHz]", " MHz"),
    "clocks.max.sm": ("clocks.max.sm [MHz]", " MHz"),
    "clocks.max.gr": ("clocks.max.graphics [MHz]", " MHz"),
    "clocks.max.graphics": ("clocks.max.graphics [MHz]", " MHz"),
    "clocks.mem": ("clocks.current.memory [MHz]", " MHz"),
    "temperature.memory": ("temperature.memory", None),
}
# NVML clocks event reasons: bit, query name, -q label (driver 580's nvidia-smi -q).
REASONS = (
    (0x1, "gpu_idle", "Idle"),
    (0x2, "applications_clocks_setting", "Applications Clocks Setting"),
    (0x4, "sw_power_cap", "SW Power Cap"),
    (0x8, "hw_slowdown", "HW Slowdown"),
    (0x40, "hw_thermal_slowdown", "HW Thermal Slowdown"),
    (0x80, "hw_power_brake_slowdown", "HW Power Brake Slowdown"),
    (0x10, "sync_boost", "Sync Boost"),
    (0x20, "sw_thermal_slowdown", "SW Thermal Slowdown"),
    (0x100, "display_clocks_setting", "Display Clock Setting"),
)
for _prefix in ("clocks_event_reasons", "clocks_throttle_reasons"):
    GPU_FIELDS[f"{_prefix}.active"] = (f"{_prefix}.active", None)
    GPU_FIELDS[f"{_prefix}.supported"] = (f"{_prefix}.supported", None)
    for _bit, _name, _label in REASONS:
        GPU_FIELDS[f"{_prefix}.{_name}"] = (f"{_prefix}.{_name}", None)
APP_FIELDS: Fields = {
    "pid": ("pid", None),
    "process_name": ("process_name", None),
    "name": ("process_name", None),
    "used_memory": ("used_gpu_memory [MiB]", " MiB"),
    "used_gpu_memory": ("used_gpu_memory [MiB]", " MiB"),
    "gpu_uuid": ("gpu_uuid", None),
    "gpu_name": ("gpu_name", None),
    "gpu_bus_id": ("gpu_bus_id", None),
}


# A GB10 under load: 2424-2483 MHz, P0, 84-89 W (hoesing/spark-gpu-throttle-check's
# README, fixtures/gpu/README.md).
LOADED = {"sm_clock_mhz": 2483, "power_w": 86.0, "util_pct": 100, "pstate": "P0"}
HOT_SHARE = 0.15  # a process that has used this share of a core since it started...
HOT_AGE_S = 0.5  # ...and has run this long (an SSH handshake's burst is shorter)
FOLLOW_FILE = "gpu-follows-load"  # in the node's dir: written by `spark-sim up`
_busy: list[bool] = []  # one answer per nvidia-smi call; empty: not asked yet
_follow: list[bool] = [False]  # whether this call's node follows load (FOLLOW_FILE)


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def node_busy() -> bool:
    """Whether a load runs on the node, as a GPU's utilisation says a kernel runs: some
    process of the node (the node has its own PID namespace, so /proc lists only its
    processes, its containers' included) other than this call's own chain has used at least
    HOT_SHARE of a core since it started, for HOT_AGE_S or more. The sim has no GPU for a
    load to reach, so a load's work is its CPU time (the pre-serving load's matmuls fall
    back to the CPU here; on a Spark they run on the GPU)."""
    if not _follow[0]:
        return False  # a node dir of no sim node (the tools run in a test): state.json alone
    if _busy:
        return _busy[0]
    hz = os.sysconf("SC_CLK_TCK")
    try:
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError):
        _busy.append(False)
        return False
    mine = _ancestors()
    found = False
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            cpu_s = (int(fields[11]) + int(fields[12])) / hz
            age_s = uptime - int(fields[19]) / hz
        except (OSError, ValueError, IndexError):
            continue
        if age_s >= HOT_AGE_S and cpu_s >= HOT_SHARE * age_s:
            found = True
            break
    _busy.append(found)
    return found


def _health(info: State) -> State:
    """The readings: state.json's, or a loaded GPU's while a load runs on the node. A fault
    that already describes the GPU under load (P0: throttled, clock-capped) is read as
    it is, load or not."""
    health = dict(info.get("health") or {})
    if health.get("pstate", "P8") != "P0" and node_busy():
        health.update(LOADED)
        health["reasons"] = [r for r in health.get("reasons") or () if r != "gpu_idle"]
    return health


def _mask(health: State) -> int:
    active = set(health.get("reasons") or ())
    return sum(bit for bit, name, _ in REASONS if name in active)


def _gpu_value(field: str, gpu: State, info: State) -> str:
    health = _health(info)
    if "_reasons." in field:
        what = field.split(".", 1)[1]
        if what == "active":
            return f"0x{_mask(health):016x}"
        if what == "supported":
            return f"0x{sum(bit for bit, _, _ in REASONS):016x}"
        return "Active" if what in (health.get("reasons") or ()) else "Not Active"
    clocks = {
        "clocks.sm": health.get("sm_clock_mhz"),
        "clocks.current.sm": health.get("sm_clock_mhz"),
        "clocks.gr": health.get("sm_clock_mhz"),
        "clocks.current.graphics": health.get("sm_clock_mhz"),
        "clocks.max.sm": health.get("max_sm_clock_mhz"),
        "clocks.max.gr": health.get("max_sm_clock_mhz"),
        "clocks.max.graphics": health.get("max_sm_clock_mhz"),
    }
    if field in clocks:
        return NA if clocks[field] is None else f"{clocks[field]} MHz"
    values = {
        "index": str(gpu["index"]),
        "name": gpu["name"],
        "uuid": gpu["uuid"],
        "driver_version": info["driver_version"],
        "count": str(len(info["gpus"])),
        "pci.bus_id": gpu["pci_bus_id"],
        "serial": NA,
        "persistence_mode": "Enabled" if health.get("persistence", True) else "Disabled",
        "pstate": str(health.get("pstate", "P8")),
        "compute_cap": gpu.get("compute_cap", "12.1"),
        "compute_mode": "Default",
        "display_active": "Disabled",
        "temperature.gpu": str(health.get("temperature_c", 41)),
        "utilization.gpu": f"{health.get('util_pct', 0)} %",
        "power.draw": f"{float(health.get('power_w', 4.21)):.2f} W",
        "mig.mode.current": NA,
        "ecc.mode.current": NA,
    }
    header = GPU_FIELDS[field][0].split(" [")[0]
    return str(values.get(field, values.get(header, NA)))


def _app_value(field: str, proc: State, gpu: State) -> str:
    mem = proc.get("used_memory_mib")
    values = {
        "pid": str(proc["pid"]),
        "process_name": proc.get("name", ""),
        "name": proc.get("name", ""),
        "used_memory": NA if mem is None else f"{mem} MiB",
        "used_gpu_memory": NA if mem is None else f"{mem} MiB",
        "gpu_uuid": gpu["uuid"],
        "gpu_name": gpu["name"],
        "gpu_bus_id": gpu["pci_bus_id"],
    }
    return str(values[field])


def _csv(fields: list[str], table: Fields, rows: list[list[str]], fmt: set[str]) -> str:
    out = []
    if "noheader" not in fmt:
        out.append(", ".join(table[f][0] for f in fields))
    for row in rows:
        cells = []
        for f, v in zip(fields, row, strict=True):
            unit = table[f][1]
            if "nounits" in fmt and unit and v.endswith(unit):
                v = v[: -len(unit)]
            cells.append(v)
        out.append(", ".join(cells))
    return "".join(line + "\n" for line in out)


def _table(info: State) -> str:
    bar = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    ver = info["driver_version"]
    lines = [
        time.strftime("%a %b %e %H:%M:%S %Y") + "       ",
        "+" + "-" * W + "+",
        f"| NVIDIA-SMI {ver:<22} Driver Version: {ver:<14} CUDA Version: "
        f"{info['cuda_version']:<9}|",
        bar,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",  # noqa: E501
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",  # noqa: E501
        "|                                         |                        |               MIG M. |",  # noqa: E501
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    health = _health(info)
    pm = "On" if health.get("persistence", True) else "Off"
    temp = f"{health.get('temperature_c', 41)}C"
    watts = f"{round(float(health.get('power_w', 4.21)))}W"
    pstate = str(health.get("pstate", "P8"))
    util = f"{health.get('util_pct', 0)}%"
    for i, gpu in enumerate(info["gpus"]):
        if i:
            lines.append(bar)
        lines += [
            f"|{gpu['index']:>4}  {gpu['name']:<30}{pm:>3}  |   {gpu['pci_bus_id']:<16} Off |"
            f"{'N/A':>21} |",
            f"| N/A  {temp:>4}    {pstate:<3}           {watts:>4} /  N/A  "
            f"| Not Supported          |{util:>8}      Default |",
            "|" + " " * 41 + "|" + " " * 24 + "|" + f"{'N/A':>21} |",
        ]
    lines += [
        bar,
        "",
        "+" + "-" * W + "+",
        f"| {'Processes:':<{W - 1}}|",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",  # noqa: E501
        "|        ID   ID                                                               Usage      |",  # noqa: E501
        "|" + "=" * W + "|",
    ]
    procs = info.get("processes", [])
    if not procs:
        lines.append(f"|  {'No running processes found':<{W - 2}}|")
    for proc in procs:
        name = proc.get("name", "")
        if len(name) > 37:
            name = "..." + name[-34:]
        mem = proc.get("used_memory_mib")
        mem_s = "N/A" if mem is None else f"{mem}MiB"
        lines.append(
            f"|{proc.get('gpu', 0):>5}   N/A  N/A{proc['pid']:>16}{proc.get('type', 'C'):>7}   "
            f"{name:<37}{mem_s:>9} |"
        )
    lines.append("+" + "-" * W + "+")
    return "".join(line + "\n" for line in lines)


def _kv(indent: int, key: str, value: object) -> str:
    return f"{' ' * indent}{key:<{42 - indent}}: {value}"


def _smi_q(info: State, display: set[str]) -> str:
    """``nvidia-smi -q [-d ...]`` in driver 580's layout; GB10's N/A fields as N/A."""
    health = _health(info)
    active = set(health.get("reasons") or ())
    every = not display
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        _kv(0, "Timestamp", time.strftime("%a %b %e %H:%M:%S %Y")),
        _kv(0, "Driver Version", info["driver_version"]),
        _kv(0, "CUDA Version", info["cuda_version"]),
        "",
        _kv(0, "Attached GPUs", len(info["gpus"])),
    ]
    for gpu in info["gpus"]:
        lines.append(f"GPU {gpu['pci_bus_id']}")
        if every:
            lines += [
                _kv(4, "Product Name", gpu["name"]),
                _kv(4, "Product Brand", "NVIDIA"),
                _kv(4, "Product Architecture", "Blackwell"),
                _kv(
                    4,
                    "Persistence Mode",
                    "Enabled" if health.get("persistence", True) else "Disabled",
                ),
                _kv(4, "Addressing Mode", "ATS"),
                _kv(4, "GPU UUID", gpu["uuid"]),
                _kv(4, "FB Memory Usage", ""),
                _kv(8, "Total", NA[1:-1]),
            ]
        if every or "PERFORMANCE" in display:
            lines.append(_kv(4, "Performance State", health.get("pstate", "P8")))
            lines.append("    Clocks Event Reasons")
            for _, name, label in REASONS:
                indent = 12 if name in ("hw_thermal_slowdown", "hw_power_brake_slowdown") else 8
                lines.append(_kv(indent, label, "Active" if name in active else "Not Active"))
            lines.append("    Clocks Event Reasons Counters")
            for label in (
                "SW Power Capping",
                "Sync Boost",
                "SW Thermal Slowdown",
                "HW Thermal Slowdown",
                "HW Power Braking",
            ):
                lines.append(_kv(8, label, "0 us"))
        if every or "TEMPERATURE" in display:
            lines.append("    Temperature")
            lines.append(_kv(8, "GPU Current Temp", f"{health.get('temperature_c', 41)} C"))
            for label in (
                "GPU T.Limit Temp",
                "GPU Shutdown Temp",
                "GPU Slowdown Temp",
                "GPU Max Operating Temp",
                "GPU Target Temperature",
                "Memory Current Temp",
                "Memory Max Operating Temp",
            ):
                lines.append(_kv(8, label, "N/A"))
        if every or "POWER" in display:
            lines.append("    GPU Power Readings")
            lines.append(_kv(8, "Average Power Draw", "N/A"))
            lines.append(
                _kv(8, "Instantaneous Power Draw", f"{float(health.get('power_w', 4.21)):.2f} W")
            )
            for label in (
                "Current Power Limit",
                "Requested Power Limit",
                "Default Power Limit",
                "Min Power Limit",
                "Max Power Limit",
            ):
                lines.append(_kv(8, label, "N/A"))
        if every or "CLOCK" in display:
            lines.append("    Clocks")
            for label in ("Graphics", "SM"):
                lines.append(_kv(8, label, f"{health.get('sm_clock_mhz', 208)} MHz"))
            lines.append(_kv(8, "Memory", "N/A"))
            lines.append("    Max Clocks")
            for label in ("Graphics", "SM"):
                lines.append(_kv(8, label, f"{health.get('max_sm_clock_mhz', 3003)} MHz"))
            lines.append(_kv(8, "Memory", "N/A"))
        lines.append("")
    return "".join(line + "\n" for line in lines)


def _query(spec: str, table: Fields) -> list[str] | str:
    fields = [f.strip() for f in spec.split(",") if f.strip()]
    for f in fields:
        if f not in table:
            return f'Field "{f}" is not a valid field to query.'
    return fields


def nvidia_smi(node_dir: str, argv: list[str]) -> int:
    _busy.clear()
    _follow[0] = os.path.exists(os.path.join(node_dir, FOLLOW_FILE))
    info = load_state(node_dir)["gpu"]
    gpus = info["gpus"]
    if not gpus:  # the driver lost the GPU (fault gpu-invisible): what nvidia-smi says then
        sys.stdout.write("No devices were found\n")
        return 6
    query_gpu = query_apps = None
    fmt: set[str] = set()
    if argv and argv[0] in ("-q", "--query"):
        display: set[str] = set()
        rest = argv[1:]
        for i, a in enumerate(rest):
            if a in ("-d", "--display") and i + 1 < len(rest):
                display |= {d.strip().upper() for d in rest[i + 1].split(",") if d.strip()}
            elif a.startswith("--display="):
                display |= {d.strip().upper() for d in a.split("=", 1)[1].split(",")}
        sys.stdout.write(_smi_q(info, display))
        return 0
    for a in argv:
        if a.startswith("--query-gpu="):
            query_gpu = a.split("=", 1)[1]
        elif a.startswith("--query-compute-apps="):
            query_apps = a.split("=", 1)[1]
        elif a.startswith("--format="):
            fmt = {x.strip() for x in a.split("=", 1)[1].split(",")}
        elif a in ("-L", "--list-gpus"):
            sys.stdout.write(
                "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in gpus)
            )
            return 0
        else:
            sys.stdout.write(
                "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n"
            )
            return 2
    if query_gpu is None and query_apps is None:
        sys.stdout.write(_table(info))
        return 0
    if "csv" not in fmt:
        sys.stdout.write("\"--format=\" switch is missing. Please run 'nvidia-smi -h' for help.\n")
        return 2
    if query_gpu is not None:
        fields = _query(query_gpu, GPU_FIELDS)
        if isinstance(fields, str):
            sys.stdout.write(fields + "\n\n")
            return 2
        rows = [[_gpu_value(f, g, info) for f in fields] for g in gpus]
        sys.stdout.write(_csv(fields, GPU_FIELDS, rows, fmt))
        return 0
    fields = _query(query_apps or "", APP_FIELDS)
    if isinstance(fields, str):
        sys.stdout.write(fields + "\n\n")
        return 2
    rows = [
        [_app_value(f, p, gpus[int(p.get("gpu", 0))]) for f in fields]
        for p in info.get("processes", [])
    ]
    sys.stdout.write(_csv(fields, APP_FIELDS, rows, fmt))
    return 0
