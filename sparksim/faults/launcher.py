"""Faults of the launcher's newest behaviours (issue #28): ``launcher`` (the head's copy of
launch-cluster.sh edited as an operator edits a checkout: ``earlyoom`` runs earlyoom as the
containers' PID 1, its report every ``--report-s`` seconds; ``head-foreground`` is the
no-Ray head before 2026-09-15), ``earlyoom-kill`` (memory runs low in a node's serving
container: the look-alike earlyoom there kills its ``vllm serve``) and ``rank-kill`` (a
node's ``vllm serve`` killed inside its container, which stays up)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from .. import docker, serving
from .. import node as nodes_mod
from ..netns import SimError
from ..topology import Topology
from .common import Kinds, record, resolve

KINDS = ("launcher", "earlyoom-kill", "rank-kill")
EARLYOOM_LOW = "earlyoom-low"  # in the node's ~/.sparksim (/etc/sparksim in containers)
RANK_PATTERN = "^python3 /opt/vllm/bin/vllm serve "  # the rank itself, not its bash parent


def add_parsers(kinds: Kinds) -> None:
    k = kinds.add("launcher", "edit the head's launch-cluster.sh defaults (its next launch)")
    k.add_argument("how", choices=["earlyoom", "head-foreground"], help="what to turn on")
    k.add_argument(
        "--report-s",
        type=int,
        default=60,
        help="earlyoom: its memory report interval, -r (default: 60, the launcher's)",
    )
    k = kinds.on_node("earlyoom-kill", "earlyoom (PID 1, --earlyoom) kills the node's rank")
    k.add_argument(
        "--after-s",
        type=float,
        default=0.0,
        help="once its vllm serve has run this long (default: 0, at once)",
    )
    k = kinds.on_node("rank-kill", "kill the node's vllm serve inside its running container")
    k.add_argument("--name", default="vllm_node", help="container (default: vllm_node)")
    k.add_argument("--signal", default="KILL", help="signal (default: KILL)")


def apply(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    if args.kind == "launcher":
        return launcher(state_dir, topo, args.how, args.report_s)
    node = resolve(topo, args.node)
    if args.kind == "earlyoom-kill":
        etc = serving.home(state_dir, node) / serving.SIM_ETC
        etc.mkdir(parents=True, exist_ok=True)
        nodes_mod.write_atomic(etc / EARLYOOM_LOW, json.dumps({"after_s": args.after_s}) + "\n")
        record(state_dir, "earlyoom-kill", node.name, "-", args.after_s)
        return [
            f"{node.name}: memory low for earlyoom once vllm serve has run {args.after_s:g} s "
            "(it must be the container's PID 1: `spark-sim fault launcher earlyoom`)"
        ]
    e = serving.engine(state_dir, node)
    if not docker.ping(e.socket):
        raise SimError(f"{node.name}: its Docker engine is not running ({e.socket})")
    signal = re.sub(r"[^A-Z0-9]", "", args.signal.upper())
    proc = subprocess.run(
        ["docker", "-H", e.host, "exec", args.name, "pkill", f"-{signal}", "-f", RANK_PATTERN],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SimError(
            f"{node.name}: no vllm serve killed in {args.name} (pkill exited {proc.returncode}: "
            f"{proc.stderr.strip() or 'no such process'})"
        )
    record(state_dir, "rank-kill", node.name, "-", f"{args.name} SIG{signal}")
    return [f"{node.name}: sent SIG{signal} to vllm serve in {args.name} (the container stays up)"]


def _script(state_dir: Path, topo: Topology) -> Path:
    return serving.home(state_dir, topo.nodes[0]) / serving.LAUNCHER_DIR / serving.LAUNCHER.name


def launcher(state_dir: Path, topo: Topology, how: str, report_s: int = 60) -> list[str]:
    """Edit the defaults at the top of the head's launch-cluster.sh (its next launch)."""
    path = _script(state_dir, topo)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SimError(f"no launcher on the head ({path}): is serving up?") from exc
    if how == "earlyoom":
        edits = {
            'ENABLE_EARLYOOM="false"': 'ENABLE_EARLYOOM="true"',
            "-s 100 -r 60}": f"-s 100 -r {int(report_s)}}}",
        }
        what = f"earlyoom -M 524288,102400 -s 100 -r {int(report_s)} as PID 1"
    else:
        edits = {'HEAD_EXEC_MODE="detached"': 'HEAD_EXEC_MODE="foreground"'}
        what = "the no-Ray head in the launcher's foreground (before 2026-09-15)"
    for old, new in edits.items():
        if old not in text and new not in text:
            raise SimError(f"{path}: no {old!r} to edit")
        text = text.replace(old, new)
    nodes_mod.write_atomic(path, text)
    os.chmod(path, 0o755)
    record(state_dir, "launcher", topo.nodes[0].name, "-", how)
    return [f"{topo.nodes[0].name}: launch-cluster.sh defaults edited: {what}"]


def clear(state_dir: Path, topo: Topology) -> list[str]:
    """The launcher as installed, no earlyoom trigger."""
    msgs = []
    path = _script(state_dir, topo)
    if path.exists() and path.read_bytes() != serving.LAUNCHER.read_bytes():
        shutil.copyfile(serving.LAUNCHER, path)
        os.chmod(path, 0o755)
        msgs.append(f"{topo.nodes[0].name}: launch-cluster.sh restored")
    for node in topo.nodes:
        trigger = serving.home(state_dir, node) / serving.SIM_ETC / EARLYOOM_LOW
        if trigger.exists():
            trigger.unlink()
            msgs.append(f"{node.name}: earlyoom trigger removed")
    return msgs
