"""The links between the head's engine and its ranks on the other nodes: ``worker`` on each
other node dials the head ``serve`` over the fabric (through the Ray head's relay, or as a
headless rank without Ray) and both sides exchange heartbeats.

Line protocol over TCP: the worker sends ``HELLO {"rank":1,"pid":..,"ip":..}``, the head
answers ``WELCOME {...}``, then both send ``HB <n>`` every ``SPARKSIM_EMU_HEARTBEAT_S``.
The head treats EOF/reset (worker killed) and silence longer than
``SPARKSIM_EMU_HEARTBEAT_TIMEOUT_S`` (link down) as the worker's death. The worker
redials forever, like a Ray worker node waiting for its head.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import Knobs
from .faults import FaultState
from .nccl import LoadedNccl

SIM_CONTROL = "/etc/sparksim/control.json"  # the node's ~/.sparksim, mounted


@dataclass
class Peer:
    """A remote rank on the head's link: as its HELLO said (``rank``: a headless rank's own;
    every Ray worker says 1 and the engine numbers them when the group forms)."""

    rank: int
    ip: str
    pid: int
    state: str = "connected"  # connected | lost
    cause: str = ""  # why it was lost: "eof" (its process gone) or "timeout" (silent)


class PeerLink:
    """Head side: accepts the ``peers`` remote ranks (one per other node: a Ray worker
    node's relay, or a headless rank) and watches each one's heartbeat. ``connected`` is
    set while all of them are joined; ``on_lost`` runs for each one that goes."""

    def __init__(
        self,
        host: str,
        port: int,
        knobs: Knobs,
        on_lost: Callable[[str], None],
        peers: int = 1,
    ) -> None:
        self.knobs = knobs
        self.on_lost = on_lost
        self.expected = max(1, peers)
        self.peers: list[Peer] = []  # joined, in join order (the lost ones stay once formed)
        self.lost: Peer | None = None  # the first rank lost after the group formed
        self.state = "waiting"  # waiting | connected | lost
        self.connected = threading.Event()
        self.formed = False  # set once the placement group / rendezvous includes them all
        self._lock = threading.Lock()
        self._stop = threading.Event()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(max(4, self.expected + 2))
        self._sock.settimeout(0.2)
        threading.Thread(target=self._accept_loop, name="tp-accept", daemon=True).start()

    @property
    def peer_ip(self) -> str:
        """The first joined rank's address ("" before any): the one peer of two nodes."""
        return self.peers[0].ip if self.peers else ""

    @property
    def peer_pid(self) -> int:
        return self.peers[0].pid if self.peers else 0

    def live(self) -> list[Peer]:
        with self._lock:
            return [p for p in self.peers if p.state == "connected"]

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def _full(self) -> bool:
        """No room for another rank: all joined, or a formed group lost one (a dead engine
        is not revived)."""
        with self._lock:
            live = sum(p.state == "connected" for p in self.peers)
            return live >= self.expected or (self.state == "lost" and self.formed)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, addr = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._full():
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, addr), daemon=True).start()

    def _join(self, hello: dict[str, Any], addr: Any) -> Peer | None:
        """A rank's HELLO: it joins unless the group is full by now."""
        with self._lock:
            live = [p for p in self.peers if p.state == "connected"]
            if len(live) >= self.expected or (self.state == "lost" and self.formed):
                return None
            peer = Peer(
                rank=int(hello.get("rank") or len(live) + 1),
                ip=str(hello.get("ip") or addr[0]),
                pid=int(hello.get("pid") or 0),
            )
            # Before the group forms, a rank that left makes room for its return.
            self.peers = [*(self.peers if self.formed else live), peer]
            if len(live) + 1 >= self.expected:
                self.state = "connected"
                self.connected.set()
            return peer

    def _leave(self, peer: Peer, cause: str) -> None:
        with self._lock:
            peer.state, peer.cause = "lost", cause
            self.connected.clear()
            self.state = "lost"
            if self.formed and self.lost is None:
                self.lost = peer
        self.on_lost(cause)

    def _serve(self, conn: socket.socket, addr: Any) -> None:
        knobs = self.knobs
        conn.settimeout(min(knobs.heartbeat_s, 0.25))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        peer: Peer | None = None
        last_rx = time.monotonic()
        next_tx = 0.0
        seq = 0
        cause = ""
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_tx and peer is not None:
                    seq += 1
                    conn.sendall(f"HB {seq}\n".encode())
                    next_tx = now + knobs.heartbeat_s
                if now - last_rx > knobs.heartbeat_timeout_s:
                    cause = "timeout"
                    break
                try:
                    data = conn.recv(4096)
                except TimeoutError:
                    continue
                if not data:
                    cause = "eof"
                    break
                last_rx = time.monotonic()
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.startswith(b"HELLO ") and peer is None:
                        peer = self._join(json.loads(line[6:].decode()), addr)
                        if peer is None:
                            return  # the group is full: refused, as at accept
                        welcome = {"pid": os.getpid(), "rank": 0}
                        conn.sendall(f"WELCOME {json.dumps(welcome)}\n".encode())
        except (OSError, ValueError):
            cause = cause or "eof"
        finally:
            conn.close()
        if self._stop.is_set() or peer is None:
            return
        self._leave(peer, cause)


class RankLink:
    """A headless rank's side (no Ray): dials the head rank at ``--master-addr:
    --master-port`` over the fabric, as torch.distributed's store clients do, and
    heartbeats; ``on_lost`` runs once when the head goes away."""

    def __init__(
        self, host: str, port: int, hello: dict[str, Any], knobs: Knobs, on_lost: Callable[[], None]
    ) -> None:
        self.host, self.port, self.hello = host, port, hello
        self.knobs = knobs
        self.on_lost = on_lost
        self._stop = threading.Event()

    def join(self, timeout: float) -> bool:
        """Connect within ``timeout`` seconds (the head may start later); False if not."""
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            try:
                conn = socket.create_connection((self.host, self.port), timeout=2.0)
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                self._stop.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                continue
            threading.Thread(target=self._run, args=(conn,), name="rank-link", daemon=True).start()
            return True
        return False

    def close(self) -> None:
        self._stop.set()

    def _run(self, conn: socket.socket) -> None:
        _heartbeat(conn, self.hello, self.knobs, self._stop)
        if not self._stop.is_set():
            self.on_lost()


def _log(message: str) -> None:
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def _stamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"


def worker_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="worker", description="TP rank 1 on the second node")
    parser.add_argument("--head-addr", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--node-ip", default=None, help="address to report (default: local end)")
    args = parser.parse_args(argv)
    knobs = Knobs.from_env()
    stop = threading.Event()

    def _term(_signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    pid = os.getpid()
    # Ray's rank maps NCCL too, and follows the node's run-time faults (the `vllm` shim
    # names the control file for `vllm serve`; the `ray` shim does not).
    control = knobs.control or (SIM_CONTROL if os.path.exists(SIM_CONTROL) else "")
    nccl = LoadedNccl(FaultState(set(), control), knobs.control_poll_s).start()  # noqa: F841
    announced = False
    last_wait_log = 0.0
    while not stop.is_set():
        try:
            conn = socket.create_connection((args.head_addr, args.port), timeout=2.0)
        except OSError:
            if time.monotonic() - last_wait_log > 5.0:
                _log(
                    f"[{_stamp()} I {pid} {pid}] gcs_rpc_client.h:179: Failed to connect to GCS at "
                    f"address {args.head_addr}:{args.port} within 5 seconds."
                )
                last_wait_log = time.monotonic()
            stop.wait(1.0)
            continue
        ip = args.node_ip or conn.getsockname()[0]
        if not announced:
            _log(f"Local node IP: {ip}")
            _log("--------------------")
            _log("Ray runtime started.")
            _log("--------------------")
            announced = True
        _log(
            f"[{_stamp()} I {pid} {pid}] raylet: connected to head node "
            f"{args.head_addr}:{args.port}"
        )
        _heartbeat(conn, {"rank": 1, "pid": pid, "ip": ip}, knobs, stop)
        if not stop.is_set():
            _log(
                f"[{_stamp()} E {pid} {pid}] raylet: lost connection to head node "
                f"{args.head_addr}:{args.port}; reconnecting"
            )
            stop.wait(1.0)
    return 0


def _heartbeat(
    conn: socket.socket, hello: dict[str, Any], knobs: Knobs, stop: threading.Event
) -> None:
    conn.settimeout(min(knobs.heartbeat_s, 0.25))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    last_rx = time.monotonic()
    next_tx = 0.0
    seq = 0
    try:
        conn.sendall(f"HELLO {json.dumps(hello)}\n".encode())
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_tx:
                seq += 1
                conn.sendall(f"HB {seq}\n".encode())
                next_tx = now + knobs.heartbeat_s
            if now - last_rx > knobs.heartbeat_timeout_s:
                return
            try:
                data = conn.recv(4096)
            except TimeoutError:
                continue
            if not data:
                return
            last_rx = time.monotonic()
    except OSError:
        return
    finally:
        conn.close()
