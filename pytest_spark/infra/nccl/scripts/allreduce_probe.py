#!/usr/bin/env python3
"""All-reduce (and all-gather) bus bandwidth between nodes, printed in nccl-tests' format.

Standalone: stdlib plus torch, copied to every node by pytest_spark (bundled with
its modules ``predict_probe.py`` and ``table_probe.py``) and run there once per rank::

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

Transport lines. With gloo and ``NCCL_DEBUG=INFO`` the script prints the transport NCCL
*would select*, labelled a prediction (``predict_probe.py``, shipped with it).

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
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

if __package__:  # imported as pytest_spark's module (its tests)
    from .predict_probe import print_predicted_transport
    from .table_probe import bus_factor, header_lines, row_line
else:  # run on a node: the bundle, or this file's folder, holds its modules
    from predict_probe import print_predicted_transport  # type: ignore[no-redef]
    from table_probe import (  # type: ignore[no-redef]
        bus_factor,
        header_lines,
        row_line,
    )

PROGRAM = "pytest_spark allreduce"
MAX_BYTES = 4 << 30  # never above 4 GiB: 16 GiB all-reduce buffers froze DGX Sparks
EXIT_WRONG, EXIT_USAGE, EXIT_INIT_TIMEOUT, EXIT_FAILED, EXIT_DEADLINE = 1, 2, 3, 4, 124
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
    announce(args, backend)
    device = join(args, torch, dist, backend)
    if device is None:
        return EXIT_FAILED
    code = measure(args, torch, dist, device, backend)
    with contextlib.suppress(Exception):  # teardown of a finished run: nothing to report
        dist.destroy_process_group()
    say(f"# {PROGRAM}: rank {args.rank} done in {time.monotonic() - started:.1f} s")
    return code


def socket_ifname(backend: str) -> str | None:
    """The interface the backend's sockets use, as its environment names it."""
    return os.environ.get("GLOO_SOCKET_IFNAME" if backend == "gloo" else "NCCL_SOCKET_IFNAME")


def announce(args: argparse.Namespace, backend: str) -> None:
    """The lines before the rendezvous: rank 0's nccl-tests header (others say they only
    log), the transport NCCL would select (gloo with NCCL_DEBUG=INFO), the address joined."""
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
    say(
        f"# {PROGRAM}: rank {rank} of {world} joining {master_url(args)} (backend {backend}, "
        f"{'GLOO' if backend == 'gloo' else 'NCCL'}_SOCKET_IFNAME="
        f"{socket_ifname(backend) or '(unset)'})"
    )


def master_url(args: argparse.Namespace) -> str:
    return f"tcp://{args.master_addr}:{args.master_port}"


def join(args: argparse.Namespace, torch: Any, dist: Any, backend: str) -> Any | None:
    """Meet the other ranks and run a first small all-reduce, within ``--init-timeout``
    (else exit 3); the device, or None when the rendezvous or the first collective failed
    (said). Rank 0 prints every rank's device line."""
    world, rank, url = args.world_size, args.rank, master_url(args)
    init_timer = start_timer(
        args.init_timeout,
        EXIT_INIT_TIMEOUT,
        f"# {PROGRAM}: init timeout: rank {rank} of {world} did not complete the rendezvous "
        f"at {url} and a first all-reduce within {args.init_timeout:g} s (backend {backend}, "
        f"socket interface {socket_ifname(backend) or '(unset)'})",
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
        return None
    init_timer.cancel()
    say(f"# {PROGRAM}: rendezvous complete: {world} ranks in {time.monotonic() - t_init:.2f} s")
    if rank == 0:
        say("#")
        say("# Using devices")
        for line in devices:
            say(line)
    return device


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
