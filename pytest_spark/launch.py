"""Drive ``launch-cluster.sh`` on the head over SSH, the way operators do by hand:

    nohup ./launch-cluster.sh -n IP,IP -t IMAGE --name NAME exec vllm serve ... &

and stop it again with ``launch-cluster.sh --name NAME stop``. Works unchanged against
the real script on real Sparks and the one sparksim installs."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pytest_spark.cluster import Node
from pytest_spark.remote.base import CommandResult, RemoteError


class LaunchError(Exception):
    """The launcher could not be started or answered with an error."""


@dataclass(frozen=True)
class LaunchSpec:
    script: str
    nodes: tuple[str, ...]
    image: str | None
    container: str
    serve_args: tuple[str, ...]
    nccl_debug: str | None = None
    log_path: str = "/tmp/pytest-spark-launch.log"

    def base(self) -> list[str]:
        argv = [self.script, "-n", ",".join(self.nodes), "--name", self.container]
        if self.image:
            argv += ["-t", self.image]
        if self.nccl_debug:
            argv += ["--nccl-debug", self.nccl_debug]
        return argv

    def start_command(self) -> str:
        """Backgrounded with setsid/nohup and no tty, so the SSH call returns at once."""
        argv = [*self.base(), "exec", *self.serve_args]
        return (
            f"setsid nohup {shlex.join(argv)} >{shlex.quote(self.log_path)} 2>&1 "
            f"</dev/null & echo $!"
        )

    def stop_command(self) -> str:
        return shlex.join([*self.base(), "stop"])

    def status_command(self) -> str:
        return shlex.join([*self.base(), "status"])


class Launcher:
    """Starts and stops the serving cluster through the head; remembers what it started."""

    def __init__(self, head: Node, spec: LaunchSpec) -> None:
        self.head = head
        self.spec = spec
        self.pid: int | None = None

    def preflight(self) -> None:
        script = shlex.quote(self.spec.script)
        result = self.head.run(f"test -x {script} || test -f {script}", timeout=15)
        if not result.ok:
            raise LaunchError(
                f"{self.head.name}: launch script {self.spec.script} not found on the head; "
                "set --spark-launch-script to its path there"
            )

    def start(self) -> int:
        self.preflight()
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

    def stop(self) -> CommandResult:
        """Stop the containers on every node and the backgrounded launcher, if alive, and
        remove the launcher's log."""
        result = self.head.run(self.spec.stop_command(), timeout=120)
        kill = f"kill {self.pid} 2>/dev/null; " if self.pid is not None else ""
        self.head.run(f"{kill}rm -f {shlex.quote(self.spec.log_path)}; true", timeout=10)
        return result
