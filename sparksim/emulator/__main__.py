"""``python -m sparksim.emulator serve|worker|ray ...``

``serve MODEL [vllm serve flags]``  the API server + engine (head node); with
    ``--nnodes N --node-rank R --master-addr A --master-port P`` (no Ray) the ranks meet
    at A:P, and ``--headless`` runs a worker node's rank (no API server)
``worker --head-addr IP --port P``  a rank on another node (heartbeats to the head)
``ray status``                      Ray's cluster status, from the head's status file
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from .config import Knobs, parse_serve_args
from .engine import Engine
from .faults import FaultState, parse_faults
from .logs import Log
from .nccl import LoadedNccl
from .raystatus import ray_main
from .server import EmulatorServer
from .startup import Startup
from .tp import PeerLink, RankLink, worker_main

USAGE = __doc__ or ""


def serve_main(argv: list[str]) -> int:
    args = parse_serve_args(argv)
    knobs = Knobs.from_env()
    try:
        faults = FaultState(parse_faults(knobs.fault), knobs.control)
    except ValueError as exc:
        print(f"SPARKSIM_EMU_FAULT: {exc}", file=sys.stderr)
        return 2
    faults.poll()
    log = Log()
    engine = Engine(args, knobs, faults, log)
    nccl = LoadedNccl(faults, knobs.control_poll_s).start()  # noqa: F841 (held: the mapping)

    def _term(_signum: int, _frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _term)
    if args.headless:
        return headless_main(engine)
    try:
        server = EmulatorServer(engine)
    except OSError as exc:
        log.raw(f"{engine.api_prefix} OSError: [Errno {exc.errno}] {exc.strerror}")
        return 1
    peer: PeerLink | None = None
    try:
        if args.multi_node or (args.world_size > 1 and knobs.tp_peer_port):
            host, port = knobs.tp_peer_host or args.host, knobs.tp_peer_port
            if args.multi_node:  # torch.distributed's store on the master address
                host, port = args.master_addr, args.master_port
            try:
                peer = PeerLink(
                    host,
                    port,
                    knobs,
                    lambda cause: engine.die(cause) if engine.ready else None,
                    peers=args.remote_ranks,
                )
            except OSError as exc:
                log.raw(f"{engine.api_prefix} OSError: [Errno {exc.errno}] {exc.strerror}")
                return 1
            engine.peer = peer
        engine.start_supervisor()
        Startup(engine, server.go_live).run()
        while True:
            signal.pause()
    except (SystemExit, KeyboardInterrupt) as exc:
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 0
        if engine.ready:
            log.uvicorn("Shutting down")
            log.uvicorn(f"Finished server process [{engine.pid}]")
        return code
    finally:
        engine.stop()
        if peer is not None:
            peer.close()
        server.close()


HEAD_LOST_EXIT_S = 2.0


def headless_main(engine: Engine) -> int:
    """A worker node's rank without Ray: joins the head rank, prints its own startup
    lines, then keeps the link until the head goes (then exits 1) or it is stopped."""
    args, log = engine.args, engine.log
    rank = args.local_ranks[0]
    log.info(
        engine.api_prefix,
        "serve.py:186",
        f"Launching vLLM in headless mode: node rank {args.node_rank} of {args.nnodes}, "
        f"head node address {args.master_addr}:{args.master_port}.",
    )

    def _lost() -> None:
        log.error(
            engine.worker_prefix(rank),
            "multiproc_executor.py:612",
            f"Connection to the head node {args.master_addr}:{args.master_port} lost; "
            "shutting down the worker.",
        )
        # A real worker's shutdown (the collective's error raised, the process group torn
        # down, the interpreter's exit) takes a moment: the head's own last lines, which
        # say why it went, reach its log before this rank's process is gone. Exiting at
        # once raced them, and a readiness watch then saw the worker die first.
        time.sleep(HEAD_LOST_EXIT_S)
        os._exit(1)

    hello = {"rank": rank, "pid": engine.worker_pids[rank], "ip": engine.knobs.head_ip}
    link = RankLink(args.master_addr, args.master_port, hello, engine.knobs, _lost)
    engine.rank_link = link
    try:
        Startup(engine, lambda: None).run()
        while True:
            signal.pause()
    except (SystemExit, KeyboardInterrupt) as exc:
        return exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 0
    finally:
        link.close()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        return serve_main(rest)
    if command == "worker":
        return worker_main(rest)
    if command == "ray":
        return ray_main(rest)
    print(f"unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
