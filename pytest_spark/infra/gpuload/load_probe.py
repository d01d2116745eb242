#!/usr/bin/env python3
"""A short GPU load (standalone: stdlib plus torch where it exists), run on a node before
serving while nvidia-smi samples the GPU::

    python3 load_probe.py SECONDS WHERE

With torch and CUDA it multiplies two 4096 x 4096 bf16 matrices in a loop for SECONDS
(3 x 32 MiB of memory: nothing a Spark's unified memory notices), synchronising every 20
products. Without them it says so and spins the CPU for SECONDS instead, so the caller's
samples show whether anything reached the GPU (its utilisation stays low on a real one).
The last line is the summary the suite parses::

    load device=cuda seconds=20 work=4180 where=vllm-node
    load device=cpu seconds=20 work=311 where=host why=torch: No module named 'torch'
"""

from __future__ import annotations

import sys
import time
from typing import Any


def main(argv: list[str]) -> int:
    seconds = float(argv[1]) if len(argv) > 1 else 10.0
    where = argv[2] if len(argv) > 2 else "host"
    end = time.monotonic() + seconds
    why = ""
    torch: Any = None
    try:
        import torch

        if not torch.cuda.is_available():
            why = "torch: no CUDA device"
    except Exception as exc:  # any import failure: no torch to load the GPU with
        why = f"torch: {exc}"
    work = 0
    if not why:
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        while time.monotonic() < end:
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()
            work += 20
        print(f"load device=cuda seconds={seconds:g} work={work} where={where}", flush=True)
        return 0
    while time.monotonic() < end:
        x = 0
        for i in range(100_000):
            x += i * i
        work += 1
    print(f"load device=cpu seconds={seconds:g} work={work} where={where} why={why}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
