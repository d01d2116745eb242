"""Run an all-reduce benchmark across the nodes at once and collect every rank's output.

:func:`run_allreduce` is the one entry point. It picks a launcher (REFERENCE §3 and issue 4,
first that every node offers wins):

1. ``nccl-tests``: ``all_reduce_perf`` on the host PATH (or ``~/nccl-tests/build``) or inside
   the serving container, launched from the head with ``mpirun -np N -H ip1:1,ip2:1`` as
   NVIDIA's playbooks do. nccl-tests spans nodes only through MPI (nccl-tests#121), so
   without ``mpirun`` the binary is passed over, with a note saying so.
2. ``container``: the shipped script (``pytest_spark/collective/allreduce.py``) run by a python
   with torch inside the serving container (``docker exec -i C python3 - ARGS < script``),
   so it sees the container's ``NCCL_*``/``GLOO_*`` environment, exactly what vLLM sees.
3. ``python``: the same script run by the host's ``python3`` when it has torch.

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
out of its planned sizes, with that size's figures.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import dataclasses
import secrets
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pytest_spark.access.base import CommandResult, CommandTimeout, RemoteError
from pytest_spark.collective.script import script_text
from pytest_spark.infra.nccl.parse import (
    MAIN_SECTION,
    SECTION,
    NcclOutput,
    ParseError,
    Row,
    parse_nccl_tests,
    split_sections,
)
from pytest_spark.infra.nccl.probe import (
    CollectiveRun,
    LaunchPlan,
    RankOutput,
    Section,
    SweepProgress,
    SweepState,
)

__all__ = [
    "MAX_BYTES",
    "TOKEN_PREFIX",
    "CollectiveUnavailable",
    "Launcher",
    "RankNode",
    "detect_launcher",
    "kill_command",
    "mpirun_chain",
    "mpirun_command",
    "planned_sweeps",
    "probe_command",
    "rank_command",
    "run_allreduce",
    "stage_command",
]

Launcher = Literal["auto", "python", "container", "nccl-tests"]
MAX_BYTES = 4 << 30  # 16 GiB all-reduce buffers froze DGX Sparks (unified memory)
TOKEN_PREFIX = "pytest-spark-nccl-"
SCRIPT = "allreduce.py"
NCCL_TESTS = "all_reduce_perf"
NCCL_TESTS_GATHER = "all_gather_perf"  # beside all_reduce_perf in an nccl-tests build
COLLECTIVES = ("all_reduce", "all_gather", "latency")
LATENCY_MIN_BYTES = 8
STEP_TIMEOUT = 30.0  # probing, staging, killing and cleaning up: each bounded by this
KILL_GRACE = 10.0  # how long the other ranks may linger once one rank has failed
RUN_GRACE = 15.0  # the script stops itself at the timeout; the SSH call waits this much more


class RankNode(Protocol):
    """What the runner needs from a node: a name and a command runner (cluster.Node) that
    can hand over stdout as it arrives (``on_output``: asked of rank 0 for progress only)."""

    name: str

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> CommandResult: ...


class CollectiveUnavailable(RuntimeError):
    """No launcher works on every node: no nccl-tests with mpirun and no python with torch."""


# ----------------------------------------------------------------------- command building


def _q(value: object) -> str:
    return shlex.quote(str(value))


Containers = str | Mapping[str, str] | None  # one name on every node, or each node's own


def container_on(container: Containers, node: str) -> str | None:
    """The serving container on ``node``: one name for every node (launch-cluster.sh), or
    each node's own (a sparkrun job's ``..._node_<rank>``)."""
    if container is None or isinstance(container, str):
        return container
    return container.get(node)


def _names(container: Containers) -> str:
    """The container(s) in words, for notes and errors."""
    if container is None or isinstance(container, str):
        return str(container)
    return ", ".join(dict.fromkeys(container.values()))


def _pattern(token: str) -> str:
    """A regex matching the token that does not match itself (``[p]ytest-...``)."""
    return f"[{token[0]}]{token[1:]}"


def stage_command(
    token: str, script: str, *, container: str | None = None, binary: str | None = None
) -> str:
    """Copy the script into a fresh temporary directory and print its path.

    With ``binary`` (nccl-tests) it instead links the binary into ``/tmp/<token>.mpi`` (the
    same path on every node, as mpirun needs), inside ``container`` when given.
    """
    if binary is not None:
        gather = f"{binary.rsplit('/', 1)[0]}/{NCCL_TESTS_GATHER}" if "/" in binary else ""
        link_gather = (
            f"if [ -x {_q(gather)} ]; then ln -sfn {_q(gather)} "
            f"/tmp/{token}.mpi/{NCCL_TESTS_GATHER}; fi && "
            if gather
            else ""
        )
        inner = (
            f"mkdir -p -m 700 /tmp/{token}.mpi && ln -sfn {_q(binary)} "
            f"/tmp/{token}.mpi/{NCCL_TESTS} && {link_gather}echo /tmp/{token}.mpi"
        )
        if container:
            return f"docker exec {_q(container)} sh -c {_q(inner)}"
        return inner
    payload = base64.b64encode(script.encode()).decode()
    return (
        f"d=$(mktemp -d /tmp/{token}.XXXXXX) && printf %s {payload} | base64 -d "
        f'> "$d/{SCRIPT}" && echo "$d"'
    )


@dataclass(frozen=True)
class _Job:
    """One run's parameters, as the ranks get them."""

    token: str
    master_addr: str
    port: int
    min_bytes: int
    max_bytes: int
    iters: int
    warmup: int
    backend: str
    init_timeout: float
    timeout: float
    collectives: tuple[str, ...] = ("all_reduce",)
    latency_max_bytes: int = 1 << 20
    progress: Callable[[SweepProgress], None] | None = None

    def script_args(self, rank: int, world_size: int) -> list[str]:
        extra = []
        if self.collectives != ("all_reduce",):
            extra = [
                "--collectives", ",".join(self.collectives),
                "--latency-min-bytes", str(LATENCY_MIN_BYTES),
                "--latency-max-bytes", str(self.latency_max_bytes),
            ]  # fmt: skip
        return [*self._args(rank, world_size), *extra]

    def _args(self, rank: int, world_size: int) -> list[str]:
        return [
            "--rank", str(rank), "--world-size", str(world_size),
            "--master-addr", self.master_addr, "--master-port", str(self.port),
            "--min-bytes", str(self.min_bytes), "--max-bytes", str(self.max_bytes),
            "--factor", "2", "--iters", str(self.iters), "--warmup", str(self.warmup),
            "--backend", self.backend, "--init-timeout", f"{self.init_timeout:g}",
            "--deadline", f"{self.timeout:g}", "--token", self.token,
        ]  # fmt: skip


def rank_command(
    launcher: str,
    *,
    workdir: str,
    env: Mapping[str, str],
    args: Sequence[str],
    python: str = "python3",
    container: str | None = None,
) -> str:
    """The command one rank runs on its node (python or container launcher)."""
    script = f"{workdir}/{SCRIPT}"
    argv = " ".join(_q(a) for a in args)
    if launcher == "container":
        if not container:
            raise ValueError("the container launcher needs the serving container's name")
        envs = " ".join(f"-e {_q(f'{k}={v}')}" for k, v in env.items())
        return (
            f"exec docker exec -i {envs + ' ' if envs else ''}{_q(container)} "
            f"{_q(python)} - {argv} < {_q(script)}"
        )
    if launcher != "python":
        raise ValueError(f"no rank command for launcher {launcher!r}")
    assigns = " ".join(_q(f"{k}={v}") for k, v in env.items())
    return (
        f"cd {_q(workdir)} && exec env {assigns + ' ' if assigns else ''}"
        f"{_q(python)} {_q(script)} {argv}"
    )


def mpirun_command(
    *,
    hosts: Sequence[str],
    env: Mapping[str, str],
    token: str,
    min_bytes: int,
    max_bytes: int,
    iters: int,
    warmup: int,
    container: str | None = None,
    binary: str = NCCL_TESTS,
    inner: bool = False,
) -> str:
    """``mpirun -np N -H ip1:1,ip2:1 ... all_reduce_perf -b -e -f 2 -g 1`` (on the head);
    ``inner``: the bare command line, for :func:`mpirun_chain`'s script."""
    cmd = [
        "env", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
        "mpirun", "-np", str(len(hosts)), "-H", ",".join(f"{h}:1" for h in hosts),
    ]  # fmt: skip
    ifname = env.get("NCCL_SOCKET_IFNAME")
    if ifname and not ifname.startswith(("^", "=")):  # keep mpirun off docker0 (REFERENCE §1)
        first = ifname.split(",")[0]
        cmd += ["--mca", "btl_tcp_if_include", first, "--mca", "oob_tcp_if_include", first]
    for key, value in env.items():
        cmd += ["-x", f"{key}={value}"]
    cmd += [
        f"/tmp/{token}.mpi/{binary}", "-b", str(min_bytes), "-e", str(max_bytes),
        "-f", "2", "-g", "1", "-n", str(iters), "-w", str(warmup), "-c", "1",
    ]  # fmt: skip
    line = " ".join(_q(c) for c in cmd)
    if inner:
        return line
    if container:
        return f"exec docker exec {_q(container)} {line}"
    return f"exec {line}"


def mpirun_chain(
    *,
    hosts: Sequence[str],
    env: Mapping[str, str],
    token: str,
    min_bytes: int,
    max_bytes: int,
    iters: int,
    warmup: int,
    collectives: Sequence[str],
    latency_max_bytes: int,
    container: str | None = None,
) -> str:
    """Several nccl-tests runs in one command on the head, one per sweep, each after the
    first preceded by its ``# pytest_spark: section NAME`` line: ``all_reduce_perf``,
    ``all_gather_perf`` (when the build beside it has one) and ``all_reduce_perf -b 8
    -e 1M`` (latency). Exit status: the first that failed."""
    if tuple(collectives) == ("all_reduce",):
        return mpirun_command(
            hosts=hosts, env=env, token=token, min_bytes=min_bytes, max_bytes=max_bytes,
            iters=iters, warmup=warmup, container=container,
        )  # fmt: skip
    steps = []
    for i, name in enumerate(collectives):
        if i:
            steps.append(f"echo {_q(SECTION + name)}")
        low, high = (LATENCY_MIN_BYTES, latency_max_bytes) if name == "latency" else (
            min_bytes, max_bytes)  # fmt: skip
        binary = NCCL_TESTS_GATHER if name == "all_gather" else NCCL_TESTS
        line = mpirun_command(
            hosts=hosts, env=env, token=token, min_bytes=low, max_bytes=high, iters=iters,
            warmup=warmup, binary=binary, inner=True,
        )  # fmt: skip
        run = f"{line} || {{ s=$?; [ $rc -ne 0 ] || rc=$s; }}"
        if name == "all_gather":
            path = f"/tmp/{token}.mpi/{NCCL_TESTS_GATHER}"
            run = (
                f"if [ -x {path} ]; then {run}; else echo '# error: no {NCCL_TESTS_GATHER} "
                f"beside {NCCL_TESTS} in this nccl-tests build'; [ $rc -ne 0 ] || rc=4; fi"
            )
        steps.append(run)
    script = "rc=0; " + "; ".join(steps) + "; exit $rc"
    if container:
        return f"exec docker exec {_q(container)} sh -c {_q(script)}"
    return f"exec sh -c {_q(script)}"


# SIGTERM, then up to 1 s for the matched processes to go, then SIGKILL for any left. A node
# whose ranks already exited (a finished run: every run ends here) matches nothing and waits
# nothing (an unconditional ``sleep 1``, in the container and on the host, was 2 s a run).
_KILL_INNER = (
    'if command -v pkill >/dev/null 2>&1; then if pkill -f "$0"; then i=0; '
    'while [ $i -lt 10 ] && pgrep -f "$0" >/dev/null 2>&1; do sleep 0.1 2>/dev/null || '
    '{ sleep 1; i=10; }; i=$((i+1)); done; pkill -9 -f "$0"; fi; '
    'else for p in /proc/[0-9]*; do grep -qa -e "$0" "$p/cmdline" 2>/dev/null && '
    'kill -9 "${p#/proc/}" 2>/dev/null; done; fi; true'
)


def kill_command(token: str, *, container: str | None = None) -> str:
    """End every process of the run on a node (inside the container first) and clean up.

    The pattern is written ``[p]ytest-...`` so that it never matches the shell running it.
    """
    pat = _q(_pattern(token))
    parts = []
    if container:
        parts.append(
            f"docker exec {_q(container)} sh -c {_q(_KILL_INNER)} {pat} </dev/null >/dev/null 2>&1"
        )
        parts.append(
            f"docker exec {_q(container)} sh -c 'rm -rf /tmp/'{pat}'.*' </dev/null >/dev/null 2>&1"
        )
    parts.append(f"sh -c {_q(_KILL_INNER)} {pat}")
    parts.append(f"rm -rf /tmp/{_pattern(token)}.*")
    parts.append("true")
    return "; ".join(parts)


def container_python(python: str) -> str:
    """The python to run inside the container: a host path means nothing there: python3."""
    return python if "/" not in python else "python3"


# Whether torch is installed and its version, without importing it (an import costs
# seconds of CPU per node, and the run imports it anyway).
TORCH_PROBE = (
    "import importlib.util as u, importlib.metadata as m\n"
    "if u.find_spec('torch'):\n"
    "    try: print(m.version('torch'))\n"
    "    except m.PackageNotFoundError: print('installed')\n"
)


def probe_command(*, python: str, container: str | None) -> str:
    """Print ``key=value`` lines: what each launcher needs, each step bounded by timeout."""
    t = int(STEP_TIMEOUT * 0.6)
    find_arp = (
        f"p=$(command -v {NCCL_TESTS} 2>/dev/null || {{ test -x "
        f'"$HOME/nccl-tests/build/{NCCL_TESTS}" && echo '
        f'"$HOME/nccl-tests/build/{NCCL_TESTS}"; }}); echo "PREFIXarp=$p"; '
        'echo "PREFIXmpirun=$(command -v mpirun 2>/dev/null)"; '
    )
    torch = TORCH_PROBE
    host = find_arp.replace("PREFIX", "")
    host += f'v=$(t {t} {_q(python)} -c {_q(torch)} 2>/dev/null | tail -n 1); echo "torch=$v"; '
    inner = find_arp.replace("PREFIX", "c_") + (
        f"v=$({_q(container_python(python))} -c {_q(torch)} 2>/dev/null | tail -n 1); "
        'echo "c_torch=$v"'
    )
    helper = (
        't() { if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi; }; '
    )
    script = helper + host
    if container:
        script += (
            f"if command -v docker >/dev/null 2>&1; then t {t} docker exec "
            f"{_q(container)} sh -c {_q(inner)} 2>/dev/null; "
            f'echo "c_rc=$?"; else echo "c_rc=docker-missing"; fi'
        )
    return f"sh -c {_q(script)}"


# ---------------------------------------------------------------------------- detection


def _facts(result: CommandResult | RemoteError | BaseException) -> dict[str, str]:
    if not isinstance(result, CommandResult):
        return {"error": str(result)}
    facts = {}
    for line in result.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            facts[key.strip()] = value.strip()
    return facts


def _each(
    nodes: Sequence[RankNode], fn: Callable[[RankNode], CommandResult], timeout: float
) -> list[CommandResult | BaseException]:
    """Run ``fn(node)`` on every node at once; exceptions are returned, not raised."""
    with cf.ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        futures = [pool.submit(fn, n) for n in nodes]
        out: list[CommandResult | BaseException] = []
        for fut in futures:
            try:
                out.append(fut.result(timeout=timeout + 5))
            except BaseException as exc:
                out.append(exc)
        return out


def detect_launcher(
    nodes: Sequence[RankNode],
    *,
    container: Containers = None,
    python: str = "python3",
    timeout: float = STEP_TIMEOUT,
) -> LaunchPlan:
    """Probe every node once (concurrently) and choose the launcher (see the module doc).
    ``container``: one name on every node, or each node's (by node name)."""

    def probe(n: RankNode) -> CommandResult:
        cmd = probe_command(python=python, container=container_on(container, n.name))
        return n.run(cmd, timeout=timeout)

    results = _each(nodes, probe, timeout)
    facts = [_facts(r) for r in results]
    notes = []
    for node, f in zip(nodes, facts, strict=True):
        if "error" in f:
            notes.append(f"{node.name}: probe failed: {f['error']}")
            continue
        found = [
            f"all_reduce_perf={f.get('arp') or 'none'}",
            f"mpirun={f.get('mpirun') or 'none'}",
            f"host torch={f.get('torch') or 'none'}",
        ]
        if container:
            found += [
                f"container {container_on(container, node.name)}: "
                f"all_reduce_perf={f.get('c_arp') or 'none'}",
                f"mpirun={f.get('c_mpirun') or 'none'}",
                f"torch={f.get('c_torch') or 'none'} (docker exec rc={f.get('c_rc', '?')})",
            ]
        notes.append(f"{node.name}: " + ", ".join(found))
    head = facts[0] if facts else {}
    if facts and all(f.get("arp") for f in facts):
        if head.get("mpirun"):
            return LaunchPlan("nccl-tests", None, head["arp"], tuple(notes))
        notes.append(
            "all_reduce_perf found on the hosts but no mpirun on the head: nccl-tests "
            "spans nodes only through MPI (nccl-tests#121); not used"
        )
    if container and facts and all(f.get("c_arp") for f in facts):
        if head.get("c_mpirun"):
            return LaunchPlan("nccl-tests", container, head["c_arp"], tuple(notes))
        notes.append(
            f"all_reduce_perf found in container {_names(container)} but no mpirun there: not used"
        )
    if container and facts and all(f.get("c_torch") for f in facts):
        return LaunchPlan("container", container, None, tuple(notes))
    if facts and all(f.get("torch") for f in facts):
        return LaunchPlan("python", None, None, tuple(notes))
    raise CollectiveUnavailable(
        "no all-reduce launcher works on every node: need nccl-tests' all_reduce_perf with "
        f"mpirun, or {python} with torch on the host"
        + (f" or inside container {_names(container)}" if container else "")
        + ". Found: "
        + "; ".join(notes)
        + ". Fix: build nccl-tests with MPI=1 (NVIDIA DGX Spark playbook) or "
        "`pip install torch` on every node."
    )


# ------------------------------------------------------------------------------ running


def _stop(nodes: Sequence[RankNode], token: str, container: Containers) -> list[str]:
    """pkill the run and remove its temporary directories on every node; return errors."""

    def stop(n: RankNode) -> CommandResult:
        cmd = kill_command(token, container=container_on(container, n.name))
        return n.run(cmd, timeout=STEP_TIMEOUT)

    results = _each(nodes, stop, STEP_TIMEOUT)
    errors = []
    for node, res in zip(nodes, results, strict=True):
        if not isinstance(res, CommandResult):
            errors.append(f"{node.name}: cleanup failed: {res}")
    return errors


def _parse(text: str) -> tuple[NcclOutput | None, str | None]:
    try:
        return parse_nccl_tests(text), None
    except ParseError as exc:
        return None, str(exc)


def _parse_all(text: str) -> tuple[NcclOutput | None, str | None, tuple[Section, ...]]:
    """The all-reduce section parsed, its error, and every later sweep parsed on its own."""
    parts = split_sections(text)
    parsed, error = _parse(parts.pop(MAIN_SECTION, ""))
    sections = []
    for name, body in parts.items():
        sub, sub_error = _parse(body)
        if sub is not None and parsed is not None and parsed.tool != sub.tool:
            # the script says what it is once, at the top: its later tables are its too
            sub = dataclasses.replace(sub, tool=parsed.tool, backend=parsed.backend)
        sections.append(Section(name, sub, sub_error))
    return parsed, error, tuple(sections)


def _doubling(low: int, high: int) -> tuple[int, ...]:
    out, size = [], low
    while size <= high:
        out.append(size - size % 4)
        size *= 2
    return tuple(out)


def planned_sweeps(
    collectives: Sequence[str], min_bytes: int, max_bytes: int, latency_max_bytes: int
) -> tuple[SweepState, ...]:
    """Each sweep's message sizes (``-b``..``-e`` doubling, as nccl-tests and the script
    step them; the latency sweep 8 B..``latency_max_bytes``), no rows yet."""
    return tuple(
        SweepState(
            name,
            _doubling(LATENCY_MIN_BYTES, latency_max_bytes)
            if name == "latency"
            else _doubling(min_bytes, max_bytes),
        )
        for name in collectives
    )


class _Stream:
    """Rank 0's stdout as it arrives (``feed``, from the SSH reader) and the progress it
    shows (``progress``, from the waiting loop): the rows of each sweep, re-read only when
    a whole new line came in."""

    def __init__(self, planned: tuple[SweepState, ...]) -> None:
        self.planned = planned
        self._lock = threading.Lock()
        self._text: list[str] = []
        self._read = ""
        self._sweeps = planned

    def feed(self, text: str) -> None:
        with self._lock:
            self._text.append(text)

    def progress(self, elapsed: float, finished: bool) -> SweepProgress:
        with self._lock:
            text = "".join(self._text)
        whole = text[: text.rfind("\n") + 1]
        if whole != self._read:
            self._read = whole
            parts = split_sections(whole)
            self._sweeps = tuple(
                dataclasses.replace(s, rows=_rows_of(parts.get(s.name, ""))) for s in self.planned
            )
        return SweepProgress(elapsed, finished, self._sweeps)


def _rows_of(text: str) -> tuple[Row, ...]:
    parsed, _ = _parse(text) if text.strip() else (None, None)
    return parsed.rows if parsed is not None else ()


def _rank_output(
    node: RankNode, rank: int, command: str, outcome: CommandResult | BaseException, elapsed: float
) -> RankOutput:
    if isinstance(outcome, CommandResult):
        parsed, error, sections = _parse_all(outcome.stdout)
        return RankOutput(
            node.name, rank, command, outcome.rc, outcome.stdout, outcome.stderr,
            outcome.duration_s or elapsed, parsed=parsed, parse_error=error, sections=sections,
        )  # fmt: skip
    if isinstance(outcome, CommandTimeout):
        parsed, error, sections = _parse_all(outcome.partial)
        return RankOutput(
            node.name, rank, command, None, outcome.partial,
            f"stopped by pytest_spark: {outcome}", elapsed, timed_out=True, parsed=parsed,
            parse_error=error, sections=sections,
        )  # fmt: skip
    return RankOutput(
        node.name, rank, command, None, "", f"{type(outcome).__name__}: {outcome}", elapsed,
        parse_error="no output",
    )  # fmt: skip


# The rendezvous port (rank 0's TCPStore), drawn below Linux's ephemeral range (32768-60999
# by default), where the head's own outgoing connections (SSH, Ray, the engine's clients)
# hold ports: one drawn from 31000-38999 was once in use there and rank 0's store "failed
# to listen" (a switch row in CI). Above Ray's worker ports (10002-19999) and below
# torch's and the launcher's 29500/29501.
PORT_LO, PORT_HI = 20000, 29000


def free_range_port() -> int:
    """A random port in [PORT_LO, PORT_HI): outside the ephemeral range and Ray's ports."""
    return PORT_LO + secrets.randbelow(PORT_HI - PORT_LO)


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
    started = time.monotonic()
    plan = _plan(nodes, launcher, container, python)
    if init_timeout is None:
        init_timeout = min(60.0, max(10.0, timeout / 3))
    job = _Job(
        token=TOKEN_PREFIX + secrets.token_hex(6), master_addr=master_addr,
        port=master_port or free_range_port(), min_bytes=min_bytes,
        max_bytes=max_bytes, iters=iters, warmup=warmup, backend=backend,
        init_timeout=init_timeout, timeout=timeout, collectives=wanted,
        latency_max_bytes=latency_max_bytes, progress=progress,
    )  # fmt: skip
    envs = []
    for node in nodes:
        env = {"NCCL_DEBUG": "INFO", **dict((rank_env or {}).get(node.name, {}))}
        if "NCCL_SOCKET_IFNAME" in env and plan.launcher == "python":
            env.setdefault("GLOO_SOCKET_IFNAME", env["NCCL_SOCKET_IFNAME"])
        envs.append(env)
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


def _plan(
    nodes: Sequence[RankNode], launcher: Launcher, container: Containers, python: str
) -> LaunchPlan:
    if launcher == "auto":
        return detect_launcher(nodes, container=container, python=python)
    if launcher == "nccl-tests":
        found = detect_launcher(nodes, container=container, python=python)
        if found.launcher != "nccl-tests":
            raise CollectiveUnavailable(
                "launcher nccl-tests asked for, but all_reduce_perf with mpirun is not on "
                "every node: " + "; ".join(found.notes)
            )
        return found
    if launcher == "container" and not container:
        raise ValueError("the container launcher needs container=NAME")
    return LaunchPlan(launcher, container if launcher == "container" else None)


def _stage(nodes: Sequence[RankNode], token: str, plan: LaunchPlan) -> list[str]:
    script = script_text(SCRIPT) if plan.binary is None else ""

    def stage(n: RankNode) -> CommandResult:
        where = container_on(plan.container, n.name)
        cmd = stage_command(token, script, container=where, binary=plan.binary)
        return n.run(cmd, timeout=STEP_TIMEOUT)

    results = _each(nodes, stage, STEP_TIMEOUT)
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
    nodes: Sequence[RankNode], commands: Sequence[str], timeout: float, job: _Job,
    container: Containers,
) -> tuple[list[RankOutput], bool]:  # fmt: skip
    """Start every command at once; stop the rest after one fails (grace) or on interrupt."""
    pool = cf.ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="spark-rank")
    starts: dict[int, float] = {}
    planned = planned_sweeps(job.collectives, job.min_bytes, job.max_bytes, job.latency_max_bytes)
    stream = _Stream(planned) if job.progress is not None else None

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
    nodes: Sequence[RankNode], plan: LaunchPlan, job: _Job, envs: Sequence[Mapping[str, str]],
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
    nodes: Sequence[RankNode], plan: LaunchPlan, job: _Job, env: Mapping[str, str],
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
