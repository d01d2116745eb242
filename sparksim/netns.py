"""Thin wrappers over ip(8), tc(8) and /proc: the only module that touches the kernel's
network state. Batches keep ``up`` to a handful of process launches."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence

NETNS_DIR = "/run/netns"
# tbf burst/latency chosen for accurate rates at <= 2 Gbit/s (REFERENCE section 7); the sim
# shapes 1 Gbit/s.
# 256kb lost tokens between gloo phases on a busy machine (benchmarks/busbw_accuracy.py)
TBF_BURST = "512kb"
TBF_LATENCY = "50ms"


class SimError(RuntimeError):
    """A sparksim operation failed; the message says what and how to fix it."""


def run(argv: Sequence[str], *, input: str | None = None, check: bool = True) -> str:
    """Run a command, return its stdout; raise SimError with its stderr on failure."""
    try:
        proc = subprocess.run(list(argv), input=input, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise SimError(f"{argv[0]} not found: install it (iproute2, openssh-server)") from exc
    if check and proc.returncode != 0:
        cmd = " ".join(argv)
        detail = (proc.stderr or proc.stdout).strip()
        if input:
            detail += "\ninput was:\n" + input
        raise SimError(f"`{cmd}` failed (rc {proc.returncode}): {detail}")
    return proc.stdout


def ip_batch(lines: Iterable[str], netns: str | None = None, *, force: bool = False) -> None:
    """Run ip commands in one process; ``force`` goes on past errors (cleanup)."""
    text = "".join(line + "\n" for line in lines)
    if not text:
        return
    argv = ["ip"] + (["-n", netns] if netns else []) + (["-force"] if force else [])
    run([*argv, "-batch", "-"], input=text, check=not force)


def tc_batch(lines: Iterable[str], netns: str | None = None) -> None:
    text = "".join(line + "\n" for line in lines)
    if not text:
        return
    argv = ["tc"] + (["-n", netns] if netns else [])
    run([*argv, "-batch", "-"], input=text)


def tbf_line(dev: str, mbit: int) -> str:
    return (
        f"qdisc replace dev {dev} root tbf rate {mbit}mbit burst {TBF_BURST} latency {TBF_LATENCY}"
    )


def list_netns() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def links(netns: str | None = None) -> list[dict[str, object]]:
    """``ip -j link`` (with details) in the root namespace or in ``netns``."""
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-j", "-d", "link", "show"]
    out = run(argv, check=False)
    try:
        data = json.loads(out or "[]")
    except json.JSONDecodeError:
        return []
    return data if isinstance(data, list) else []


def link_names(netns: str | None = None) -> list[str]:
    return [str(link["ifname"]) for link in links(netns)]


def qdisc_rates(netns: str | None = None) -> dict[str, int]:
    """Root tbf rate in Mbit/s per device."""
    argv = ["tc"] + (["-n", netns] if netns else []) + ["-j", "qdisc", "show"]
    try:
        data = json.loads(run(argv, check=False) or "[]")
    except json.JSONDecodeError:
        return {}
    rates = {}
    for q in data:
        if q.get("kind") == "tbf" and q.get("root"):
            rate = q.get("options", {}).get("rate")
            if isinstance(rate, int | float):  # bytes per second
                rates[str(q.get("dev"))] = round(rate * 8 / 1_000_000)
    return rates


def netns_pids(name: str) -> list[int]:
    out = run(["ip", "netns", "pids", name], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def kill_pids(pids: Iterable[int], timeout: float = 3.0) -> list[int]:
    """SIGKILL ``pids``; return those still alive after ``timeout``."""
    pids = [p for p in pids if p > 1 and p != os.getpid()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if pid_alive(p)]
        if alive:
            time.sleep(0.01)
    return alive
