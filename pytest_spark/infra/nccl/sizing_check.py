"""The memory guard of our own NCCL sweep: its largest message sized from the nodes'
MemAvailable. Pure: the profile's sizes and every node's MemAvailable in, the sizes to
run (and a note when they were capped) out.

Why. A 16 GB nccl-tests buffer froze a Spark until a power cycle: "The suggested 16 GB
validation test (`-b 16G -e 16G -f 2`) freezes one node completely (unified-memory OOM
with a desktop session active)" (NVIDIA/dgx-spark-playbooks#102); "The 16 GB test buffer
allocates ~32 GB per node in unified memory" (PR #103). On GB10 the GPU's buffers come
out of the same LPDDR5X pool as the OS, so a sweep sized past what the node has free
takes the node down, not the test. The 16G command is still in the official playbook.

The rule. Each rank holds ``BUFFERS`` message-sized buffers (our script: the input and
the work buffer; nccl-tests: send and receive, PR #103's "16 GB ... ~32 GB per node").
Together they may take at most ``nccl.max_mem_share`` (0.25) of the smallest node's
MemAvailable. A quarter, because MemAvailable is an estimate the kernel reaches only by
dropping page cache, and the rest of the node (a desktop session, the serving engine
attached beside the sweep, the engine's next load) lives in the same pool: at a quarter
the playbook's 16 GB test (32 GB) would need 128 GB available, more than a Spark's 119.7
GiB, so it never runs here, while the profile's 1 GiB sweep (2 GiB) needs only 8 GiB
free. The cap is rounded down to a size the sweep reaches (``min_bytes`` doubled), and a
cap below ``min_bytes`` lowers both ends to it: the sweep runs smaller rather than not
at all, and the note says so.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUFFERS", "SweepSizes", "sweep_sizes"]

BUFFERS = 2  # message-sized buffers per rank (allreduce.py: src + work)
SMALLEST = 4  # one float32


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class SweepSizes:
    """The sweep's smallest and largest message; ``capped`` says why they are below the
    profile's (None: the profile's sizes fit)."""

    min_bytes: int
    max_bytes: int
    capped: str | None = None


def sweep_sizes(
    min_bytes: int, max_bytes: int, available: dict[str, int | None], share: float
) -> SweepSizes:
    """The sizes to run: the profile's, or capped so that ``BUFFERS`` buffers of the
    largest fit in ``share`` of the smallest MemAvailable (``available``: bytes by node;
    None where the node's could not be read, which caps nothing)."""
    if not 0 < share <= 1:
        raise ValueError(f"nccl.max_mem_share {share}: need 0 < share <= 1")
    known = {node: b for node, b in available.items() if b is not None}
    if not known:
        return SweepSizes(min_bytes, max_bytes)
    node = min(known, key=lambda n: known[n])
    room = int(known[node] * share) // BUFFERS
    if max_bytes <= room:
        return SweepSizes(min_bytes, max_bytes)
    if room >= min_bytes:
        top = min_bytes
        while top * 2 <= room:
            top *= 2
        low = min_bytes
    else:
        top = SMALLEST
        while top * 2 <= room:
            top *= 2
        low = top
    why = (
        f"sweep capped at {_size(top)} (profile nccl.max_bytes {_size(max_bytes)}): {node} "
        f"has {known[node] / (1 << 30):.1f} GiB MemAvailable and the sweep's {BUFFERS} "
        f"buffers a rank may take {share:g} of it ({_size(room * BUFFERS)}; a 16 GB nccl-tests "
        "buffer froze a Spark: dgx-spark-playbooks#102)"
    )
    return SweepSizes(low, top, why)
