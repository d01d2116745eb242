#!/usr/bin/env python3
"""The transport NCCL would select, for the all-reduce benchmark's gloo runs.

Standalone: stdlib only; shipped with ``allreduce_probe.py`` (pytest_spark bundles both into
one program, :func:`pytest_spark.infra.nccl.command_probe.script_text`) and imported by it.

With nccl, NCCL itself prints ``NCCL INFO`` lines when ``NCCL_DEBUG=INFO``. With gloo there
is no NCCL, so the benchmark prints the transport NCCL *would select* from the same inputs
NCCL reads (``NCCL_NET``, ``NCCL_IB_DISABLE``, ``NCCL_IB_HCA``, ``NCCL_SOCKET_IFNAME``, HCA
state from ``ibdev2netdev`` or ``/sys/class/infiniband``), in NCCL's own line format, between
two ``# pytest_spark:`` comment lines saying so. They are a prediction, never a measurement.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PREDICTED_BEGIN = (
    "# pytest_spark: transport NCCL would select (computed from NCCL_* env and HCA state; "
    "not a measurement, this run uses gloo over TCP):"
)
PREDICTED_END = "# pytest_spark: end of transport NCCL would select"


def say(line: str = "") -> None:
    print(line, flush=True)


@dataclass(frozen=True)
class Hca:
    """One RDMA device port and its netdev, as ``ibdev2netdev`` prints it."""

    dev: str
    port: int
    netdev: str
    up: bool
    link_layer: str = "RoCE"


_IBDEV2NETDEV = re.compile(r"^(\S+) port (\d+) ==> (\S+) \((\w+)\)")


def parse_ibdev2netdev(text: str) -> list[Hca]:
    hcas = []
    for line in text.splitlines():
        match = _IBDEV2NETDEV.match(line.strip())
        if match:
            dev, port, netdev, state = match.groups()
            hcas.append(Hca(dev, int(port), netdev, state.lower() == "up"))
    return hcas


def read_hcas_sysfs(root: Path = Path("/sys/class/infiniband")) -> list[Hca]:
    hcas: list[Hca] = []
    if not root.is_dir():
        return hcas
    for devdir in sorted(root.iterdir()):
        netdevs = sorted(p.name for p in (devdir / "device" / "net").glob("*"))
        for portdir in sorted((devdir / "ports").glob("*")):
            try:
                state = (portdir / "state").read_text().strip()
                layer = (portdir / "link_layer").read_text().strip()
            except OSError:
                continue
            hcas.append(
                Hca(
                    devdir.name,
                    int(portdir.name),
                    netdevs[0] if netdevs else "?",
                    "ACTIVE" in state,
                    "IB" if layer == "InfiniBand" else "RoCE",
                )
            )
    return hcas


def read_hcas() -> tuple[list[Hca], str]:
    """HCA ports and where they were read from (``ibdev2netdev`` first, as NVIDIA's tools)."""
    tool = shutil.which("ibdev2netdev")
    if tool:
        try:
            proc = subprocess.run([tool], capture_output=True, text=True, timeout=10)
            if proc.returncode == 0:
                return parse_ibdev2netdev(proc.stdout), "ibdev2netdev"
        except (OSError, subprocess.TimeoutExpired):
            pass
    return read_hcas_sysfs(), "/sys/class/infiniband"


def parse_if_list(spec: str | None) -> tuple[list[tuple[str, int]], bool, bool]:
    """NCCL's list syntax: ``[^][=]name[:port],...`` -> (entries, exclude, exact)."""
    if not spec:
        return [], False, False
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    entries = []
    for item in spec.split(","):
        name, _, port = item.strip().partition(":")
        if name:
            entries.append((name, int(port) if port.isdigit() else -1))
    return entries, exclude, exact


def match_if_list(name: str, port: int, spec: str | None) -> bool:
    """Whether NCCL's ``matchIfList`` keeps ``name:port`` for this env value (prefix match)."""
    entries, exclude, exact = parse_if_list(spec)
    if not entries:
        return True
    hit = any(
        (name == want if exact else name.startswith(want)) and want_port in (-1, port)
        for want, want_port in entries
    )
    return hit != exclude


def interface_addrs() -> dict[str, str]:
    """IPv4 address of every interface that has one (SIOCGIFADDR), in kernel order."""
    addrs: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            addrs[name] = socket.inet_ntoa(packed[20:24])
    return addrs


def find_socket_ifs(env: Mapping[str, str], addrs: Mapping[str, str]) -> list[str]:
    """NCCL's ncclFindInterfaces: NCCL_SOCKET_IFNAME, else ib*, else not docker/lo, ..."""
    names = list(addrs)
    spec = env.get("NCCL_SOCKET_IFNAME")
    if spec:
        return [n for n in names if match_if_list(n, -1, spec)]
    for choice in ("ib", "^docker,lo", "docker", "lo"):
        found = [n for n in names if match_if_list(n, -1, choice)]
        if found:
            return found
    return []


def predict_transport(
    env: Mapping[str, str], hcas: Sequence[Hca], addrs: Mapping[str, str]
) -> list[str]:
    """The NCCL INFO messages (without prefix) NCCL would print choosing its network."""
    lines: list[str] = []
    sock_ifs = find_socket_ifs(env, addrs)
    if env.get("NCCL_SOCKET_IFNAME"):
        lines.append(f"NCCL_SOCKET_IFNAME set by environment to {env['NCCL_SOCKET_IFNAME']}")
    if sock_ifs:
        lines.append(f"Bootstrap : Using {sock_ifs[0]}:{addrs[sock_ifs[0]]}<0>")
    else:
        lines.append("Bootstrap : no socket interface found")
    net = env.get("NCCL_NET", "").strip().lower()
    disabled = env.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0")
    if "NCCL_IB_DISABLE" in env:
        lines.append(f"NCCL_IB_DISABLE set by environment to {env['NCCL_IB_DISABLE']}.")
    chosen: list[Hca] = []
    if net != "socket" and not disabled:
        spec = env.get("NCCL_IB_HCA")
        if spec:
            lines.append(f"NCCL_IB_HCA set to {spec}")
        chosen = [h for h in hcas if h.up and match_if_list(h.dev, h.port, spec)]
        if not chosen:
            lines.append("NET/IB : No device found.")
    if chosen and sock_ifs:
        devs = " ".join(f"[{i}]{h.dev}:{h.port}/{h.link_layer}" for i, h in enumerate(chosen))
        oob = f"{sock_ifs[0]}:{addrs[sock_ifs[0]]}<0>"
        lines.append(f"NET/IB : Using {devs} ; OOB {oob}")
        lines.append("Using network IB")
    elif sock_ifs:
        used = " ".join(f"[{i}]{n}:{addrs[n]}<0>" for i, n in enumerate(sock_ifs))
        lines.append(f"NET/Socket : Using {used}")
        lines.append("Using network Socket")
    else:
        lines.append("NET/Socket : no interface found")
    return lines


def nccl_prefix() -> str:
    host = socket.gethostname().split(".")[0]
    return f"{host}:{os.getpid()}:{threading.get_native_id()} [0] NCCL INFO "


def print_predicted_transport(env: Mapping[str, str]) -> None:
    hcas, source = read_hcas()
    lines = predict_transport(env, hcas, interface_addrs())
    say(PREDICTED_BEGIN)
    say(
        f"# (HCA state from {source}: "
        + (", ".join(f"{h.dev}={'Up' if h.up else 'Down'}" for h in hcas) or "no HCA")
        + ")"
    )
    prefix = nccl_prefix()
    for line in lines:
        say(prefix + line)
    say(PREDICTED_END)
