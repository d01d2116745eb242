"""Preflight, the serving environment: NCCL/gloo/UCX variables naming the fabric, judged
against the cluster's fabric, this node's own cabling, the head's environment and the
recipe's ``env:``.

Pure functions over the rank's environment (its /proc environ) and the node's interfaces:
a :class:`Finding` whose failure message names the node, what was measured, what was
expected and the usual fix (STYLE.md).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from pytest_spark.infra.finding import Finding
from pytest_spark.infra.preflight.cabling_check import (
    MGMT_INIT,
    management_first,
    management_init_note,
    nccl_list,
    nccl_matches,
    node_own_fabric,
    port_of,
)

ENV_VERDICT = "test_serving_env_matches_fabric"
# The evidence key of a serving-env failure judged against the node's own cabling
# (:func:`node_own_fabric`): wrong whatever the links, so never a down link's consequence.
OWN_CABLING = "against this node's cabling"


def same_env_as(node: str, finding: Finding, owner: str, owner_finding: Finding) -> str | None:
    """The skip reason of a node whose serving environment is wrong exactly as ``owner``'s
    (the same values: one launch, one .env or set of -e flags, set both), so that the
    owner's check is the one failure; None when it is not so (this node reports its own)."""
    if finding.ok or owner_finding.ok or finding.measured != owner_finding.measured:
        return None
    return (
        f"{node}: its serving container's environment is {owner}'s, wrong the same way "
        f"(one launch sets it on every node, one fix): {owner_finding.message} "
        f"({ENV_VERDICT}[{owner}] has the evidence)"
    )


def same_env_note(finding: Finding, same_on: Sequence[str]) -> Finding:
    """The owner's failure, saying which other nodes have the same environment."""
    if finding.ok or not same_on:
        return finding
    note = f" The same environment on {', '.join(same_on)}: this one fix covers them."
    return replace(finding, message=finding.message + note)


FORCED_KEYS = ("NCCL_ALGO", "NCCL_PROTO")
# What one launch sets alike on every node (eugr's get_env_flags, its -e flags and .env):
# compared with the head's. VLLM_HOST_IP and RAY_*IP* name the node itself.
SHARED_PREFIXES = ("NCCL_", "GLOO_", "UCX_", "TP_")
RING_ALGO_MIN_NODES = 4


def forced_nccl_choices(env: Mapping[str, str], nodes: int) -> list[str]:
    """The problems of a forced NCCL algorithm or protocol (``NCCL_ALGO=Ring`` on 4+ nodes
    is eugr's closed-ring setting and allowed)."""
    out = []
    algo, proto = env.get("NCCL_ALGO", "").strip(), env.get("NCCL_PROTO", "").strip()
    if algo and not (algo.lower() == "ring" and nodes >= RING_ALGO_MIN_NODES):
        out.append(
            f"NCCL_ALGO={algo} forced (a debugging variable: NCCL's docs say not to keep it in "
            "production; unset it and let NCCL choose"
            + (
                f"; Ring is eugr's setting only on closed rings of {RING_ALGO_MIN_NODES}+ nodes"
                if algo.lower() == "ring"
                else ""
            )
            + ")"
        )
    if proto:
        out.append(f"NCCL_PROTO={proto} forced (a debugging variable: unset it)")
    return out


# eugr/spark-vllm-docker's mesh mode (3+ Sparks cabled to each other, no switch: every
# node's four RoCE devices in NCCL_IB_HCA, README "Mesh-mode NCCL variables", written to
# .env when it detects a mesh; spark-arena/sparkrun#174: "Need to be added to a .env to run
# on a ring topology"): without them NCCL merges the NICs and routes across subnets that
# the cables do not join (eugr#252: `ibv_modify_qp failed with 110` on a 3-node ring).
MESH_VARIABLES = (
    ("NCCL_NET_PLUGIN", "none"),
    ("NCCL_IB_SUBNET_AWARE_ROUTING", "1"),
    ("NCCL_IB_MERGE_NICS", "0"),
)
MESH_MIN_NODES = 3
MESH_HCAS = 4  # a mesh lists both twins of both QSFP ports


def mesh_variables(env: Mapping[str, str], nodes: int) -> list[str]:
    """On a mesh of 3+ nodes (NCCL_IB_HCA naming 4+ devices: every port of the node, as
    eugr's mesh mode sets it), the variables eugr writes for it, as it writes them."""
    hca = env.get("NCCL_IB_HCA", "")
    listed = [d for d in hca.lstrip("^=").split(",") if d.strip()]
    if nodes < MESH_MIN_NODES or len(listed) < MESH_HCAS or hca.startswith("^"):
        return []
    wrong = [
        f"{k}={env.get(k, '(unset)')}"
        for k, want in MESH_VARIABLES
        if env.get(k, "").strip() != want
    ]
    if not wrong:
        return []
    want = ", ".join(f"{k}={v}" for k, v in MESH_VARIABLES)
    return [
        f"a {nodes}-node mesh (NCCL_IB_HCA lists {len(listed)} devices) with {', '.join(wrong)}: "
        f"eugr's mesh mode sets {want} (README 'Mesh-mode NCCL variables')"
    ]


def env_differences(env: Mapping[str, str], owner: str, owner_env: Mapping[str, str]) -> list[str]:
    """The NCCL/GLOO/UCX/TP variables that differ from ``owner``'s environment."""
    keys = sorted(k for k in set(env) | set(owner_env) if k.startswith(SHARED_PREFIXES))
    diffs = [
        f"{k}={env.get(k, '(unset)')} ({owner}: {owner_env.get(k, '(unset)')})"
        for k in keys
        if env.get(k) != owner_env.get(k)
    ]
    return [f"differs from {owner}'s ranks: {', '.join(diffs)}"] if diffs else []


def recipe_env_differences(
    env: Mapping[str, str], origin: str, wanted: Mapping[str, str]
) -> list[str]:
    """The recipe's ``env:`` entries the serving environment does not hold as written."""
    diffs = [
        f"{k}={env.get(k, '(unset)')} ({origin} sets {k}={v})"
        for k, v in sorted(wanted.items())
        if env.get(k) != v
    ]
    return [f"not as the recipe sets it: {', '.join(diffs)}"] if diffs else []


def check_serving_env(
    node: str,
    container: str,
    env: Mapping[str, str] | None,
    fabric_ifs: Sequence[str],
    fabric_devs: Sequence[str],
    node_ifs: Mapping[str, bool],
    *,
    source: str | None = None,
    nodes: int = 2,
    reference: tuple[str, Mapping[str, str]] | None = None,
    recipe_env: tuple[str, Mapping[str, str]] | None = None,
    ports: Sequence[tuple[str, str, bool]] = (),
    wireless: Collection[str] = (),
) -> Finding:
    """NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA and UCX_NET_DEVICES in the
    serving environment name the fabric interfaces (``fabric_ifs``) and RDMA devices
    (``fabric_devs``, both twins in NCCL_IB_HCA); NCCL_IB_DISABLE is not 1; no forced
    NCCL_ALGO / NCCL_PROTO (NCCL's docs list them as debugging variables that "should not
    be used in production"; eugr's launcher sets ``NCCL_ALGO=Ring`` on closed rings of 4+
    nodes, so Ring is let through at ``nodes`` >= 4); and, given ``reference`` (the head's
    name and environment, when the head's own is right), the NCCL/GLOO/UCX/TP variables
    equal to the head's (one launch sets them all; VLLM_HOST_IP and Ray's node addresses
    differ by design and are not compared); and, given ``recipe_env`` (a sparkrun recipe's
    origin and its fixed ``env:`` entries, settings.recipe), each of them as the recipe sets
    it (sparkrun passes them to every rank). ``source``: where ``env`` was read (the rank
    process's /proc environ), for the message. ``node_ifs`` maps each netdev of the node
    to whether it carries an IPv4 address. ``ports``: the node's own ``ibdev2netdev``
    (device, netdev, Up), to judge the env against this node's cabling
    (:func:`node_own_fabric`); a port with no Up twin here is then not asked for in
    NCCL_IB_HCA (another node is cabled on it). ``wireless``: the node's wireless netdevs
    (sysfs / ``iw dev``): one named in a socket variable fails (sparkrun PR #219: serving
    died when the WiFi dropped); a wired non-fabric one in sparkrun's management-first
    layout (:func:`management_first`) passes with a note (evidence ``MGMT_INIT``)."""
    if env is None:
        return Finding.failed(
            "no container",
            f"container {container}",
            node=node,
            message=(
                f"{node}: serving container {container} not found (docker inspect); expected "
                "it running on every node. Check `docker ps -a` there and the launcher log"
            ),
        )
    fabric = set(fabric_ifs)
    devs = _devs_on_up_ports(set(fabric_devs), ports)
    verdict = serving_env_verdict(
        node,
        env,
        fabric,
        devs,
        node_ifs,
        nodes=nodes,
        reference=reference,
        recipe_env=recipe_env,
        ports=ports,
        wireless=wireless,
    )
    if verdict.problems:
        return _env_failure(node, source or f"container {container}", fabric, devs, verdict)
    up_fabric = [n for _, n, ok in ports if ok and n in fabric] or sorted(fabric)
    note = management_init_note(node, env, node_ifs, fabric, wireless, up_fabric)
    sock, hca = env.get("NCCL_SOCKET_IFNAME"), env.get("NCCL_IB_HCA")
    passed = Finding.passed(
        verdict.measured,
        verdict.expected,
        node=node,
        message=f"{node}: {container} uses {sock} (NCCL/gloo) and {hca} (NCCL_IB_HCA)",
    )
    return replace(passed, evidence={MGMT_INIT: note}) if note else passed


# The variables the serving-env check reads, in its measured order (then the forced NCCL
# choices and the recipe's variables that are set).
ENV_KEYS = (
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "UCX_NET_DEVICES",
    "NCCL_IB_DISABLE",
)


@dataclass(frozen=True)
class EnvVerdict:
    """The verdict of :func:`check_serving_env` on one node's environment: every problem
    in the message's order, those of them from the recipe's ``env:`` and from this node's
    own cabling (with its fix), and what was measured and expected."""

    problems: list[str]
    recipe_problems: list[str]
    own_problems: list[str]
    own_fix: str
    measured: dict[str, object]
    expected: dict[str, object]


def _devs_on_up_ports(devs: set[str], ports: Sequence[tuple[str, str, bool]]) -> set[str]:
    """The fabric's RDMA devices less those on a port with no Up twin on this node (given
    its ``ibdev2netdev``): another node is cabled there."""
    if not any(up for _, _, up in ports):
        return devs
    up_ports = {port_of(n) for _, n, up in ports if up}
    netdev_of = {d: n for d, n, _ in ports}
    return {d for d in devs if d not in netdev_of or port_of(netdev_of[d]) in up_ports}


def serving_env_verdict(
    node: str,
    env: Mapping[str, str],
    fabric: set[str],
    devs: set[str],
    node_ifs: Mapping[str, bool],
    *,
    nodes: int,
    reference: tuple[str, Mapping[str, str]] | None,
    recipe_env: tuple[str, Mapping[str, str]] | None,
    ports: Sequence[tuple[str, str, bool]],
    wireless: Collection[str],
) -> EnvVerdict:
    """The problems of ``env`` against the fabric (``fabric`` interfaces, ``devs``), NCCL's
    debugging variables, a mesh's variables, the head's environment (``reference``), the
    recipe's ``env:`` and this node's own cabling; see :func:`check_serving_env`."""
    problems = _socket_problems(env, fabric, node_ifs, wireless)
    problems += _rdma_problems(env, fabric, devs)
    problems += forced_nccl_choices(env, nodes)
    problems += mesh_variables(env, nodes)
    if reference is not None:
        problems += env_differences(env, *reference)
    recipe_problems = recipe_env_differences(env, *recipe_env) if recipe_env else []
    problems += recipe_problems
    own_problems, own_fix = node_own_fabric(node, env, ports, sorted(node_ifs), wireless)
    problems += own_problems
    measured: dict[str, object] = {k: env.get(k) for k in ENV_KEYS}
    for key in FORCED_KEYS:
        if env.get(key):
            measured[key] = env[key]
    expected: dict[str, object] = {"interfaces": sorted(fabric), "NCCL_IB_HCA": sorted(devs)}
    if recipe_env and recipe_env[1]:
        measured.update({k: env.get(k) for k in recipe_env[1]})
        expected["recipe env"] = dict(recipe_env[1])
    return EnvVerdict(problems, recipe_problems, own_problems, own_fix, measured, expected)


def _socket_problems(
    env: Mapping[str, str],
    fabric: set[str],
    node_ifs: Mapping[str, bool],
    wireless: Collection[str],
) -> list[str]:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME: set, and naming the fabric (a wired
    non-fabric interface too in sparkrun's management-first layout; never a wireless one)."""
    problems = []
    mgmt_first = management_first(env)
    sock = env.get("NCCL_SOCKET_IFNAME")
    if not sock:
        problems.append(
            "NCCL_SOCKET_IFNAME unset (NCCL picks any interface, often the management one)"
        )
    else:
        _, exclude, exact, items = nccl_list(sock)
        chosen = [n for n in node_ifs if nccl_matches(n, items, exact) != exclude]
        wrong = [
            n
            for n in chosen
            if n not in fabric and node_ifs.get(n) and (n in wireless or not mgmt_first)
        ]
        if exclude or not any(n in fabric for n in chosen) or wrong:
            problems.append(
                f"NCCL_SOCKET_IFNAME={sock} selects {', '.join(chosen) or 'no interface'}"
            )
    gloo = env.get("GLOO_SOCKET_IFNAME")
    if not gloo:
        problems.append("GLOO_SOCKET_IFNAME unset (gloo binds the hostname's interface)")
    elif not all(
        i in fabric or (mgmt_first and i in node_ifs and i not in wireless)
        for i in (j.strip() for j in gloo.split(","))
        if i
    ):
        problems.append(f"GLOO_SOCKET_IFNAME={gloo}")
    return problems


def _rdma_problems(env: Mapping[str, str], fabric: set[str], devs: set[str]) -> list[str]:
    """NCCL_IB_HCA set and naming both twins, UCX_NET_DEVICES (when set) naming the fabric,
    NCCL_IB_DISABLE not 1."""
    problems = []
    hca = env.get("NCCL_IB_HCA")
    if not hca:
        problems.append("NCCL_IB_HCA unset")
    else:
        _, exclude, exact, items = nccl_list(hca)
        left_out = sorted(d for d in devs if nccl_matches(d, items, exact) == exclude)
        if left_out:
            problems.append(f"NCCL_IB_HCA={hca} leaves out {', '.join(left_out)}")
    ucx = env.get("UCX_NET_DEVICES")
    if ucx:
        names = [i.split(":", 1)[0].strip() for i in ucx.split(",") if i.strip()]
        if not names or any(n not in fabric and n not in devs for n in names):
            problems.append(f"UCX_NET_DEVICES={ucx}")
    if env.get("NCCL_IB_DISABLE", "0").strip() not in ("0", ""):
        problems.append(
            f"NCCL_IB_DISABLE={env['NCCL_IB_DISABLE']} (RDMA off: NCCL falls back "
            "to TCP sockets, ~3 GB/s)"
        )
    return problems


def _env_failure(
    node: str, where: str, fabric: set[str], devs: set[str], verdict: EnvVerdict
) -> Finding:
    """The serving env's failure: every problem, the fabric expected, and the fixes (the
    recipe's when its variables differ, this node's own when its cabling does)."""
    own = verdict.own_problems
    return Finding.failed(
        verdict.measured,
        verdict.expected,
        node=node,
        evidence={OWN_CABLING: "; ".join(own)} if own else None,
        message=(
            f"{node}: {where} environment does not match the fabric: "
            f"{'; '.join(verdict.problems)}; expected the fabric interfaces "
            f"{', '.join(sorted(fabric))} and both twins {','.join(sorted(devs))} in "
            "NCCL_IB_HCA. Fix the launcher's .env / -e flags (CONTAINER_NCCL_* "
            "variables, --eth-if/--ib-if) or let it auto-detect, then relaunch"
            + (
                "; for the recipe's variables, the job was not started with this recipe "
                "or its env was changed: sparkrun run the recipe again"
                if verdict.recipe_problems
                else ""
            )
            + verdict.own_fix
        ),
    )
