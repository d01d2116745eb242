"""Reading the readiness probe's answers (no I/O): the sections into a ``NodeProbe``, docker's
log lines and their timestamps (``LogCursor``: only new lines are fed), ``vllm serve``
command lines (a loopback ``--master-addr``), the head-exit status in words."""

from __future__ import annotations

import re
import shlex
import signal
from collections import Counter
from dataclasses import dataclass, field

from pytest_spark.access.base import CommandResult
from pytest_spark.readiness.probe import SEP, SERVER_PROCESS, NodeProbe
from pytest_spark.readiness.vllm_log import PREFIX, classify

LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|localhost|localhost\.localdomain|::1|\[::1\])$", re.I)


def serve_flag(words: list[str], flag: str) -> str | None:
    """``--flag VALUE`` or ``--flag=VALUE`` in a command line's words (the last one wins,
    as with argparse)."""
    found = None
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            found = words[i + 1]
        elif word.startswith(flag + "="):
            found = word.split("=", 1)[1]
    return found


def loopback_master(process: str) -> tuple[str, int, str] | None:
    """``(address, nnodes, rank)`` when ``process`` (a ``docker top`` args line) is a
    multi-node ``vllm serve`` whose ``--master-addr`` is a loopback address: its ranks on
    other nodes dial their own loopback and can never join (sparkrun#249)."""
    if not re.search(r"\bvllm serve\b", process):
        return None
    try:
        words = shlex.split(process)
    except ValueError:
        words = process.split()
    nnodes, addr = serve_flag(words, "--nnodes"), serve_flag(words, "--master-addr")
    if not (nnodes and nnodes.isdigit() and int(nnodes) > 1 and addr and LOOPBACK.match(addr)):
        return None
    return addr, int(nnodes), serve_flag(words, "--node-rank") or "0"


def fixed_ts(stamp: str) -> str:
    """An RFC 3339 UTC time with nine fractional digits, as ``docker logs --timestamps``
    prints it, so it compares as text with the log's stamps (``docker inspect`` trims
    trailing zeros: ``20:00:00Z`` would sort after ``20:00:00.5…Z``)."""
    if not stamp.endswith("Z") or "T" not in stamp:
        return stamp
    whole, _, frac = stamp[:-1].partition(".")
    return f"{whole}.{(frac + '0' * 9)[:9]}Z"


def parse_probe(result: CommandResult, with_health: bool = True) -> NodeProbe:
    sections: dict[str, str] = {}
    for chunk in result.stdout.split(SEP + " ")[1:]:
        name, _, body = chunk.partition("\n")
        sections[name.strip()] = body
    health = sections["health"].strip() if "health" in sections else None
    state = sections.get("state", "").strip()
    logs = sections.get("logs", "")
    alive = None
    if "alive" in sections:
        alive = sections["alive"].strip() == "alive"
    started_at = None
    if not state or "No such object" in state or "No such container" in state:
        status = "missing"
    elif state.startswith(("running", "created", "restarting", "exited", "dead")):
        parts = state.split()
        status = parts[0]
        if status in ("exited", "dead"):
            status = f"{parts[0]} (code {parts[1]})" if len(parts) > 1 else parts[0]
        if len(parts) > 2 and parts[2][:4].isdigit():
            started_at = fixed_ts(parts[2])
    else:
        status = f"unknown: {state[:200]}"
    if status == "missing" or status.startswith("unknown"):
        logs = ""  # docker's own "No such container" error, not the container's log
    processes = None
    if "procs" in sections:
        processes = [
            line.strip() for line in sections["procs"].splitlines() if SERVER_PROCESS.search(line)
        ]
    exit_text = sections.get("exit", "").strip()
    return NodeProbe(
        health,
        status,
        split_segments(logs),
        alive,
        sections.get("launcher", ""),
        started_at,
        processes,
        int(exit_text) if exit_text.isdigit() else None,
        logs,
    )


def exit_status_text(status: int) -> str:
    """``$?`` of the head command as launch-cluster.sh's sentinel holds it, in words."""
    if status > 128:
        try:
            name = signal.Signals(status - 128).name
        except ValueError:
            return f"exit status {status}"
        return f"exit status {status}: killed by {name}"
    return f"exit status {status}"


def vllm_output(line: str) -> bool:
    """A line of vLLM's own (a ``(APIServer pid=N)``-style prefix, or one the watch reads),
    not a monitor's (earlyoom) or the container's PID 1's."""
    if PREFIX.match(line):
        return True
    return any(event.kind not in ("monitor", "benign") for event in classify(line))


def split_segments(logs: str) -> list[str]:
    """``docker logs --timestamps`` lines -> one entry per ``\\r`` segment (a tqdm bar redraws
    with ``\\r`` inside one line), each carrying its line's timestamp, so that the cursor can
    tell a segment it already fed from a new one."""
    out: list[str] = []
    for raw in logs.split("\n"):  # not splitlines(): it splits at "\r" too
        ts, sep, text = raw.partition(" ")
        if not _is_timestamp(ts):
            ts, sep, text = "", "", raw
        out.extend(f"{ts}{sep}{seg}" for seg in text.split("\r") if seg.strip())
    return out


def _is_timestamp(word: str) -> bool:
    return len(word) >= 20 and word[:4].isdigit() and word[4] == "-" and "T" in word


@dataclass
class LogCursor:
    """Remembers the last docker log timestamp seen on a node, to fetch only new lines.

    ``docker logs --since TS`` returns the lines stamped TS again on the next poll, so the
    entries at the newest timestamp are counted (a tqdm line's ``\\r`` segments share its
    stamp, and may repeat): one is fresh only past the count already fed. The cursor so
    re-feeds nothing, and a progress bar that stops moving is silence."""

    since: str
    seen_at_since: Counter[str] = field(default_factory=Counter)

    def new_lines(self, lines: list[str]) -> list[str]:
        fresh: list[str] = []
        polled: Counter[str] = Counter()
        for line in lines:
            ts, _, text = line.partition(" ")
            if not _is_timestamp(ts):  # not docker's: nothing to order it by
                fresh.append(line)
                continue
            if ts < self.since:
                continue
            if ts > self.since:
                self.since, self.seen_at_since, polled = ts, Counter(), Counter()
            polled[line] += 1
            if polled[line] <= self.seen_at_since[line]:
                continue
            self.seen_at_since[line] = polled[line]
            fresh.append(text)
        return fresh
