"""Run an all-reduce benchmark across the nodes at once and collect every rank's output.

:func:`run_allreduce` is the one entry point. It picks a launcher
(:mod:`~pytest_spark.infra.nccl.launcher_gather`), copies the benchmark to every node and
starts one rank per node (the commands: :mod:`~pytest_spark.infra.nccl.command_probe`).

Each rank is a foreground command on its node (one thread per node, all started at once).
The script is copied first, base64 through the command line, into a fresh
``mktemp -d /tmp/<token>.XXXXXX``. ``<token>`` (``pytest-spark-nccl-<hex>``) is in every
command line the run starts, so on a timeout, a failure of one rank, or an interrupt
(KeyboardInterrupt included) the runner ends the run with ``pkill -f`` on every node (inside
the container too) and always removes the temporary directories. A run that never produced a
result row and timed out or printed ``init timeout`` is a hang at initialisation
(:attr:`CollectiveRun.hung_at_init`); its log lines stay in :meth:`CollectiveRun.log_lines`.
The run's types (:class:`CollectiveRun`, :class:`RankOutput`, :class:`LaunchPlan`) live in
:mod:`pytest_spark.infra.nccl.probe`, where the checks read them.

Progress: rank 0's output (the script's, or mpirun's: the one that prints the tables) is read
as it streams in over SSH (the node's ``run`` with ``on_output``); every result row it prints
is one message size done, so a :class:`SweepProgress` says the size each sweep has reached,
out of its planned sizes, with that size's figures
(:class:`~pytest_spark.infra.nccl.result_probe.OutputStream`).
"""

from __future__ import annotations

import concurrent.futures as cf
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from pytest_spark.access.base import CommandResult, CommandTimeout, RemoteError
from pytest_spark.infra.nccl.command_probe import (
    LATENCY_MIN_BYTES,
    STEP_TIMEOUT,
    TOKEN_PREFIX,
    Containers,
    Job,
    container_on,
    container_python,
    free_range_port,
    kill_command,
    mpirun_chain,
    rank_command,
    script_text,
    stage_command,
)
from pytest_spark.infra.nccl.launcher_gather import (
    CollectiveUnavailable,
    Launcher,
    RankNode,
    each_node,
    plan_launch,
)
from pytest_spark.infra.nccl.probe import CollectiveRun, LaunchPlan, RankOutput, SweepProgress
from pytest_spark.infra.nccl.result_probe import OutputStream, parse_all, planned_sweeps

__all__ = ["COLLECTIVES", "MAX_BYTES", "CollectiveUnavailable", "run_allreduce"]

MAX_BYTES = 4 << 30  # 16 GiB all-reduce buffers froze DGX Sparks (unified memory)
COLLECTIVES = ("all_reduce", "all_gather", "latency")
KILL_GRACE = 10.0  # how long the other ranks may linger once one rank has failed
RUN_GRACE = 15.0  # the script stops itself at the timeout; the SSH call waits this much more


def _stop(nodes: Sequence[RankNode], token: str, container: Containers) -> list[str]:
    """pkill the run and remove its temporary directories on every node; return errors."""

    def stop(n: RankNode) -> CommandResult:
        cmd = kill_command(token, container=container_on(container, n.name))
        return n.run(cmd, timeout=STEP_TIMEOUT)

    results = each_node(nodes, stop, STEP_TIMEOUT)
    errors = []
    for node, res in zip(nodes, results, strict=True):
        if not isinstance(res, CommandResult):
            errors.append(f"{node.name}: cleanup failed: {res}")
    return errors


def _rank_output(
    node: RankNode, rank: int, command: str, outcome: CommandResult | BaseException, elapsed: float
) -> RankOutput:
    if isinstance(outcome, CommandResult):
        parsed, error, sections = parse_all(outcome.stdout)
        return RankOutput(
            node.name, rank, command, outcome.rc, outcome.stdout, outcome.stderr,
            outcome.duration_s or elapsed, parsed=parsed, parse_error=error, sections=sections,
        )  # fmt: skip
    if isinstance(outcome, CommandTimeout):
        parsed, error, sections = parse_all(outcome.partial)
        return RankOutput(
            node.name, rank, command, None, outcome.partial,
            f"stopped by pytest_spark: {outcome}", elapsed, timed_out=True, parsed=parsed,
            parse_error=error, sections=sections,
        )  # fmt: skip
    return RankOutput(
        node.name, rank, command, None, "", f"{type(outcome).__name__}: {outcome}", elapsed,
        parse_error="no output",
    )  # fmt: skip


def run_allreduce(
    nodes: Sequence[RankNode],
    *,
    master_addr: str,
    rank_env: Mapping[str, Mapping[str, str]] | None = None,
    launcher: Launcher = "auto",
    python: str = "python3",
    container: Containers = None,
    min_bytes: int = 1 << 20,
    max_bytes: int = 1 << 30,
    iters: int = 20,
    warmup: int = 5,
    timeout: float = 300.0,
    init_timeout: float | None = None,
    master_port: int | None = None,
    backend: Literal["auto", "nccl", "gloo"] = "auto",
    fabric_addrs: Sequence[str] | None = None,
    collectives: Sequence[str] = ("all_reduce",),
    latency_max_bytes: int = 1 << 20,
    progress: Callable[[SweepProgress], None] | None = None,
) -> CollectiveRun:
    """Run the all-reduce sweep with one rank per node (``nodes[0]`` is rank 0, the head).

    ``container``: the serving container, one name on every node or each node's own (by
    node name). ``rank_env`` maps a node name to the environment its rank gets
    (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``, ``GLOO_SOCKET_IFNAME``...);
    ``NCCL_DEBUG=INFO`` is added unless set, and for the host python
    ``GLOO_SOCKET_IFNAME`` defaults to ``NCCL_SOCKET_IFNAME``.
    ``fabric_addrs``: every node's fabric address, for mpirun's ``-H`` (nccl-tests only).
    ``init_timeout`` defaults to a third of ``timeout`` (10-60 s). ``collectives``: the
    sweeps of this one launch, in order (``all_reduce`` first; ``all_gather``; ``latency``,
    8 B..``latency_max_bytes``), the same rank processes for all. ``progress`` gets a
    :class:`SweepProgress` about twice a second while the ranks run and once when they are
    done: each sweep's planned sizes and the rows rank 0 has printed so far, read from its
    output as it streams in. Raises ValueError for sizes above 4 GiB and
    :class:`CollectiveUnavailable` when no launcher works.
    """
    wanted = _checked_request(nodes, collectives, min_bytes, max_bytes, latency_max_bytes)
    started = time.monotonic()
    plan = plan_launch(nodes, launcher, container, python)
    if init_timeout is None:
        init_timeout = min(60.0, max(10.0, timeout / 3))
    job = Job(
        token=TOKEN_PREFIX + secrets.token_hex(6), master_addr=master_addr,
        port=master_port or free_range_port(), min_bytes=min_bytes,
        max_bytes=max_bytes, iters=iters, warmup=warmup, backend=backend,
        init_timeout=init_timeout, timeout=timeout, collectives=wanted,
        latency_max_bytes=latency_max_bytes, progress=progress,
    )  # fmt: skip
    envs = _rank_envs(nodes, rank_env, plan.launcher)
    ranks: list[RankOutput] = []
    timed_out = False
    try:
        if plan.launcher == "nccl-tests":
            ranks, timed_out = _run_mpirun(nodes, plan, job, envs[0], fabric_addrs)
        else:
            ranks, timed_out = _run_script(nodes, plan, job, envs, python)
    finally:
        cleanup = _stop(nodes, job.token, plan.container)
    return CollectiveRun(
        launcher=plan.launcher, token=job.token, world_size=len(nodes), ranks=tuple(ranks),
        result=ranks[0].parsed if ranks else None, timed_out=timed_out,
        duration_s=time.monotonic() - started, notes=plan.notes, cleanup_errors=tuple(cleanup),
        nodes=tuple(n.name for n in nodes), init_timeout_s=init_timeout, timeout_s=timeout,
        collectives=wanted,
    )  # fmt: skip


def _checked_request(
    nodes: Sequence[RankNode],
    collectives: Sequence[str],
    min_bytes: int,
    max_bytes: int,
    latency_max_bytes: int,
) -> tuple[str, ...]:
    """The sweeps asked for, once the request is known to be sound (ValueError if not)."""
    if not nodes:
        raise ValueError("run_allreduce needs at least one node")
    wanted = tuple(collectives)
    if not wanted or wanted[0] != "all_reduce" or any(c not in COLLECTIVES for c in wanted):
        raise ValueError(f"collectives {wanted}: all_reduce first, then any of {COLLECTIVES[1:]}")
    if not LATENCY_MIN_BYTES <= latency_max_bytes <= MAX_BYTES:
        raise ValueError(f"latency_max_bytes {latency_max_bytes}: need 8 B..4 GiB")
    if max_bytes > MAX_BYTES:
        raise ValueError(
            f"max_bytes {max_bytes} is above 4 GiB ({MAX_BYTES}): 16 GiB all-reduce buffers "
            "froze DGX Sparks (unified memory)"
        )
    if not 4 <= min_bytes <= max_bytes:
        raise ValueError(f"sizes {min_bytes}..{max_bytes}: need 4 <= min_bytes <= max_bytes")
    return wanted


def _rank_envs(
    nodes: Sequence[RankNode], rank_env: Mapping[str, Mapping[str, str]] | None, launcher: str
) -> list[dict[str, str]]:
    """Each rank's environment: its node's, ``NCCL_DEBUG=INFO`` unless set, and for the host
    python ``GLOO_SOCKET_IFNAME`` defaulting to ``NCCL_SOCKET_IFNAME``."""
    envs = []
    for node in nodes:
        env = {"NCCL_DEBUG": "INFO", **dict((rank_env or {}).get(node.name, {}))}
        if "NCCL_SOCKET_IFNAME" in env and launcher == "python":
            env.setdefault("GLOO_SOCKET_IFNAME", env["NCCL_SOCKET_IFNAME"])
        envs.append(env)
    return envs


def _stage(nodes: Sequence[RankNode], token: str, plan: LaunchPlan) -> list[str]:
    script = script_text() if plan.binary is None else ""

    def stage(n: RankNode) -> CommandResult:
        where = container_on(plan.container, n.name)
        cmd = stage_command(token, script, container=where, binary=plan.binary)
        return n.run(cmd, timeout=STEP_TIMEOUT)

    results = each_node(nodes, stage, STEP_TIMEOUT)
    dirs = []
    for node, res in zip(nodes, results, strict=True):
        if not isinstance(res, CommandResult):
            raise RemoteError(node.name, f"could not copy the benchmark: {res}")
        if not res.ok or not res.stdout.strip().startswith("/"):
            detail = (res.stderr or res.stdout).strip()[:300]
            raise RemoteError(node.name, f"could not copy the benchmark (exit {res.rc}): {detail}")
        dirs.append(res.stdout.strip().splitlines()[-1])
    return dirs


def _launch(
    nodes: Sequence[RankNode], commands: Sequence[str], timeout: float, job: Job,
    container: Containers,
) -> tuple[list[RankOutput], bool]:  # fmt: skip
    """Start every command at once; stop the rest after one fails (grace) or on interrupt."""
    pool = cf.ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="spark-rank")
    starts: dict[int, float] = {}
    planned = planned_sweeps(job.collectives, job.min_bytes, job.max_bytes, job.latency_max_bytes)
    stream = OutputStream(planned) if job.progress is not None else None

    def call(i: int) -> CommandResult:
        starts[i] = time.monotonic()
        if i == 0 and stream is not None:  # rank 0 prints the tables: watch them come
            return nodes[i].run(commands[i], timeout=timeout, on_output=stream.feed)
        return nodes[i].run(commands[i], timeout=timeout)

    futures = [pool.submit(call, i) for i in range(len(nodes))]
    try:
        first_failure: float | None = None
        pending = set(futures)
        t0 = time.monotonic()
        while pending:
            done, pending = cf.wait(pending, timeout=0.5)
            if job.progress is not None and stream is not None:
                job.progress(stream.progress(time.monotonic() - t0, not pending))
            for fut in done:
                exc = fut.exception()
                failed = exc is not None or fut.result().rc != 0
                if first_failure is None and failed:
                    first_failure = time.monotonic()
            if pending and first_failure and time.monotonic() - first_failure > KILL_GRACE:
                _stop(nodes, job.token, container)  # the peers of a failed rank would wait on
                first_failure = float("inf")
    except BaseException:  # KeyboardInterrupt included: end the run on every node first
        _stop(nodes, job.token, container)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    out = []
    timed_out = False
    for i, fut in enumerate(futures):
        exc = fut.exception()
        outcome: CommandResult | BaseException = fut.result() if exc is None else exc
        timed_out = timed_out or isinstance(outcome, CommandTimeout)
        elapsed = time.monotonic() - starts.get(i, time.monotonic())
        out.append(_rank_output(nodes[i], i, commands[i], outcome, elapsed))
    return out, timed_out


def _run_script(
    nodes: Sequence[RankNode], plan: LaunchPlan, job: Job, envs: Sequence[Mapping[str, str]],
    python: str,
) -> tuple[list[RankOutput], bool]:  # fmt: skip
    dirs = _stage(nodes, job.token, plan)
    if plan.launcher == "container":
        python = container_python(python)
    commands = [
        rank_command(plan.launcher, workdir=workdir, env=env, python=python,
                     args=job.script_args(rank, len(nodes)),
                     container=container_on(plan.container, node.name))
        for rank, (node, workdir, env) in enumerate(zip(nodes, dirs, envs, strict=True))
    ]  # fmt: skip
    return _launch(nodes, commands, job.timeout + RUN_GRACE, job, plan.container)


def _run_mpirun(
    nodes: Sequence[RankNode], plan: LaunchPlan, job: Job, env: Mapping[str, str],
    fabric_addrs: Sequence[str] | None,
) -> tuple[list[RankOutput], bool]:  # fmt: skip
    hosts = list(fabric_addrs) if fabric_addrs else [job.master_addr]
    if len(hosts) != len(nodes):
        raise ValueError(
            f"mpirun needs every node's fabric address: got {hosts} for {len(nodes)} nodes "
            "(pass fabric_addrs)"
        )
    _stage(nodes, job.token, plan)
    cmd = mpirun_chain(
        hosts=hosts, env=env, token=job.token, min_bytes=job.min_bytes,
        max_bytes=job.max_bytes, iters=job.iters, warmup=job.warmup,
        container=container_on(plan.container, nodes[0].name), collectives=job.collectives,
        latency_max_bytes=job.latency_max_bytes,
    )  # fmt: skip
    return _launch(nodes[:1], [cmd], job.timeout, job, plan.container)
