"""Fake nvidia-smi for a GB10 (unified memory: memory fields are ``[N/A]``/Not Supported).

GPUs, driver version and the fake GPU processes come from state.json (``gpu`` key);
faults may add processes there (``{"pid", "name", "type", "used_memory_mib"}``). An empty
GPU list gives ``No devices were found`` and exit status 6, as the real tool does.
"""

from __future__ import annotations

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
}
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


def _gpu_value(field: str, gpu: State, info: State) -> str:
    values = {
        "index": str(gpu["index"]),
        "name": gpu["name"],
        "uuid": gpu["uuid"],
        "driver_version": info["driver_version"],
        "count": str(len(info["gpus"])),
        "pci.bus_id": gpu["pci_bus_id"],
        "serial": NA,
        "persistence_mode": "Enabled",
        "pstate": "P8",
        "compute_cap": gpu.get("compute_cap", "12.1"),
        "compute_mode": "Default",
        "display_active": "Disabled",
        "temperature.gpu": "41",
        "utilization.gpu": "0 %",
        "power.draw": "4.21 W",
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
    for i, gpu in enumerate(info["gpus"]):
        if i:
            lines.append(bar)
        lines += [
            f"|{gpu['index']:>4}  {gpu['name']:<31}On  |   {gpu['pci_bus_id']:<16} Off |"
            f"{'N/A':>21} |",
            "| N/A   41C    P8              4W /  N/A  | Not Supported          |"
            "      0%      Default |",
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


def _query(spec: str, table: Fields) -> list[str] | str:
    fields = [f.strip() for f in spec.split(",") if f.strip()]
    for f in fields:
        if f not in table:
            return f'Field "{f}" is not a valid field to query.'
    return fields


def nvidia_smi(node_dir: str, argv: list[str]) -> int:
    info = load_state(node_dir)["gpu"]
    gpus = info["gpus"]
    if not gpus:  # the driver lost the GPU (fault gpu-invisible): what nvidia-smi says then
        sys.stdout.write("No devices were found\n")
        return 6
    query_gpu = query_apps = None
    fmt: set[str] = set()
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
