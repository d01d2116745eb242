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

- ``cx7-firmware NODE VERSION``: the node's ConnectX-7 runs firmware VERSION (``28.39.1002``,
  or with its PSID ``"28.39.1002 (NVD0000000087)"``), as after a firmware update on one node
  alone: ``ethtool -i``, ``ibstat`` and ``ibdev2netdev -v`` say it (state.json).
- ``dgx-os NODE VERSION``: the node's /etc/dgx-release says ``DGX_SWBUILD_VERSION=VERSION``,
  as after a DGX OS update on that node alone (the node's file, bound over /etc/dgx-release
  in its mount namespace, rewritten in place).

- ``running-image NODE [--name C]``: the next serving container C (default ``vllm_node``)
  started on NODE runs another image than the others under the same tag, as a container
  started before the node's image was replaced (launch-cluster.sh compares image IDs only
  when it launches, and not at all when the containers already run): ``vllm-node:latest``
  on NODE is rebuilt as for ``nccl-build``, and a watcher tags it back on the original
  image once C runs (within 15 min; ``clear`` stops the watcher and removes the rebuilt
  image once no container uses it).
- ``vllm-patch NODE``: one file of the installed vllm package
  (``vllm/distributed/device_communicators/pynccl_wrapper.py`` under the image's site
  directory) gains a line in NODE's running serving container(s), as eugr's
  ``--apply-vllm-pr`` / ``--apply-mod`` patch the tree in place (``git apply`` in the
  container) and leave the version string as it was. The file's original is kept in the
  container's /tmp (outside the tree); ``clear`` puts it back.

``clear`` removes the rebuilt image (host.clear imports the original again); the
sim core's clear resets state.json (driver, NTP, firmware) and ``clear`` here writes
/etc/dgx-release back.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
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

KINDS = ("driver", "ntp", "nccl-build", "cx7-firmware", "dgx-os", "running-image", "vllm-patch")
VLLM_PATCHED = "vllm/distributed/device_communicators/pynccl_wrapper.py"
PATCH_BACKUP = "/tmp/.sparksim-vllm-patch.orig"
PATCH_LINE = "# sparksim fault vllm-patch: applied at launch, as --apply-vllm-pr does"
REBUILT = "sparksim-nccl-build-2"


def add_parsers(kinds: Kinds) -> None:
    k = kinds.on_node("driver", "a node's NVIDIA driver differs (as nvidia-smi says)")
    k.add_argument("version", metavar="VERSION", help="driver version, e.g. 580.82.09")
    k.add_argument("--cuda", metavar="X", help="CUDA version nvidia-smi reports with it")
    k = kinds.on_node("ntp", "a node's NTP service off, its clock unsynchronised")
    k = kinds.on_node("cx7-firmware", "a node's ConnectX-7 firmware differs (ethtool -i)")
    k.add_argument("version", metavar="VERSION", help="e.g. 28.39.1002 or '28.39.1002 (PSID)'")
    k = kinds.on_node(
        "running-image", "a node's serving container runs another image under the same tag"
    )
    k.add_argument("--name", default="vllm_node", help="container (default: vllm_node)")
    k = kinds.on_node("dgx-os", "a node's DGX OS release differs (/etc/dgx-release)")
    k.add_argument("version", metavar="VERSION", help="DGX_SWBUILD_VERSION, e.g. 7.2.3")
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
    if args.kind == "cx7-firmware":
        return cx7_firmware(state_dir, node, args.version)
    if args.kind == "dgx-os":
        return dgx_os(state_dir, node, args.version)
    if args.kind == "running-image":
        return running_image(state_dir, node, args.name)
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


def cx7_firmware(state_dir: Path, node: NodeSpec, version: str) -> list[str]:
    firmware, _, psid = version.partition("(")
    state = nodes_mod.read_state(state_dir, node)
    state["firmware"] = firmware.strip()
    if psid.strip(" )"):
        state["psid"] = psid.strip(" )")
    nodes_mod.write_state(state_dir, node, state)
    record(state_dir, "cx7-firmware", node.name, "-", version)
    return [f"{node.name}: ConnectX-7 firmware {version}"]


def _write_dgx_release(state_dir: Path, node: NodeSpec, version: str) -> None:
    # in place (not a rename): the file is bound over /etc/dgx-release by its inode
    path = nodes_mod.node_dir(state_dir, node) / "dgx-release"
    with path.open("r+") as fh:
        fh.truncate(0)
        fh.write(nodes_mod.dgx_release(version))


def dgx_os(state_dir: Path, node: NodeSpec, version: str) -> list[str]:
    _write_dgx_release(state_dir, node, version)
    record(state_dir, "dgx-os", node.name, "-", version)
    return [f"{node.name}: DGX OS {version} (/etc/dgx-release)"]


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


def _rebuild(e: Any) -> None:
    """``vllm-node:latest`` in engine ``e`` committed over with another build of its NCCL
    library (the same version string, other bytes)."""
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


def _engine(state_dir: Path, node: NodeSpec) -> Any:
    if serving.enabled() is not None:
        raise SimError(f"this sim has no Docker engines ({serving.enabled()})")
    return serving.engine(state_dir, node)


def nccl_build(state_dir: Path, node: NodeSpec) -> list[str]:
    _rebuild(_engine(state_dir, node))
    record(state_dir, "nccl-build", node.name, "-", REBUILT)
    return [f"{node.name}: {image.IMAGE} rebuilt with another build of NCCL {image.NCCL_VERSION}"]


# Tags the image back once the container runs: the tag replaced after the start.
_WATCH = """
for i in $(seq 4500); do
  [ "$(docker -H "$1" inspect -f '{{.State.Running}}' "$2" 2>/dev/null)" = true ] && break
  sleep 0.2
done
docker -H "$1" tag "$3" "$4"
"""


def running_image(state_dir: Path, node: NodeSpec, name: str) -> list[str]:
    e = _engine(state_dir, node)
    original = _docker(e, "image", "inspect", "-f", "{{.Id}}", image.IMAGE)
    _rebuild(e)
    rebuilt = _docker(e, "image", "inspect", "-f", "{{.Id}}", image.IMAGE)
    watcher = subprocess.Popen(
        ["sh", "-c", _WATCH, "watch", e.host, name, original, image.IMAGE],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    value = {"container": name, "image": rebuilt, "original": original, "watcher": watcher.pid}
    record(state_dir, "running-image", node.name, "-", value)
    return [
        f"{node.name}: {image.IMAGE} is {rebuilt[7:19]} (another NCCL build) until container "
        f"{name} runs, then {original[7:19]} again"
    ]


def _clear_running_image(
    state_dir: Path, node: NodeSpec | None, value: dict[str, Any]
) -> list[str]:
    pid = value.get("watcher")
    if isinstance(pid, int):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)  # its own session: the sh and its docker call
    if node is None or serving.enabled() is not None:
        return []
    host = serving.engine(state_dir, node).host
    # the container on the rebuilt image goes (the stack lost that rank: the next attach
    # relaunches), the tag back on the original, the rebuilt image removed
    name = value.get("container", "vllm_node")
    subprocess.run(["docker", "-H", host, "rm", "-f", name], capture_output=True)
    if value.get("original"):
        subprocess.run(["docker", "-H", host, "tag", value["original"], image.IMAGE])
    subprocess.run(["docker", "-H", host, "rmi", value.get("image", "")], capture_output=True)
    return [f"{node.name}: container {name} on the rebuilt image removed, {image.IMAGE} back"]


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
    """Write /etc/dgx-release back; remove the rebuilt images (host.clear imports the
    original on those nodes); put the patched vllm file back in the running containers."""
    msgs = []
    for f in load_faults(state_dir):
        node = next((n for n in topo.nodes if n.name == f.get("node")), None)
        if f.get("kind") == "running-image":
            msgs += _clear_running_image(state_dir, node, f.get("value") or {})
        if f.get("kind") == "dgx-os" and node is not None:
            _write_dgx_release(state_dir, node, nodes_mod.DGX_OS_VERSION)
            msgs.append(f"{node.name}: DGX OS {nodes_mod.DGX_OS_VERSION} again")
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
