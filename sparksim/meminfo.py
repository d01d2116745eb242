"""A GB10's ``/proc/meminfo`` for the simulated nodes.

A DGX Spark's 128 GB LPDDR5X is one pool that the kernel reports in /proc/meminfo and
CUDA allocates from (~119.7 GiB is the total CUDA reports: vLLM's `Free memory on device
(58.2/119.7 GiB)`). The machine running sparksim has its own, smaller memory, so each
node's /proc/meminfo is a file of its own, bound over /proc/meminfo in the node's mount
namespace (as LXCFS does for containers): ``cat /proc/meminfo`` over SSH reads it, as on a
real node. The figures are an idle node's; ``fault memory-held`` takes from them. The file
is rewritten in place (never replaced: the bind mount holds its inode).
"""

from __future__ import annotations

from pathlib import Path

GIB_KB = 1024 * 1024
MEM_TOTAL_KB = 125_513_324  # 119.7 GiB
IDLE_USED_KB = 3_459_652  # an idle DGX OS with Docker, sshd and the desktop off
CACHED_KB = 4_817_236
BUFFERS_KB = 212_408
SWAP_KB = 16_777_212  # a 16 GiB swap file
MIN_FREE_KB = 262_144  # the kernel keeps a few hundred MiB free whatever holds the rest


def meminfo_text(held_kb: int = 0) -> str:
    """/proc/meminfo of an idle GB10 node, less ``held_kb`` held by a process (anonymous,
    unreclaimable memory: it comes out of MemFree, MemAvailable and the page cache)."""
    free = MEM_TOTAL_KB - IDLE_USED_KB - CACHED_KB - BUFFERS_KB - held_kb
    cache = CACHED_KB
    if free < MIN_FREE_KB:  # the kernel drops page cache before it runs out
        cache = max(0, cache - (MIN_FREE_KB - free))
        free = MIN_FREE_KB
    available = free + cache + BUFFERS_KB - MIN_FREE_KB // 2
    anon = IDLE_USED_KB // 2 + held_kb
    rows = [
        ("MemTotal", MEM_TOTAL_KB),
        ("MemFree", free),
        ("MemAvailable", max(0, available)),
        ("Buffers", BUFFERS_KB),
        ("Cached", cache),
        ("SwapCached", 0),
        ("Active", anon + cache // 2),
        ("Inactive", cache // 2),
        ("Active(anon)", anon),
        ("Inactive(anon)", 0),
        ("Active(file)", cache // 2),
        ("Inactive(file)", cache // 2),
        ("Unevictable", 0),
        ("Mlocked", 0),
        ("SwapTotal", SWAP_KB),
        ("SwapFree", SWAP_KB),
        ("Dirty", 124),
        ("Writeback", 0),
        ("AnonPages", anon),
        ("Mapped", 402_112),
        ("Shmem", 38_912),
        ("KReclaimable", 301_568),
        ("Slab", 652_288),
        ("SReclaimable", 301_568),
        ("SUnreclaim", 350_720),
        ("KernelStack", 21_376),
        ("PageTables", 19_840 + held_kb // 512),
        ("CommitLimit", MEM_TOTAL_KB // 2 + SWAP_KB),
        ("Committed_AS", 5_123_456 + held_kb),
        ("VmallocTotal", 133_143_592_960),
        ("VmallocUsed", 98_304),
        ("VmallocChunk", 0),
        ("Percpu", 11_520),
        ("HugePages_Total", None),
        ("HugePages_Free", None),
        ("HugePages_Rsvd", None),
        ("HugePages_Surp", None),
        ("Hugepagesize", 2048),
        ("Hugetlb", 0),
    ]
    lines = []
    for key, value in rows:
        if value is None:
            lines.append(f"{key + ':':<16}{0:>8}")
        else:
            lines.append(f"{key + ':':<16}{value:>8} kB")
    return "\n".join(lines) + "\n"


def write_meminfo(path: Path, held_kb: int = 0) -> None:
    """Write the node's meminfo in place (same inode: it is bound over /proc/meminfo)."""
    text = meminfo_text(held_kb).encode()
    with open(path, "r+b" if path.exists() else "wb") as f:
        f.write(text)
        f.truncate()
