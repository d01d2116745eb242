#!/usr/bin/env python3
"""All-reduce (and all-gather) bus bandwidth between nodes, printed in nccl-tests' format.

Standalone: stdlib plus torch, copied to every node by pytest_spark and run there once per
rank::

    python3 allreduce.py --rank R --world-size N --master-addr HEAD_FABRIC_IP \\
        --master-port 29500 --min-bytes 1M --max-bytes 1G [--backend auto|nccl|gloo] \\
        [--collectives all_reduce,all_gather,latency]

``--collectives`` runs several sweeps in one launch, on the same process group (one torch
import and one rendezvous per rank): ``all_reduce`` (``all_reduce_perf``), ``all_gather``
(``all_gather_perf``: busbw = algbw * (n-1)/n, size the whole gathered buffer, count the
elements each rank sends, as nccl-tests prints them) and ``latency`` (the all-reduce again
at ``--latency-min-bytes``..``--latency-max-bytes``, 8 B..1 MiB: the time column is the
small-message latency). Each sweep after the first is preceded by a
``# pytest_spark: section NAME`` line and every sweep by nccl-tests' own
``# Collective test starting: X_perf`` line, so one output splits into one table each.

Ranks meet over TCP at ``--master-addr`` (the head's fabric address); the interface comes
from ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` as vLLM's containers set them. Backend
``auto`` is nccl where CUDA exists, gloo otherwise. For every size it times float32 sum
all-reduce out-of-place (a copy of the input, outside the timed region, then the collective)
and in-place, and prints nccl-tests rows: ``algbw = bytes / time`` (GB = 1e9 B) and
``busbw = algbw * 2(n-1)/n``. Rank 0 prints the table; every rank prints its log lines.

Transport lines. With nccl, NCCL itself prints ``NCCL INFO`` lines when ``NCCL_DEBUG=INFO``.
With gloo there is no NCCL, so the script prints the transport NCCL *would select* from the
same inputs NCCL reads (``NCCL_NET``, ``NCCL_IB_DISABLE``, ``NCCL_IB_HCA``,
``NCCL_SOCKET_IFNAME``, HCA state from ``ibdev2netdev`` or ``/sys/class/infiniband``), in
NCCL's own line format, between two ``# pytest_spark:`` comment lines saying so. They are a
prediction, never a measurement.

Bounds: sizes above 4 GiB are refused (16 GiB buffers froze DGX Sparks: unified memory). If
the rendezvous and a first small all-reduce do not finish within ``--init-timeout`` seconds,
the script prints an ``init timeout`` line and exits 3; past ``--deadline`` seconds it exits
124. Exit 1: wrong values; 2: bad arguments; 4: a collective failed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import fcntl
import math
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROGRAM = "pytest_spark allreduce"
MAX_BYTES = 4 << 30  # never above 4 GiB: 16 GiB all-reduce buffers froze DGX Sparks
EXIT_WRONG, EXIT_USAGE, EXIT_INIT_TIMEOUT, EXIT_FAILED, EXIT_DEADLINE = 1, 2, 3, 4, 124
PREDICTED_BEGIN = (
    "# pytest_spark: transport NCCL would select (computed from NCCL_* env and HCA state; "
    "not a measurement, this run uses gloo over TCP):"
)
PREDICTED_END = "# pytest_spark: end of transport NCCL would select"
CHECK_CHUNK = 1 << 24  # elements per validation chunk (bounds temporaries to 64 MiB)
SECTION = "# pytest_spark: section "
COLLECTIVES = ("all_reduce", "all_gather", "latency")
PERF_NAME = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
             "latency": "all_reduce_perf"}  # fmt: skip


def say(line: str = "") -> None:
    print(line, flush=True)


def flush_all() -> None:
    """Flush Python's and C's stdio (NCCL writes with printf) before a hard exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


def die(code: int, line: str) -> None:
    say(line)
    flush_all()
    os._exit(code)


# ----------------------------------------------------------------------------- arguments


def parse_size(text: str) -> int:
    """``1048576``, ``1M``, ``1MiB``, ``4G``: powers of 1024, as nccl-tests' -b/-e read them."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)(i?[bB])?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1048576, 1M, 1GiB)")
    scale = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[match.group(2).lower()]
    return int(match.group(1)) << scale


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="allreduce.py", description="All-reduce bus bandwidth, nccl-tests format."
    )
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--master-addr", required=True, help="the head's fabric address")
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--min-bytes", type=parse_size, default=1 << 20)
    parser.add_argument("--max-bytes", type=parse_size, default=1 << 30)
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    parser.add_argument("--init-timeout", type=float, default=60.0, metavar="S")
    parser.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        metavar="S",
        help="exit 124 after S seconds in all (0: no deadline)",
    )
    parser.add_argument("--token", default="", help="run id (lets the launcher find us)")
    parser.add_argument(
        "--collectives",
        default="all_reduce",
        help="comma list of sweeps, run in this order: all_reduce, all_gather, latency",
    )
    parser.add_argument("--latency-min-bytes", type=parse_size, default=8)
    parser.add_argument("--latency-max-bytes", type=parse_size, default=1 << 20)
    return parser


def collectives(args: argparse.Namespace) -> list[str]:
    return [c.strip() for c in args.collectives.split(",") if c.strip()]


def validate(args: argparse.Namespace) -> str | None:
    if args.world_size < 1 or not 0 <= args.rank < args.world_size:
        return f"rank {args.rank} is not in 0..{args.world_size - 1}"
    if args.min_bytes < 4 or args.max_bytes < args.min_bytes:
        return f"sizes {args.min_bytes}..{args.max_bytes} B: need 4 <= min <= max"
    if args.max_bytes > MAX_BYTES:
        return (
            f"refusing --max-bytes {args.max_bytes}: above 4 GiB ({MAX_BYTES} B); 16 GiB "
            "all-reduce buffers froze DGX Sparks (unified memory)"
        )
    if args.factor < 2:
        return f"--factor {args.factor}: must be >= 2"
    if args.iters < 1 or args.warmup < 0:
        return "--iters must be >= 1 and --warmup >= 0"
    if not 1 <= args.master_port <= 65535:
        return f"--master-port {args.master_port} is not a TCP port"
    wanted = collectives(args)
    unknown = [c for c in wanted if c not in COLLECTIVES]
    if unknown or not wanted or len(set(wanted)) != len(wanted):
        return f"--collectives {args.collectives!r}: each of {', '.join(COLLECTIVES)} at most once"
    if "latency" in wanted and not 4 <= args.latency_min_bytes <= args.latency_max_bytes:
        return (
            f"latency sizes {args.latency_min_bytes}..{args.latency_max_bytes} B: need "
            "4 <= min <= max"
        )
    if "latency" in wanted and args.latency_max_bytes > MAX_BYTES:
        return f"refusing --latency-max-bytes {args.latency_max_bytes}: above 4 GiB"
    return None


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """nccl-tests' sweep: min, min*f, ... <= max; each a whole number of float32."""
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size - size % 4)
        size *= factor
    return out


# ------------------------------------------------------------ transport NCCL would select


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


# ----------------------------------------------------------------------------- formatting


def float_str(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: as many decimals as the width allows."""
    if not math.isfinite(value):
        return f"{value!s:>{width}}"
    power, val = 0, 1
    while value >= val:
        power += 1
        val *= 10
    if power < width - 2:
        return f"{value:{width}.2f}"
    if power < width - 1:
        return f"{value:{width}.1f}"
    if power < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}"


def header_lines() -> list[str]:
    blank = ("", "", "", "", "")
    return [
        "#",
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place"
        "                       in-place          ".format(*blank),
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}"
        "  {:>6} ".format(
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong",
        ),
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}"
        "  {:>6} ".format(
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
        ),
    ]


def bus_factor(collective: str, nranks: int) -> float:
    """nccl-tests' busbw factor (doc/PERFORMANCE.md): all-reduce 2(n-1)/n, all-gather (n-1)/n."""
    if collective == "all_gather":
        return (nranks - 1) / nranks
    return 2 * (nranks - 1) / nranks


def row_line(
    nbytes: int,
    count: int,
    results: Iterable[tuple[float, int]],
    nranks: int,
    collective: str = "all_reduce",
) -> str:
    """One nccl-tests row from (seconds per iteration, wrong elements) per placement.
    all_gather rows, as all_gather_perf prints them: redop ``none``, ``count`` the elements
    each rank sends, ``nbytes`` the whole gathered buffer."""
    redop = "none" if collective == "all_gather" else "sum"
    line = f"{nbytes:12d}  {count:12d}  {'float':>8}  {redop:>6}  {-1:6d}"
    for seconds, wrong in results:
        algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        busbw = algbw * bus_factor(collective, nranks)
        cols = (float_str(seconds * 1e6, 7), float_str(algbw, 6), float_str(busbw, 6))
        line += "  {:>7}  {:>6}  {:>6}".format(*cols) + f"  {float(wrong):>6g}"
    return line


# ------------------------------------------------------------------------------ measuring


class Bench:
    """All-reduce timing over an initialised torch.distributed process group."""

    def __init__(self, torch: Any, dist: Any, device: Any, rank: int, nranks: int) -> None:
        self.torch, self.dist, self.device = torch, dist, device
        self.rank, self.nranks = rank, nranks
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def fill(self, buf: Any, count: int) -> None:
        """Rank-dependent, exactly summable input: (i % 13) + rank + 1."""
        torch = self.torch
        for off in range(0, count, CHECK_CHUNK):
            n = min(CHECK_CHUNK, count - off)
            chunk = torch.arange(off, off + n, device=self.device, dtype=torch.float64)
            buf[off : off + n].copy_(chunk.remainder_(13).add_(self.rank + 1))

    def wrong(self, buf: Any, count: int) -> int:
        torch, n = self.torch, self.nranks
        bad = 0
        for off in range(0, count, CHECK_CHUNK):
            m = min(CHECK_CHUNK, count - off)
            exp = torch.arange(off, off + m, device=self.device, dtype=torch.float64)
            exp.remainder_(13).mul_(n).add_(n * (n + 1) // 2)
            bad += int((buf[off : off + m].double() != exp).sum().item())
        return bad

    def allreduce(self, buf: Any) -> None:
        self.dist.all_reduce(buf, op=self.dist.ReduceOp.SUM)

    def time_size(self, src: Any, work: Any, count: int, iters: int) -> list[tuple[float, int]]:
        s, w = src[:count], work[:count]
        # out-of-place: a fresh copy of the input each time, the copy outside the timing
        total = 0.0
        for _ in range(iters):
            w.copy_(s)
            self.sync()
            t0 = time.perf_counter()
            self.allreduce(w)
            self.sync()
            total += time.perf_counter() - t0
        oop = total / iters
        w.copy_(s)
        self.allreduce(w)
        self.sync()
        oop_wrong = self.wrong(w, count)
        # in-place: back-to-back collectives on one buffer, as nccl-tests times them
        w.zero_()
        self.sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            self.allreduce(w)
        self.sync()
        ip = (time.perf_counter() - t0) / iters
        w.copy_(s)
        self.allreduce(w)
        self.sync()
        ip_wrong = self.wrong(w, count)
        # the slowest rank's time (the collective is only done when every rank is done)
        times = self.torch.tensor([oop, ip], dtype=self.torch.float64, device=self.device)
        errors = self.torch.tensor(
            [oop_wrong, ip_wrong], dtype=self.torch.float64, device=self.device
        )
        self.dist.all_reduce(times, op=self.dist.ReduceOp.MAX)
        self.dist.all_reduce(errors, op=self.dist.ReduceOp.SUM)
        return [(float(times[0]), int(errors[0])), (float(times[1]), int(errors[1]))]

    def gathered_wrong(self, out: Any, count: int) -> int:
        """Wrong elements of a gathered buffer: chunk r holds rank r's input."""
        torch, bad = self.torch, 0
        for r in range(self.nranks):
            chunk = out[r * count : (r + 1) * count]
            for off in range(0, count, CHECK_CHUNK):
                m = min(CHECK_CHUNK, count - off)
                exp = torch.arange(off, off + m, device=self.device, dtype=torch.float64)
                exp.remainder_(13).add_(r + 1)
                bad += int((chunk[off : off + m].double() != exp).sum().item())
        return bad

    def allgather(self, out: Any, inp: Any, count: int) -> None:
        chunks = [out[r * count : (r + 1) * count] for r in range(self.nranks)]
        self.dist.all_gather(chunks, inp)

    def time_gather(self, src: Any, out: Any, count: int, iters: int) -> list[tuple[float, int]]:
        """all_gather of ``count`` elements per rank, out-of-place then in-place (the rank's
        own chunk of the output is its input), back to back as nccl-tests times them."""
        n, mine = self.nranks, src[:count]
        outv = out[: count * n]
        results = []
        for in_place in (False, True):
            own = outv[self.rank * count : (self.rank + 1) * count]
            inp = own if in_place else mine
            outv.zero_()
            own.copy_(mine)
            self.sync()
            t0 = time.perf_counter()
            for _ in range(iters):
                self.allgather(outv, inp, count)
            self.sync()
            seconds = (time.perf_counter() - t0) / iters
            results.append((seconds, self.gathered_wrong(outv, count)))
        times = self.torch.tensor([t for t, _ in results], dtype=self.torch.float64,
                                  device=self.device)  # fmt: skip
        errors = self.torch.tensor([float(w) for _, w in results], dtype=self.torch.float64,
                                   device=self.device)  # fmt: skip
        self.dist.all_reduce(times, op=self.dist.ReduceOp.MAX)
        self.dist.all_reduce(errors, op=self.dist.ReduceOp.SUM)
        return [(float(times[0]), int(errors[0])), (float(times[1]), int(errors[1]))]


def device_line(torch: Any, backend: str, rank: int, device: Any) -> str:
    host = socket.gethostname().split(".")[0]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        ids = [
            int(getattr(props, key, 0) or 0)
            for key in ("pci_domain_id", "pci_bus_id", "pci_device_id")
        ]
        bus = f"{ids[0]:04x}:{ids[1]:02x}:{ids[2]:02x}"
        index, name = device.index or 0, props.name
    else:
        bus, index, name = "cpu", 0, f"CPU ({backend} over TCP)"
    pid = os.getpid()
    return f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10} device {index:2d} [{bus}] {name}"


def gather_lines(torch: Any, dist: Any, device: Any, line: str, width: int = 512) -> list[str]:
    """Every rank's line, in rank order (fixed-width byte tensors: no pickling, no numpy)."""
    data = line.encode()[:width].ljust(width, b"\0")
    mine = torch.tensor(list(data), dtype=torch.uint8, device=device)
    out = [
        torch.empty(width, dtype=torch.uint8, device=device) for _ in range(dist.get_world_size())
    ]
    dist.all_gather(out, mine)
    return [bytes(t.tolist()).rstrip(b"\0").decode(errors="replace") for t in out]


def start_timer(seconds: float, code: int, line: str) -> threading.Timer:
    timer = threading.Timer(seconds, die, args=(code, line))
    timer.daemon = True
    timer.start()
    return timer


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if args.deadline > 0:
        start_timer(
            args.deadline,
            EXIT_DEADLINE,
            f"# {PROGRAM}: deadline of {args.deadline:g} s reached (rank {args.rank}); exiting",
        )
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        say(f"# {PROGRAM}: error: cannot import torch: {exc}")
        return EXIT_FAILED
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        say(f"# {PROGRAM}: error: backend nccl needs CUDA, and torch sees no GPU")
        return EXIT_USAGE
    ifname = os.environ.get("GLOO_SOCKET_IFNAME" if backend == "gloo" else "NCCL_SOCKET_IFNAME")
    world, rank = args.world_size, args.rank
    if rank == 0:
        say(f"# nccl-tests-compatible output from {PROGRAM} (backend {backend})")
        say(
            f"# nThread 1 nGpus 1 minBytes {args.min_bytes} maxBytes {args.max_bytes} step: "
            f"{args.factor}(factor) warmup iters: {args.warmup} iters: {args.iters} agg iters: 1 "
            "validation: 1 graph: 0"
        )
    else:
        say(
            f"# {PROGRAM} rank {rank} of {world} (backend {backend}): log lines only; rank 0 "
            "prints the results"
        )
    if backend == "gloo" and os.environ.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE"):
        print_predicted_transport(os.environ)
    url = f"tcp://{args.master_addr}:{args.master_port}"
    say(
        f"# {PROGRAM}: rank {rank} of {world} joining {url} (backend {backend}, "
        f"{'GLOO' if backend == 'gloo' else 'NCCL'}_SOCKET_IFNAME={ifname or '(unset)'})"
    )
    init_timer = start_timer(
        args.init_timeout,
        EXIT_INIT_TIMEOUT,
        f"# {PROGRAM}: init timeout: rank {rank} of {world} did not complete the rendezvous "
        f"at {url} and a first all-reduce within {args.init_timeout:g} s (backend {backend}, "
        f"socket interface {ifname or '(unset)'})",
    )
    t_init = time.monotonic()
    if backend == "nccl":
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # gloo does the reduction; spare the CPUs for its I/O threads
    try:
        dist.init_process_group(
            backend,
            init_method=url,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=args.init_timeout + 30),
        )
        probe = torch.ones(1, device=device)
        dist.all_reduce(probe)  # NCCL builds its channels here: a hang is an init hang
        if backend == "nccl":
            torch.cuda.synchronize()
        devices = gather_lines(torch, dist, device, device_line(torch, backend, rank, device))
    except Exception as exc:  # the peers never met, or the first collective failed
        init_timer.cancel()
        say(
            f"# {PROGRAM}: init failed: rank {rank} of {world} at {url}: "
            f"{type(exc).__name__}: {exc}".replace("\n", " ")
        )
        return EXIT_FAILED
    init_timer.cancel()
    say(f"# {PROGRAM}: rendezvous complete: {world} ranks in {time.monotonic() - t_init:.2f} s")
    if rank == 0:
        say("#")
        say("# Using devices")
        for line in devices:
            say(line)
    code = measure(args, torch, dist, device, backend)
    with contextlib.suppress(Exception):  # teardown of a finished run: nothing to report
        dist.destroy_process_group()
    say(f"# {PROGRAM}: rank {rank} done in {time.monotonic() - started:.1f} s")
    return code


def section_sizes(args: argparse.Namespace, collective: str) -> list[int]:
    """The sweep of one section: all-gather sizes are whole float32 elements per rank."""
    if collective == "latency":
        return sizes(args.latency_min_bytes, args.latency_max_bytes, args.factor)
    steps = sizes(args.min_bytes, args.max_bytes, args.factor)
    if collective == "all_gather":
        unit = 4 * args.world_size
        steps = [s - s % unit for s in steps if s >= unit]
    return steps


def measure(args: argparse.Namespace, torch: Any, dist: Any, device: Any, backend: str) -> int:
    world, rank = args.world_size, args.rank
    wanted = collectives(args)
    max_count = max(max(section_sizes(args, c), default=4) for c in wanted) // 4
    bench = Bench(torch, dist, device, rank, world)
    try:
        src = torch.empty(max_count, dtype=torch.float32, device=device)
        work = torch.empty(max_count, dtype=torch.float32, device=device)
        bench.fill(src, max_count)
    except Exception as exc:
        say(f"# {PROGRAM}: error: buffers of {max_count * 4} B failed on rank {rank}: {exc}")
        return EXIT_FAILED
    code = 0
    for i, collective in enumerate(wanted):
        if i and rank == 0:
            say(f"{SECTION}{collective}")
        code = max(code, sweep(args, bench, src, work, collective, backend))
        if code == EXIT_FAILED:
            break  # a collective that failed leaves the group unusable for the next
    return code


def sweep(
    args: argparse.Namespace, bench: Bench, src: Any, work: Any, collective: str, backend: str
) -> int:
    """One nccl-tests table (header, rows, footer) for one collective."""
    world, rank = args.world_size, args.rank
    steps = section_sizes(args, collective)
    gather = collective == "all_gather"
    name = "all-gather" if gather else "all-reduce"
    try:
        if rank == 0:
            say(f"# Collective test starting: {PERF_NAME[collective]}")
        largest = steps[-1] // 4
        work.zero_()
        for _ in range(args.warmup):  # nccl-tests warms up at the largest size
            if gather:
                bench.allgather(work, src[: largest // world], largest // world)
            else:
                bench.allreduce(work[:largest])
        bench.sync()
        if rank == 0:
            for line in header_lines():
                say(line)
        busbws: list[float] = []
        errors = 0
        factor = bus_factor("all_gather" if gather else "all_reduce", world)
        for nbytes in steps:
            count = nbytes // 4 // world if gather else nbytes // 4
            if gather:
                results = bench.time_gather(src, work, count, args.iters)
            else:
                bench.allreduce(work[:count])  # one untimed pass per size
                results = bench.time_size(src, work, count, args.iters)
            for seconds, wrong in results:
                errors += wrong
                busbws.append(nbytes / seconds / 1e9 * factor if seconds else 0)
            if rank == 0:
                say(row_line(nbytes, count, results, world, collective))
    except Exception as exc:
        say(
            f"# {PROGRAM}: error: {name} failed on rank {rank}: {type(exc).__name__}: "
            f"{exc}".replace("\n", " ")
        )
        return EXIT_FAILED
    if rank == 0:
        avg = sum(busbws) / len(busbws) if busbws else 0.0
        say(f"# {'Out of bounds values':<20} : {errors} {'FAILED' if errors else 'OK'}")
        say(f"# {'Avg bus bandwidth':<20} : {avg:g} ")
        say("#")
        say(f"# Collective test concluded: {PROGRAM} (backend {backend})")
    return EXIT_WRONG if errors else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = validate(args)
    if problem:
        say(f"# {PROGRAM}: error: {problem}")
        return EXIT_USAGE
    try:
        return run(args)
    except KeyboardInterrupt:
        say(f"# {PROGRAM}: interrupted (rank {args.rank})")
        return 130
    finally:
        flush_all()


if __name__ == "__main__":
    sys.exit(main())
