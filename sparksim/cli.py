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

from . import cluster, engines, serving, sparkrun_layout
from .emulator.config import Knobs
from .faults import alike, fabric, gpu, host, launch, link, mem, perturb, rdma, reach, wifi
from .faults import launcher as launcher_faults
from .faults import serving as serving_faults
from .faults.common import Kinds, positive_int
from .netns import SimError
from .topology import MAX_NODES, TOPOLOGIES

# The fault modules besides link (sparksim/faults/): each has KINDS, add_parsers(kinds),
# apply(state_dir, topo, args) and clear(state_dir, topo).
FAULTS = (
    serving_faults, host, alike, reach, gpu, mem, fabric, rdma, perturb, launch, launcher_faults,
    wifi,
)  # fmt: skip
# `fault clear`: the network state last (link.clear resets state.json and faults.json).
CLEAR_ORDER = (
    launch, reach, mem, alike, host, serving_faults, fabric, rdma, perturb, launcher_faults, wifi,
    link,
)  # fmt: skip


def _nodes(text: str) -> int:
    value = positive_int(text)
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

    p_job = sub.add_parser(
        "job", parents=[common], help="start or stop serving laid out as another launcher does"
    )
    p_job.add_argument("action", choices=["start", "stop"])
    p_job.add_argument(
        "--layout",
        choices=sparkrun_layout.LAYOUTS,
        default="sparkrun",
        help="sparkrun: sparkrun 0.4.2's vllm-distributed job (labelled rank containers, "
        "PID 1 sleep infinity, vllm serve exec'd with its output in /tmp/sparkrun_serve.log)",
    )
    p_job.add_argument("--intent", default=sparkrun_layout.DEFAULT_INTENT, help="name stem")
    p_job.add_argument("--recipe", default=sparkrun_layout.DEFAULT_RECIPE, help="recipe label")
    p_job.add_argument("--serve-args", default=None, help="the vllm serve line (default: sim's)")
    p_job.add_argument("--nnodes", type=positive_int, default=None, help="ranks (default: all)")
    p_job.add_argument("--cluster-id", default=None, help="stop: this job only (default: all)")
    p_job.add_argument(
        "--master-addr",
        default=None,
        help="every rank's --master-addr (default: the head's fabric address); a loopback "
        "address reproduces sparkrun#249 (the headless ranks never join)",
    )
    p_job.add_argument(
        "--no-serve",
        type=int,
        action="append",
        default=[],
        metavar="RANK",
        help="leave this rank's container on sleep infinity, its vllm serve never exec'd "
        "(sparkrun#292); repeatable",
    )
    p_job.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set on every rank over sparkrun's NCCL env, e.g. GLOO_SOCKET_IFNAME=mgmt0 "
        "(sparkrun PR #219); repeatable",
    )
    p_job.add_argument(
        "--env-node",
        nargs=2,
        action="append",
        default=[],
        metavar=("NODE", "KEY=VALUE"),
        help="set on NODE's rank only, e.g. a worker's NCCL_IB_HCA naming a port not cabled "
        "there (sparkrun#135); repeatable",
    )

    p_fault = sub.add_parser("fault", parents=[common], help="inject or clear a fault")
    kinds = Kinds(p_fault.add_subparsers(dest="kind", required=True, metavar="KIND"), common)
    link.add_parsers(kinds)  # link-down, link-rate, mtu, switch-mtu
    kinds.add("clear", "undo every fault: back to a healthy cluster")
    for module in FAULTS:  # in this order in `spark-sim fault --help`
        module.add_parsers(kinds)
    return parser


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
    if args.command == "job":
        topo = cluster.require_topology(state_dir)
        if args.action == "stop":
            for msg in sparkrun_layout.stop_job(state_dir, topo, args.cluster_id):
                print(msg, file=sys.stderr)
            return 0
        job = sparkrun_layout.start_job(
            state_dir,
            topo,
            intent=args.intent,
            recipe=args.recipe,
            serve_args=args.serve_args,
            nnodes=args.nnodes,
            master_addr=args.master_addr,
            no_serve=tuple(args.no_serve),
            env=_job_env(args.env, args.env_node),
        )
        print(json.dumps(job, indent=2))
        return 0
    # fault
    cluster.require_topology(state_dir)
    with cluster.lock(state_dir):
        topo = cluster.require_topology(state_dir)
        if args.kind == "clear":
            msgs = [msg for module in CLEAR_ORDER for msg in module.clear(state_dir, topo)]
        else:
            (module,) = [m for m in (link, *FAULTS) if args.kind in m.KINDS]
            msgs = module.apply(state_dir, topo, args)
    for msg in msgs:
        print(msg)
    return 0


def _job_env(every: list[str], per_node: list[list[str]]) -> dict[str, dict[str, str]]:
    """``--env KEY=VALUE`` (every rank, key ``*``) and ``--env-node NODE KEY=VALUE``."""
    out: dict[str, dict[str, str]] = {}
    for node, item in [("*", e) for e in every] + [(n, e) for n, e in per_node]:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SimError(f"--env {item!r}: expected KEY=VALUE")
        out.setdefault(node, {})[key] = value
    return out


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
