#!/usr/bin/env python3
"""Per-node cost of the loaded-parity probe (issue #28 part 1: budget 5 s a node), before
and after its one speed choice, on a vllm-sized package tree and a rank that mapped a
219 MB libnccl (vllm#41725's pip build size).

The probe is one ``docker exec CONTAINER python3 -c SCRIPT`` inside the node's shared
round trip (pytest_spark/infra/loaded): it walks /proc once (maps and environ of the
serving processes), reads each mapped libnccl's Build ID from its PT_NOTE (a few KiB,
whatever the library's size), and hashes the vllm package tree. The tree is what costs:
"before" hashes every byte; "after" (what ships) hashes a file over 8 MiB (the native
extensions, which --apply-vllm-pr never patches: it rejects non-``vllm/**`` and native
files) by its size and first and last MiB.

    .venv/bin/python benchmarks/loaded_parity.py [--py-files 2500] [--so-mib 96 96 64 32]
        [--runs 3] [--container NAME]

``--container``: also time the real ``docker exec`` of the script in a running container
on this host (the probe as a node runs it, less SSH).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_spark.infra.loaded.probe import inner_script
from sparksim import image

FULL = inner_script().replace("BIG = 8 << 20", "BIG = 1 << 62")
SAMPLED = inner_script()


def make_tree(root: Path, py_files: int, so_mib: list[int]) -> int:
    """A vllm-shaped tree: ``py_files`` sources of ~12 KiB in ~60 folders, and native
    extensions of the given sizes (random bytes: nothing compresses or dedups)."""
    total = 0
    pkg = root / "vllm"
    for i in range(py_files):
        d = pkg / f"sub{i % 60}"
        d.mkdir(parents=True, exist_ok=True)
        data = os.urandom(6 * 1024).hex().encode()
        (d / f"mod{i}.py").write_bytes(data)
        total += len(data)
    (pkg / "__init__.py").write_text('"""vllm (benchmark tree)."""\n')
    for n, mib in enumerate(so_mib):
        with open(pkg / f"_ext{n}.abi3.so", "wb") as fh:
            for _ in range(mib):
                fh.write(os.urandom(1 << 20))
        total += mib << 20
    return total


def time_script(script: str, env: dict[str, str], runs: int) -> tuple[float, dict]:
    samples, last = [], {}
    for _ in range(runs):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
        )
        samples.append(time.perf_counter() - t0)
        last = json.loads(out.stdout)
    return statistics.median(samples), last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--py-files", type=int, default=2500)
    parser.add_argument("--so-mib", type=int, nargs="*", default=[96, 96, 64, 32])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--container", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loaded-bench-") as tmp:
        root = Path(tmp)
        size = make_tree(root, args.py_files, args.so_mib)
        lib = root / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
        lib.parent.mkdir(parents=True)
        with open(lib, "wb") as fh:  # the stand-in's ELF head, padded to 219 MB
            fh.write(image.nccl_library())
            fh.truncate(219_000_000)
        with open(lib, "rb") as fh:  # this process is the "rank": it maps the library
            held = mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        env = {**os.environ, "PYTHONPATH": str(root)}
        full_s, full = time_script(FULL, env, args.runs)
        samp_s, samp = time_script(SAMPLED, env, args.runs)
        held.close()
    ours = [p for p in samp["procs"] if p["pid"] == os.getpid()]
    print(
        f"tree: {args.py_files} .py files + {len(args.so_mib)} native ({sum(args.so_mib)} MiB),"
        f" {size / 2**20:.0f} MiB in all; a rank mapping a 219 MB libnccl "
        f"(Build ID {samp['libs'][str(lib)]['build_id'][:12]}..., read: {bool(ours)})"
    )
    print(f"median of {args.runs} runs, page cache warm, python3 -c SCRIPT on this machine:")
    print(
        f"  before: every byte hashed          {full_s:6.2f} s (script {full['elapsed_s']:.2f} s)"
    )
    print(
        f"  after : >8 MiB files by edges      {samp_s:6.2f} s (script {samp['elapsed_s']:.2f} s)"
    )
    if args.container:
        t0 = time.perf_counter()
        subprocess.run(
            ["docker", "exec", args.container, "python3", "-c", SAMPLED],
            capture_output=True,
            check=True,
        )
        print(f"  docker exec {args.container} (real image) {time.perf_counter() - t0:6.2f} s")
    print("budget: 5 s a node for the whole probe (issue #28)")


if __name__ == "__main__":
    main()
