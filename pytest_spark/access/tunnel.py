"""Local port forwarding through a node's SSH transport (``ssh -L``), for an API that
listens only on the head's loopback or a network the runner cannot reach."""

from __future__ import annotations

import contextlib
import select
import socket
import threading

import paramiko

from pytest_spark.access.ssh import SSHConnection


class Tunnel:
    """127.0.0.1:<local_port> on the runner -> remote_host:remote_port seen from the node."""

    def __init__(self, conn: SSHConnection, remote_host: str, remote_port: int) -> None:
        self.conn = conn
        self.remote = (remote_host, remote_port)
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self._server.settimeout(0.2)
        self.local_port: int = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="spark-tunnel", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._pump, args=(client,), daemon=True).start()

    def _pump(self, client: socket.socket) -> None:
        try:
            chan = self.conn.transport().open_channel(
                "direct-tcpip", self.remote, client.getpeername(), timeout=10
            )
        except Exception:
            client.close()
            return
        ends: list[socket.socket | paramiko.Channel] = [client, chan]
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select(ends, [], [], 0.5)
                if client in readable:
                    data = client.recv(65536)
                    if not data:
                        break
                    chan.sendall(data)
                if chan in readable:
                    data = chan.recv(65536)
                    if not data:
                        break
                    client.sendall(data)
        except OSError:
            pass
        finally:
            chan.close()
            client.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._server.close()
        self._thread.join(timeout=2)
