"""The readiness wait's shell probe: one round trip per node and poll (the head's
``/health``, the serving container's state and new log lines, its serving processes, the
launcher's output and liveness, the launcher's head-exit file), sections marked ``SEP name``; and
what one answer holds (``NodeProbe``; ``parse.parse_probe`` reads it)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

SEP = "__PYTEST_SPARK_PROBE__"
PROBE_TIMEOUT_S = 15.0
# ``since`` meaning "from this container's current start" (its .State.StartedAt).
SINCE_START = "start"
# Serving processes in a container, as ``docker top`` lists them: the API server and
# headless ranks (``vllm serve``, vLLM's ``VLLM::`` process titles) and Ray's.
VLLM_PROCESS = re.compile(r"\bvllm serve\b|VLLM::")
RAY_PROCESS = re.compile(r"\bray start\b|\braylet\b|ray::")
SERVER_PROCESS = re.compile(f"{VLLM_PROCESS.pattern}|{RAY_PROCESS.pattern}")
PROCESS_NAMES = {"vllm": "vllm serve", "ray": "ray"}


@dataclass
class NodeProbe:
    health: str | None
    status: str  # running | exited (code N) | missing | ...
    lines: list[str]
    launcher_alive: bool | None = None
    launcher_output: str = ""
    started_at: str | None = None  # the container's .State.StartedAt, fixed width
    processes: list[str] | None = None  # serving processes (docker top), when asked
    exit_status: int | None = None  # the launcher's head-exit sentinel, when present
    log_text: str = ""  # the logs section as read (a serve log file's bytes from the cursor)

    @property
    def kinds(self) -> set[str]:
        """What serves in the container: ``vllm`` (the API server or a headless rank),
        ``ray`` (Ray's processes: in Ray mode vLLM's ranks run under them)."""
        found = set()
        for line in self.processes or ():
            if VLLM_PROCESS.search(line):
                found.add("vllm")
            if RAY_PROCESS.search(line):
                found.add("ray")
        return found


def probe_command(
    container: str,
    since: str,
    port: int | None,
    launcher_pid: int | None,
    launcher_log: str | None = None,
    log_offset: int = 0,
    processes: bool = False,
    sentinel: str | None = None,
    serve_log: str | None = None,
    serve_offset: int = 0,
) -> str:
    """One round trip: [health], container state and start time, new container log lines
    (``since`` a log time of this node, or ``SINCE_START``: from the container's current
    start; with ``serve_log``, a file inside the container, its bytes from
    ``serve_offset`` on instead: sparkrun's /tmp/sparkrun_serve.log), [serving
    processes], [new launcher output], [launcher alive]. Sections are marked ``SEP
    name``."""
    c = shlex.quote(container)
    parts = []
    if port is not None:
        parts.append(
            f"echo {SEP} health; if command -v curl >/dev/null; then curl -s -o "
            f"/dev/null -m 2 -w '%{{http_code}}' http://127.0.0.1:{int(port)}/health;"
            " else echo nocurl; fi; echo"
        )
    parts.append(
        f"echo {SEP} state; st=$(docker inspect -f '{{{{.State.Status}}}} "
        f"{{{{.State.ExitCode}}}} {{{{.State.StartedAt}}}}' {c} 2>&1 | grep . | head -n 1);"
        ' echo "$st"'
    )
    if serve_log is not None:
        parts.append(
            f'echo {SEP} logs; case "$st" in running*|restarting*|paused*) docker exec {c} '
            f"tail -c +{int(serve_offset) + 1} {shlex.quote(serve_log)} 2>/dev/null "
            "| head -c 1048576;; esac"
        )
    else:
        since_arg = '"${st##* }"' if since == SINCE_START else shlex.quote(since)
        parts.append(
            f"echo {SEP} logs; docker logs --timestamps --since {since_arg} {c} 2>&1 | tail -n 2000"
        )
    if processes:
        parts.append(
            f'echo {SEP} procs; case "$st" in running*) p=$(docker top {c} -eo pid,args -ww '
            "2>/dev/null | grep -E 'vllm|VLLM::|ray' | cut -c1-1000 | head -n 50);"
            ' printf "%s\\n" "$p";; esac'
        )
        if sentinel is not None:  # read only while no vllm serve runs: no cost when serving
            parts.append(
                f'echo {SEP} exit; case "$st" in running*) printf "%s" "$p" | grep -qE '
                f"'vllm serve|VLLM::' || docker exec {c} cat {shlex.quote(sentinel)} "
                "2>/dev/null;; esac"
            )
    if launcher_log is not None:
        parts.append(
            f"echo {SEP} launcher; tail -c +{int(log_offset) + 1} "
            f"{shlex.quote(launcher_log)} 2>/dev/null | head -c 1048576"
        )
    if launcher_pid is not None:
        parts.append(
            f"echo {SEP} alive; s=$(ps -o stat= -p {int(launcher_pid)} 2>/dev/null); "
            'case "$s" in ""|Z*) echo dead;; *) echo alive;; esac'
        )
    return "; ".join(parts)
