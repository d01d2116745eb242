"""``up``, ``down`` and ``status`` of one sparksim instance (state kept in its state dir)."""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import engines, registry, serving
from . import node as nodes_mod
from .faults.common import load_faults
from .faults.link import apply_shaping
from .netns import (
    SimError,
    ip_batch,
    kill_pids,
    link_names,
    links,
    list_netns,
    netns_pids,
    pid_alive,
    qdisc_rates,
)
from .topology import (
    FABRIC_TWINS,
    HEALTHY_MTU,
    LINK_RE,
    MAX_NODES,
    MGMT_IF,
    NETNS_RE,
    UNPLUGGED,
    Topology,
    build,
)

DEFAULT_STATE_DIR = "/run/sparksim/default"
STATE_DIR_ENV = "SPARKSIM_STATE_DIR"
CLUSTER_JSON = "cluster.json"


def default_state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def lock(state_dir: Path) -> Any:
    return registry.flock(state_dir / ".lock")


def load_cluster(state_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((state_dir / CLUSTER_JSON).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data


def topology_of(cluster: dict[str, Any]) -> Topology:
    kind = cluster.get("topology")
    return build(int(cluster["instance"]), len(cluster["nodes"]), str(kind) if kind else None)


def require_topology(state_dir: Path) -> Topology:
    cluster = load_cluster(state_dir)
    if cluster is None:
        raise SimError(f"no sparksim is up at {state_dir}: run `spark-sim up` first")
    return topology_of(cluster)


# ------------------------------------------------------------------------ up


def _network_lines(topo: Topology) -> list[str]:
    """The root namespace's part (run there): the nodes' namespaces, the management
    bridge, and every fabric cable (a veth per twin, node to node or node to switch)."""
    lines = [f"netns add {n.netns}" for n in topo.nodes]
    lines += [
        f"link add {topo.bridge} type bridge",
        f"addr add {topo.gateway}/24 dev {topo.bridge}",
        f"link set {topo.bridge} up",
    ]
    for n in topo.nodes:
        lines += [
            f"link add {MGMT_IF} netns {n.netns} type veth peer name {n.host_veth}",
            f"link set {n.host_veth} master {topo.bridge} up",
        ]
    if not topo.switched:
        a, b = topo.nodes
        for ifname, _, _ in FABRIC_TWINS:
            lines.append(
                f"link add {ifname} netns {a.netns} mtu {HEALTHY_MTU} type veth "
                f"peer name {ifname} netns {b.netns} mtu {HEALTHY_MTU}"
            )
        return lines
    lines.append(f"netns add {topo.switch_netns}")
    for t, (ifname, _, _) in enumerate(FABRIC_TWINS):
        lines += [
            f"link add {ifname} netns {n.netns} mtu {HEALTHY_MTU} type veth "
            f"peer name {topo.switch_port(n, t)} netns {topo.switch_netns} mtu {HEALTHY_MTU}"
            for n in topo.nodes
        ]
    return lines


def _switch_lines(topo: Topology) -> list[str]:
    """The switch namespace's part: one bridge per twin holding every node's port."""
    lines = ["link set lo up"]
    for t in range(len(FABRIC_TWINS)):
        br = topo.twin_bridge(t)
        lines += [f"link add {br} mtu {HEALTHY_MTU} type bridge", f"link set {br} up"]
        lines += [f"link set {topo.switch_port(n, t)} master {br} up" for n in topo.nodes]
    return lines


def _node_lines(topo: Topology, index: int) -> list[str]:
    n = topo.nodes[index]
    lines = [
        "link set lo up",
        f"addr add {n.mgmt}/24 dev {MGMT_IF}",
        f"link set {MGMT_IF} up",
    ]
    for p in n.fabric:
        lines += [f"addr add {p.addr}/24 dev {p.ifname}", f"link set {p.ifname} up"]
    for ifname, _ in UNPLUGGED:
        lines += [f"tuntap add dev {ifname} mode tap", f"link set {ifname} up"]
    return lines


def _cluster_json(state_dir: Path, topo: Topology) -> dict[str, Any]:
    data = {
        "version": 1,
        "instance": topo.instance,
        "state_dir": str(state_dir),
        "topology": topo.kind,
        "nodes": [n.as_json() for n in topo.nodes],
        "ssh_config": str(state_dir / "ssh_config"),
        "known_hosts": str(state_dir / "known_hosts"),
        "identity": str(state_dir / "id_ed25519"),
        "user": "root",
    }
    launch = serving.launch_hints(state_dir)
    if launch is not None:
        data["launch"] = launch  # how to start serving on this sim (suite settings)
    return data


def up(
    state_dir: Path,
    count: int,
    *,
    topology: str | None = None,
    time_scale: float = 0.002,
    engine: str = engines.DEFAULT,
    launch_mode: str = serving.DEFAULT_LAUNCH_MODE,
    emu: dict[str, str] | None = None,
) -> dict[str, Any]:
    state_dir = Path(os.path.abspath(state_dir))
    if any(c.isspace() for c in str(state_dir)):
        raise SimError(
            f"state dir {str(state_dir)!r} contains whitespace (sshd_config cannot "
            "hold it): choose another --state-dir"
        )
    if not 2 <= count <= MAX_NODES:
        raise SimError(f"--nodes {count}: expected 2..{MAX_NODES}")
    try:
        build(0, count, topology)  # a bad --topology fails before anything is made
    except ValueError as exc:
        raise SimError(str(exc)) from None
    state_dir.mkdir(parents=True, exist_ok=True)
    with lock(state_dir):
        report = health(state_dir)
        if report["healthy"]:
            raise SimError(
                f"sparksim at {state_dir} is already up (instance {report['instance']}, "
                f"{len(report['nodes'])} nodes); run `spark-sim --state-dir {state_dir} down` "
                "first, or use another --state-dir"
            )
        _teardown(state_dir)  # remnants of a crashed or half-removed run
        engines.select(state_dir, engine)  # read by the node and serving set-up below
        serving.select_launch_mode(state_dir, launch_mode)  # said in cluster.json's "launch"
        k = registry.claim(state_dir, count)
        topo = build(k, count, topology)
        try:
            _build(state_dir, topo, time_scale, emu or {})
        except BaseException:
            _cleanup_instance(k, state_dir)
            registry.release(k)
            raise
        cluster = _cluster_json(state_dir, topo)
        nodes_mod.write_atomic(state_dir / CLUSTER_JSON, json.dumps(cluster, indent=2) + "\n")
        return cluster


def _build(
    state_dir: Path, topo: Topology, time_scale: float = 0.002, emu: dict[str, str] | None = None
) -> None:
    names = {n.name for n in topo.nodes}
    for old in (state_dir / "nodes").glob("*"):
        if old.name not in names and old.is_dir():
            shutil.rmtree(old)  # a node of an earlier, larger cluster
    for n in topo.nodes:
        nodes_mod.node_dir(state_dir, n).mkdir(parents=True, exist_ok=True)
        (nodes_mod.node_dir(state_dir, n) / "state.json").unlink(missing_ok=True)
    (state_dir / "faults.json").unlink(missing_ok=True)
    nodes_mod.keygen_many(
        [(state_dir / "id_ed25519", f"sparksim-client@{state_dir}")]
        + [
            (nodes_mod.node_dir(state_dir, n) / "ssh_host_ed25519_key", f"root@{n.name}")
            for n in topo.nodes
        ]
    )
    lib = nodes_mod.install_tools(state_dir)
    setenv = {n.name: serving.sshd_setenv(state_dir, n) for n in topo.nodes}
    # Each node's files at once: ~1,150 of them a node (its /sys/class/infiniband tree,
    # rdmasysfs.py), file creation that the kernel runs in parallel.
    with ThreadPoolExecutor(min(len(topo.nodes), os.cpu_count() or 1)) as pool:
        list(
            pool.map(
                lambda n: nodes_mod.write_node_files(state_dir, topo, n, lib, setenv[n.name]),
                topo.nodes,
            )
        )
    nodes_mod.write_client_files(state_dir, topo)

    ip_batch(_network_lines(topo))
    if topo.switched:
        ip_batch(_switch_lines(topo), netns=topo.switch_netns)
    for i, n in enumerate(topo.nodes):
        ip_batch(_node_lines(topo, i), netns=n.netns)
    apply_shaping(state_dir, topo)
    for n in topo.nodes:
        binds = serving.node_binds(state_dir, n)
        nodes_mod.start_sshd(state_dir, n, binds, serving.container_sources(state_dir))
    nodes_mod.wait_sshd(state_dir, topo.nodes)
    serving.start(state_dir, topo, time_scale, emu)  # Docker engine, image, model, launcher


# ---------------------------------------------------------------------- down


def _instance_of(name: str, pattern: Any) -> int | None:
    m = pattern.match(name)
    return int(m.group(1)) if m else None


def _cleanup_instance(k: int, state_dir: Path | None) -> list[str]:
    """Kill every process of instance k, delete its namespaces and root-ns links."""
    removed: list[str] = serving.stop(state_dir, k)  # containers and engines first
    namespaces = [ns for ns in list_netns() if _instance_of(ns, NETNS_RE) == k]
    pids: set[int] = set()
    for ns in namespaces:
        pids.update(netns_pids(ns))
    if state_dir is not None:  # wrappers whose namespace was deleted by hand
        for pidfile in state_dir.glob("nodes/*/sshd.pid"):
            try:
                pid = int(pidfile.read_text().strip())
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if str(state_dir).encode() in fh.read():
                        pids.add(pid)
            except (OSError, ValueError):
                pass
            pidfile.unlink(missing_ok=True)
    if pids:
        stuck = kill_pids(sorted(pids))
        removed.append(f"{len(pids) - len(stuck)} processes")
        if stuck:
            removed.append(f"(still alive: {stuck})")
    root_links = [name for name in link_names() if _instance_of(name, LINK_RE) == k]
    ip_batch([f"link del {name}" for name in root_links], force=True)
    ip_batch([f"netns delete {ns}" for ns in namespaces], force=True)
    removed += namespaces + root_links
    return removed


def _teardown(state_dir: Path) -> list[str]:
    """Remove whatever instance this state dir owns (or owned)."""
    ks = {k for k, e in registry.entries().items() if e.get("state_dir") == str(state_dir)}
    cluster = load_cluster(state_dir)
    if cluster is not None:
        k = int(cluster["instance"])
        if registry.owner(k) in (None, str(state_dir)):
            ks.add(k)
    removed = []
    for k in sorted(ks):
        removed += _cleanup_instance(k, state_dir)
        registry.release(k)
    for name in (CLUSTER_JSON, "faults.json", serving.KEPT_TARBALL):
        (state_dir / name).unlink(missing_ok=True)
    return removed


def down(state_dir: Path) -> list[str]:
    state_dir = Path(os.path.abspath(state_dir))
    if not state_dir.exists():
        return []
    with lock(state_dir):
        return _teardown(state_dir)


def down_all() -> list[str]:
    with registry.flock(registry.LOCK):
        owners = {k: e.get("state_dir") for k, e in registry.entries().items()}
        ks = set(owners) | registry.instances_in_kernel()
        removed = []
        for k in sorted(ks):
            owner = owners.get(k)
            sdir = Path(str(owner)) if owner else None
            removed += _cleanup_instance(k, sdir)
            registry.release(k)
            if sdir is not None:
                cluster = load_cluster(sdir)
                if cluster is not None and int(cluster.get("instance", -1)) == k:
                    for name in (CLUSTER_JSON, "faults.json", serving.KEPT_TARBALL):
                        (sdir / name).unlink(missing_ok=True)
        return removed


# -------------------------------------------------------------------- status


def health(state_dir: Path) -> dict[str, Any]:
    """Status of the sim at state_dir: up, healthy, nodes with link facts, faults."""
    state_dir = Path(os.path.abspath(state_dir))
    report: dict[str, Any] = {
        "state_dir": str(state_dir), "up": False, "healthy": False, "instance": None,
        "nodes": [], "faults": [], "problems": [],
    }  # fmt: skip
    cluster = load_cluster(state_dir)
    if cluster is None:
        report["problems"].append("not up (no cluster.json)")
        return report
    topo = topology_of(cluster)
    k = topo.instance
    report["instance"] = k
    report["up"] = True
    problems: list[str] = report["problems"]
    if registry.owner(k) not in (None, str(state_dir)):
        problems.append(f"instance {k} now belongs to {registry.owner(k)}")
    present = set(list_netns())
    root = set(link_names())
    if topo.bridge not in root:
        problems.append(f"bridge {topo.bridge} missing")
    report["topology"] = topo.kind
    if topo.switched and topo.switch_netns not in present:
        problems.append(f"switch: namespace {topo.switch_netns} missing")
    for n in topo.nodes:
        entry: dict[str, Any] = {**n.as_json(), "sshd": "down", "pid": None, "links": []}
        pid = nodes_mod.read_pid(state_dir, n)
        if pid is not None and pid_alive(pid):
            entry["pid"] = pid
        if n.netns not in present:
            problems.append(f"{n.name}: namespace {n.netns} missing")
        else:
            if nodes_mod.ssh_banner(n.mgmt, timeout=1.0):
                entry["sshd"] = "running"
            else:
                problems.append(f"{n.name}: sshd not answering on {n.mgmt}:22")
            entry["links"] = _link_facts(state_dir, n)
        report["nodes"].append(entry)
    report["faults"] = load_faults(state_dir)
    report["serving"] = serving.report(state_dir)
    problems += serving.problems(state_dir, topo)
    report["healthy"] = not problems
    return report


def _link_facts(state_dir: Path, n: Any) -> list[dict[str, Any]]:
    by_name = {str(link["ifname"]): link for link in links(n.netns)}
    shaped = qdisc_rates(n.netns)
    try:
        ports = nodes_mod.read_state(state_dir, n)["ports"]
    except (OSError, ValueError, KeyError):
        ports = {}
    facts = []
    for p in n.fabric:
        link = by_name.get(p.ifname, {})
        rate = ports.get(p.dev, {}).get("rate_gbps") if isinstance(ports, dict) else None
        facts.append({
            "if": p.ifname, "dev": p.dev,
            "operstate": link.get("operstate", "MISSING"), "mtu": link.get("mtu"),
            "rate_mbps": None if rate is None else round(float(rate) * 1000),
            "shaped_mbit": shaped.get(p.ifname),
        })  # fmt: skip
    return facts
