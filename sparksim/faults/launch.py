"""Faults of how the serving stack was launched (issue 28): ``relaunch`` stops the running
stack and starts it again through the look-alike launch-cluster.sh, in daemon mode, the way
an operator or a recipe does: from a launch script (``--launch-script``: each container
runs ``/workspace/exec-script.sh``, the real ``vllm serve`` a child of its bash), and/or
``--non-privileged`` (the container's cgroup memory limit, 110 GiB by default), with the
sim's serve line edited (``--drop FLAG``: the flag and its value; ``--add ARGS``). The
suite then attaches to it. ``clear`` stops what it started: the next run launches its own.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
from pathlib import Path

from .. import image, serving
from ..netns import SimError
from ..topology import Topology
from .common import Kinds, load_faults, positive_int, record

KINDS = ("relaunch",)
SCRIPT = "/root/spark-launch-script.sh"  # on the head, given to --launch-script


def add_parsers(kinds: Kinds) -> None:
    k = kinds.add(
        "relaunch",
        "stop the serving stack and launch it again with launch-cluster.sh -d "
        "(--launch-script, --non-privileged, an edited serve line)",
    )
    k.add_argument("--launch-script", action="store_true", help="the serve line as a script")
    k.add_argument("--non-privileged", action="store_true", help="cgroup limits, no --privileged")
    k.add_argument("--mem-limit-gb", type=positive_int, default=None, help="with --non-privileged")
    k.add_argument(
        "--drop", action="append", default=[], metavar="FLAG", help="e.g. reasoning-parser"
    )
    k.add_argument("--add", default="", metavar="ARGS", help="appended to the serve line")


def serve_line(base: str, drop: list[str], add: str) -> list[str]:
    """``base`` without each ``--FLAG [VALUE]`` of ``drop``, with ``add`` appended."""
    argv = shlex.split(base)
    for flag in drop:
        name = "--" + flag.lstrip("-")
        if name not in argv:
            raise SimError(f"relaunch: {name} is not in the serve line {base!r}")
        at = argv.index(name)
        takes_value = at + 1 < len(argv) and not argv[at + 1].startswith("-")
        del argv[at : at + (2 if takes_value else 1)]
    return argv + shlex.split(add)


def _head_ssh(state_dir: Path, topo: Topology, command: str, timeout: float = 110) -> str:
    head = topo.nodes[0]
    proc = subprocess.run(
        ["ssh", "-F", str(state_dir / "ssh_config"), "-o", "ConnectTimeout=5", head.mgmt, command],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise SimError(
            f"{head.name}: {command[:200]} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        )
    return proc.stdout


def _launcher(state_dir: Path, topo: Topology) -> tuple[str, list[str]]:
    """The launcher's path on the head and its base options (nodes, name, image, mode)."""
    hints = serving.launch_hints(state_dir)
    if hints is None:
        raise SimError("relaunch: this sim has no serving stack")
    fabric = ",".join(n.fabric[0].addr for n in topo.nodes)
    base = ["-n", fabric, "--name", hints["container"], "-t", image.IMAGE, *hints["mode_flags"]]
    return hints["script"], base


def relaunch(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    script, base = _launcher(state_dir, topo)
    hints = serving.launch_hints(state_dir)
    assert hints is not None
    argv = serve_line(hints["serve_args"], args.drop, args.add)
    options = list(base)
    if args.non_privileged:
        options.append("--non-privileged")
        if args.mem_limit_gb:
            options += ["--mem-limit-gb", str(args.mem_limit_gb)]
    _head_ssh(state_dir, topo, f"{shlex.quote(script)} {shlex.join(base)} stop")
    if args.launch_script:
        text = f"#!/bin/bash\n# sparksim relaunch fault\n{shlex.join(argv)}\n"
        _head_ssh(state_dir, topo, f"cat > {SCRIPT} <<'EOF'\n{text}EOF")
        tail = ["-d", "--launch-script", SCRIPT]
    else:
        tail = ["-d", "exec", *argv]
    _head_ssh(state_dir, topo, f"{shlex.quote(script)} {shlex.join(options + tail)} </dev/null")
    how = " ".join(
        t
        for t in (
            "--launch-script" if args.launch_script else "",
            "--non-privileged" if args.non_privileged else "",
        )
        if t
    )
    record(
        state_dir,
        "relaunch",
        topo.nodes[0].name,
        "-",
        {"options": options + tail, "serve": shlex.join(argv)},
    )
    return [f"{topo.nodes[0].name}: relaunched ({how or 'exec'}): {shlex.join(argv)}"]


def apply(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    return relaunch(state_dir, topo, args)


def clear(state_dir: Path, topo: Topology) -> list[str]:
    """Stop a relaunched stack (the next run launches its own, privileged, from its line)."""
    if not any(f.get("kind") == "relaunch" for f in load_faults(state_dir)):
        return []
    script, base = _launcher(state_dir, topo)
    _head_ssh(state_dir, topo, f"{shlex.quote(script)} {shlex.join(base)} stop; rm -f {SCRIPT}")
    return [f"{topo.nodes[0].name}: the relaunched serving stack stopped"]
