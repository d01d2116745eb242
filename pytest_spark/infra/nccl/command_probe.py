"""The shell commands a collective run sends to the nodes, as text (no I/O here).

Probing what each node offers (:func:`probe_command`: nccl-tests, mpirun, a python with
torch, on the host and inside the serving container), staging the benchmark
(:func:`stage_command`: the shipped script, base64 through the command line, into a fresh
``mktemp -d /tmp/<token>.XXXXXX``; or nccl-tests' binaries linked into ``/tmp/<token>.mpi``),
one rank's command (:func:`rank_command`), mpirun on the head (:func:`mpirun_command`,
:func:`mpirun_chain`) and the end of a run (:func:`kill_command`: ``pkill -f`` of the token,
the temporary directories removed). ``<token>`` (``pytest-spark-nccl-<hex>``) is in every
command line the run starts. :func:`script_text` is the shipped script's text (the files of
``scripts/``, bundled into one program).
"""

from __future__ import annotations

import base64
import secrets
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

from pytest_spark.infra.nccl.parse import SECTION
from pytest_spark.infra.nccl.probe import SweepProgress

__all__ = [
    "LATENCY_MIN_BYTES",
    "SCRIPT",
    "STEP_TIMEOUT",
    "TOKEN_PREFIX",
    "Containers",
    "Job",
    "container_on",
    "container_python",
    "free_range_port",
    "kill_command",
    "mpirun_chain",
    "mpirun_command",
    "probe_command",
    "rank_command",
    "script_text",
    "stage_command",
]

TOKEN_PREFIX = "pytest-spark-nccl-"
SCRIPT = "allreduce.py"  # the shipped script's name on the node
NCCL_TESTS = "all_reduce_perf"
NCCL_TESTS_GATHER = "all_gather_perf"  # beside all_reduce_perf in an nccl-tests build
LATENCY_MIN_BYTES = 8
STEP_TIMEOUT = 30.0  # probing, staging, killing and cleaning up: each bounded by this


def quote(value: object) -> str:
    return shlex.quote(str(value))


Containers = str | Mapping[str, str] | None  # one name on every node, or each node's own


def container_on(container: Containers, node: str) -> str | None:
    """The serving container on ``node``: one name for every node (launch-cluster.sh), or
    each node's own (a sparkrun job's ``..._node_<rank>``)."""
    if container is None or isinstance(container, str):
        return container
    return container.get(node)


def container_names(container: Containers) -> str:
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
            f"if [ -x {quote(gather)} ]; then ln -sfn {quote(gather)} "
            f"/tmp/{token}.mpi/{NCCL_TESTS_GATHER}; fi && "
            if gather
            else ""
        )
        inner = (
            f"mkdir -p -m 700 /tmp/{token}.mpi && ln -sfn {quote(binary)} "
            f"/tmp/{token}.mpi/{NCCL_TESTS} && {link_gather}echo /tmp/{token}.mpi"
        )
        if container:
            return f"docker exec {quote(container)} sh -c {quote(inner)}"
        return inner
    payload = base64.b64encode(script.encode()).decode()
    return (
        f"d=$(mktemp -d /tmp/{token}.XXXXXX) && printf %s {payload} | base64 -d "
        f'> "$d/{SCRIPT}" && echo "$d"'
    )


@dataclass(frozen=True)
class Job:
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
    argv = " ".join(quote(a) for a in args)
    if launcher == "container":
        if not container:
            raise ValueError("the container launcher needs the serving container's name")
        envs = " ".join(f"-e {quote(f'{k}={v}')}" for k, v in env.items())
        return (
            f"exec docker exec -i {envs + ' ' if envs else ''}{quote(container)} "
            f"{quote(python)} - {argv} < {quote(script)}"
        )
    if launcher != "python":
        raise ValueError(f"no rank command for launcher {launcher!r}")
    assigns = " ".join(quote(f"{k}={v}") for k, v in env.items())
    return (
        f"cd {quote(workdir)} && exec env {assigns + ' ' if assigns else ''}"
        f"{quote(python)} {quote(script)} {argv}"
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
    line = " ".join(quote(c) for c in cmd)
    if inner:
        return line
    if container:
        return f"exec docker exec {quote(container)} {line}"
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
            steps.append(f"echo {quote(SECTION + name)}")
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
        return f"exec docker exec {quote(container)} sh -c {quote(script)}"
    return f"exec sh -c {quote(script)}"


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
    pat = quote(_pattern(token))
    parts = []
    if container:
        exec_in = f"docker exec {quote(container)} sh -c"
        parts.append(f"{exec_in} {quote(_KILL_INNER)} {pat} </dev/null >/dev/null 2>&1")
        parts.append(f"{exec_in} 'rm -rf /tmp/'{pat}'.*' </dev/null >/dev/null 2>&1")
    parts.append(f"sh -c {quote(_KILL_INNER)} {pat}")
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
    host += (
        f'v=$(t {t} {quote(python)} -c {quote(torch)} 2>/dev/null | tail -n 1); echo "torch=$v"; '
    )
    inner = find_arp.replace("PREFIX", "c_") + (
        f"v=$({quote(container_python(python))} -c {quote(torch)} 2>/dev/null | tail -n 1); "
        'echo "c_torch=$v"'
    )
    helper = (
        't() { if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi; }; '
    )
    script = helper + host
    if container:
        script += (
            f"if command -v docker >/dev/null 2>&1; then t {t} docker exec "
            f"{quote(container)} sh -c {quote(inner)} 2>/dev/null; "
            f'echo "c_rc=$?"; else echo "c_rc=docker-missing"; fi'
        )
    return f"sh -c {quote(script)}"


# The rendezvous port (rank 0's TCPStore), drawn below Linux's ephemeral range (32768-60999
# by default), where the head's own outgoing connections (SSH, Ray, the engine's clients)
# hold ports: one drawn from 31000-38999 was once in use there and rank 0's store "failed
# to listen" (a switch row in CI). Above Ray's worker ports (10002-19999) and below
# torch's and the launcher's 29500/29501.
PORT_LO, PORT_HI = 20000, 29000


def free_range_port() -> int:
    """A random port in [PORT_LO, PORT_HI): outside the ephemeral range and Ray's ports."""
    return PORT_LO + secrets.randbelow(PORT_HI - PORT_LO)


# The shipped script's files (scripts/), in load order: the last is the program, run as
# __main__; the others are the modules it imports (from its folder, or from the bundle).
SCRIPT_PARTS = ("predict_probe", "table_probe", "allreduce_probe")

_BUNDLE_HEAD = '''#!/usr/bin/env python3
"""pytest_spark's all-reduce benchmark, bundled by pytest_spark into one program (its files
in pytest_spark/infra/nccl/scripts/: {names}). A rank runs it from a file or from stdin
(``python3 - ARGS``); each part runs as its own module, the last as ``__main__``."""

import sys
import types

PARTS = [
'''
_BUNDLE_TAIL = """]
for _name, _file, _text in PARTS:
    _module = types.ModuleType(_name)
    _module.__file__ = _file
    sys.modules[_name] = _module
    exec(compile(_text, _file, "exec"), _module.__dict__)
"""


def script_text() -> str:
    """The program copied to a node and run by each rank: the files of ``scripts/``
    (:data:`SCRIPT_PARTS`, each standalone: stdlib, plus torch) bundled into one text."""
    files = resources.files("pytest_spark").joinpath("infra/nccl/scripts")
    last = len(SCRIPT_PARTS) - 1
    parts = "".join(
        f"    ({'__main__' if i == last else name!r}, {name + '.py'!r}, "
        f"{files.joinpath(name + '.py').read_text()!r}),\n"
        for i, name in enumerate(SCRIPT_PARTS)
    )
    names = ", ".join(f"{name}.py" for name in SCRIPT_PARTS)
    return _BUNDLE_HEAD.format(names=names) + parts + _BUNDLE_TAIL
