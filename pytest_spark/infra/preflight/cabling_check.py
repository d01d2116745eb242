"""Preflight, the serving environment against this node's own cabling: the NCCL/gloo
variables judged against the node's ``ibdev2netdev`` (the head's values pushed to a worker
cabled on another port, sparkrun#135), and the socket variables naming a non-fabric link
(wireless: a problem; wired, in sparkrun's management-first layout: a note).

Pure functions over the rank's environment and the node's ports; used by the serving-env
check (:mod:`pytest_spark.infra.preflight.env_check`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from pytest_spark.infra.finding import CheckNote


def nccl_list(value: str) -> tuple[str, bool, bool, list[str]]:
    """NCCL's interface/HCA list syntax: ``^`` excludes, ``=`` matches exactly, else
    prefixes; items are comma-separated, HCA items may carry ``:port``."""
    v = value.strip()
    exclude = v.startswith("^")
    v = v.lstrip("^")
    exact = v.startswith("=")
    v = v.lstrip("=")
    return value, exclude, exact, [i.strip() for i in v.split(",") if i.strip()]


def nccl_matches(name: str, items: list[str], exact: bool) -> bool:
    bases = [i.split(":", 1)[0] for i in items]
    return any(name == b if exact else name.startswith(b) for b in bases)


# A netdev's physical port: its twins differ only by the PCI-domain prefix (``enP2p1s0f1np1``
# and ``enp1s0f1np1``; ``roceP2p1s0f1`` and ``rocep1s0f1``).
_DOMAIN = re.compile(r"^(en|roce)P\d+p")


def port_of(name: str) -> str:
    return _DOMAIN.sub(lambda m: f"{m[1]}p", name)


def node_own_fabric(
    node: str,
    env: Mapping[str, str],
    ports: Sequence[tuple[str, str, bool]],
    netdevs: Sequence[str] = (),
    wireless: Collection[str] = (),
) -> tuple[list[str], str]:
    """The serving environment judged against this node's own ``ibdev2netdev`` (``ports``:
    (RDMA device, netdev, Up)), not the head's nor the cluster's: (problems, the fix).

    - A device in NCCL_IB_HCA, or an interface in NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME,
      on a port with no Up twin on this node (or no such device here): the head's values
      pushed to a worker cabled on the other QSFP port (sparkrun#135: sparkrun sets every
      rank's env from the head's detection). One Down twin of a port that is Up is the
      link checks' finding, not this.
    - A socket interface of the node (``netdevs``) with no RDMA device that is wireless
      (``wireless``: sysfs or ``iw dev``): NCCL's bootstrap and gloo run over the WiFi, and
      serving dies when it drops (sparkrun PR #219). A wired one (the management link) is
      a problem only outside sparkrun's management-first layout (:func:`management_first`:
      sparkrun inits over the management link by design, data over RDMA; eugr's
      launch-cluster.sh sets every socket variable to the fabric, its ETH_IF)."""
    up = [(d, n) for d, n, ok in ports if ok]
    if not up:
        return [], ""
    problems, fixes = _hca_off_ports(node, env, ports)
    socket_problems, socket_fixes, mgmt = _sockets_off_ports(node, env, ports, netdevs)
    problems += socket_problems
    fixes += socket_fixes
    if fixes:
        here = ", ".join(f"{d} ==> {n}" for d, n in up)
        problems.append(f"Up on {node} (ibdev2netdev): {here}")
    mgmt_problems, mgmt_fixes = _management_links(node, env, mgmt, wireless, up)
    problems += mgmt_problems
    fix = ""
    if fixes:
        fix += (
            f"; on {node} set its own {' '.join(dict.fromkeys(fixes))} (sparkrun passes the "
            "head's values to every rank, sparkrun#135: give this host its own, or cable "
            "every node on the same port)"
        )
    if mgmt_fixes:
        fix += (
            f"; set {' '.join(dict.fromkeys(mgmt_fixes))} on every rank: the fabric "
            "interface, not the default route"
        )
    return problems, fix


def _hca_off_ports(
    node: str, env: Mapping[str, str], ports: Sequence[tuple[str, str, bool]]
) -> tuple[list[str], list[str]]:
    """(problems, fixes) of NCCL_IB_HCA naming a device whose port has no Up twin here, or
    no such device on this node."""
    hca = env.get("NCCL_IB_HCA", "")
    if not hca or hca.strip().startswith("^"):
        return [], []
    up = [d for d, _, ok in ports if ok]
    up_ports = {port_of(n) for _, n, ok in ports if ok}
    _, _, _, items = nccl_list(hca)
    named = [i.split(":", 1)[0] for i in items]
    known = {d: n for d, n, _ in ports}
    off = [d for d in named if d in known and port_of(known[d]) not in up_ports]
    missing = [d for d in named if not any(k.startswith(d) for k in known)]
    if not (off or missing):
        return [], []
    names = [f"{d} (port not Up on {node})" for d in off]
    names += [f"{d} (no such device on {node})" for d in missing]
    return [f"NCCL_IB_HCA={hca} names {', '.join(names)}"], [f"NCCL_IB_HCA={','.join(up)}"]


def _sockets_off_ports(
    node: str,
    env: Mapping[str, str],
    ports: Sequence[tuple[str, str, bool]],
    netdevs: Sequence[str],
) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """(problems, fixes, non-RDMA netdev -> the socket variables naming it) of
    NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME: a fabric interface whose port has no Up twin
    here is a problem; a netdev of the node without an RDMA device is returned for
    :func:`_management_links` to judge."""
    first_up = next(n for _, n, ok in ports if ok)
    up_ports = {port_of(n) for _, n, ok in ports if ok}
    rdma_netdevs = {n for _, n, _ in ports}
    problems: list[str] = []
    fixes: list[str] = []
    mgmt: dict[str, list[str]] = {}
    for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        value = env.get(key, "")
        if not value or value.strip().startswith("^"):
            continue
        _, _, _, items = nccl_list(value)
        names = [i.split(":", 1)[0] for i in items]
        off = [n for n in names if n in rdma_netdevs and port_of(n) not in up_ports]
        if off:
            problems.append(f"{key}={value} names {', '.join(off)}, whose port is not Up on {node}")
            fixes.append(f"{key}={first_up}")
        for n in netdevs:
            if n not in rdma_netdevs and any(n.startswith(i) for i in names):
                mgmt.setdefault(n, []).append(key)
    return problems, fixes, mgmt


def _management_links(
    node: str,
    env: Mapping[str, str],
    mgmt: Mapping[str, list[str]],
    wireless: Collection[str],
    up: Sequence[tuple[str, str]],
) -> tuple[list[str], list[str]]:
    """(problems, fixes) of socket variables naming a non-fabric netdev: wireless always a
    problem; a wired one a problem outside sparkrun's management-first layout (in it, a
    note: :func:`management_init_note`)."""
    sparkrun_mgmt = management_first(env)
    fabric_up = ", ".join(n for _, n in up)
    problems: list[str] = []
    fixes: list[str] = []
    for name, keys in mgmt.items():
        if name in wireless:
            problems.append(
                f"{name} ({', '.join(keys)}) is wireless: serving dies when it drops (sparkrun "
                f"PR #219): NCCL's bootstrap and gloo run over it; the fabric interfaces Up on "
                f"{node}: " + fabric_up
            )
        elif sparkrun_mgmt:
            continue  # sparkrun's management-first init: a note, not a problem
        else:
            problems.append(
                f"{name} ({', '.join(keys)}) is not a fabric interface: no RDMA device on it "
                f"in {node}'s ibdev2netdev (the management / default-route link): NCCL's "
                "bootstrap and gloo run over it and serving dies when it drops (sparkrun PR "
                f"#219); the fabric interfaces Up on {node}: " + fabric_up
            )
        fixes += [f"{k}={up[0][1]}" for k in keys]
    return problems, fixes


def management_first(env: Mapping[str, str]) -> bool:
    """sparkrun's layout (orchestration/infiniband.py, runtimes/_init_network.py): data over
    RDMA (``NCCL_NET=IB``) and the socket variables naming the management / default-route
    interface first, for NCCL's bootstrap and the distributed init, by design. eugr's
    launch-cluster.sh never sets NCCL_NET: there a non-fabric socket interface is a
    departure from what the launcher sets (its ETH_IF, the fabric)."""
    return env.get("NCCL_NET", "").strip().lower() == "ib"


# The evidence key of a passing serving env whose init runs over a wired management link
# (sparkrun's default): the check warns it as a CheckNote (ManagementInitNote).
MGMT_INIT = "management-link init"


class ManagementInitNote(CheckNote):
    """The serving env passed with NCCL's bootstrap / gloo on a wired management link
    (sparkrun's management-first init): serving depends on that link too."""


def management_init_note(
    node: str,
    env: Mapping[str, str],
    node_ifs: Mapping[str, bool],
    fabric: Collection[str],
    wireless: Collection[str],
    up_fabric: Sequence[str],
) -> str | None:
    """The note of a serving env that names a wired non-fabric interface of the node in
    GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME in sparkrun's management-first layout; None
    when it names none (or not in that layout: there it is a problem)."""
    if not management_first(env):
        return None
    seen: dict[str, list[str]] = {}
    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        value = env.get(key, "")
        if not value or value.strip().startswith("^"):
            continue
        _, _, exact, items = nccl_list(value)
        for n in node_ifs:
            if n not in fabric and n not in wireless and nccl_matches(n, items, exact):
                seen.setdefault(n, []).append(key)
    if not seen:
        return None
    names = ", ".join(f"{n} ({', '.join(k)})" for n, k in seen.items())
    target = up_fabric[0] if up_fabric else (sorted(fabric)[0] if fabric else "the fabric")
    return (
        f"{node}: NCCL_NET=IB carries the data over RDMA, and the init (NCCL's bootstrap, "
        f"gloo) runs over the wired management link {names}: sparkrun's default "
        "(runtimes/_init_network.py prefers the management address), so serving depends on "
        f"that link too. To pin it to the fabric, set GLOO_SOCKET_IFNAME={target} "
        f"NCCL_SOCKET_IFNAME={target} (and TP_SOCKET_IFNAME) in the recipe's env: "
        "(sparkrun puts it over its own)"
    )
