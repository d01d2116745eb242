"""What a node looks like, as the node itself sees it over SSH, and what changed.

:func:`snapshot` runs one shell script per node (all nodes at once) and returns
``{section: {key: value}}``; :func:`diff` compares two of them, minus what is ``allowed``.

Sections (per node): ``files`` (path -> type, size, mode, mtime) under the writable places
a node sees (/tmp, /var/tmp, /root, /etc, /dev/shm, the sim's per-node state dir), and the
same for /tmp, /var/tmp and /root inside each running container; ``procs`` (the command
lines running in the node's PID namespace, counted); ``docker`` (containers, images,
volumes, networks); ``net`` (``ip -d link``, addresses, routes, rules, ``tc qdisc``);
``sysctl`` (``sysctl -a`` in the node's namespaces); ``mounts`` (the node's mount table).

Left out, and why:

- a directory's size and mtime: they change whenever an entry is added or removed in it,
  which the entries' own lines already show (a temp dir made and removed leaves /tmp's
  mtime changed and nothing else);
- the sim's own logs in the node's state dir (``sshd.log``: one line per login, written
  by sshd; ``node.log``; ``docker/dockerd.log``) and docker's data root
  (``docker/data``: its containers, images, volumes are compared through the docker CLI);
  the node's /root, /tmp and /var/tmp backing dirs (``home``, ``tmp``, ``var-tmp``)
  and the cgroup parking point there, which are walked as /root, /tmp, /var/tmp;
- in a container: Ray's session directory (/tmp/ray), which the running cluster rewrites
  by itself;
- on the node and in a container, folders mounted below /tmp, /var/tmp or /root (but the
  node's ~/.ssh): another's files bound in (sparksim: the host's venv and torch, when they
  lie there, as a CI clone's may; the host may rewrite them while a row runs);
- the snapshot's own SSH session (sshd's per-session processes and what runs under them);
- kernel counters in ``sysctl -a`` that move by themselves (:data:`VOLATILE_SYSCTLS`);
- the neighbour (ARP) cache: pinging a peer fills it, the kernel ages it out.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pytest_spark.access.simcontrol import spawn_env

Snapshot = dict[str, dict[str, str]]
ROOTS = ("/tmp", "/var/tmp", "/root", "/etc", "/dev/shm")
CONTAINER_ROOTS = ("/tmp", "/var/tmp", "/root")
STATE_PRUNE = ("docker/data", "home", "tmp", "var-tmp", "cgroup")
STATE_LOGS = ("sshd.log", "node.log", "docker/dockerd.log")
VOLATILE_SYSCTLS = re.compile(
    r"^(kernel\.random\.|fs\.(dentry-state|inode-nr|inode-state|file-nr|quota\.)|"
    r"kernel\.ns_last_pid|kernel\.pty\.nr|net\.netfilter\.nf_conntrack_count|"
    r"kernel\.sched_|vm\.stat_|fs\.aio-nr|kernel\.perf_|net\.ipv6\.route\.gc_)"
)
# A `docker exec` in flight: runc's exec through the runtime (and its GPU hook), there and
# gone within the call; a kept launcher's periodic `docker exec` check starts one every 5 s.
VOLATILE_PROCS = re.compile(
    r"( exec --process /tmp/runc-process\S*|^/usr/bin/python3 -I -c import json, os, resource)"
)
SECTIONS = ("files", "procs", "docker", "net", "sysctl", "mounts")


def snapshot_script(state_dir: str, node_dir: str) -> str:
    """The shell script that prints one node's snapshot, section by section."""
    q = shlex.quote
    prune = [f"{node_dir}/{p}" for p in STATE_PRUNE] + [state_dir]
    prune_expr = " -o ".join(f"-path {q(p)}" for p in prune)
    fmt = r"%p\t%y\t%s\t%m\t%T@\t%l\n"
    roots = " ".join(q(r) for r in (*ROOTS, node_dir))
    croots = " ".join(CONTAINER_ROOTS)
    # Folders mounted below /tmp, /var/tmp or /root (not those themselves, nor the node's
    # ~/.ssh) are another's, bound in: on sparksim the host's venv and torch when they lie
    # there (a CI clone), which the node and its containers mount at the host's path, and
    # which the host may rewrite while a row runs (a sandbox appending its CA to the venv's
    # certifi bundle did).
    bound = (
        r"""awk '$2 ~ "^/((var/)?tmp|root)/." && $2 != "/root/.ssh" {print $2}' """
        "/proc/self/mounts"
    )
    container = (
        f"set -- -path {q(state_dir)} -o -path /tmp/ray; "
        f'for m in $({bound}); do [ -d "$m" ] && set -- "$@" -o -path "$m"; done; '
        f'find {croots} \\( "$@" \\) -prune -o -printf "{fmt}" 2>/dev/null || '
        f"ls -ladR --time-style=+%s {croots} 2>/dev/null"
    )
    return f"""
echo @self $$
echo @files
set -- -path {q(state_dir)}
for m in $({bound}); do [ -d "$m" ] && set -- "$@" -o -path "$m"; done
for r in {roots}; do
  [ -e "$r" ] || continue
  if [ "$r" = {q(node_dir)} ]; then
    find "$r" \\( {prune_expr} \\) -prune -o -printf '{fmt}' 2>/dev/null
  else
    find "$r" \\( "$@" \\) -prune -o -printf '{fmt}' 2>/dev/null
  fi
done
if command -v docker >/dev/null 2>&1; then
  for c in $(docker ps -q 2>/dev/null); do
    name=$(docker inspect -f '{{{{.Name}}}}' "$c" 2>/dev/null)
    docker exec "$c" sh -c {q(container)} | sed "s|^|container$name:|"
  done
fi
echo @procs
ps -e -o pid=,ppid=,args=
echo @docker
if command -v docker >/dev/null 2>&1; then
  docker ps -a --no-trunc --format 'container {{{{.Names}}}}\t{{{{.Image}}}}\t{{{{.State}}}}'
  docker images -a --no-trunc --format 'image {{{{.Repository}}}}:{{{{.Tag}}}}\t{{{{.ID}}}}'
  docker volume ls -q | sed 's/^/volume /'
  docker network ls --no-trunc --format 'network {{{{.Name}}}}\t{{{{.Driver}}}}'
fi
echo @net
ip -d -o link show | sed 's/^[0-9]*: //'
ip -o addr show | sed 's/^[0-9]*: //'
ip route show table all
ip rule show
tc qdisc show
echo @sysctl
sysctl -a 2>/dev/null
echo @mounts
findmnt -rn -o TARGET,FSTYPE,SOURCE
"""


def parse(text: str) -> Snapshot:
    """The script's output -> ``{section: {key: value}}``."""
    raw: dict[str, list[str]] = {s: [] for s in SECTIONS}
    section = ""
    me = ""
    for line in text.splitlines():
        if line.startswith("@self "):
            me = line.split()[1]
        elif line.startswith("@") and line[1:] in raw:
            section = line[1:]
        elif section and line.strip():
            raw[section].append(line)
    snap: Snapshot = {s: {} for s in SECTIONS}
    for line in raw["files"]:
        path, kind, size, mode, mtime, target = (line.split("\t") + [""] * 6)[:6]
        if path.endswith(tuple(f"/{log}" for log in STATE_LOGS)):
            continue
        if kind == "d":
            snap["files"][path] = f"d {mode}"
        elif kind == "l":
            snap["files"][path] = f"l -> {target}"
        else:
            snap["files"][path] = f"{kind} {size} B {mode} mtime {mtime}"
    snap["procs"] = {k: str(v) for k, v in _processes(raw["procs"], me).items()}
    for name in ("docker", "net"):
        snap[name] = {line: "" for line in raw[name]}
    # /run/netns holds every sim's namespace handles, made and removed on the host.
    snap["mounts"] = {line: "" for line in raw["mounts"] if not line.startswith("/run/netns/")}
    for line in raw["sysctl"]:
        key, _, value = line.partition(" = ")
        if not VOLATILE_SYSCTLS.match(key):
            snap["sysctl"][key] = value
    return snap


def _processes(lines: Iterable[str], me: str) -> Counter[str]:
    """Command lines counted, minus the snapshot's own SSH session (sshd's per-session
    processes, ``sshd: root...``, and everything under them)."""
    parent: dict[str, str] = {}
    args: dict[str, str] = {}
    for line in lines:
        parts = line.split(None, 2)
        if len(parts) == 3:
            parent[parts[0]], args[parts[0]] = parts[1], parts[2]
    session = {pid for pid, a in args.items() if a.startswith("sshd: ") and "[listener]" not in a}

    def in_session(pid: str) -> bool:
        seen = set()
        while pid in parent and pid not in seen:
            if pid in session or pid == me:
                return True
            seen.add(pid)
            pid = parent[pid]
        return False

    launchers = {pid for pid, a in args.items() if "launch-cluster.sh" in a}

    def launcher_child(pid: str) -> bool:
        """Under a launch-cluster.sh that follows its head (its polling subshells, `sleep`
        and `docker exec` checks come and go): the launcher itself is counted, once."""
        seen = set()
        pid = parent.get(pid, "")
        while pid in parent and pid not in seen:
            if pid in launchers:
                return True
            seen.add(pid)
            pid = parent[pid]
        return False

    return Counter(
        a
        for pid, a in args.items()
        if not in_session(pid) and not launcher_child(pid) and not VOLATILE_PROCS.search(a)
    )


def snapshot(ssh_config: Path, nodes: Mapping[str, str], state_dir: Path) -> dict[str, Snapshot]:
    """Every node's snapshot, taken over SSH at once: ``nodes`` maps name -> address."""

    def one(item: tuple[str, str]) -> tuple[str, Snapshot]:
        name, address = item
        script = snapshot_script(str(state_dir.resolve()), str(state_dir / "nodes" / name))
        proc = subprocess.run(
            ["ssh", "-F", str(ssh_config), address, "sh -s"],
            input=script,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=spawn_env(),  # spawned off the main thread (this pool, the matrix's lanes)
        )
        if proc.returncode != 0 or "@mounts" not in proc.stdout:
            raise RuntimeError(f"{name}: snapshot failed ({proc.returncode}): {proc.stderr}")
        return name, parse(proc.stdout)

    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        return dict(pool.map(one, nodes.items()))


def diff(
    before: Mapping[str, Snapshot],
    after: Mapping[str, Snapshot],
    allowed: Iterable[str] = (),
) -> list[str]:
    """Every difference, one line each (``NODE SECTION: + key`` / ``- key`` /
    ``~ key: old -> new``), minus lines that match one of the ``allowed`` regexes."""
    allow = [re.compile(a) for a in allowed]
    out: list[str] = []
    for node in sorted(set(before) | set(after)):
        b, a = before.get(node, {}), after.get(node, {})
        for section in SECTIONS:
            old, new = b.get(section, {}), a.get(section, {})
            for key in sorted(set(old) | set(new)):
                if key not in new:
                    line = f"{node} {section}: - {key} {old[key]}".rstrip()
                elif key not in old:
                    line = f"{node} {section}: + {key} {new[key]}".rstrip()
                elif old[key] != new[key]:
                    line = f"{node} {section}: ~ {key}: {old[key]} -> {new[key]}"
                else:
                    continue
                if not any(p.search(line) for p in allow):
                    out.append(line)
    return out


def describe(changes: list[str], limit: int = 60) -> str:
    more = f"\n... and {len(changes) - limit} more" if len(changes) > limit else ""
    return "\n".join(changes[:limit]) + more


# ------------------------------------------------------------------ around a run on a sim

# What --spark-launch may leave behind (README): launch-cluster.sh bind-mounts
# $HF_HOME (default ~/.cache/huggingface) and, unless --no-cache-dirs, the compile caches
# ~/.cache/vllm, ~/.cache/flashinfer, ~/.triton and ~/.tilelang into the containers, and
# makes each on every node where it is missing (five mounts in real deployments of
# eugr/spark-vllm-docker). The containers themselves are stopped and removed.
LAUNCH_LEAVES = (
    r"^\S+ files: \+ /root/(\.cache/(huggingface|vllm|flashinfer)|\.triton|\.tilelang) d \d+$",
)
# A cluster someone else launched keeps writing its launcher log while it serves.
KEPT_LAUNCHER_LOG = (r"^spark-1 files: ~ /tmp/pytest-spark-launch-[0-9a-f]+\.log: ",)
# launch-cluster.sh without Ray follows the head's vLLM, checking every 5 s whether it has
# exited; after `stop` it notices the container is gone at its next check.
ORPHAN_LAUNCHER = (
    "for i in $(seq 60); do pgrep -f 'launch-cluster.sh .* exec ' >/dev/null || exit 0; "
    '[ -n "$(docker ps -q --filter name=^vllm_node$)" ] && exit 0; sleep 0.5; done; exit 1'
)
SETTLE_S = 30.0  # a container still stopping, an SSH session still closing, on a busy machine


def sim_nodes(sim: Any) -> dict[str, str]:
    """A sparksim's nodes (``SimCluster``): name -> management address."""
    return {n["name"]: n["mgmt"] for n in sim.info["nodes"]}


def sim_snapshot(sim: Any) -> dict[str, Snapshot]:
    return snapshot(sim.ssh_config, sim_nodes(sim), sim.state_dir)


def sim_ssh(sim: Any, address: str, command: str) -> None:
    subprocess.run(
        ["ssh", "-F", str(sim.ssh_config), address, command],
        capture_output=True,
        timeout=120,
        check=False,
        env=spawn_env(),  # the fault matrix's lanes call this off the main thread
    )


def before_run(sim: Any) -> dict[str, Snapshot]:
    """The snapshot to compare against, once a launcher that was stopped before has
    noticed its container is gone (at most 30 s; else its exit would count as a change)."""
    sim_ssh(sim, sim.head, ORPHAN_LAUNCHER)
    return sim_snapshot(sim)


def changes_after(
    sim: Any, before: dict[str, Snapshot], allowed: tuple[str, ...] = ()
) -> list[str]:
    """The differences once the nodes have settled: snapshots are taken until one shows
    nothing changed (what a stopping container or a closing SSH session was still doing
    has ended) or SETTLE_S has passed; then the last one's differences stand."""
    deadline = time.monotonic() + SETTLE_S
    while (changes := diff(before, sim_snapshot(sim), allowed)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return changes
