"""launch-cluster.sh's command lines, built as text for the head's shell (no I/O): start
(backgrounded), stop, status, and the tests and waits on the backgrounded launcher's PID."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

# How a launch-cluster.sh that has Ray as an option parses it (`--ray)` in its case, or
# `--ray|...`); the scripts from before mid-2026 always start Ray and have no such flag.
RAY_FLAG_PATTERN = r"(^|[[:space:]|(])--ray[)|]"
# launch-cluster.sh (since 2026-09-15): the head command's exit status, in the head container
# from its exit until the launcher's next poll (<= 5 s), which deletes it.
HEAD_EXIT_SENTINEL = "/tmp/.launch-cluster-head-exit"
# How long teardown waits for a signalled launcher's own cleanup, after `stop` (its `docker
# stop` on every node, head first, then each worker over SSH: quick once they are stopped).
LAUNCHER_EXIT_WAIT_S = 60.0


def shell_path(path: str) -> str:
    """A path for the head's shell: quoted, with a leading ``~/`` left to expand there."""
    if path == "~" or path.startswith("~/"):
        rest = path[2:]
        return '"$HOME"' + (f"/{shlex.quote(rest)}" if rest else "")
    return shlex.quote(path)


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
