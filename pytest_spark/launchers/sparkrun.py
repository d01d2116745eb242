"""``--spark-launch --spark-launcher=sparkrun --spark-recipe=R``: the cluster stood up by
the real sparkrun CLI, from this machine, as its users start one::

    sparkrun run R --hosts HEAD,WORKER... --offline --no-follow [--spark-sparkrun-args]

and stopped with ``sparkrun stop CLUSTER_ID --hosts ...``, always (an interrupt during the
start included: what teardown needs is saved before sparkrun starts). sparkrun itself
waits for rank 0 (its master port, HTTP, one first token) and returns; the suite's
readiness watch then takes over with every rank (REFERENCE.md 6a).

Nothing is added that the user did not ask for: no ``--trust`` (a recipe's hooks and host
paths run only when ``--spark-sparkrun-args`` passes it), no registry, no download
(``--offline``; ``--online`` in the args wins, as the last flag does in sparkrun). sparkrun
reaches the nodes with plain ``ssh HOST``: where the suite reaches them through files of
its own (``--spark-ssh-config`` other than ``~/.ssh/config``, ``--spark-ssh-key``,
``--spark-user``), an ``ssh`` first on sparkrun's PATH adds them, so both reach the same
nodes the same way and the operator's ``~/.ssh`` is not touched. A failed start is one
failure in sparkrun's own words (its ``Error:`` lines, else its last lines).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_spark.access.base import CommandResult, RemoteError
from pytest_spark.access.cluster import Cluster
from pytest_spark.access.layout import ServingLayout
from pytest_spark.launchers.base import LauncherLog, LaunchError, Notify, Record, StoodUp
from pytest_spark.settings.resolve import Settings

NAME = "sparkrun"
SHIM_DIR = "sparkrun-ssh"  # in the run directory: the ssh that adds the suite's files
RUN_LOG = "sparkrun-run.log"  # in the run directory: what `sparkrun run` printed
RUN_MARGIN_S = 600.0  # sparkrun's own steps before its readiness wait (image, model copy)
STOP_TIMEOUT_S = 180.0
INTERRUPT_WAIT_S = 20.0  # an interrupted `sparkrun run` is given this long to exit
GONE_WAIT_S = 30.0  # dockerd removes a stopped --rm container just after `docker stop`
TAIL_LINES = 15
# Its phase lines, its job id and its readiness verdict, passed on as notices.
PROGRESS = re.compile(r"^(\[\d+/\d+\] .+|Cluster:\s+\S+|\[sparkrun\] Inference ready.*)$")
CLUSTER_LINE = re.compile(r"^Cluster:\s+(sparkrun_\S+)", re.M)
# `sparkrun stop RECIPE` recomputes the job id from these (its --help: "to match run-time
# override"): passed on from the run's arguments when the id itself is not known.
STOP_MATCHING = ("--tp", "--tensor-parallel", "--port", "--served-model-name")
NOTHING_TO_STOP = "No running workload matches"  # `sparkrun stop RECIPE`: none was started
RUNTIME_MODES = {"vllm-distributed": "no-ray", "vllm-ray": "ray", "eugr-vllm": "ray"}


def sparkrun_binary(settings: Settings) -> str:
    """``--spark-sparkrun`` (an executable file), else ``sparkrun`` on PATH."""
    given = settings.sparkrun
    if given is not None:
        if not (given.is_file() and os.access(given, os.X_OK)):
            raise LaunchError(
                f"--spark-sparkrun={given} ({settings.source('sparkrun')}) is not an executable "
                "file: give the path of the sparkrun CLI (`which sparkrun`; this checkout's "
                "scripts/setup-sparkrun installs one in .venv-sparkrun/bin/sparkrun)"
            )
        return str(given.resolve())  # teardown may run from elsewhere
    found = shutil.which("sparkrun")
    if found is None:
        raise LaunchError(
            "--spark-launcher=sparkrun: no sparkrun on PATH. Install it (pip install "
            "sparkrun; it needs Python >= 3.12) or give --spark-sparkrun=PATH"
        )
    return found


def recipe_file(settings: Settings) -> Path:
    """The recipe file ``--spark-recipe`` names (sparkrun runs the file; the suite only
    reads it)."""
    recipe = settings.recipe
    path = getattr(recipe, "path", None)
    if path is None and recipe is not None and recipe.origin.startswith("recipe "):
        path = recipe.origin.removeprefix("recipe ")
    if path is None:
        raise LaunchError(
            "--spark-launcher=sparkrun runs a recipe: give --spark-recipe=PATH (a sparkrun v2 "
            "recipe YAML; `sparkrun show NAME` finds a registry recipe's file)"
        )
    return Path(path).expanduser().resolve()


def ssh_options(settings: Settings) -> list[str]:
    """What the suite's own SSH settings add to a plain ``ssh HOST``."""
    opts: list[str] = []
    config = settings.ssh_config.expanduser()
    if config != Path("~/.ssh/config").expanduser() and config.is_file():
        opts += ["-F", str(config)]
    if settings.ssh_key is not None:
        opts += ["-i", str(settings.ssh_key.expanduser())]
    if settings.user:
        opts += ["-l", settings.user]
    return opts


def write_ssh_shim(directory: Path, options: Sequence[str]) -> Path | None:
    """``DIR/ssh``: the real ssh with ``options`` first (None: nothing to add, or no ssh)."""
    real = shutil.which("ssh")
    if not options or real is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "ssh"
    shim.write_text(
        "#!/bin/sh\n# pytest-dgx-spark: sparkrun's ssh reaches the nodes as the suite does\n"
        f'exec {shlex.quote(real)} {shlex.join(options)} "$@"\n'
    )
    shim.chmod(0o755)
    return directory


def sparkrun_env(path_prefix: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if path_prefix:
        env["PATH"] = path_prefix + os.pathsep + env.get("PATH", os.defpath)
    return env


def own_words(output: str) -> tuple[str, str]:
    """sparkrun's account of a failure: (its headline, its lines). The lines from its first
    ``Error:`` on (the error, what is missing where, its ``Fix:``), else its ``ERROR`` log
    lines, else its last lines; the headline is the first of them, ``Error:`` dropped."""
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    first = next((i for i, ln in enumerate(lines) if ln.startswith("Error:")), None)
    if first is not None:
        picked = lines[first:][:TAIL_LINES]
    else:
        picked = [ln for ln in lines if re.search(r"\bERROR\b", ln)][-TAIL_LINES:]
        picked = picked or lines[-TAIL_LINES:]
    if not picked:
        return "it printed nothing", "    (no output)"
    headline = picked[0].strip().removeprefix("Error:").strip()
    return headline, "\n".join(f"    {ln}" for ln in picked)


def stop_matching_args(args: Sequence[str]) -> list[str]:
    """The run's arguments ``sparkrun stop RECIPE`` needs to find the same job."""
    out: list[str] = []
    it = iter(range(len(args)))
    for i in it:
        word = args[i]
        flag = word.split("=", 1)[0]
        if flag not in STOP_MATCHING:
            continue
        if "=" in word:
            out.append(word)
        elif i + 1 < len(args):
            out += [word, args[i + 1]]
            next(it, None)
    return out


class SparkrunLauncher:
    """The ``sparkrun`` launcher plug-in (``launchers.base``'s interface)."""

    name = NAME

    def __init__(
        self,
        cluster: Cluster,
        settings: Settings,
        run_dir: Path,
        mode: str | None = None,
        mode_source: str = "",
    ) -> None:
        _ = mode, mode_source  # sparkrun's runtime decides (the recipe's ``runtime``)
        self.cluster = cluster
        self.settings = settings
        self.run_dir = run_dir
        self.binary = sparkrun_binary(settings)
        self.recipe = recipe_file(settings)
        self.hosts = ",".join(node.address for node in cluster.nodes)
        self.output: list[str] = []
        self.job: str | None = None  # the job's cluster id, once sparkrun named it

    def run_argv(self) -> list[str]:
        return [
            self.binary, "run", str(self.recipe), "--hosts", self.hosts,
            "--offline", "--no-follow", *self.settings.sparkrun_args,
        ]  # fmt: skip

    def describe(self) -> str:
        return shlex.join(self.run_argv())

    def refuse_running(self) -> None:
        """A sparkrun job already up on the nodes: ``sparkrun run`` would evict one of the
        same recipe (and teardown would then stop what this session did not start), and
        another one would hold the GPU beside it (sparkrun#229: two serves on one box)."""
        try:
            found = _ps(
                self.cluster, "sparkrun.cluster_id",
                '{{.Label "sparkrun.cluster_id"}} {{.Names}}', running=True,
            )  # fmt: skip
        except RemoteError:
            return  # the nodes' own checks say why they cannot be reached
        if found:
            listing = "; ".join(f"{node}: {', '.join(lines)}" for node, lines in found.items())
            ids = sorted({line.split()[0] for lines in found.values() for line in lines})
            raise LaunchError(
                f"--spark-launch: a sparkrun job already runs on the nodes ({listing}). "
                "Attach to it instead (run without --spark-launch), or stop it first "
                f"(sparkrun stop {ids[0]} --hosts {self.hosts})"
            )

    def _mode(self) -> tuple[str | None, str]:
        runtime = getattr(self.settings.recipe, "runtime", None) or ""
        mode = RUNTIME_MODES.get(runtime)
        return mode, (f"the recipe's runtime {runtime}" if mode else "")

    def stand_up(self, record: Record, notify: Notify | None = None) -> StoodUp:
        self.refuse_running()
        shim = write_ssh_shim(self.run_dir / SHIM_DIR, ssh_options(self.settings))
        prefix = str(shim) if shim else None
        record({
            "launcher": NAME,
            "sparkrun": self.binary,
            "recipe": str(self.recipe),
            "hosts": self.hosts,
            "stop_matching": stop_matching_args(self.settings.sparkrun_args),
            "path_prefix": prefix,
            "launch_command": self.describe(),
        })  # fmt: skip
        timeout = self.settings.ready_timeout + RUN_MARGIN_S
        rc = self._run(sparkrun_env(prefix), timeout, notify)
        text = "\n".join(self.output)
        found = CLUSTER_LINE.search(text)
        if found:
            record({"cluster_id": found.group(1)})
        if rc != 0:
            headline, words = own_words(text)
            raise LaunchError(
                f"sparkrun run exited {rc}: {headline}\n  the cluster did not start: "
                f"`{self.describe()}` on this machine says:\n{words}"
            )
        if not found:
            raise LaunchError(
                "sparkrun run exited 0 but named no job (no 'Cluster: sparkrun_...' line): "
                f"`{self.describe()}`; its last lines:\n{own_words(text)[1]}"
            )
        self.job = found.group(1)
        mode, mode_source = self._mode()
        return StoodUp(mode=mode, mode_source=mode_source)

    def watch(self) -> ServingLayout:
        """The job's rank container on each node, found by its id (the containers'
        sparkrun.* labels); vLLM's output is /tmp/sparkrun_serve.log inside each."""
        return self.cluster.discover_layout(dataclasses.replace(self.settings, job=self.job))

    def serve_log(self) -> LauncherLog | None:
        """None: sparkrun returns once rank 0 serves; it keeps no process on the head."""
        return None

    def _run(self, env: Mapping[str, str], timeout: float, notify: Notify | None) -> int:
        """``sparkrun run`` in a session of its own (a terminal's Ctrl-C reaches the suite,
        which then stops it: INT, then KILL after INTERRUPT_WAIT_S), its output in a file
        of the run directory (a child it leaves behind holds no pipe of ours open)."""
        log = self.run_dir / RUN_LOG
        with open(log, "w") as out:
            proc = subprocess.Popen(
                self.run_argv(), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, env=dict(env), start_new_session=True,
            )  # fmt: skip
        done = threading.Event()
        follower = threading.Thread(target=_follow, args=(log, done, notify), daemon=True)
        follower.start()
        try:
            rc = self._wait(proc, time.monotonic() + timeout)
        except BaseException:  # Ctrl-C, SIGTERM (roles.py): stop it first
            _end(proc)
            raise
        finally:
            done.set()
            follower.join(5)
            self.output = log.read_text(errors="replace").splitlines()
        if rc is None:
            raise LaunchError(
                f"sparkrun run did not return within {timeout:.0f} s "
                f"(--spark-ready-timeout + {RUN_MARGIN_S:.0f} s; `{self.describe()}`); "
                f"its last lines:\n{own_words(chr(10).join(self.output))[1]}"
            )
        return rc

    @staticmethod
    def _wait(proc: subprocess.Popen[bytes], deadline: float) -> int | None:
        """The run's exit status, or None once ``deadline`` passed (it is then ended)."""
        while True:
            try:
                return proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    _end(proc)
                    return None

    @staticmethod
    def tear_down(
        cluster: Cluster,
        state: Mapping[str, Any],
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], float] = time.monotonic,
    ) -> str | None:
        """``sparkrun stop`` of the job (its id; found by its recipe label on the nodes
        when the start was cut short; else the recipe and the run's matching flags), then
        no container of it may be left."""
        hosts = str(state["hosts"])
        cid = state.get("cluster_id") or job_on_nodes(cluster, str(state["recipe"]))
        target = [cid] if cid else [str(state["recipe"]), *state.get("stop_matching", ())]
        argv = [str(state["sparkrun"]), "stop", *target, "--hosts", hosts]
        try:
            proc = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                errors="replace", timeout=STOP_TIMEOUT_S,
                env=sparkrun_env(state.get("path_prefix")), start_new_session=True,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`{shlex.join(argv)}` failed: {exc}"
        out = proc.stdout + "\n" + proc.stderr
        if proc.returncode != 0 and not (not cid and NOTHING_TO_STOP in out):
            return f"`{shlex.join(argv)}` exited {proc.returncode}:\n{own_words(out)[1]}"
        if not cid:
            return None
        left = leftovers(cluster, cid, sleep, now)
        if left:
            return (
                f"after `{shlex.join(argv)}`, sparkrun job {cid}'s containers are still "
                f"there: {left}; remove them (sparkrun stop --all --hosts {hosts})"
            )
        return None


def _follow(log: Path, done: threading.Event, notify: Notify | None) -> None:
    """Pass sparkrun's progress lines on as notices while it runs."""
    if notify is None:
        return
    with open(log, errors="replace") as fh:
        pending = ""
        while True:
            finished = done.is_set()
            pending += fh.read()
            *lines, pending = pending.split("\n")
            for line in lines:
                if PROGRESS.match(line.strip()):
                    notify(f"sparkrun: {line.strip()}")
            if finished:
                return
            done.wait(0.2)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """INT to the run's process group (sparkrun's own Ctrl-C), KILL if it stays; then
    KILL to what is left of the group (a child that ignores INT, as a shell's background
    job does), so nothing of the cut-short run goes on."""
    for sig, wait in ((signal.SIGINT, INTERRUPT_WAIT_S), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)


def _ps(cluster: Cluster, label: str, fmt: str, running: bool = False) -> dict[str, list[str]]:
    """``docker ps [-a]`` filtered on ``label`` on every reachable node: node -> lines."""
    every = "" if running else " -a"
    cmd = f"docker ps{every} --filter {shlex.quote('label=' + label)} --format {shlex.quote(fmt)}"
    nodes = [n for n in cluster.nodes if cluster.unreachable(n) is None]
    results = cluster.map(lambda n: n.run(cmd, timeout=20), nodes)
    found: dict[str, list[str]] = {}
    for node in nodes:
        result = results[node.name]
        if isinstance(result, CommandResult) and result.ok:
            lines = [ln.strip() for ln in result.stdout.splitlines() if ln.strip()]
            if lines:
                found[node.name] = lines
        elif not isinstance(result, (CommandResult, RemoteError)):  # pragma: no cover
            raise TypeError(result)
    return found


def job_on_nodes(cluster: Cluster, recipe: str) -> str | None:
    """The id of the sparkrun job this recipe started on the nodes (its containers'
    ``sparkrun.recipe`` label), if any."""
    try:
        found = _ps(cluster, f"sparkrun.recipe={recipe}", '{{.Label "sparkrun.cluster_id"}}')
    except RemoteError:
        return None
    ids = sorted({cid for lines in found.values() for cid in lines})
    return ids[0] if ids else None


def leftovers(
    cluster: Cluster,
    cluster_id: str,
    sleep: Callable[[float], None],
    now: Callable[[], float],
) -> str:
    """The job's containers still there after up to GONE_WAIT_S ("" when none)."""
    deadline = now() + GONE_WAIT_S
    while True:
        try:
            found = _ps(cluster, f"sparkrun.cluster_id={cluster_id}", "{{.Names}} ({{.State}})")
        except RemoteError:
            return ""
        if not found or now() >= deadline:
            return "; ".join(f"{node}: {', '.join(lines)}" for node, lines in found.items())
        sleep(1.0)
