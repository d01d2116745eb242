"""A userspace packet delayer over nfnetlink_queue, for kernels without sch_netem.

``python3 nfqdelay.py --queue N --ms D`` binds netfilter queue N in the network namespace
it runs in (``iptables ... -j NFQUEUE --queue-num N --queue-bypass`` sends packets there),
holds every queued packet D ms and then lets it go. It speaks nfnetlink_queue over a raw
``AF_NETLINK``/``NETLINK_NETFILTER`` socket (standard library only):

- config: bind the queue, copy mode META (no payload is copied to userspace: only the
  packet id matters here), a long queue, and the flags GSO (a TCP super-packet is queued
  whole, not cut into MTU segments first: ~40x fewer packets at 9000 MTU) and FAIL_OPEN
  (a full queue lets packets through rather than dropping them);
- every packet is due D ms after it was queued; ids rise in queue order and D is the same
  for all, so one ``NFQNL_MSG_VERDICT_BATCH`` accepting every id up to the newest due one
  releases them in order, one syscall for many packets.

Started by ``spark-sim fault link-delay`` (faults/fabric.py) when netem is missing; it
prints ``ready`` once the queue is bound. SIGTERM (``fault clear``) lets every held packet
go at once, unbinds and exits; killed outright (``spark-sim down``), the kernel drops what
it held and ``--queue-bypass`` passes later packets, so nothing waits on a dead delayer.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import os
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
SO_RCVBUFFORCE = 33
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 2
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQA_CFG_MASK, NFQA_CFG_FLAGS = 4, 5
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_GSO = 0x1, 0x4
NF_ACCEPT = 1
QUEUE_MAXLEN = 65536
RCVBUF = 16 << 20

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid (host order)
_NFGENMSG = struct.Struct("!BBH")  # family, version, res_id (the queue, network order)
_NLATTR = struct.Struct("=HH")  # len, type (host order)


def _align(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    raw = _NLATTR.pack(_NLATTR.size + len(payload), kind) + payload
    return raw + b"\0" * (_align(len(raw)) - len(raw))


def message(msg_type: int, queue: int, attrs: bytes, *, seq: int = 0, ack: bool = False) -> bytes:
    """An nfnetlink_queue message: nlmsghdr, nfgenmsg (AF_UNSPEC, v0, the queue), attrs."""
    body = _NFGENMSG.pack(socket.AF_UNSPEC, 0, queue) + attrs
    flags = NLM_F_REQUEST | (NLM_F_ACK if ack else 0)
    kind = (NFNL_SUBSYS_QUEUE << 8) | msg_type
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, seq, 0) + body


def config_messages(queue: int) -> list[bytes]:
    """Bind ``queue``, copy META, a long queue, GSO and fail-open (each one ACKed)."""
    flags = NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN
    return [
        message(
            NFQNL_MSG_CONFIG,
            queue,
            attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_UNSPEC)),
            seq=1,
            ack=True,
        ),
        message(
            NFQNL_MSG_CONFIG,
            queue,
            attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
            + attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN))
            + attr(NFQA_CFG_FLAGS, struct.pack("!I", flags))
            + attr(NFQA_CFG_MASK, struct.pack("!I", flags)),
            seq=2,
            ack=True,
        ),
    ]


def unbind_message(queue: int) -> bytes:
    cmd = struct.pack("!BxH", NFQNL_CFG_CMD_UNBIND, socket.AF_UNSPEC)
    return message(NFQNL_MSG_CONFIG, queue, attr(NFQA_CFG_CMD, cmd), seq=3)


def verdict_batch(queue: int, last_id: int) -> bytes:
    """Accept every packet of ``queue`` with an id up to ``last_id``."""
    hdr = struct.pack("!II", NF_ACCEPT, last_id)
    return message(NFQNL_MSG_VERDICT_BATCH, queue, attr(NFQA_VERDICT_HDR, hdr))


def parse(data: bytes) -> tuple[list[int], list[int]]:
    """(the packet ids of the NFQNL_MSG_PACKET messages, the errnos of the netlink errors)
    in one read; ACKs and other messages are left out."""
    ids: list[int] = []
    errors: list[int] = []
    off = 0
    while off + _NLMSGHDR.size <= len(data):
        length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, off)
        if length < _NLMSGHDR.size:
            break
        end = off + length
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, off + _NLMSGHDR.size)
            if code:
                errors.append(-code)
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            at = off + _NLMSGHDR.size + _NFGENMSG.size
            while at + _NLATTR.size <= end:
                alen, akind = _NLATTR.unpack_from(data, at)
                if alen < _NLATTR.size:
                    break
                if akind & 0x3FFF == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", data, at + _NLATTR.size)[0])
                    break
                at += _align(alen)
        off += _align(length)
    return ids, errors


def _configure(sock: socket.socket, queue: int) -> None:
    for msg in config_messages(queue):
        sock.send(msg)
        _, errors = parse(sock.recv(65536))
        if errors:  # EPERM (not root), EBUSY (the queue is taken)
            raise OSError(errors[0], os.strerror(errors[0]))


class Delayer:
    """Holds queued packets ``delay_s`` each, FIFO, releasing due ones in batches."""

    def __init__(self, sock: socket.socket, queue: int, delay_s: float) -> None:
        self.sock, self.queue, self.delay_s = sock, queue, delay_s
        self.held: collections.deque[tuple[float, int]] = collections.deque()
        self.stopping = False

    def release(self, now: float | None = None) -> None:
        """Accept every held packet due by ``now`` (all of them when None)."""
        last = None
        while self.held and (now is None or self.held[0][0] <= now):
            last = self.held.popleft()[1]
        if last is not None:
            self.sock.send(verdict_batch(self.queue, last))

    def run(self) -> None:
        buf = bytearray(65536)
        view = memoryview(buf)
        # A signal wakes the wait at once (Python restarts an interrupted wait otherwise).
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        while not self.stopping:
            now = time.monotonic()
            self.release(now)
            # select's timeout has microseconds (poll's has milliseconds: ~0.5 ms late a hold)
            wait_s = None if not self.held else max(0.0, self.held[0][0] - now)
            ready, _, _ = select.select([self.sock, wake_r], [], [], wait_s)
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    wake_r.recv(64)
            if self.sock not in ready:
                continue
            while True:  # drain what is queued, stamping each packet as it arrives
                try:
                    n = self.sock.recv_into(buf, 0, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.ENOBUFS:
                        continue  # notifications lost; FAIL_OPEN let those packets through
                    raise
                due = time.monotonic() + self.delay_s
                ids, errors = parse(bytes(view[:n]))
                self.held.extend((due, pid) for pid in ids)
                for code in errors:  # a verdict the kernel refused: say so, keep going
                    print(f"nfqdelay: netlink error {os.strerror(code)}", file=sys.stderr)
        self.release()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, required=True, help="netfilter queue number")
    parser.add_argument("--ms", type=float, required=True, help="delay in milliseconds")
    parser.add_argument("--tag", default="", help="who started it (spark-sim: the node's dir)")
    args = parser.parse_args(argv)
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
    sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
    sock.bind((0, 0))
    try:
        _configure(sock, args.queue)
    except OSError as exc:
        print(f"nfqdelay: cannot bind netfilter queue {args.queue}: {exc}", file=sys.stderr)
        return 1
    delayer = Delayer(sock, args.queue, args.ms / 1000)

    def stop(signum: int, frame: object) -> None:
        delayer.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the starter reads one line and goes
    os.close(devnull)
    try:
        delayer.run()
    finally:
        delayer.release()
        with contextlib.suppress(OSError):
            sock.send(unbind_message(args.queue))
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
