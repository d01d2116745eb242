"""Open files on a node: can the serving container raise its limit to what vLLM asks?

A container's processes start with the open-files limit (RLIMIT_NOFILE) of the Docker
engine that starts them, unless ``docker run --ulimit nofile=...`` (or daemon.json's
``default-ulimits``) sets one. vLLM's API server raises its soft limit to 65535 at start
(``set_ulimit(target_soft_limit=65535)`` in vllm/utils/system_utils.py, vllm-project/vllm;
adapted from SGLang): ``setrlimit(RLIMIT_NOFILE, (65535, hard))``, which an unprivileged
process can do only up to its hard limit. Below it, vLLM logs ``Found ulimit of N and
failed to automatically increase`` and serves on the low limit; every HTTP connection,
stream and engine socket is a descriptor, and many concurrent clients end in ``OSError:
[Errno 24] Too many open files``. So a node is fit when its dockerd's *hard* limit is at
least the profile's ``fdlimit.min_open_files`` (65535 by default: vLLM's figure); the
soft limit does not matter, vLLM raises it.

``fs.nr_open`` caps every hard limit (a drop-in above it makes dockerd fail to start);
``fs.file-max`` is the kernel's system-wide file table: below the minimum, one server can
exhaust the whole node, which warns.
"""

from __future__ import annotations

from pytest_spark.infra.fdlimit.parse import UNLIMITED, OpenFiles
from pytest_spark.infra.fdlimit.probe import NodeFdLimits
from pytest_spark.infra.finding import Finding, Skip

__all__ = ["VLLM_NOFILE_TARGET", "check_fd_limits", "low_limits"]

VLLM_NOFILE_TARGET = 65535  # set_ulimit's target_soft_limit in vllm/utils/system_utils.py
FIX_NOFILE = 1048576  # systemd's own default hard limit (and Ubuntu's fs.nr_open)


def _n(value: int | None) -> str:
    if value is None:
        return "unreadable"
    return "unlimited" if value >= UNLIMITED else str(value)


def low_limits(facts: NodeFdLimits, limits: OpenFiles, min_open_files: int) -> list[str]:
    """Whose hard open-files limit is below ``min_open_files``: ``dockerd`` (``limits``)
    and the serving container's main process, where it was read (the verdict)."""
    box = facts.container
    return [
        who
        for who, hard in (
            ("dockerd", limits.hard),
            ("the serving container", box.hard if box else None),
        )
        if hard is not None and hard < min_open_files
    ]


def _state_text(facts: NodeFdLimits, limits: OpenFiles) -> str:
    """The limits read on the node, in words: dockerd's, the kernel's and the container's."""
    kernel = f"fs.file-max {_n(facts.file_max)}, fs.nr_open {_n(facts.nr_open)}"
    state = (
        f"dockerd (pid {facts.dockerd_pid}) runs with Max open files soft {_n(limits.soft)}, "
        f"hard {_n(limits.hard)}; {kernel}"
    )
    box = facts.container
    if box is not None:
        state += (
            f"; the serving container's main process (pid {facts.container_pid}) has soft "
            f"{_n(box.soft)}, hard {_n(box.hard)}"
        )
    return state


def _why_low(low: list[str], container_read: bool) -> str:
    """Why the low limit matters, by whose it is (see :func:`low_limits`)."""
    if "dockerd" not in low:
        return "the container was started with a --ulimit nofile below it"
    if container_read and "the serving container" not in low:
        return (
            "the serving container kept the limit it started with, but every container "
            "started now without --ulimit (docker compose, docker run by hand, the next "
            "launch) inherits dockerd's"
        )
    return "containers started without --ulimit inherit dockerd's"


def _no_dockerd(
    node: str, facts: NodeFdLimits, expected: dict[str, int], docker_verdict: str | None
) -> Finding | Skip:
    """No dockerd limits read: a skip citing ``docker_verdict`` when no dockerd runs and
    that check is in the session, else the failure saying what could not be read."""
    if not facts.dockerd_running and docker_verdict is not None:
        return Skip(f"{node}: no dockerd process runs ({docker_verdict} has the verdict)")
    return Finding.failed(
        {"dockerd": facts.dockerd_error or "unreadable"},
        expected,
        node=node,
        message=(
            f"{node}: cannot read the Docker engine's open-files limit "
            f"({facts.dockerd_error}); expected a running dockerd whose /proc/PID/limits "
            "has 'Max open files'. Start Docker (sudo systemctl start docker) and check "
            "that pgrep and /proc are there for the SSH user"
        ),
    )


def check_fd_limits(
    node: str, facts: NodeFdLimits, min_open_files: int, *, docker_verdict: str | None = None
) -> Finding | Skip:
    """dockerd's hard RLIMIT_NOFILE on ``node`` >= ``min_open_files``. ``docker_verdict``:
    the check that owns "Docker is not running" when it runs in the session (no dockerd
    process is its failure, and this one skips citing it)."""
    expected = {"dockerd_nofile_hard_min": min_open_files}
    if facts.dockerd is None:
        return _no_dockerd(node, facts, expected, docker_verdict)
    limits = facts.dockerd
    measured = {
        "dockerd_pid": facts.dockerd_pid,
        "dockerd_nofile_soft": limits.soft,
        "dockerd_nofile_hard": limits.hard,
        "container_nofile_hard": facts.container.hard if facts.container else None,
        "fs_file_max": facts.file_max,
        "fs_nr_open": facts.nr_open,
    }
    state = _state_text(facts, limits)
    low = low_limits(facts, limits, min_open_files)
    if low:
        target = FIX_NOFILE if facts.nr_open is None else min(FIX_NOFILE, facts.nr_open)
        why = _why_low(low, facts.container is not None)
        return Finding.failed(
            measured,
            expected,
            node=node,
            message=(
                f"{node}: {state}: expected a hard limit of at least {min_open_files} for "
                f"{' and '.join(low)} (profile fdlimit.min_open_files; vLLM's API server "
                f"raises its soft limit to {VLLM_NOFILE_TARGET} and cannot pass the hard "
                f"one); {why}. vLLM then logs 'Found ulimit of ... failed to automatically "
                "increase' and fails under many connections with 'Too many open files'. "
                "Fix: a systemd drop-in for docker.service (sudo systemctl edit docker: "
                f"[Service] LimitNOFILE={target}), then sudo systemctl daemon-reload && sudo "
                f"systemctl restart docker; or start the container with --ulimit "
                f"nofile={target}:{target}"
            ),
        )
    if facts.file_max is not None and facts.file_max < min_open_files:
        return Finding.warned(
            measured,
            expected,
            node=node,
            message=(
                f"{node}: {state}: dockerd's limit is enough, but the kernel's whole file "
                f"table (fs.file-max) is below {min_open_files}: one busy server can exhaust "
                "the node ('VFS: file-max limit reached'). Raise it: sudo sysctl -w "
                f"fs.file-max={FIX_NOFILE * 2} (and in /etc/sysctl.d/ to keep it)"
            ),
        )
    return Finding.passed(
        measured,
        expected,
        node=node,
        message=f"{node}: {state}; "
        + (
            f"a container can raise its limit to vLLM's {VLLM_NOFILE_TARGET}"
            if limits.hard >= VLLM_NOFILE_TARGET
            else f"at or above the profile's floor of {min_open_files}, but below vLLM's "
            f"{VLLM_NOFILE_TARGET}: a container raises its soft limit to {_n(limits.hard)} only"
        ),
    )
