"""Launch the serving cluster (or attach to it), once per session, even under xdist; and
stop what this session started.

The launcher driver: ``launch-cluster.sh`` on the head over SSH, the way operators do by
hand::

    nohup ./launch-cluster.sh -n IP,IP -t IMAGE --name NAME exec vllm serve ... &

and ``launch-cluster.sh --name NAME stop`` again. Works unchanged against the real script on
real Sparks and the one sparksim installs.

The session: the first process to take the lock launches and waits (``wait.wait_ready``);
the others read the outcome from the run directory. Teardown happens once, in the
controller (``stop_if_launched``), also after a failure or Ctrl-C, and only for what this
session started."""

from __future__ import annotations

import dataclasses
import json
import posixpath
import shlex
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from filelock import FileLock

from pytest_spark.access.base import CommandResult, RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.access.files import write_json
from pytest_spark.access.layout import LayoutError, ServingLayout, launcher_layout
from pytest_spark.infra.serveargs import mode_of_processes, parse_serve_args
from pytest_spark.readiness.launchers import ClusterLauncher, LaunchError, Notify, Record, StoodUp
from pytest_spark.readiness.sparkrun_launch import SparkrunLauncher
from pytest_spark.readiness.wait import (
    SINCE_START,
    NodeProbe,
    StartupFailed,
    WaitSpec,
    parse_probe,
    probe_command,
    wait_ready,
)
from pytest_spark.readiness.watch import StartupWatch
from pytest_spark.settings.resolve import Settings

# How a launch-cluster.sh that has Ray as an option parses it (`--ray)` in its case, or
# `--ray|...`); the scripts from before mid-2026 always start Ray and have no such flag.
RAY_FLAG_PATTERN = r"(^|[[:space:]|(])--ray[)|]"
# How long teardown waits for a signalled launcher's own cleanup, after `stop` (its `docker
# stop` on every node, head first, then each worker over SSH: quick once they are stopped).
LAUNCHER_EXIT_WAIT_S = 60.0


def shell_path(path: str) -> str:
    """A path for the head's shell: quoted, with a leading ``~/`` left to expand there."""
    if path == "~" or path.startswith("~/"):
        rest = path[2:]
        return '"$HOME"' + (f"/{shlex.quote(rest)}" if rest else "")
    return shlex.quote(path)


def dotenv_path(script: str) -> str:
    """The ``.env`` the launcher reads: beside the script."""
    return posixpath.join(posixpath.dirname(script) or ".", ".env")


def parse_dotenv(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of a launcher ``.env`` (comments, ``export``, quotes allowed)."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.removeprefix("export ").partition("=")
        if not eq or not key.strip().isidentifier():
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        values[key.strip()] = value
    return values


@dataclass(frozen=True)
class LaunchSpec:
    script: str
    nodes: tuple[str, ...]
    image: str | None
    container: str
    serve_args: tuple[str, ...]
    nccl_debug: str | None = None
    log_path: str = "/tmp/pytest-spark-launch.log"
    ray: bool = False  # Ray mode: --ray; without it the launcher runs no Ray (its default)

    def base(self) -> list[str]:
        argv = ["-n", ",".join(self.nodes), "--name", self.container]
        if self.image:
            argv += ["-t", self.image]
        if self.nccl_debug:
            argv += ["--nccl-debug", self.nccl_debug]
        if self.ray:
            argv += ["--ray"]
        return argv

    def _command(self, *args: str) -> str:
        return f"{shell_path(self.script)} {shlex.join([*self.base(), *args])}"

    def start_command(self) -> str:
        """Backgrounded with setsid/nohup and no tty, so the SSH call returns at once."""
        return (
            f"setsid nohup {self._command('exec', *self.serve_args)} "
            f">{shlex.quote(self.log_path)} 2>&1 </dev/null & echo $!"
        )

    def stop_command(self) -> str:
        return self._command("stop")

    def _is_launcher(self, pid: int) -> str:
        """A shell test: ``pid`` is alive (not a zombie) and is this launcher (a PID of an
        earlier start may have been reused by an unrelated process)."""
        name = shlex.quote(posixpath.basename(self.script.rstrip("/")) or self.script)
        return (
            f"[ -r /proc/{pid}/stat ] && ! grep -q '^[0-9]* (.*) Z' /proc/{pid}/stat && "
            f"tr '\\0' ' ' </proc/{pid}/cmdline 2>/dev/null | grep -qF -- {name}"
        )

    def signal_command(self, pid: int) -> str:
        """TERM the backgrounded launcher ``pid``, if that process is still this launcher.

        The launcher (not in daemon mode) traps EXIT/TERM with its cleanup, which
        ``docker stop``s the container by name on every node. bash runs that trap only
        when its foreground command returns: in Ray mode that is the head's ``docker exec
        ... vllm serve``, which returns once ``stop`` has stopped the container. So
        teardown signals first, stops, then waits (:meth:`wait_command`): the cleanup is
        over before anyone launches again. Killed after ``stop`` and not waited for, it
        ran late and stopped the *next* launch's containers (CI: a second run's ``docker
        exec`` found "No such container" on both nodes).

        The TERM goes to the launcher's process group (``setsid`` made it the leader) when
        it leads one: its foreground child gets it too, so the trap runs now, not when
        that child returns. Since 2026-09-15 that child is ``sleep
        $HEAD_EXEC_POLL_INTERVAL`` (5 s) in the no-Ray head's wait loop, and teardown sat
        out up to 5 s of it; in Ray mode it is the head's ``docker exec``. The trap's
        ``docker stop`` and the ``stop`` after it both tolerate a stopped container."""
        pg = f"$(sed 's/.*) //' /proc/{pid}/stat 2>/dev/null | cut -d' ' -f3)"
        return (
            f'if {self._is_launcher(pid)}; then if [ "{pg}" = {pid} ]; then '
            f"kill -s TERM -- -{pid} 2>/dev/null; else kill {pid} 2>/dev/null; fi; fi; true"
        )

    def wait_command(self, pid: int, wait_s: float = LAUNCHER_EXIT_WAIT_S) -> str:
        """Wait up to ``wait_s`` until the launcher ``pid`` has exited (its cleanup done)."""
        ticks = max(1, int(wait_s * 10))
        return (
            f"i=0; while {self._is_launcher(pid)} && [ $i -lt {ticks} ]; "
            "do sleep 0.1; i=$((i+1)); done; true"
        )

    def status_command(self) -> str:
        return self._command("status")


class Launcher:
    """Starts and stops the serving cluster through the head; remembers what it started."""

    def __init__(self, head: Node, spec: LaunchSpec) -> None:
        self.head = head
        self.spec = spec
        self.pid: int | None = None
        self.knows_ray = True  # the script has a --ray flag (read by preflight)

    def preflight(self) -> None:
        """The script is there; and whether it knows ``--ray`` (:attr:`knows_ray`)."""
        script = shell_path(self.spec.script)
        result = self.head.run(
            f"test -f {script} || exit 3; grep -qE -- {shlex.quote(RAY_FLAG_PATTERN)} {script} "
            "&& echo ray-flag; true",
            timeout=15,
        )
        if not result.ok:
            raise LaunchError(
                f"{self.head.name}: launch script {self.spec.script} not found on the head; "
                "clone eugr/spark-vllm-docker there (git clone ... ~/spark-vllm-docker) or "
                "set --spark-launch-script to its path"
            )
        self.knows_ray = "ray-flag" in result.stdout

    def without_ray_flag(self) -> None:
        """An older launch-cluster.sh (before mid-2026) always starts Ray and has no
        ``--ray``: passing one would make it the command to run."""
        self.spec = replace(self.spec, ray=False)

    def dotenv(self) -> dict[str, str]:
        """The launcher's ``.env`` beside the script (empty when there is none)."""
        path = shell_path(dotenv_path(self.spec.script))
        result = self.head.run(f"cat {path} 2>/dev/null; true", timeout=15)
        return parse_dotenv(result.stdout)

    def start(self) -> int:
        result = self.head.run(self.spec.start_command(), timeout=30)
        pid = result.stdout.strip().splitlines()[-1:] if result.ok else []
        if not pid or not pid[0].isdigit():
            raise LaunchError(
                f"{self.head.name}: could not start the launcher:\n{result.evidence()}"
            )
        self.pid = int(pid[0])
        return self.pid

    def launcher_log(self, lines: int = 40) -> str:
        try:
            result = self.head.run(
                f"tail -n {int(lines)} {shlex.quote(self.spec.log_path)}", timeout=10
            )
        except RemoteError:
            return ""
        return result.stdout


STATE = "serving.json"
STOP_TIMEOUT_S = 120.0  # the launcher's stop (docker stop on every node through the head)
DEFAULT_CONTAINER = "vllm_node"  # launch-cluster.sh's default --name


class NotServing(Exception):
    """The cluster is not (and will not become) ready; the message says what was found."""


@dataclass(frozen=True)
class ServingInfo:
    launched: bool
    ready_s: float | None
    timeline: list[dict[str, Any]]
    facts: dict[str, str]
    mode: str | None = None  # "ray" | "no-ray" | None (not known)
    mode_source: str = ""  # how the mode was known
    nodes: tuple[str, ...] = ()  # the nodes that serve a rank (empty: every node)
    idle_nodes: tuple[str, ...] = ()  # configured, left idle by design (the launcher trims)
    idle_because: str = ""


def fabric_addresses(cluster: Cluster) -> tuple[str, ...]:
    """Each node's address on its primary fabric interface, as launch-cluster.sh wants them
    in -n (it checks that the local fabric IP is in that list)."""
    from pytest_spark.infra.links.gather import node_link_facts
    from pytest_spark.infra.links.probe import primary_fabric_if

    addresses = []
    for node in cluster.nodes:
        facts = node_link_facts(cluster, node)
        ifname = primary_fabric_if(facts)
        addrs = facts.ip_addrs.get(ifname or "", [])
        if not addrs:
            why = (
                ""
                if facts.roce or facts.rdma
                else " (ibdev2netdev and `rdma link` list no RDMA device: are the RDMA "
                "drivers loaded? modprobe mlx5_ib)"
            )
            raise NotServing(
                f"{node.name}: no fabric interface with an IPv4 address (ibdev2netdev Up)"
                f"{why}: cannot give launch-cluster.sh its -n list; set --spark-launch-nodes"
            )
        addresses.append(str(addrs[0].ip))
    return tuple(addresses)


def launch_spec(settings: Settings, cluster: Cluster, ray: bool = False) -> LaunchSpec:
    if not settings.serve_args:
        raise NotServing(
            "--spark-launch needs --spark-serve-args='vllm serve MODEL ...' (the "
            "command the launcher runs in the head container)"
        )
    nodes = settings.launch_nodes or fabric_addresses(cluster)
    return LaunchSpec(
        settings.launch_script,
        tuple(nodes),
        settings.image,
        settings.container,
        tuple(shlex.split(settings.serve_args)),
        settings.nccl_debug,
        log_path=f"/tmp/pytest-spark-launch-{uuid.uuid4().hex[:12]}.log",
        ray=ray,
    )


def configured_mode(settings: Settings) -> tuple[str | None, str]:
    """Ray or no-Ray as the settings and the serve args say, and how that is known."""
    if settings.ray != "auto":
        return ("ray" if settings.ray == "on" else "no-ray"), settings.source("ray")
    if settings.serve_args:
        mode = parse_serve_args(settings.serve_args).mode
        if mode is not None:
            return mode, "the serve args"
    if settings.launch:
        return "no-ray", "launch-cluster.sh's default (no --ray)"
    return None, ""


def ray_only_script(
    launcher: Launcher, settings: Settings, mode: str | None, mode_source: str
) -> tuple[str | None, str]:
    """A launch-cluster.sh without ``--ray`` (before mid-2026) always starts Ray: pass no
    flag, and watch a Ray cluster; asked for no Ray explicitly, say it cannot."""
    if launcher.knows_ray:
        return mode, mode_source
    if mode == "no-ray" and settings.ray == "off":
        raise LaunchError(
            f"{launcher.head.name}: {launcher.spec.script} has no --ray option: it predates "
            "launch-cluster.sh's no-Ray mode and always starts Ray, but "
            f"{settings.source('ray')} asks for no Ray (--spark-ray=off); update the "
            "script's checkout (git pull) or give --spark-ray=on"
        )
    launcher.without_ray_flag()
    return "ray", f"{launcher.spec.script} has no --ray option (it always starts Ray)"


def serving_nodes(
    cluster: Cluster, settings: Settings, info: ServingInfo | None = None
) -> list[Node]:
    """The nodes the launcher keeps: it trims its node list to TP x PP x DP (one GPU a
    node on a Spark), head first; what the launch or attach found (``info``) when known."""
    if info is not None and info.nodes:
        return [n for n in cluster.nodes if n.name in info.nodes]
    return kept_nodes(cluster, settings)[0]


def idle_by_design(
    cluster: Cluster, settings: Settings, info: ServingInfo | None, node: str
) -> str | None:
    """The skip reason of a check that needs ``node``'s serving container when the node
    serves no rank by design (the launcher trimmed it: no container there), else None."""
    kept = [n.name for n in serving_nodes(cluster, settings, info)]
    if node in kept:
        return None
    why = info.idle_because if info is not None and info.idle_because else ""
    why = why or kept_nodes(cluster, settings)[1]
    return (
        f"{node} is idle by design: it serves no rank, the cluster keeps {len(kept)} "
        f"node(s) ({', '.join(kept)}): {why}"
    )


def head_serve_line(processes: list[str]) -> str | None:
    """The head's ``vllm serve ...`` out of its container's process lines (``docker top``
    args; a launch script's ``bash /workspace/exec-script.sh`` has it in a child)."""
    for line in processes:
        if "vllm serve" in line:
            return line[line.index("vllm serve") :]
    return None


def kept_nodes(
    cluster: Cluster, settings: Settings, attached_line: str | None = None
) -> tuple[list[Node], str]:
    """(the nodes that serve a rank, why the others are idle). The serve args' TP x PP x
    DP, as launch-cluster.sh trims its node list (eugr's "Parallelism-Aware Node
    Trimming", 2026-03-31: the head and the first workers); attached without serve args,
    the head's own ``vllm serve`` line: its ``--nnodes`` (no Ray), else its TP x PP x DP."""
    nodes = list(cluster.nodes)
    line, source = settings.serve_args, "the serve args"
    if not line and attached_line:
        line, source = attached_line, "the head's vllm serve process"
    if not line:
        return nodes, ""
    try:
        args = parse_serve_args(line)
    except ValueError:  # a cut or shell-quoted process line
        return nodes, ""
    if source != "the serve args" and args.nnodes is not None:
        used = args.nnodes
        why = f"{source} has --nnodes {used}"
    elif args.parallelism_given:
        used = args.nodes_used()
        why = (
            f"{source}' {args.describe_ranks()}, one GPU a node; launch-cluster.sh prints "
            f"`Note: Command requires {used} node(s) (tp={args.tensor_parallel_size} * "
            f"pp={args.pipeline_parallel_size} * dp={args.data_parallel_size}); using "
            f"{used} of {len(nodes)} configured node(s).` and starts no container there"
        )
    else:
        return nodes, ""
    kept = nodes[: max(1, used)]
    return kept, why if len(kept) < len(nodes) else ""


LEFTOVER_WAIT_S = 30.0  # dockerd removes a stopped --rm container just after `docker stop`


def inspected_state(result: CommandResult) -> tuple[str, str | None]:
    """``docker inspect -f '{{.State.Status}}' NAME``'s answer: ``(state, None)`` with
    state running, exited, ... or "missing" (no such container); ``("unknown", error)``
    when docker itself did not answer (a daemon that is down, no permission on its
    socket): its stderr is docker's error, never a state or a container name."""
    state = result.stdout.strip()
    error = result.stderr.strip()
    if result.ok and state:
        return state.split()[0], None
    if "No such" in error or "No such" in state:
        return "missing", None
    return "unknown", (error or state or f"docker inspect exited {result.rc}").splitlines()[0]


HEAD_TAIL_LINES = 15  # the head's last log lines a not-serving failure quotes


def head_account(
    problem: str,
    node: str,
    container: str,
    status: str,
    lines: list[str],
    log_hint: str | None = None,
) -> tuple[str, dict[str, str]]:
    """A not-serving failure that only says what the API answered (``Connection refused``)
    with the head's own account added: its serving container's state (``exited (code
    137)``: the engine was killed) and its last log lines, in the message and as evidence.
    A problem that already names the container (the readiness watch's), or a container
    that runs (an API key, a proxy: not the engine's story), is kept as it is.
    ``log_hint``: where its log is read (default ``docker logs CONTAINER`` on the node)."""
    if container in problem or status in ("", "running") or status.startswith("unknown"):
        return problem, {}
    tail = [line.rstrip() for line in lines if line.strip()][-HEAD_TAIL_LINES:]
    state = f"{node}: container {container!r} {status}"
    hint = log_hint or f"`docker logs {container}` on {node}"
    message = f"{problem}\n  {state} (its engine is gone: {hint} says why)"
    if tail:
        message += f"\n  {node} log (last {len(tail)} lines):\n" + "\n".join(
            f"    {line}" for line in tail
        )
    return message, {"container": state, f"{node} log": "\n".join(tail)}


DOCKER_SILENT = "unknown: docker did not answer"


def container_states(cluster: Cluster, container: str | ServingLayout) -> dict[str, str]:
    """Each reachable node's state of ``container`` (one name, or a layout's container on
    each node) (``docker inspect``: running, exited,
    removing, ...), "" where there is none, or ``unknown: docker did not answer (...)``
    where the daemon did not (that is no answer about the container: it was read as
    "no container")."""
    layout = launcher_layout(container) if isinstance(container, str) else container

    def inspect(node: Node) -> CommandResult:
        name = shlex.quote(layout.container(node))
        return node.run(f"docker inspect -f '{{{{.State.Status}}}}' {name}", timeout=15)

    reachable = [node for node in cluster.nodes if cluster.unreachable(node) is None]
    results = cluster.map(inspect, reachable)
    states = {}
    for node in reachable:
        result = results[node.name]
        if isinstance(result, RemoteError):
            states[node.name] = ""
        elif result.ok:
            states[node.name] = result.stdout.strip()
        else:
            error = next((ln.strip() for ln in result.stderr.splitlines() if ln.strip()), "")
            silent = error and "no such" not in error.lower()
            states[node.name] = f"{DOCKER_SILENT} ({error})" if silent else ""
    return states


def wait_gone(
    cluster: Cluster,
    container: str | ServingLayout,
    wait_s: float = LEFTOVER_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.monotonic,
) -> dict[str, str]:
    """Wait up to ``wait_s`` for stopped containers of that name to go (a ``--rm``
    container is removed by dockerd after ``docker stop`` returns). Returns what is still
    there: every running one at once, else the stopped ones left after the wait."""
    deadline = now() + wait_s
    while True:
        states = {
            name: state
            for name, state in container_states(cluster, container).items()
            if state and not state.startswith(DOCKER_SILENT)  # the docker check's, not ours
        }
        if not states or "running" in states.values() or now() >= deadline:
            return states
        sleep(1.0)


def refuse_running(
    cluster: Cluster,
    container: str,
    wait_s: float = LEFTOVER_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.monotonic,
) -> None:
    """--spark-launch on a cluster that already runs containers of that name: the launcher
    would skip the launch and exec into them, an old server would answer /health, and
    teardown would stop what this session did not start. A stopped one of that name (an
    earlier run's, still being removed, or kept) would make the launcher's unchecked
    ``docker run --name`` fail, and its ``docker exec`` would reach a dying container."""
    left = wait_gone(cluster, container, wait_s, sleep, now)
    running = [name for name, state in left.items() if state == "running"]
    if running:
        raise NotServing(
            f"--spark-launch: container {container!r} is already running on "
            f"{', '.join(running)}. launch-cluster.sh would skip the launch and exec into it "
            "(an old server would answer /health). Attach to it instead (run without "
            f"--spark-launch), or stop it first (launch-cluster.sh --name {container} stop)"
        )
    if left:
        found = ", ".join(f"{name} ({state})" for name, state in left.items())
        raise NotServing(
            f"--spark-launch: a stopped container {container!r} is still there on {found} "
            f"after {wait_s:.0f} s: launch-cluster.sh's `docker run --name {container}` "
            "would fail on the name and its `docker exec` would reach no server. Remove it "
            f"on that node (docker rm -f {container}) and run again"
        )


def apply_dotenv(cluster: Cluster, settings: Settings, launcher: Launcher) -> Launcher:
    """The launcher's ``.env`` wins over some of its flags. Its CONTAINER_NAME wins over
    ``--name vllm_node`` (the script's default name, even when given): the watch then uses
    it, or fails when --spark-container was set to vllm_node on purpose. LOCAL_IP (the
    head's address, always wins) and ETH_IF (used as no --eth-if is given) are checked."""
    env = launcher.dotenv()
    where = f"{cluster.head.name}: {launcher.spec.script}'s .env"
    name = env.get("CONTAINER_NAME")
    spec = launcher.spec
    if name and name != spec.container and spec.container == DEFAULT_CONTAINER:
        if settings.source("container") != "default":
            raise NotServing(
                f"{where} sets CONTAINER_NAME={name}, but --spark-container is "
                f"{spec.container!r} ({settings.source('container')}): the launcher names "
                f"its containers after the .env when --name is {DEFAULT_CONTAINER}. Give the "
                "same name to both, or remove it from the .env"
            )
        spec = replace(spec, container=name)
    local_ip = env.get("LOCAL_IP")
    if local_ip and local_ip not in spec.nodes:
        raise NotServing(
            f"{where} sets LOCAL_IP={local_ip}, not among the launcher's nodes "
            f"{','.join(spec.nodes)}: the head would not find itself in -n. Fix LOCAL_IP, or "
            "set --spark-launch-nodes"
        )
    eth_if = env.get("ETH_IF")
    if eth_if:
        check = cluster.head.run(f"ip -o link show dev {shlex.quote(eth_if)}", timeout=15)
        if not check.ok:
            raise NotServing(
                f"{where} sets ETH_IF={eth_if}, which {cluster.head.name} does not have: "
                f"{(check.stderr or check.stdout).strip()[:200]}. Fix ETH_IF (ibdev2netdev "
                "lists the fabric interfaces)"
            )
    return launcher if spec is launcher.spec else Launcher(launcher.head, spec)


class LaunchClusterSh:
    """The ``launch-cluster`` launcher plug-in (readiness/launchers.py): eugr's
    launch-cluster.sh on the head, backgrounded there, its containers one name on every
    node; stopped with the script's own ``stop``."""

    name = "launch-cluster"

    def __init__(
        self,
        cluster: Cluster,
        settings: Settings,
        run_dir: Path,
        mode: str | None = None,
        mode_source: str = "",
    ) -> None:
        self.cluster = cluster
        self.settings = settings
        self.mode = mode
        self.mode_source = mode_source

    def describe(self) -> str:
        return f"{self.settings.launch_script} on {self.cluster.head.name}"

    def stand_up(self, record: Record, notify: Notify | None = None) -> StoodUp:
        cluster, settings = self.cluster, self.settings
        launcher = Launcher(cluster.head, launch_spec(settings, cluster, self.mode == "ray"))
        launcher.preflight()
        mode, mode_source = ray_only_script(launcher, settings, self.mode, self.mode_source)
        launcher = apply_dotenv(cluster, settings, launcher)
        container = launcher.spec.container
        if notify is not None and container != settings.container:
            notify(f"the launcher's .env names the container {container!r}: watching it")
        refuse_running(cluster, container)
        pid = launcher.start()
        record({
            "container": container,
            "launch_pid": pid,
            "signal_launcher": launcher.spec.signal_command(pid),
            "wait_launcher": launcher.spec.wait_command(pid),
            "stop_command": launcher.spec.stop_command(),
            "launch_log": launcher.spec.log_path,
        })  # fmt: skip
        return StoodUp(
            container=container,
            pid=pid,
            log=launcher.launcher_log,
            log_path=launcher.spec.log_path,
            mode=mode,
            mode_source=mode_source,
        )

    @staticmethod
    def tear_down(
        cluster: Cluster,
        state: Mapping[str, Any],
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], float] = time.monotonic,
    ) -> str | None:
        return stop_launch_cluster(cluster, state, sleep, now)


# --spark-launcher's names -> plug-ins (the one table a new launcher adds a line to).
LAUNCHERS: dict[str, type[LaunchClusterSh] | type[SparkrunLauncher]] = {
    LaunchClusterSh.name: LaunchClusterSh,
    SparkrunLauncher.name: SparkrunLauncher,
}


def make_launcher(
    cluster: Cluster, settings: Settings, run_dir: Path, mode: str | None, mode_source: str
) -> ClusterLauncher:
    """The plug-in ``--spark-launcher`` names, ready to stand the cluster up."""
    return LAUNCHERS[settings.launcher](cluster, settings, run_dir, mode, mode_source)


def job_layout(cluster: Cluster, settings: Settings, job: str | None) -> ServingLayout:
    """A launched sparkrun job's rank containers, found by its id on the nodes."""
    return cluster.discover_layout(dataclasses.replace(settings, job=job))


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


def ensure_serving(
    cluster: Cluster,
    settings: Settings,
    run_dir: Path,
    progress: Callable[[StartupWatch, float], None] | None = None,
    notify: Callable[[str], None] | None = None,
) -> ServingInfo:
    state_path = run_dir / STATE
    with FileLock(str(run_dir / "serving.lock")):
        state = _read(state_path)
        if state is not None and state.get("status") != "launching":
            if state.get("layout"):  # the containers the session's serving process watched
                cluster.layout = ServingLayout.from_json(state["layout"])
            if state["status"] == "failed":
                raise NotServing(state["message"])
            return ServingInfo(
                state["launched"],
                state.get("ready_s"),
                state["timeline"],
                state["facts"],
                state.get("mode"),
                state.get("mode_source", ""),
                tuple(state.get("nodes", ())),
                tuple(state.get("idle_nodes", ())),
                state.get("idle_because", ""),
            )
        if cluster.unreachable(cluster.head) is not None:
            raise NotServing(f"head unreachable: {cluster.head._error}")
        profile = settings.profile
        launcher: StoodUp | None = None
        doc: dict[str, Any] = {
            "status": "launching",
            "launched": False,
            "timeline": [],
            "facts": {},
        }
        t0 = time.monotonic()
        mode, mode_source = configured_mode(settings)
        container = settings.container
        attached_line: str | None = None
        try:
            layout = cluster.layout if not settings.launch else launcher_layout(container)
            log_path: str | None = None
            head_log_visible = True
            if settings.launch:
                plugin = make_launcher(cluster, settings, run_dir, mode, mode_source)

                def record(entries: Mapping[str, Any]) -> None:
                    doc.update(entries, launched=True)
                    write_json(state_path, doc)

                launcher = plugin.stand_up(record, notify)
                mode = launcher.mode or mode
                mode_source = launcher.mode_source or mode_source
                if launcher.container is not None:
                    container = launcher.container
                    layout = cluster.layout = launcher_layout(container)
                else:
                    layout = cluster.layout = job_layout(cluster, settings, launcher.job)
                # launch-cluster.sh: in Ray mode the head's vLLM output is the launcher's
                # stdout. Without Ray the head writes to its container log, which the
                # launcher only echoes (since 2026-09-15; before, it too was on the
                # launcher's stdout): the launcher's log is read until the head's container
                # log shows vLLM output.
                log_path = launcher.log_path
            else:
                head = attach_precheck(cluster, settings)
                if notify is not None and layout.job is not None:
                    notify(f"attached to {layout.describe()}")
                if mode is None and head.processes:
                    mode = mode_of_processes(head.processes)
                    mode_source = "the head container's processes" if mode else ""
                attached_line = head_serve_line(head.processes or [])
                log_path = settings.serve_log
                if log_path is None and mode != "no-ray" and layout.serve_log is None:
                    head_log_visible = False
                    if notify is not None:
                        notify(
                            f"{cluster.head.name}'s vLLM output is not visible: in Ray mode "
                            "launch-cluster.sh prints it to its own stdout (the operator's "
                            "log), not to docker logs; give --spark-serve-log=PATH to follow "
                            "it. Waiting on /health and the workers' logs"
                        )
            kept, idle_because = kept_nodes(cluster, settings, attached_line)
            doc.update(mode=mode, mode_source=mode_source, nodes=[n.name for n in kept])
            doc.update(layout=layout.to_json())
            idle = [n.name for n in cluster.nodes if n not in kept]
            if idle:
                doc.update(idle_nodes=idle, idle_because=idle_because)
                if notify is not None:
                    notify(f"{', '.join(idle)}: idle by design ({idle_because})")
            spec = WaitSpec(
                container=layout.default,
                containers=dict(layout.containers),
                serve_log=layout.serve_log,
                port=settings.port,
                ready_timeout=settings.ready_timeout,
                hang_timeout=settings.hang_timeout,
                placement_timeout=profile.readiness.placement_group_timeout_s,
                since=SINCE_START,
                nodes=tuple(kept),
                head_log_visible=head_log_visible,
                launcher_pid=launcher.pid if launcher else None,
                launcher_log=launcher.log if launcher else None,
                launcher_log_path=log_path,
                launcher_log_fallback=bool(launcher and launcher.log) and mode != "ray",
            )
            watch = wait_ready(cluster, spec, progress=progress, notify=notify)
        except StartupFailed as exc:
            doc.update(
                status="failed",
                failed_s=round(time.monotonic() - t0, 3),
                message=str(exc),
                timeline=exc.watch.timeline(),
                facts=exc.watch.facts,
            )
            write_json(state_path, doc)
            raise NotServing(str(exc)) from None
        except (LaunchError, NotServing, RemoteError, LayoutError) as exc:
            doc.update(status="failed", failed_s=round(time.monotonic() - t0, 3), message=str(exc))
            write_json(state_path, doc)
            raise NotServing(str(exc)) from None
        doc.update(
            status="ready",
            ready_s=round(time.monotonic() - t0, 3),
            timeline=watch.timeline(),
            facts=watch.facts,
        )
        write_json(state_path, doc)
        return ServingInfo(
            doc["launched"],
            doc["ready_s"],
            doc["timeline"],
            doc["facts"],
            doc.get("mode"),
            doc.get("mode_source", ""),
            tuple(doc.get("nodes", ())),
            tuple(doc.get("idle_nodes", ())),
            doc.get("idle_because", ""),
        )


def attach_precheck(cluster: Cluster, settings: Settings) -> NodeProbe:
    """Attach mode: report what is there instead of waiting on nothing. Returns the
    head's probe (its serving processes tell Ray from no-Ray)."""
    layout = cluster.layout
    cmd = probe_command(
        layout.container(cluster.head),
        SINCE_START,
        settings.port,
        None,
        processes=True,
        serve_log=layout.serve_log,
    )
    head = parse_probe(cluster.head.run(cmd, timeout=15))
    if head.health == "200":
        return head
    states = {cluster.head.name: head.status}
    reachable = [node for node in cluster.workers if cluster.unreachable(node) is None]

    def probe(node: Node) -> CommandResult:
        return node.run(probe_command(layout.container(node), "1s", None, None), timeout=15)

    # All workers at once (a serial loop grew with the node count); the first worker's
    # error, in worker order, is raised as the loop raised it.
    results = cluster.map(probe, reachable)
    for node in reachable:
        result = results[node.name]
        if isinstance(result, RemoteError):
            raise result
        states[node.name] = parse_probe(result, with_health=False).status
    if all(status == "missing" or status.startswith("unknown") for status in states.values()):
        found = ", ".join(f"{n}: {s}" for n, s in states.items())
        raise NotServing(
            f"attach mode: the cluster is not serving. API /health on {cluster.head.name} port "
            f"{settings.port}: {_health_text(head.health)}; {_containers_text(layout)}: "
            f"{found}. Start it (launch-cluster.sh, or run with --spark-launch), or point "
            "--spark-container / --spark-port at what is running"
        )
    return head


def _containers_text(layout: ServingLayout) -> str:
    if layout.job is None:
        return f"container {layout.default!r}"
    return f"sparkrun job {layout.job.cluster_id}'s containers"


def _health_text(code: str | None) -> str:
    return {"000": "connection refused or timed out", None: "not probed"}.get(code, f"HTTP {code}")


def stop_if_launched(
    cluster: Cluster,
    run_dir: Path,
    keep: bool,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.monotonic,
) -> str | None:
    """Controller teardown: stop what this session launched (and nothing else), with the
    launcher that started it (serving.json's ``launcher``)."""
    state = _read(run_dir / STATE)
    if not state or not state.get("launched") or state.get("stopped") or keep:
        return None
    plugin = LAUNCHERS[state.get("launcher", LaunchClusterSh.name)]
    try:
        cluster.connect()
        problem = plugin.tear_down(cluster, state, sleep, now)
    except RemoteError as exc:
        return f"could not stop the cluster: {exc}"
    state["stopped"] = True
    write_json(run_dir / STATE, state)
    return problem


def stop_launch_cluster(
    cluster: Cluster,
    state: Mapping[str, Any],
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.monotonic,
) -> str | None:
    """launch-cluster.sh's teardown (may raise RemoteError)."""
    # The launcher is signalled, the containers stopped, then the launcher waited for:
    # its own cleanup (a trap on TERM, run once its foreground command returns) stops
    # the containers by name, and must be over before anyone launches again.
    if state.get("signal_launcher"):
        cluster.head.run(state["signal_launcher"], timeout=15)
    result = cluster.head.run(state["stop_command"], timeout=STOP_TIMEOUT_S)
    if state.get("wait_launcher"):
        cluster.head.run(state["wait_launcher"], timeout=LAUNCHER_EXIT_WAIT_S + 15)
    if state.get("launch_log"):  # the launcher's output, kept only while it serves
        cluster.head.run(f"rm -f {shlex.quote(state['launch_log'])}; true", timeout=10)
    # `docker stop` returns before dockerd has removed a --rm container: wait, so that
    # the next launch (this suite's or an operator's) finds the name free.
    container = state.get("container")
    left = wait_gone(cluster, container, sleep=sleep, now=now) if container else {}
    if container and "running" in left.values():
        # Started after the stop: the TERM reached the launcher's group while it was
        # still starting the cluster (an interrupt during readiness), and a `docker
        # run` it had sent went through after ours stopped the rest. The launcher is
        # gone now (waited for above): one more stop catches what it left.
        result = cluster.head.run(state["stop_command"], timeout=STOP_TIMEOUT_S)
        left = wait_gone(cluster, container, sleep=sleep, now=now)
    if not result.ok:
        return f"launcher stop exited {result.rc}: {result.stderr[-500:]}"
    if left:
        found = ", ".join(f"{name} ({status})" for name, status in left.items())
        return (
            f"after launch-cluster.sh stop, container {state['container']!r} is still there "
            f"on {found} after {LEFTOVER_WAIT_S:.0f} s; remove it (docker rm -f "
            f"{state['container']}) before the next launch"
        )
    return None
