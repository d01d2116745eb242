"""Preflight: is every node fit to serve before the model load (REFERENCE.md §1-3)?

Per node: Docker and the serving image, nothing else holding the GPU, the GPU visible,
disk room, link flaps per fabric twin, the serving environment naming the fabric. Per
cluster: the model directory identical everywhere, clocks in step, passwordless SSH from
the head to the workers. Facts come from one probe round trip per node (cached).
"""

from __future__ import annotations

import warnings

import pytest

from pytest_spark import (
    Cluster,
    Finding,
    HostKeyError,
    Node,
    RemoteError,
    SparkCheck,
    progress_line_writer,
    require_once_across_nodes,
    require_unless_twin_down,
    verdict_in_session,
)
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.gpuhealth.check import gpu_lost_in_kernel_log
from pytest_spark.infra.gpuhealth.gather import node_gpu_health
from pytest_spark.infra.kernellog import KERNEL_VERDICT
from pytest_spark.infra.links.gather import unusable_fabric_links
from pytest_spark.infra.loaded.gather import rank_env
from pytest_spark.infra.modelfiles import ModelListing
from pytest_spark.infra.modelhash.gather import full_hash_listings
from pytest_spark.infra.preflight.cabling_check import MGMT_INIT, ManagementInitNote
from pytest_spark.infra.preflight.docker_check import check_docker, check_gpu_holders
from pytest_spark.infra.preflight.env_check import (
    ENV_VERDICT,
    OWN_CABLING,
    check_serving_env,
    same_env_as,
    same_env_note,
)
from pytest_spark.infra.preflight.gather import (
    address_owners,
    all_preflight,
    clock_samples,
    fabric_of,
    roce_ports,
    serving_env,
    ssh_from_head,
    wireless_ifs,
)
from pytest_spark.infra.preflight.host_check import (
    check_clock_skew,
    check_gpu_visible,
    check_link_flaps,
    check_passwordless_ssh,
    check_reachable,
)
from pytest_spark.infra.preflight.model_check import check_disk, check_model_identical
from pytest_spark.infra.preflight.probe import ClockSample, NodePreflight, model_dir
from pytest_spark.launchers.base import NotServing
from pytest_spark.launchers.launch_cluster.driver import fabric_addresses
from pytest_spark.readiness.ranks import ServingInfo, idle_by_design
from pytest_spark.readiness.reachability import (
    require_reachable,
    through_unreachable_jump,
    unreachable,
)

pytestmark = pytest.mark.preflight


def require(spark_check: SparkCheck, result: Finding | Skip) -> None:
    if isinstance(result, Skip):
        pytest.skip(result.reason)
    spark_check.require(result)


def _facts(cluster: Cluster, node: Node) -> NodePreflight:
    facts = all_preflight(cluster)[node.name]
    if isinstance(facts, RemoteError):
        pytest.fail(f"node unreachable: {facts}", pytrace=False)
    return facts


@pytest.fixture
def preflight(spark_cluster: Cluster, spark_node: Node) -> NodePreflight:
    """This node's facts; the first use probes every node at once."""
    return _facts(spark_cluster, spark_node)


# The per-node checks below fail once for a cause several nodes share (the same value,
# expected and fix: Docker stopped on both, the same image missing): on the first node,
# naming the others, which skip citing it (verdict.require_once_across_nodes).


def test_docker_ready(
    request: pytest.FixtureRequest,
    spark_node: Node,
    preflight: NodePreflight,
    spark_cluster: Cluster,
    spark_check: SparkCheck,
) -> None:
    def judge(node: Node) -> Finding | Skip:
        container = spark_cluster.container(node)
        return check_docker(node.name, _facts(spark_cluster, node).docker, container)

    require_once_across_nodes(request, spark_check, spark_cluster, spark_node, judge)


def test_gpu_not_held_by_others(
    request: pytest.FixtureRequest,
    spark_node: Node,
    preflight: NodePreflight,
    spark_cluster: Cluster,
    spark_check: SparkCheck,
) -> None:
    def judge(node: Node) -> Finding | Skip:
        facts = _facts(spark_cluster, node)
        container = spark_cluster.container(node)
        return check_gpu_holders(node.name, facts.docker, facts.gpu, container, facts.now)

    require_once_across_nodes(request, spark_check, spark_cluster, spark_node, judge)


def test_gpu_visible(
    request: pytest.FixtureRequest,
    spark_node: Node,
    preflight: NodePreflight,
    spark_cluster: Cluster,
    spark_check: SparkCheck,
) -> None:
    if preflight.gpu.driver_version:
        spark_check.attach("driver_version", preflight.gpu.driver_version)

    def judge(node: Node) -> Finding | Skip:
        facts = _facts(spark_cluster, node)
        finding = check_gpu_visible(
            node.name, facts.gpu, spark_cluster.profile.preflight.gpus_per_node
        )
        owner = f"{KERNEL_VERDICT}[{node.name}]"  # tests_infra/test_gpuhealth.py
        if not finding.ok and verdict_in_session(request.session, owner):
            lost = gpu_lost_in_kernel_log(node_gpu_health(spark_cluster, node).kernel)
            if lost is not None:
                return Skip(
                    f"{node.name}: no GPU because it fell off the bus ({owner} has the "
                    f"evidence: {lost.line})"
                )
        return finding

    require_once_across_nodes(request, spark_check, spark_cluster, spark_node, judge)


def test_disk_space(
    request: pytest.FixtureRequest,
    spark_node: Node,
    preflight: NodePreflight,
    spark_cluster: Cluster,
    spark_check: SparkCheck,
) -> None:
    where = model_dir(spark_cluster.settings)
    sizes = [
        f.model.total_bytes
        for f in all_preflight(spark_cluster).values()
        if isinstance(f, NodePreflight) and f.model and f.model.exists and f.model.files
    ]
    needed = max(sizes) if sizes else None
    max_pct = spark_cluster.profile.preflight.max_disk_used_pct

    def judge(node: Node) -> Finding | Skip:
        facts = _facts(spark_cluster, node)
        mine = facts.model
        have = mine.total_bytes if mine and mine.exists else 0
        return check_disk(
            node.name, facts.disk, max_pct, where.path, needed, have, facts.disk_error
        )

    require_once_across_nodes(request, spark_check, spark_cluster, spark_node, judge)


@pytest.mark.spark_reachability_verdict
def test_node_reachable(
    spark_node_unchecked: Node, spark_cluster: Cluster, spark_check: SparkCheck
) -> None:
    """The node answers over SSH. An unreachable node is this one failure; every check
    that needs the node is skipped citing it."""
    node = spark_node_unchecked
    error = spark_cluster.unreachable(node)
    if error is not None:
        others = [n.name for n in unreachable(spark_cluster) if n is not node]
        cause = through_unreachable_jump(node.name, error, others)
        if cause is not None:
            pytest.skip(cause)
    spark_check.require(
        check_reachable(
            node.name,
            node.conn.target.describe(),
            None if error is None else str(error),
            host_key=isinstance(error, HostKeyError),
        )
    )


def test_model_dir_identical(
    pytestconfig: pytest.Config, spark_cluster: Cluster, spark_check: SparkCheck
) -> None:
    require_reachable(pytestconfig, spark_cluster)
    where = model_dir(spark_cluster.settings)
    if where.path is None:
        pytest.skip(where.reason or "model directory not known")
    listings: dict[str, ModelListing | None] = {}
    for name, facts in all_preflight(spark_cluster).items():
        if isinstance(facts, RemoteError):
            pytest.fail(f"node unreachable: {facts}", pytrace=False)
        listings[name] = facts.model
    if where.must_exist_somewhere and not any(m and m.exists for m in listings.values()):
        pytest.skip(
            f"{where.source} {where.path} does not exist on any node (a path inside "
            "the container?): set --spark-model-dir to the host directory"
        )
    if spark_cluster.settings.model_hash == "full":  # every byte of every shard, with progress
        listings = full_hash_listings(
            spark_cluster, where.path, listings, progress_line_writer(pytestconfig)
        )
    spark_check.require(check_model_identical(where.path, listings, where.source or ""))


def test_clock_skew(
    pytestconfig: pytest.Config, spark_cluster: Cluster, spark_check: SparkCheck
) -> None:
    require_reachable(pytestconfig, spark_cluster)
    samples = []
    for name, sample in clock_samples(spark_cluster).items():
        if isinstance(sample, RemoteError):
            pytest.fail(f"node unreachable: {sample}", pytrace=False)
        assert isinstance(sample, ClockSample), name
        samples.append(sample)
    spark_check.require(check_clock_skew(samples, spark_cluster.profile.preflight.max_clock_skew_s))


def test_passwordless_ssh_head_to_workers(
    pytestconfig: pytest.Config, spark_cluster: Cluster, spark_head: Node, spark_check: SparkCheck
) -> None:
    """``ssh -o BatchMode=yes -o ConnectTimeout=5 ADDR true`` on the head, to every worker
    address the launcher gets (--spark-launch-nodes, else each node's fabric address). A
    worker the suite cannot reach either is the reachability check's, not this one's."""
    require_reachable(pytestconfig, spark_cluster)
    if not spark_cluster.workers:
        pytest.skip("no workers")
    try:
        addresses = list(spark_cluster.settings.launch_nodes or fabric_addresses(spark_cluster))
    except (NotServing, RemoteError) as exc:
        pytest.skip(f"worker addresses for the launcher not known: {exc}")
    owners = address_owners(spark_cluster)
    workers = [a for a in addresses if owners.get(a) != spark_head.name]
    names = {a: owners[a] for a in workers if a in owners}
    spark_check.require(
        check_passwordless_ssh(spark_head.name, ssh_from_head(spark_cluster, workers), names)
    )


def test_link_flaps(
    spark_node: Node,
    preflight: NodePreflight,
    fabric_if: str,
    spark_cluster: Cluster,
    spark_check: SparkCheck,
) -> None:
    """Carrier losses per 24 h on each fabric twin (journald, else sysfs counters)."""
    spark_check.require(
        check_link_flaps(
            spark_node.name,
            fabric_if,
            preflight.carriers.get(fabric_if),
            preflight.uptime_s,
            preflight.journal,
            spark_cluster.profile.preflight.max_link_flaps_24h,
        )
    )


def _effective_env(cluster: Cluster, node: Node) -> tuple[dict[str, str] | None, str | None]:
    """The rank process's own environment (/proc/PID/environ: what NCCL reads, with the
    launch's -e flags, .env and anything exported before exec) and where it was read;
    the container's configured one (docker inspect) when no rank process can be read."""
    found = rank_env(cluster, node)
    if found is not None:
        env, pid = found
        return (
            env,
            f"container {cluster.container(node)} rank process {pid} (/proc/{pid}/environ)",
        )
    return serving_env(cluster, node), None


def _env_finding(cluster: Cluster, node: Node, head_env: dict[str, str] | None = None) -> Finding:
    ifs, devs, node_ifs = fabric_of(cluster, node)
    env, source = _effective_env(cluster, node)
    head = cluster.head.name
    recipe = cluster.settings.recipe  # --spark-recipe or the running sparkrun job's
    return check_serving_env(
        node.name,
        cluster.container(node),
        env,
        ifs,
        devs,
        node_ifs,
        source=source,
        nodes=len(cluster.nodes),
        reference=(head, head_env) if head_env is not None and node.name != head else None,
        recipe_env=(recipe.origin, recipe.fixed_env()) if recipe is not None else None,
        ports=roce_ports(cluster, node),
        wireless=wireless_ifs(cluster, node),
    )


def _head_env_if_right(cluster: Cluster, node: Node) -> dict[str, str] | None:
    """The head's rank environment when its own check passes (the reference a worker's
    must equal); None otherwise (the head reports its own)."""
    head = cluster.head
    if node.name == head.name or cluster.unreachable(head) is not None:
        return None
    try:
        if not _env_finding(cluster, head).ok:
            return None
        return _effective_env(cluster, head)[0]
    except (RemoteError, pytest.fail.Exception):
        return None


def _env_finding_or_none(cluster: Cluster, node: Node) -> Finding | None:
    """Another node's finding, or None when its environment cannot be read (it reports that)."""
    if cluster.unreachable(node) is not None:
        return None
    try:
        return _env_finding(cluster, node)
    except (RemoteError, pytest.fail.Exception):
        return None


def test_serving_env_matches_fabric(
    request: pytest.FixtureRequest,
    spark_serving: ServingInfo,
    spark_cluster: Cluster,
    spark_node: Node,
    spark_check: SparkCheck,
) -> None:
    """Needs the serving containers (launched with --spark-launch, else attached to). One
    launch sets every node's environment: a worker whose environment is wrong exactly as
    the head's skips citing the head's check, which names every node it covers. A node
    the launcher trimmed (TP x PP x DP needs fewer) has no container, by design."""
    idle = idle_by_design(spark_cluster, spark_cluster.settings, spark_serving, spark_node.name)
    if idle is not None:
        pytest.skip(idle)
    finding = _env_finding(spark_cluster, spark_node, _head_env_if_right(spark_cluster, spark_node))
    head = spark_cluster.head
    if not finding.ok and not unusable_fabric_links(spark_cluster):
        if spark_node.name != head.name:
            owner = _env_finding_or_none(spark_cluster, head)
            verdict = f"{ENV_VERDICT}[{head.name}]"
            if owner is not None and verdict_in_session(request.session, verdict):
                cited = same_env_as(spark_node.name, finding, head.name, owner)
                if cited is not None:
                    pytest.skip(cited)
        else:
            others = [
                (n.name, _env_finding_or_none(spark_cluster, n)) for n in spark_cluster.workers
            ]
            same = [
                name
                for name, f in others
                if f is not None and same_env_as(name, f, head.name, finding)
            ]
            finding = same_env_note(finding, same)
    if finding.ok and finding.evidence.get(MGMT_INIT):
        # sparkrun's init over the wired management link: passes, and says so
        warnings.warn(ManagementInitNote(finding.evidence[MGMT_INIT]), stacklevel=1)
    if finding.evidence.get(OWN_CABLING):
        # names a port this node has no Up twin of while another is Up here (sparkrun#135),
        # or a wireless / non-fabric interface (PR #219): wrong whatever the links say
        spark_check.require(finding)
    require_unless_twin_down(spark_cluster, finding, spark_check)
