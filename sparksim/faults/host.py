"""Node faults that a preflight check catches, each made of real state where the kernel
or the tools can hold it:

- ``docker NODE [stopped|no-image]``: the node's Docker engine stopped (its containers
  with it), or the serving image removed from it.
- ``gpu-invisible NODE``: the GPU list in state.json emptied; nvidia-smi then answers
  ``No devices were found`` (exit 6), as when the driver lost the GPU.
- ``disk-full NODE [--pct P]``: a small tmpfs mounted over the node's ``/root/models`` in
  the node's own mount namespace (entered with nsenter through its sshd), holding a copy
  of the checkpoint and filled to P % (default 97). ``df`` is real.
- ``clock NODE SECONDS``: the node's ``date`` runs SECONDS ahead (negative: behind). This
  is the one faked clock of sparksim: a ``date`` wrapper in the node's tools directory
  (first on PATH) adds ``clock_offset_s`` from state.json; the kernel clock, and every
  other program's, is the machine's.
- ``ssh WORKER [key|known-hosts]``: the head can no longer log in to WORKER without a
  password, as launch-cluster.sh requires: ``key`` (default) limits the worker's
  authorized key to logins from the runner (``from=``), so the head gets ``Permission
  denied (publickey)``; ``known-hosts`` drops the worker from the head's known_hosts
  (``Host key verification failed``).
- ``nccl-socket [NODE]``: the launcher's ``.env`` on the head gains
  ``CONTAINER_NCCL_SOCKET_IFNAME=mgmt0`` and ``CONTAINER_NCCL_IB_DISABLE=1``: at the next
  launch every serving container points NCCL at the management interface with RDMA off
  (NCCL's socket transport).
- ``nccl-env NODE VAR=VALUE...``: the launcher's ``.env`` on NODE (the head) gains
  ``CONTAINER_VAR=VALUE`` for each: at the next launch every serving container, and every
  rank process in it, has them (a forced ``NCCL_ALGO``, an ``NCCL_IB_HCA`` naming one
  twin, as in vllm#41725).
- ``link-flap NODE TWIN N``: the fabric link taken down and up N times; the kernel's
  carrier counters of both ends count every loss. ``clear`` replaces the cable (a new veth
  pair, or port on the twin's switch), which resets them; so it does after ``link-down``.
- ``fd-limit NODE [--nofile N]``: the node's dockerd, and the containerd it runs, get an
  open-files limit of N soft and hard (default 4096) with ``prlimit``, as a bad
  ``LimitNOFILE`` in docker.service would give them: the kernel's /proc/PID/limits shows
  it. ``clear`` gives them back the limits they had.

Every fault is recorded in faults.json; :func:`clear` undoes them all.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

from .. import docker, image, models, serving
from .. import node as nodes_mod
from ..netns import SimError, ip_batch, run
from ..topology import FABRIC_TWINS, HEALTHY_MTU, MGMT_IF, NodeSpec, Topology
from .common import Kinds, load_faults, positive_int, record, resolve

KINDS = (
    "docker",
    "gpu-invisible",
    "disk-full",
    "clock",
    "ssh",
    "nccl-socket",
    "link-flap",
    "fd-limit",
    "nccl-env",
)
BACKUP = "fault-backup"  # DIR/nodes/<name>/fault-backup: files a fault changed
MODELS_MOUNT = f"/root/{models.MODELS_DIR}"
DISK_SIZE_MIB = 16
ENV_MARK = "# sparksim fault nccl-socket"
REAL_DATE = ("/usr/bin/date", "/bin/date")


def add_parsers(kinds: Kinds) -> None:
    k = kinds.on_node("docker", "stop a node's Docker engine, or remove the serving image")
    k.add_argument(
        "how",
        metavar="HOW",
        nargs="?",
        default="stopped",
        choices=["stopped", "no-image"],
        help="stopped (default) or no-image",
    )
    k = kinds.on_node("gpu-invisible", "nvidia-smi finds no GPU on a node")
    k = kinds.on_node("disk-full", f"a nearly full filesystem under {MODELS_MOUNT} on a node")
    k.add_argument(
        "--pct", type=int, default=97, metavar="P", help="percent used, 1..99 (default: 97)"
    )
    k = kinds.on_node("clock", "a node's date runs SECONDS off (the one faked clock)")
    k.add_argument("seconds", metavar="SECONDS", type=float, help="offset, e.g. 5 or -2.5")
    k = kinds.on_node("ssh", "passwordless SSH from the head to a worker broken", metavar="WORKER")
    k.add_argument(
        "how",
        metavar="HOW",
        nargs="?",
        default="key",
        choices=["key", "known-hosts"],
        help="key (default) or known-hosts",
    )
    k = kinds.add(
        "nccl-socket",
        f"the launcher's .env points NCCL at {MGMT_IF} with IB disabled (next launch, every node)",
    )
    k.add_argument(
        "node",
        metavar="NODE",
        nargs="?",
        default="head",
        help="the node holding the launcher (default: head)",
    )
    k = kinds.add(
        "nccl-env",
        "the launcher's .env sets VAR=VALUE in every serving container (next launch)",
    )
    k.add_argument("node", metavar="NODE", help="the node holding the launcher (head)")
    k.add_argument("assignments", metavar="VAR=VALUE", nargs="+", help="e.g. NCCL_ALGO=Tree")
    k = kinds.on_node("link-flap", "take a fabric link down and up N times")
    k.add_argument("twin", metavar="TWIN", help="twin: 0, 1 or interface name")
    k.add_argument("count", metavar="N", type=int, help="number of carrier losses")
    k = kinds.on_node("fd-limit", "lower a node's dockerd open-files limit (prlimit)")
    k.add_argument(
        "--nofile", type=positive_int, default=4096, metavar="N", help="soft = hard (default 4096)"
    )


def apply(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    node = resolve(topo, args.node)
    kind = args.kind
    if kind == "docker":
        return docker_fault(state_dir, node, args.how)
    if kind == "gpu-invisible":
        return gpu_invisible(state_dir, node)
    if kind == "disk-full":
        return disk_full(state_dir, node, args.pct)
    if kind == "clock":
        return clock(state_dir, node, args.seconds)
    if kind == "ssh":
        return ssh_broken(state_dir, topo, node, args.how)
    if kind == "nccl-socket":
        return nccl_socket(state_dir, node)
    if kind == "nccl-env":
        return nccl_env(state_dir, node, args.assignments)
    if kind == "link-flap":
        return link_flap(state_dir, node, args.twin, args.count)
    if kind == "fd-limit":
        return fd_limit(state_dir, node, args.nofile)
    raise SimError(f"unknown fault {kind!r}")


# ---------------------------------------------------------------------------- helpers


def _backup(state_dir: Path, node: NodeSpec, path: Path) -> None:
    """Keep the first original of a file a fault changes (restored by clear)."""
    dest = nodes_mod.node_dir(state_dir, node) / BACKUP / path.name
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)


def _node_pid1(state_dir: Path, node: NodeSpec) -> int:
    wrapper = nodes_mod.read_pid(state_dir, node)
    if wrapper is None:
        raise SimError(f"{node.name}: no sshd wrapper pid; is the node up?")
    return docker.node_pid1(wrapper)


def in_node_mounts(state_dir: Path, node: NodeSpec, script: str, check: bool = True) -> str:
    """Run a shell script in the node's mount namespace (where its sessions live)."""
    pid1 = _node_pid1(state_dir, node)
    # -p too: the node's /proc is its own PID namespace's (umount reads /proc/self)
    return run(["nsenter", "-t", str(pid1), "-m", "-p", "--", "/bin/sh", "-c", script], check=check)


# ----------------------------------------------------------------------------- docker


def docker_fault(state_dir: Path, node: NodeSpec, how: str) -> list[str]:
    if serving.enabled() is not None:
        raise SimError(f"this sim has no Docker engines ({serving.enabled()})")
    e = serving.engine(state_dir, node)
    if how == "stopped":
        done = docker.stop_engines([e])
        record(state_dir, "docker", node.name, "-", how)
        return [f"{node.name}: Docker engine stopped ({', '.join(done) or 'was not running'})"]
    if not docker.ping(e.socket):
        raise SimError(f"{node.name}: its Docker engine is not running ({e.socket})")
    proc = subprocess.run(
        ["docker", "-H", e.host, "rmi", "-f", image.IMAGE], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SimError(f"{node.name}: docker rmi {image.IMAGE}: {proc.stderr.strip()}")
    record(state_dir, "docker", node.name, "-", how)
    return [f"{node.name}: image {image.IMAGE} removed"]


def _restore_docker(state_dir: Path, topo: Topology) -> list[str]:
    rep = serving.report(state_dir)
    if serving.enabled() is not None or not rep.get("docker"):
        return []
    msgs = []
    for node in topo.nodes:
        e = serving.engine(state_dir, node)
        if not docker.ping(e.socket):
            wrapper = nodes_mod.read_pid(state_dir, node)
            if wrapper is None:
                continue
            nd = nodes_mod.node_dir(state_dir, node)
            docker.start_engines([(nd, node.netns, wrapper)], state_dir, image.image_python())
            msgs.append(f"{node.name}: Docker engine restarted")
        have = subprocess.run(
            ["docker", "-H", e.host, "image", "inspect", image.IMAGE],
            capture_output=True,
            text=True,
        )
        if have.returncode != 0:
            saved = Path(str(rep.get("tarball") or image.archive(image.tarball()[0])))
            run(image.load_argv(e.host, saved))  # the other nodes' image ID, as at up
            msgs.append(f"{node.name}: image {image.IMAGE} loaded")
    return msgs


# -------------------------------------------------------------------------------- GPU


def gpu_invisible(state_dir: Path, node: NodeSpec) -> list[str]:
    state = nodes_mod.read_state(state_dir, node)
    gpu = state["gpu"]
    assert isinstance(gpu, dict)
    gpu["gpus"] = []
    gpu["processes"] = []
    nodes_mod.write_state(state_dir, node, state)
    record(state_dir, "gpu-invisible", node.name, "-", None)
    return [f"{node.name}: nvidia-smi finds no GPU"]


# ------------------------------------------------------------------------------- disk


def disk_full(state_dir: Path, node: NodeSpec, pct: int) -> list[str]:
    if not 1 <= pct <= 99:
        raise SimError(f"--pct {pct}: expected 1..99")
    size = DISK_SIZE_MIB * 1024 * 1024
    fill_kib = size * pct // 100 // 1024
    mnt = MODELS_MOUNT
    script = (  # the checkpoint moves onto the small filesystem with everything else
        f"set -e; if mountpoint -q {mnt}; then umount -l {mnt}; fi; "
        f"stage=$(mktemp -d); cp -a {mnt}/. $stage/; "
        f"mount -t tmpfs -o size={DISK_SIZE_MIB}m,mode=755 sparksim-disk {mnt}; "
        f"cp -a $stage/. {mnt}/; rm -rf $stage; "
        f"used=$(df -P -k {mnt} | awk 'NR==2 {{print $3}}'); "
        f"n=$(({fill_kib} - used)); [ $n -gt 0 ] || n=0; "
        f"head -c $((n * 1024)) /dev/zero > {mnt}/.sparksim-fill; "
        f"df -P -k {mnt} | awk 'NR==2 {{print $5}}'"
    )
    used = in_node_mounts(state_dir, node, script).strip()
    record(state_dir, "disk-full", node.name, "-", pct)
    return [f"{node.name}: {mnt} on a {DISK_SIZE_MIB} MiB tmpfs, {used} used"]


def _clear_disk(state_dir: Path, node: NodeSpec) -> list[str]:
    mnt = MODELS_MOUNT
    try:
        out = in_node_mounts(
            state_dir,
            node,
            f"if mountpoint -q {mnt}; then umount -l {mnt} && echo unmounted; fi",
            check=False,
        )
    except SimError:
        return []
    return [f"{node.name}: {mnt} back on its own disk"] if "unmounted" in out else []


# ------------------------------------------------------------------------------ clock


def clock(state_dir: Path, node: NodeSpec, seconds: float) -> list[str]:
    state = nodes_mod.read_state(state_dir, node)
    state["clock_offset_s"] = seconds
    nodes_mod.write_state(state_dir, node, state)
    nd = nodes_mod.node_dir(state_dir, node)
    lib = state_dir / "lib"
    real = next((p for p in REAL_DATE if os.access(p, os.X_OK)), REAL_DATE[0])
    nodes_mod.write_atomic(
        nd / "bin" / "date",
        f"#!{nodes_mod.tools_python()} -IS\n"
        "import sys\n"
        f"sys.path.insert(0, {str(lib)!r})\n"
        f"from {nodes_mod.TOOLS_PKG}.clock import date\n"
        f"sys.exit(date({str(nd)!r}, {real!r}, sys.argv[1:]))\n",
        0o755,
    )
    record(state_dir, "clock", node.name, "-", seconds)
    return [f"{node.name}: date runs {seconds:+g} s off"]


def _clear_clock(state_dir: Path, node: NodeSpec) -> list[str]:
    wrapper = nodes_mod.node_dir(state_dir, node) / "bin" / "date"
    if not wrapper.exists():
        return []
    wrapper.unlink()
    return [f"{node.name}: date back to the machine's clock"]


# -------------------------------------------------------------------------------- ssh


def ssh_broken(state_dir: Path, topo: Topology, worker: NodeSpec, how: str) -> list[str]:
    head = topo.nodes[0]
    if worker.index == head.index:
        raise SimError("ssh: name a worker (the head logs in to its workers)")
    if how == "known-hosts":
        path = nodes_mod.node_dir(state_dir, head) / "ssh" / "known_hosts"
        _backup(state_dir, head, path)
        kept = [
            line
            for line in path.read_text().splitlines()
            if worker.mgmt not in line.split(" ", 1)[0].split(",")
        ]
        nodes_mod.write_atomic(path, "".join(line + "\n" for line in kept))
        what = f"{head.name} no longer knows {worker.name}'s host key"
        record(state_dir, "ssh", head.name, "-", f"{worker.name} known-hosts")
    else:
        path = nodes_mod.node_dir(state_dir, worker) / "ssh" / "authorized_keys"
        _backup(state_dir, worker, path)
        key = nodes_mod.pubkey(state_dir / "id_ed25519")
        nodes_mod.write_atomic(path, f'from="{topo.gateway}" {key}\n', 0o600)
        what = f"{worker.name} accepts the cluster key only from the runner ({topo.gateway})"
        record(state_dir, "ssh", worker.name, "-", "key")
    return [f"{what}: passwordless SSH {head.name} -> {worker.name} fails"]


def _clear_ssh(state_dir: Path, node: NodeSpec) -> list[str]:
    backup = nodes_mod.node_dir(state_dir, node) / BACKUP
    msgs = []
    for name in ("known_hosts", "authorized_keys"):
        saved = backup / name
        if saved.exists():
            dest = nodes_mod.node_dir(state_dir, node) / "ssh" / name
            shutil.copy2(saved, dest)
            saved.unlink()
            msgs.append(f"{node.name}: ~/.ssh/{name} restored")
    return msgs


# ------------------------------------------------------------------------ nccl-socket


def _env_file(state_dir: Path, node: NodeSpec) -> Path:
    return serving.home(state_dir, node) / serving.LAUNCHER_DIR / ".env"


def _write_env(state_dir: Path, node: NodeSpec, why: str, values: dict[str, str]) -> None:
    """The launcher's .env next to the node's launch-cluster.sh: ``CONTAINER_<VAR>=VALUE``
    lines (every serving container gets ``-e VAR=VALUE`` at the next launch)."""
    launcher = serving.home(state_dir, node) / serving.LAUNCHER_DIR / serving.LAUNCHER.name
    if not launcher.exists():
        raise SimError(
            f"{node.name} holds no launcher; the .env lives next to the head's launch-cluster.sh"
        )
    path = _env_file(state_dir, node)
    if path.exists() and ENV_MARK not in path.read_text():
        _backup(state_dir, node, path)
    lines = "".join(f"CONTAINER_{k}={v}\n" for k, v in values.items())
    nodes_mod.write_atomic(path, f"{ENV_MARK}: {why}\n{lines}")


def nccl_socket(state_dir: Path, node: NodeSpec) -> list[str]:
    _write_env(
        state_dir,
        node,
        "NCCL over the management network, RDMA off",
        {"NCCL_SOCKET_IFNAME": MGMT_IF, "NCCL_IB_DISABLE": "1"},
    )
    record(state_dir, "nccl-socket", node.name, MGMT_IF, "NCCL_IB_DISABLE=1")
    return [
        f"{node.name}: launcher .env sets NCCL_SOCKET_IFNAME={MGMT_IF} NCCL_IB_DISABLE=1 "
        "for every serving container at the next launch"
    ]


def nccl_env(state_dir: Path, node: NodeSpec, assignments: list[str]) -> list[str]:
    values = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise SimError(f"nccl-env: {item!r} is not VAR=VALUE")
        values[key] = value
    _write_env(state_dir, node, "nccl-env " + " ".join(assignments), values)
    record(state_dir, "nccl-env", node.name, "-", " ".join(assignments))
    return [
        f"{node.name}: launcher .env sets {' '.join(assignments)} for every serving container "
        "at the next launch"
    ]


def _clear_env(state_dir: Path, node: NodeSpec) -> list[str]:
    path = _env_file(state_dir, node)
    if not path.exists() or ENV_MARK not in path.read_text():
        return []
    saved = nodes_mod.node_dir(state_dir, node) / BACKUP / ".env"
    if saved.exists():
        shutil.copy2(saved, path)
        saved.unlink()
    else:
        path.unlink()
    return [f"{node.name}: launcher .env restored"]


# -------------------------------------------------------------------------- link-flap


def _ifname(twin: str) -> str:
    for t, (ifname, dev, _) in enumerate(FABRIC_TWINS):
        if twin in (str(t), ifname, dev):
            return ifname
    choices = ", ".join(f"{t} ({ifname})" for t, (ifname, _, _) in enumerate(FABRIC_TWINS))
    raise SimError(f"unknown twin {twin!r}: use {choices}")


def link_flap(state_dir: Path, node: NodeSpec, twin: str, count: int) -> list[str]:
    if not 1 <= count <= 1000:
        raise SimError(f"link-flap {count}: expected 1..1000 carrier losses")
    ifname = _ifname(twin)
    ip_batch(
        [f"link set {ifname} {state}" for _ in range(count) for state in ("down", "up")],
        netns=node.netns,
    )
    prior = next(
        (
            f
            for f in load_faults(state_dir)
            if (f.get("kind"), f.get("node"), f.get("if")) == ("link-flap", node.name, ifname)
        ),
        None,
    )
    total = count + int(prior["value"]) if prior else count
    record(state_dir, "link-flap", node.name, ifname, total)
    return [f"{node.name} {ifname}: link flapped {count} times ({total} since the last clear)"]


def _replug(topo: Topology, node: NodeSpec, ifname: str) -> None:
    """A new cable: the veth pair (or the node's port on the twin's switch) made anew,
    so the kernel's carrier counters start again. Shaping is reapplied by faults.clear."""
    t = next(i for i, (name, _, _) in enumerate(FABRIC_TWINS) if name == ifname)
    ip_batch([f"link del {ifname}"], netns=node.netns)
    ends = [node]
    if topo.switched:
        port = topo.switch_port(node, t)
        ip_batch(
            [
                f"link add {ifname} netns {node.netns} mtu {HEALTHY_MTU} type veth "
                f"peer name {port} netns {topo.switch_netns} mtu {HEALTHY_MTU}"
            ]
        )
        ip_batch([f"link set {port} master {topo.twin_bridge(t)} up"], netns=topo.switch_netns)
    else:
        peer = topo.peer(node)
        ip_batch(
            [
                f"link add {ifname} netns {node.netns} mtu {HEALTHY_MTU} type veth "
                f"peer name {ifname} netns {peer.netns} mtu {HEALTHY_MTU}"
            ]
        )
        ends.append(peer)
    for n in ends:
        addr = next(p.addr for p in n.fabric if p.ifname == ifname)
        ip_batch([f"addr add {addr}/24 dev {ifname}", f"link set {ifname} up"], netns=n.netns)


# ---------------------------------------------------------------------------- fd-limit


def _engine_pids(state_dir: Path, node: NodeSpec) -> list[int]:
    """The node's dockerd (host PID) and the containerd it started."""
    pid = serving.engine(state_dir, node).host_pid()
    if pid is None:
        return []
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    found = [pid]
    for kid in kids:
        try:
            if Path(f"/proc/{kid}/comm").read_text().strip() == "containerd":
                found.append(int(kid))
        except OSError:
            continue
    return found


def _nofile(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise SimError(f"/proc/{pid}/limits has no 'Max open files' line")


def fd_limit(state_dir: Path, node: NodeSpec, nofile: int) -> list[str]:
    if serving.enabled() is not None:
        raise SimError(f"this sim has no Docker engines ({serving.enabled()})")
    pids = _engine_pids(state_dir, node)
    if not pids:
        raise SimError(f"{node.name}: its Docker engine is not running")
    was = next(
        (f["value"]["was"] for f in load_faults(state_dir) if _is_fd_fault(f, node)),
        {str(p): _nofile(p) for p in pids},
    )
    for pid in pids:
        run(["prlimit", "--pid", str(pid), f"--nofile={nofile}:{nofile}"])
    record(state_dir, "fd-limit", node.name, "-", {"nofile": nofile, "was": was})
    return [f"{node.name}: dockerd (pid {pids[0]}) and its containerd: open files {nofile}"]


def _is_fd_fault(f: dict[str, object], node: NodeSpec) -> bool:
    return (f.get("kind"), f.get("node")) == ("fd-limit", node.name)


def _clear_fd_limit(state_dir: Path, node: NodeSpec) -> list[str]:
    """Give the engine its limits back; where raising a hard limit is not permitted (no
    CAP_SYS_RESOURCE, e.g. in a container), stop the engine: :func:`_restore_docker`
    starts it again with the sim's limits (its containers are gone, as after a restart
    of docker.service)."""
    msgs = []
    for f in load_faults(state_dir):
        if not _is_fd_fault(f, node):
            continue
        for pid, (soft, hard) in f["value"]["was"].items():
            if not Path(f"/proc/{pid}").exists():  # a restarted engine has its own limits
                continue
            back = subprocess.run(
                ["prlimit", "--pid", pid, f"--nofile={soft}:{hard}"], capture_output=True, text=True
            )
            if back.returncode == 0:
                msgs.append(f"{node.name}: pid {pid} open files back to {soft}:{hard}")
                continue
            done = docker.stop_engines([serving.engine(state_dir, node)])
            msgs.append(
                f"{node.name}: Docker engine stopped to restore its open-files limit "
                f"({back.stderr.strip()}; {', '.join(done) or 'was not running'})"
            )
            break
    return msgs


# ------------------------------------------------------------------------------ clear


def clear(state_dir: Path, topo: Topology) -> list[str]:
    """Undo every fault of this module (before the sim core's clear, which resets
    state.json, the links and faults.json). Links that lost their carrier (``link-flap``,
    ``link-down``) get a new cable, so a healthy cluster shows no past flaps."""
    msgs: list[str] = []
    replug: dict[tuple[str, str], NodeSpec] = {}
    for f in load_faults(state_dir):
        if f.get("kind") in ("link-flap", "link-down"):
            node = next((n for n in topo.nodes if n.name == f.get("node")), None)
            if node is not None and f.get("if") in {name for name, _, _ in FABRIC_TWINS}:
                # a direct cable has both ends in one veth pair: replace it once
                key = (node.name if topo.switched else "cable", str(f["if"]))
                replug.setdefault(key, node)
    for (_, ifname), node in sorted(replug.items()):
        _replug(topo, node, ifname)
        msgs.append(f"{node.name} {ifname}: cable replaced (carrier counters reset)")
    for node in topo.nodes:
        msgs += _clear_disk(state_dir, node)
        msgs += _clear_clock(state_dir, node)
        msgs += _clear_ssh(state_dir, node)
        msgs += _clear_env(state_dir, node)
        msgs += _clear_fd_limit(state_dir, node)
    msgs += _restore_docker(state_dir, topo)
    return msgs
