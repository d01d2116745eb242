"""GB10 memory headroom: will the engine's claim fit in what the node has available, and
leave the OS its share?

On GB10 the GPU has no memory of its own: CUDA allocates from the same LPDDR5X pool that
the kernel reports in ``/proc/meminfo``. vLLM claims ``--gpu-memory-utilization`` x the
device total at startup and refuses to start when less than that is free (``Free memory
on device (58.2/119.7 GiB) on startup is less than desired GPU memory utilization``,
REFERENCE.md §4); what the claim leaves is all the OS, Docker and the API server have.
So a node is fit when ``MemAvailable - claim >= os_headroom``.

**Before the engine runs** (preflight before a launch) the claim is still to come: the
check compares MemAvailable with ``utilization x MemTotal + headroom``. The utilization
is the serve args' ``--gpu-memory-utilization``, else vLLM's default (0.92 in
vllm/config/cache.py since 2025; 0.9 before: the larger one is the one that must fit).

**``--kv-cache-memory-bytes``** on the serve line sizes the KV cache per GPU to that figure
and ignores ``--gpu-memory-utilization`` there (vllm/config/cache.py; the worker's
``determine_available_memory`` returns it as is). The claim is then that figure (the weights
and activations come on top: not counted, so it is a lower bound). vLLM's startup check
(``request_memory`` in vllm/v1/worker/utils.py) still holds the free memory to
``utilization x total`` at start, so that stays a floor too.

**While the engine runs** (attach mode, or a launch already under way) the claim is
already taken: the engine holds it and MemAvailable is what is left after it, so the check
compares MemAvailable with the headroom alone. Counting the claim again would fail every
healthy serving cluster (about 10 GiB available of 120). Counting the engine's own
processes as the claim instead does not work on GB10: CUDA's allocations come from the
driver, not from the process's resident pages, so the engine's RSS is a few GiB while it
holds a hundred. While loading, MemAvailable only falls towards the served figure, so the
headroom form holds at every moment of a healthy start.

A short node names the largest processes outside the serving container (by resident
size, from /proc) and the GPU compute apps with their memory where nvidia-smi gives it
(GB10 may print ``[N/A]``): today operators find and free them by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pytest_spark.infra.finding import Finding, Skip
from pytest_spark.infra.human import gib
from pytest_spark.infra.memory.parse import GIB, ContainerMemory, MemInfo, ProcessMemory
from pytest_spark.infra.memory.probe import NodeMemory

VLLM_DEFAULT_UTILIZATION = 0.92  # vllm/config/cache.py CacheConfig.gpu_memory_utilization
# eugr's gpu-mem-util-gb mod (mods/gpu-mem-util-gb/gpu_mem.patch, request_memory): the
# engine refuses to start unless this much beyond its --gpu-memory-utilization-gb is free
GB_SAFETY_MARGIN = int(0.5 * 1024**3)
MIN_LISTED_BYTES = 1024**3  # smaller processes are not what holds a GB10 short (dockerd is ~0.1)


@dataclass(frozen=True)
class Claim:
    """What the engine will claim: a fraction of the device total, and where it came from."""

    fraction: float
    source: str
    kv_cache_bytes: int | None = None  # --kv-cache-memory-bytes: the KV cache, per GPU
    gib: float | None = None  # --gpu-memory-utilization-gb: GiB per rank, not a fraction

    def startup_bytes(self, total: int) -> int:
        """What vLLM's startup check holds free memory to: ``fraction x total``, or with
        --gpu-memory-utilization-gb, ``ceil(N x 2^30)`` plus the mod's 0.5 GiB margin."""
        if self.gib is not None:
            return -(-int(self.gib * GIB * 1000) // 1000) + GB_SAFETY_MARGIN
        return int(self.fraction * total)

    @classmethod
    def from_serve_args(
        cls,
        utilization: float | None,
        have_args: bool,
        kv_cache_bytes: int | None = None,
        utilization_gb: float | None = None,
    ) -> Claim:
        if utilization_gb is not None:
            claim = cls(
                utilization or VLLM_DEFAULT_UTILIZATION,
                f"--gpu-memory-utilization-gb {utilization_gb:g} in the serve args (eugr's "
                "gpu-mem-util-gb mod: GiB per rank, + 0.5 GiB safety margin)",
                gib=utilization_gb,
            )
        elif utilization is not None:
            claim = cls(utilization, f"--gpu-memory-utilization {utilization:g} in the serve args")
        else:
            where = "the serve args have no" if have_args else "no serve args, so no"
            claim = cls(
                VLLM_DEFAULT_UTILIZATION,
                f"vLLM's default {VLLM_DEFAULT_UTILIZATION:g} ({where} --gpu-memory-utilization)",
            )
        if kv_cache_bytes is None:
            return claim
        return cls(claim.fraction, claim.source, kv_cache_bytes, claim.gib)

    def describe(self) -> str:
        """The claim as the evidence shows it."""
        if self.kv_cache_bytes is None:
            return f"{self.fraction:g} ({self.source})"
        return (
            f"KV cache {gib(self.kv_cache_bytes)} (--kv-cache-memory-bytes in the serve args); "
            f"startup floor {self.fraction:g} ({self.source})"
        )


def holders(
    mem: NodeMemory, own_pids: frozenset[int], limit: int
) -> tuple[list[str], list[ProcessMemory]]:
    """(descriptions, processes) of the largest memory holders outside the serving
    container: processes by RSS, then GPU compute apps not already named."""
    outside = [p for p in mem.processes if p.pid not in own_pids and p.rss >= MIN_LISTED_BYTES]
    top = outside[:limit]
    named = {p.pid for p in top}
    out = [f"pid {p.pid} {p.name} ({_args(p)}) holds {gib(p.rss)} resident" for p in top]
    for app in mem.apps or ():
        if app.pid in own_pids or app.pid in named:
            continue
        used = gib(app.used) if app.used is not None else "memory [N/A] (unified memory)"
        out.append(f"GPU compute app pid {app.pid} {app.name}: {used}")
    return out, top


def _args(p: ProcessMemory, width: int = 100) -> str:
    text = p.args or f"[{p.name}]"
    return text if len(text) <= width else text[: width - 3] + "..."


def _measured(info: MemInfo, available: int) -> dict[str, float]:
    return {
        "mem_total_gib": round(info.total / GIB, 2),
        "mem_available_gib": round(available / GIB, 2),
        "mem_free_gib": round(info.free / GIB, 2),
        "swap_used_gib": round(info.swap_used / GIB, 2),
    }


def _swap(info: MemInfo) -> str:
    if info.swap_total == 0:
        return "no swap"
    return f"swap {gib(info.swap_used)} used of {gib(info.swap_total)}"


# What the headroom check found: enough (with swap in use, or the claim only in page
# cache: warnings), short, or more asked than the node has at all.
HeadroomVerdict = Literal["fits", "swapped", "page cache", "short", "never"]


@dataclass(frozen=True)
class Headroom:
    """The verdict of :func:`check_memory_headroom` and the figures it rests on (bytes)."""

    verdict: HeadroomVerdict
    available: int  # MemAvailable, else MemFree + page cache (``estimated``)
    estimated: bool
    headroom: int  # the OS's share (profile memory.os_headroom_gib)
    gate: int  # vLLM's startup floor (request_memory): Claim.startup_bytes
    claimed: int  # the claim still to come: 0 while the engine runs
    needed: int  # what MemAvailable must be

    def expected(self, os_headroom_gib: float) -> dict[str, float]:
        return {
            "claim_gib": round(self.claimed / GIB, 2),
            "os_headroom_gib": os_headroom_gib,
            "mem_available_gib_min": round(self.needed / GIB, 2),
        }


def headroom_verdict(
    info: MemInfo,
    claim: Claim,
    os_headroom_gib: float,
    *,
    engine_running: bool,
    max_swap_used_gib: float = 1.0,
) -> Headroom:
    """``MemAvailable - claim >= os_headroom_gib`` (the claim 0 while the engine runs; with
    --kv-cache-memory-bytes the KV cache, and never less than vLLM's startup floor)."""
    available = info.available if info.available is not None else info.free + info.cached
    headroom = int(os_headroom_gib * GIB)
    gate = claim.startup_bytes(info.total)  # vLLM's startup check (request_memory)
    kv = claim.kv_cache_bytes
    claimed = 0 if engine_running else gate if kv is None else kv
    needed = claimed + headroom
    if not engine_running and kv is not None:
        needed = max(needed, gate)
    verdict: HeadroomVerdict
    if available >= needed:
        if info.swap_used > int(max_swap_used_gib * GIB):
            verdict = "swapped"
        elif not engine_running and info.free < claimed:
            verdict = "page cache"
        else:
            verdict = "fits"
    else:
        verdict = "never" if needed > info.total else "short"
    estimated = info.available is None
    return Headroom(verdict, available, estimated, headroom, gate, claimed, needed)


def check_memory_headroom(
    node: str,
    mem: NodeMemory,
    claim: Claim,
    os_headroom_gib: float,
    *,
    engine_running: bool,
    own_pids: frozenset[int] = frozenset(),
    max_swap_used_gib: float = 1.0,
    top_holders: int = 3,
    gpu_held: str | None = None,
) -> Finding | Skip:
    """``MemAvailable - claim >= os_headroom_gib`` on ``node`` (the claim 0 while the
    engine runs: see the module docstring). ``own_pids``: the serving container's
    processes (not named as holders). ``gpu_held``: the GPU-holder check's failure on this
    node, when it failed: memory short because of it is that check's failure (one root
    cause), and this one skips citing it."""
    info = mem.meminfo
    if info is None:
        return Finding.failed(
            "/proc/meminfo unreadable",
            "MemTotal and MemAvailable",
            node=node,
            message=(
                f"{node}: cannot read the node's memory ({mem.meminfo_error}); expected "
                "/proc/meminfo with MemTotal and MemAvailable, as every Linux kernel since "
                "3.14 prints. Check that /proc is mounted on the node and readable over SSH"
            ),
        )
    h = headroom_verdict(
        info,
        claim,
        os_headroom_gib,
        engine_running=engine_running,
        max_swap_used_gib=max_swap_used_gib,
    )
    measured = _measured(info, h.available)
    expected = h.expected(os_headroom_gib)
    text = _HeadroomText.of(node, info, claim, h, engine_running)
    if h.verdict in ("swapped", "page cache"):
        message = _warning(text, info, h, max_swap_used_gib)
        return Finding.warned(measured, expected, node=node, message=message)
    if h.verdict == "fits":
        message = (
            f"{node}: {text.state}; {gib(h.available - h.claimed)} left for the OS {text.what}"
        )
        return Finding.passed(measured, expected, node=node, message=message)
    if h.verdict == "never":
        return Finding.failed(
            measured,
            expected,
            node=node,
            message=(
                f"{node}: {text.state}: expected {text.want} {text.what}. That is more than "
                f"the node's MemTotal of {gib(info.total)}: it can never be met, whatever is "
                f"freed. Lower {_what_to_lower(claim, info.total, h.headroom, engine_running)}"
            ),
        )
    listed, top = holders(mem, frozenset(own_pids), top_holders)
    if gpu_held is not None:
        return Skip(
            f"{node}: {text.state}, {gib(h.needed - h.available)} short of {text.want}, "
            f"because the GPU is held outside the serving container ({gpu_held})"
        )
    return Finding.failed(
        {**measured, "holders": listed},
        expected,
        node=node,
        message=_short_message(text, mem, info, claim, h, engine_running, own_pids, listed, top),
    )


@dataclass(frozen=True)
class _HeadroomText:
    """The parts every headroom message shares: the node, its memory as read (``state``),
    the claim it was judged before (``what``) and what it must have (``want``)."""

    node: str
    state: str
    what: str
    want: str

    @classmethod
    def of(
        cls, node: str, info: MemInfo, claim: Claim, h: Headroom, engine_running: bool
    ) -> _HeadroomText:
        approx = " (MemFree + page cache: no MemAvailable)" if h.estimated else ""
        state = (
            f"MemAvailable {gib(h.available)}{approx} of MemTotal {gib(info.total)}, {_swap(info)}"
        )
        return cls(node, state, *_what_and_want(claim, h, engine_running))


def _what_and_want(claim: Claim, h: Headroom, engine_running: bool) -> tuple[str, str]:
    """(the claim the memory was judged before, what the node must have for it)."""
    headroom, needed, kv = gib(h.headroom), gib(h.needed), claim.kv_cache_bytes
    if engine_running:
        what = f"with the serving engine running (its {claim.fraction:g} claim already taken)"
        return what, f"at least {headroom} left for the OS (profile memory.os_headroom_gib)"
    plus = f"the claim plus {headroom} for the OS (profile memory.os_headroom_gib)"
    if kv is not None:
        what = (
            f"before the engine's KV cache of {gib(kv)} (--kv-cache-memory-bytes in the "
            "serve args: vLLM sizes the cache to it and ignores --gpu-memory-utilization "
            "there; the weights come on top)"
        )
        want = (
            f"at least {needed}: the KV cache plus {headroom} for the OS (profile "
            f"memory.os_headroom_gib), and no less than vLLM's startup floor of "
            f"{claim.fraction:g} x MemTotal = {gib(h.gate)} ({claim.source})"
        )
        return what, want
    if claim.gib is not None:
        what = f"before the engine's claim of {gib(h.claimed)} ({claim.source})"
    else:
        what = (
            f"before the engine's claim of {claim.fraction:g} x MemTotal = {gib(h.claimed)} "
            f"({claim.source})"
        )
    return what, f"at least {needed}: {plus}"


def _warning(text: _HeadroomText, info: MemInfo, h: Headroom, max_swap_used_gib: float) -> str:
    """Enough memory, but swap in use (``swapped``) or the claim only in page cache."""
    if h.verdict == "swapped":
        return (
            f"{text.node}: {text.state}: memory is enough {text.what}, but "
            f"{gib(info.swap_used)} is swapped out (more than memory.max_swap_used_gib = "
            f"{max_swap_used_gib:g}): the node was short of memory, and on unified "
            "memory swapping stalls the GPU too. Find what grew (ps -eo pid,rss,args "
            "--sort=-rss) and reboot or `swapoff -a && swapon -a` when it is gone"
        )
    return (
        f"{text.node}: {text.state}: enough {text.what}, but MemFree is {gib(info.free)}, below "
        f"the claim: the rest is page cache, which CUDA on GB10 does not always "
        "count as free. If the load fails on `Free memory on device`, drop the "
        "cache first: sudo sh -c 'sync; echo 3 > /proc/sys/vm/drop_caches'"
    )


def _short_message(
    text: _HeadroomText,
    mem: NodeMemory,
    info: MemInfo,
    claim: Claim,
    h: Headroom,
    engine_running: bool,
    own_pids: frozenset[int],
    listed: list[str],
    top: list[ProcessMemory],
) -> str:
    """A short node's failure: by how much, what follows, who holds the memory, the fix."""
    by = _held_by(mem, own_pids, listed)
    kill = f"kill {' '.join(str(p.pid) for p in top)}" if top else "free the memory"
    return (
        f"{text.node}: {text.state}, {gib(h.needed - h.available)} short: expected "
        f"{text.want} {text.what}; {_consequence(info, claim, h, engine_running)}. "
        f"{by[0].upper()}{by[1:]}. Free it ({kill}; `systemctl status PID` names a "
        f"service that would start it again; a stale container: docker ps)"
        f"{_lower_hint(info, claim, h, engine_running)}"
    )


def _consequence(info: MemInfo, claim: Claim, h: Headroom, engine_running: bool) -> str:
    """What a short node means for the engine (or, once it runs, for the OS)."""
    kv = claim.kv_cache_bytes
    if not engine_running and h.available < h.gate:
        return (
            f"vLLM will refuse to start on this node (`Free memory on device "
            f"({gib(h.available)}/{gib(info.total)}) on startup is less than desired GPU "
            f"memory utilization ({claim.fraction:g}, {gib(h.gate)})`)"
        )
    if not engine_running and kv is not None and h.available < kv:
        return (
            f"the engine cannot allocate its {gib(kv)} KV cache here (CUDA out of memory "
            "after the weights load)"
        )
    if engine_running:
        return "the OS is squeezed under the engine: expect swapping, then the OOM killer"
    return (
        f"the engine would fit but leave the OS {gib(h.available - h.claimed)}: expect "
        "swapping and a node that freezes under load"
    )


def _held_by(mem: NodeMemory, own_pids: frozenset[int], listed: list[str]) -> str:
    """The largest holders outside the serving container, or where else to look."""
    if listed:
        return f"largest holders outside the serving container: {'; '.join(listed)}"
    biggest = next((p for p in mem.processes if p.pid not in own_pids), None)
    largest = (
        f" (the largest: pid {biggest.pid} {biggest.name}, {gib(biggest.rss)})" if biggest else ""
    )
    return (
        "no process outside the serving container holds 1 GiB or more"
        f"{largest}: look at the page cache, shared memory (/dev/shm) and kernel "
        "memory (slabtop), or reboot the node"
    )


def _lower_hint(info: MemInfo, claim: Claim, h: Headroom, engine_running: bool) -> str:
    """The engine setting to lower to what this node has room for, when there is one."""
    fit = (h.available - h.headroom) / info.total
    if not engine_running and claim.kv_cache_bytes is not None:
        room = h.available - h.headroom
        if h.available >= h.gate and room > GIB:
            return (
                f", or lower --kv-cache-memory-bytes to {int(room / GIB)}G (what this node has "
                "room for, less the weights)"
            )
        if fit > 0.05:
            return (
                f", or lower --gpu-memory-utilization to {int(fit * 100) / 100:.2f} (vLLM's "
                "startup floor)"
            )
        return ""
    if not engine_running and fit > 0.05:
        return (
            f", or lower --gpu-memory-utilization to {int(fit * 100) / 100:.2f} (what this "
            "node has room for)"
        )
    return ""


def _what_to_lower(claim: Claim, total: int, headroom: int, engine_running: bool) -> str:
    """The settings whose sum asks for more than MemTotal, each with a value that fits."""
    room_gib = max(total / GIB - 1, 0)
    fix = (
        f"the profile's memory.os_headroom_gib (now {headroom / GIB:g}; e.g. "
        f"--spark-threshold=memory.os_headroom_gib={int(min(headroom / GIB, room_gib) / 2)})"
    )
    if engine_running:
        return fix
    fit = (total - headroom) / total
    if claim.kv_cache_bytes is not None:
        kv_room = int(max(total - headroom, 0) / GIB)
        engine = f"--kv-cache-memory-bytes in the serve args (now {gib(claim.kv_cache_bytes)}"
        engine += f"; at most {kv_room}G with this headroom)" if kv_room else ")"
    else:
        engine = f"--gpu-memory-utilization (now {claim.fraction:g}, {claim.source}"
        engine += f"; at most {int(fit * 100) / 100:.2f} with this headroom)" if fit > 0.05 else ")"
    return f"{engine}, or {fix}"


def check_container_limit(containers: list[ContainerMemory]) -> Finding | Skip:
    """Each serving container's cgroup memory limit (launch-cluster.sh --non-privileged:
    ``--memory 110g`` by default) holds what its rank asks for: the kernel's OOM killer
    ends the engine at the limit, whatever the host has free. One finding for the
    cluster, naming every node whose limit is short."""
    limited = [c for c in containers if c.limit is not None]
    if not containers:
        return Skip("no serving container to read a memory limit from")
    if not limited:
        names = ", ".join(c.node for c in containers)
        return Finding.passed(
            None, "no limit or one above the need", message=f"no cgroup memory limit ({names})"
        )
    short = [c for c in limited if c.need is not None and c.limit is not None and c.need > c.limit]
    measured = {c.node: round((c.limit or 0) / GIB, 2) for c in limited}
    expected = {c.node: round(c.need / GIB, 2) for c in limited if c.need is not None}
    if not short:
        fits = "; ".join(
            f"{c.node}: limit {gib(c.limit or 0)}, need "
            f"{gib(c.need) if c.need is not None else 'unknown'}"
            for c in limited
        )
        return Finding.passed(measured, expected, message=f"within the container limits: {fits}")
    lines = []
    for c in short:
        assert c.need is not None and c.limit is not None
        lines.append(
            f"{c.node}: the serving container's memory limit is {gib(c.limit)} ({c.source}), "
            f"but its rank asks for {gib(c.need)} ({c.need_source})"
        )
    worst = max(short, key=lambda c: (c.need or 0) - (c.limit or 0))
    assert worst.need is not None and worst.limit is not None
    raise_to = -(-(worst.need + GIB) // GIB)
    lower = int((worst.limit - GB_SAFETY_MARGIN) / GIB) - 2
    return Finding.failed(
        measured,
        expected,
        node=", ".join(c.node for c in short),
        message=(
            "; ".join(lines)
            + ". The cgroup is the OOM boundary (launch-cluster.sh --non-privileged: "
            "--memory 110g by default): the kernel kills the engine when it loads past the "
            "limit (EngineDeadError), whatever the host has free. Fix: raise the limit "
            f"(--mem-limit-gb {raise_to}, and --mem-swap-limit-gb above it) or lower "
            f"--gpu-memory-utilization-gb to {lower} or less (the limit less the mod's "
            "0.5 GiB margin and room for the API server)"
        ),
    )
