"""The all-reduce sweep across the cluster (with all_gather and the small-message latency
sweep in the same launch), run once per session and shared by the NCCL checks: ranks meet
over the fabric, with the serving containers' NCCL environment; and each node's RoCE GID
tables from sysfs (one round trip per node, cached)."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Sequence

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.links.check import link_is_usable
from pytest_spark.infra.links.gather import fabric_ifs, node_link_facts, port_of
from pytest_spark.infra.links.probe import NodeLinkFacts
from pytest_spark.infra.memory.gather import node_memory
from pytest_spark.infra.nccl.check import _gb, _size
from pytest_spark.infra.nccl.gid_parse import GID_PROBE, GidTable, parse_gid_probe
from pytest_spark.infra.nccl.launcher_gather import CollectiveUnavailable
from pytest_spark.infra.nccl.probe import CollectiveRun, SweepProgress
from pytest_spark.infra.nccl.runner_gather import run_allreduce
from pytest_spark.infra.nccl.sizing_check import sweep_sizes

NCCL_ENV = (
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_IB_DISABLE",
    "NCCL_NET",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "UCX_NET_DEVICES",
    "NCCL_DEBUG",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_ADDR_FAMILY",
    "NCCL_IB_ADDR_RANGE",
)
COLLECTIVES = ("all_reduce", "all_gather", "latency")  # one launch, the same rank processes


SOCKET_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def named_interfaces(value: str) -> list[str]:
    """The interfaces an ``NCCL_SOCKET_IFNAME`` value names (``=`` exact match, comma
    list); an exclusion list (``^docker0,lo``) names none to use."""
    if value.startswith("^"):
        return []
    return [name for name in value.removeprefix("=").split(",") if name]


def down_socket_ports(cluster: Cluster, envs: dict[str, dict[str, str]]) -> list[str]:
    """Each fabric port a rank's NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME names that is
    down on its node, in the link-up check's words: NCCL would bootstrap over it and hang."""
    ifs = fabric_ifs(cluster)
    reasons = []
    for node in cluster.nodes:
        env = envs.get(node.name) or {}
        facts = node_link_facts(cluster, node)
        named = {i: v for v in SOCKET_VARS for i in named_interfaces(env.get(v, "")) if i in ifs}
        for ifname, var in named.items():
            usable, reason = link_is_usable(port_of(facts, ifname), node.name)
            if not usable:
                reasons.append(f"{var}={env[var]} on {node.name} names a down port: {reason}")
    return reasons


def down_fabric_ports(cluster: Cluster) -> list[str]:
    """Every fabric port that is down, in the link-up check's words (launch-cluster.sh
    refuses to start unless 2 or 4 of a node's RoCE devices are Up)."""
    reasons = []
    for node in cluster.nodes:
        facts = node_link_facts(cluster, node)
        for ifname in fabric_ifs(cluster):
            usable, reason = link_is_usable(port_of(facts, ifname), node.name)
            if not usable:
                reasons.append(reason)
    return reasons


def container_env(node: Node, container: str) -> dict[str, str] | None:
    """The NCCL-related environment of the node's serving container, or None if absent."""
    fmt = "{{range .Config.Env}}{{println .}}{{end}}"
    result = node.run(f"docker inspect -f {shlex.quote(fmt)} {shlex.quote(container)}", timeout=20)
    if not result.ok:
        return None
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return {k: v for k, v in env.items() if k in NCCL_ENV and k != "NCCL_DEBUG"}


def fallback_env(cluster: Cluster, facts: NodeLinkFacts) -> dict[str, str]:
    """What launch-cluster.sh would set from the node's Up fabric twins."""
    ifs = fabric_ifs(cluster)
    devs = [m.dev for m in facts.roce if m.netdev in ifs]
    env = {"NCCL_IB_HCA": ",".join(devs)} if devs else {}
    if ifs:
        env["NCCL_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"] = ifs[-1]
    return env


def master_address(cluster: Cluster, env: dict[str, str]) -> str | None:
    """The head's address on the interface its rank bootstraps over."""
    facts = node_link_facts(cluster, cluster.head)
    ifname = env.get("GLOO_SOCKET_IFNAME") or env.get("NCCL_SOCKET_IFNAME", "")
    addrs = facts.ip_addrs.get(ifname.split(",")[0].lstrip("^="), [])
    return str(addrs[0].ip) if addrs else None


def rank_envs(cluster: Cluster) -> dict[str, dict[str, str]] | str:
    """Each rank's NCCL environment: its serving container's, else what the launcher
    would set (once per session); a string says why it cannot be known."""

    def compute() -> dict[str, dict[str, str]] | str:
        rank_env: dict[str, dict[str, str]] = {}
        envs = cluster.map(lambda node: container_env(node, cluster.container(node)))  # at once
        for node in cluster.nodes:
            if cluster.unreachable(node) is not None:
                return f"node unreachable: {cluster.unreachable(node)}"
            env = envs[node.name]
            if isinstance(env, RemoteError):
                return str(env)
            rank_env[node.name] = (
                env if env is not None else fallback_env(cluster, node_link_facts(cluster, node))
            )
        return rank_env

    return cluster.cached("rank-envs", compute)


def collective_run(
    cluster: Cluster,
    progress: Callable[[str], None] | None = None,
    nodes: Sequence[Node] | None = None,
) -> CollectiveRun | str:
    """Run (once per session) the sweep; a string says why it could not run. ``progress``
    gets a live line while the ranks run. ``nodes``: the ranks' nodes (default: every
    node; a node the launcher trimmed has no serving container, by design)."""
    ranks = list(nodes) if nodes else list(cluster.nodes)

    def compute() -> CollectiveRun | str:
        profile = cluster.profile
        rank_env = rank_envs(cluster)
        if isinstance(rank_env, str):
            return rank_env
        master = master_address(cluster, rank_env[cluster.head.name])
        if master is None:
            return (
                f"{cluster.head.name}: no IPv4 address on the bootstrap interface "
                f"{rank_env[cluster.head.name]}: the fabric is down or unaddressed "
                "(see the link checks)"
            )
        sizes = sweep_sizes(
            profile.nccl.min_bytes,
            profile.nccl.max_bytes,
            mem_available(cluster, ranks),
            profile.nccl.max_mem_share,
        )
        try:
            run = run_allreduce(
                ranks,
                master_addr=master,
                rank_env=rank_env,
                container={node.name: cluster.container(node) for node in ranks},
                min_bytes=sizes.min_bytes,
                max_bytes=sizes.max_bytes,
                iters=profile.nccl.iters,
                warmup=profile.nccl.warmup,
                timeout=profile.nccl.timeout_s,
                collectives=COLLECTIVES,
                latency_max_bytes=profile.collectives.latency_max_bytes,
                progress=_progress_line(progress, len(ranks), profile.nccl.timeout_s, sizes.capped),
            )
        except CollectiveUnavailable as exc:
            return str(exc)
        return dataclasses.replace(run, capped=sizes.capped) if sizes.capped else run

    return cluster.cached("collective-run", compute)


def fabric_devs(cluster: Cluster, node: Node) -> list[str]:
    """The RDMA devices of the node's fabric twins, as its link probe found them."""
    ifs = fabric_ifs(cluster)
    return [m.dev for m in node_link_facts(cluster, node).roce if m.netdev in ifs]


def gid_tables(cluster: Cluster, node: Node) -> dict[str, GidTable] | str | None:
    """The node's RoCE GID tables from sysfs (once per session): None when it has no
    /sys/class/infiniband; a string says why they could not be read."""

    def compute() -> dict[str, GidTable] | str | None:
        problem = cluster.unreachable(node)
        if problem is not None:
            return f"node unreachable: {problem}"
        try:
            result = node.run(GID_PROBE, timeout=20)
        except RemoteError as exc:
            return str(exc)
        if not result.ok:
            return f"{node.name}: the sysfs GID probe exited {result.rc}: {result.stderr[:300]}"
        try:
            return parse_gid_probe(result.stdout)
        except ParseError as exc:
            return f"{node.name}: {exc}"

    return cluster.cached(("gid-tables", node.name), compute)


def nodes_without_rdma(cluster: Cluster) -> list[str]:
    """The reachable nodes with no /sys/class/infiniband (no RDMA drivers), in the
    cluster's order."""
    reachable = [node for node in cluster.nodes if cluster.unreachable(node) is None]
    return [node.name for node in reachable if gid_tables(cluster, node) is None]


def mem_available(cluster: Cluster, nodes: Sequence[Node]) -> dict[str, int | None]:
    """Each rank node's MemAvailable in bytes (the memory probe, shared round trip,
    cached); None where it cannot be read (an unreachable node is the reachability
    check's)."""
    available: dict[str, int | None] = {}
    for node in nodes:
        try:
            meminfo = (
                node_memory(cluster, node).meminfo if cluster.unreachable(node) is None else None
            )
        except RemoteError:
            meminfo = None
        available[node.name] = meminfo.available if meminfo is not None else None
    return available


def _progress_line(
    write: Callable[[str], None] | None, ranks: int, timeout_s: float, capped: str | None = None
) -> Callable[[SweepProgress], None] | None:
    """The live line of the sweep (:func:`progress_text`), written as the ranks report; the
    last one says when the memory guard capped the sweep (``capped``)."""
    if write is None:
        return None

    def line(progress: SweepProgress) -> None:
        text = progress_text(progress, ranks, timeout_s)
        write(f"{text}; {capped}" if capped and progress.finished else text)

    return line


def progress_text(progress: SweepProgress, ranks: int, timeout_s: float) -> str:
    """``nccl all_reduce 4 MiB of 8 MiB: busbw 0.117 GB/s so far; 3/30 sizes 10%, 12/120 s``:
    the sweep running, the message size it has reached out of its largest, that size's
    busbw (the latency sweep: its time a call), the sizes done out of every sweep's; before
    the first row the ranks are starting (rendezvous, warm-up); the last line says
    `` 100% `` (the writer ends the line there), with the all-reduce's largest size."""
    names = ", ".join(s.name for s in progress.sweeps)
    done, total = progress.done, progress.total
    sizes = f"{done}/{total} sizes"
    if progress.finished:
        line = f"nccl {names}: {ranks} ranks done 100% in {progress.elapsed_s:.0f} s, {sizes}"
        main = progress.sweeps[0] if progress.sweeps else None
        if main is None or not main.rows:
            return line
        row = main.rows[-1]
        return f"{line}; {main.name} busbw {_gb(row.busbw_gbps)} GB/s at {_size(row.size_bytes)}"
    pct = min(99, 100 * done // total) if total else 0
    clock = f"{progress.elapsed_s:.0f}/{timeout_s:.0f} s"
    current = progress.current
    if current is None:
        return f"nccl {names}: {ranks} ranks starting, {sizes} {pct}%, {clock}"
    row = current.rows[-1]
    if current.name == "latency":
        figure = f"{row.in_place.time_us:.0f} us a call"
    else:
        figure = f"busbw {_gb(row.busbw_gbps)} GB/s"
    largest = _size(current.sizes[-1]) if current.sizes else "?"
    return (
        f"nccl {current.name} {_size(row.size_bytes)} of {largest}: {figure} so far; "
        f"{sizes} {pct}%, {clock}"
    )
