"""Drive ``launch-cluster.sh`` on the head over SSH, the way operators do by hand:

    nohup ./launch-cluster.sh -n IP,IP -t IMAGE --name NAME exec vllm serve ... &

and stop it again with ``launch-cluster.sh --name NAME stop``. Works unchanged against
the real script on real Sparks and the one sparksim installs."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, replace

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Node

# How a launch-cluster.sh that has Ray as an option parses it (`--ray)` in its case, or
# `--ray|...`); the scripts from before mid-2026 always start Ray and have no such flag.
RAY_FLAG_PATTERN = r"(^|[[:space:]|(])--ray[)|]"
# How long teardown waits for a signalled launcher's own cleanup, after `stop` (its `docker
# stop` on every node, head first, then each worker over SSH: quick once they are stopped).
LAUNCHER_EXIT_WAIT_S = 60.0


class LaunchError(Exception):
    """The launcher could not be started or answered with an error."""


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
        exec`` found "No such container" on both nodes)."""
        return f"if {self._is_launcher(pid)}; then kill {pid} 2>/dev/null; fi; true"

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
