"""Faults that make one node unlike the others (the nodes-alike preflight catches them):

- ``driver NODE VERSION [--cuda X]``: the node's NVIDIA driver (and with ``--cuda`` the
  CUDA version nvidia-smi reports) is VERSION, as after ``apt upgrade`` on that node alone.
  nvidia-smi reads it from state.json.
- ``ntp NODE``: the node's NTP service is off and its clock unsynchronised
  (``timedatectl show``: ``NTP=no``, ``NTPSynchronized=no``); the clock itself stays the
  machine's, so the skew check still passes: the state, not a measured drift.
- ``nccl-build NODE``: the serving image on NODE is rebuilt with another build of the same
  NCCL version (``libnccl.so.2`` carries the same ``NCCL version 2.27.7+cuda13.0``
  string, different bytes): ``docker create`` + ``docker cp`` + ``docker commit`` over
  ``vllm-node:latest`` in the node's own engine, as an image built on each node instead of
  copied from one. The next launch runs it; the ranks of a real cluster hang at NCCL init.

- ``vllm-patch NODE``: one file of the installed vllm package
  (``vllm/distributed/device_communicators/pynccl_wrapper.py`` under the image's site
  directory) gains a line in NODE's running serving container(s), as eugr's
  ``--apply-vllm-pr`` / ``--apply-mod`` patch the tree in place (``git apply`` in the
  container) and leave the version string as it was. The file's original is kept in the
  container's /tmp (outside the tree); ``clear`` puts it back.

``clear`` removes the rebuilt image (host.clear imports the original again); the
sim core's clear resets state.json (driver, NTP).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from .. import image, serving
from .. import node as nodes_mod
from ..netns import SimError
from ..topology import NodeSpec, Topology
from . import serving as serving_faults
from .common import Kinds, load_faults, record, resolve

KINDS = ("driver", "ntp", "nccl-build", "vllm-patch")
VLLM_PATCHED = "vllm/distributed/device_communicators/pynccl_wrapper.py"
PATCH_BACKUP = "/tmp/.sparksim-vllm-patch.orig"
PATCH_LINE = "# sparksim fault vllm-patch: applied at launch, as --apply-vllm-pr does"
REBUILT = "sparksim-nccl-build-2"


def add_parsers(kinds: Kinds) -> None:
    k = kinds.on_node("driver", "a node's NVIDIA driver differs (as nvidia-smi says)")
    k.add_argument("version", metavar="VERSION", help="driver version, e.g. 580.82.09")
    k.add_argument("--cuda", metavar="X", help="CUDA version nvidia-smi reports with it")
    k = kinds.on_node("ntp", "a node's NTP service off, its clock unsynchronised")
    k = kinds.on_node(
        "nccl-build", "the serving image on a node carries another build of the same NCCL version"
    )
    kinds.on_node(
        "vllm-patch", "one file of the installed vllm package patched in a node's container"
    )


def apply(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    node = resolve(topo, args.node)
    if args.kind == "driver":
        return driver(state_dir, node, args.version, args.cuda)
    if args.kind == "ntp":
        return ntp_off(state_dir, node)
    if args.kind == "nccl-build":
        return nccl_build(state_dir, node)
    if args.kind == "vllm-patch":
        return vllm_patch(state_dir, node)
    raise SimError(f"unknown fault {args.kind!r}")


def driver(state_dir: Path, node: NodeSpec, version: str, cuda: str | None) -> list[str]:
    state = nodes_mod.read_state(state_dir, node)
    gpu = state["gpu"]
    assert isinstance(gpu, dict)
    gpu["driver_version"] = version
    if cuda:
        gpu["cuda_version"] = cuda
    nodes_mod.write_state(state_dir, node, state)
    record(state_dir, "driver", node.name, "-", {"driver": version, "cuda": cuda})
    return [f"{node.name}: NVIDIA driver {version}" + (f", CUDA {cuda}" if cuda else "")]


def ntp_off(state_dir: Path, node: NodeSpec) -> list[str]:
    state = nodes_mod.read_state(state_dir, node)
    state["time"] = {"ntp": False, "synchronized": False}
    nodes_mod.write_state(state_dir, node, state)
    record(state_dir, "ntp", node.name, "-", False)
    return [f"{node.name}: NTP off, clock unsynchronised"]


def _docker(e: Any, *argv: str) -> str:
    proc = subprocess.run(["docker", "-H", e.host, *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SimError(f"docker {' '.join(argv)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def nccl_build(state_dir: Path, node: NodeSpec) -> list[str]:
    if serving.enabled() is not None:
        raise SimError(f"this sim has no Docker engines ({serving.enabled()})")
    e = serving.engine(state_dir, node)
    target = image.nccl_path_in_image()
    cid = _docker(e, "create", image.IMAGE, "true")
    try:
        with tempfile.TemporaryDirectory(prefix="sparksim-nccl-") as tmp:
            lib = Path(tmp) / "libnccl.so.2"
            lib.write_bytes(image.nccl_library(REBUILT))
            lib.chmod(0o755)
            _docker(e, "cp", str(lib), f"{cid}:{target}")
        note = f"sparksim fault nccl-build ({REBUILT})"
        keep = [a for c in image.import_changes() for a in ("--change", c)]  # not `true`
        _docker(e, "commit", "--message", note, *keep, cid, image.IMAGE)
    finally:
        subprocess.run(["docker", "-H", e.host, "rm", "-f", cid], capture_output=True)
    record(state_dir, "nccl-build", node.name, "-", REBUILT)
    return [f"{node.name}: {image.IMAGE} rebuilt with another build of NCCL {image.NCCL_VERSION}"]


def _patched_file() -> str:
    return f"{image.site_in_image()}/{VLLM_PATCHED}"


def vllm_patch(state_dir: Path, node: NodeSpec) -> list[str]:
    names = serving_faults.serving_containers(state_dir, node)
    if not names:
        raise SimError(f"{node.name}: no serving container is running to patch")
    target = _patched_file()
    script = (
        f'[ -f {PATCH_BACKUP} ] || cp "$1" {PATCH_BACKUP} || exit 1; printf "\\n%s\\n" "$2" >> "$1"'
    )
    for name in names:
        serving_faults._docker(
            state_dir, node, "exec", name, "sh", "-c", script, "_", target, PATCH_LINE
        )
    record(state_dir, "vllm-patch", node.name, "-", ",".join(names))
    return [f"{node.name}: {target} patched in {', '.join(names)}"]


def _clear_vllm_patch(state_dir: Path, node: NodeSpec) -> list[str]:
    script = f'[ -f {PATCH_BACKUP} ] || exit 0; cp {PATCH_BACKUP} "$1" && rm -f {PATCH_BACKUP}'
    msgs = []
    try:
        names = serving_faults.serving_containers(state_dir, node)
    except SimError:
        return []
    for name in names:
        serving_faults._docker(
            state_dir, node, "exec", name, "sh", "-c", script, "_", _patched_file(), check=False
        )
        msgs.append(f"{node.name}: {VLLM_PATCHED} restored in {name}")
    return msgs


def clear(state_dir: Path, topo: Topology) -> list[str]:
    """Remove the rebuilt images (host.clear imports the original on those nodes); put the
    patched vllm file back in the running containers."""
    msgs = []
    for f in load_faults(state_dir):
        node = next((n for n in topo.nodes if n.name == f.get("node")), None)
        if f.get("kind") == "vllm-patch" and node is not None and serving.enabled() is None:
            msgs += _clear_vllm_patch(state_dir, node)
        if f.get("kind") != "nccl-build" or node is None or serving.enabled() is not None:
            continue
        e = serving.engine(state_dir, node)
        subprocess.run(
            ["docker", "-H", e.host, "rmi", "-f", image.IMAGE], capture_output=True, text=True
        )
        msgs.append(f"{node.name}: rebuilt {image.IMAGE} removed")
    return msgs
