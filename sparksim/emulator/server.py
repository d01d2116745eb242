"""HTTP layer: routes, auth, headers and SSE framing as uvicorn/vLLM send them.

Headers (lower-case, in uvicorn's order): ``date, server: uvicorn, content-length,
content-type, vary: Origin``; SSE adds ``transfer-encoding: chunked``. The API-key check
runs outside CORS (so a 401 has no ``vary``) and guards only ``/v1/*``, as vLLM's
middleware does: ``/health``, ``/ping``, ``/version``, ``/metrics``, ``/tokenize`` stay open.
The socket is bound at start-up and listens only when the engine is ready.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import select
import socket
import socketserver
import threading
import time
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from . import errors as err
from . import openai_api as api
from .engine import Engine
from .jobs import dumps
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

ROUTES: dict[str, tuple[str, ...]] = {
    "/health": ("GET",),
    "/ping": ("GET", "POST"),
    "/version": ("GET",),
    "/load": ("GET",),
    "/metrics": ("GET",),
    "/v1/models": ("GET",),
    "/tokenize": ("POST",),
    "/detokenize": ("POST",),
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
}


class EmulatorServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, engine: Engine) -> None:
        host = engine.args.host
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, engine.args.port), Handler, bind_and_activate=False)
        self.engine = engine
        self.live = False
        self._tokens = [hashlib.sha256(k.encode()).digest() for k in engine.args.api_keys]
        try:
            self.server_bind()
        except OSError:
            self.server_close()
            raise

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn); skip it.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = (
            str(self.server_address[0]),
            int(self.server_address[1]),
        )

    def go_live(self) -> None:
        """listen() now: until here connections are refused, never answered 503."""
        self.server_activate()
        self.live = True
        threading.Thread(target=self.serve_forever, args=(0.1,), name="http", daemon=True).start()

    def close(self) -> None:
        if self.live:
            self.shutdown()
        self.server_close()

    def authorized(self, header: str | None) -> bool:
        if not header:
            return False
        scheme, _, param = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(param.encode()).digest()
        return any(secrets.compare_digest(digest, t) for t in self._tokens)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: EmulatorServer

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the access log is written in uvicorn's format by _start()

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    # --- response primitives --------------------------------------------------------------
    def _start(
        self,
        status: int,
        headers: list[tuple[str, str]],
        vary: bool = True,
        trailing: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._status = status
        self.send_response_only(status, HTTPStatus(status).phrase)
        self.send_header("date", formatdate(usegmt=True))
        self.send_header("server", "uvicorn")
        for name, value in headers:
            self.send_header(name, value)
        if vary:
            self.send_header("vary", "Origin")
        for name, value in trailing:
            self.send_header(name, value)
        if self._request_id is not None:
            self.send_header("x-request-id", self._request_id)
        self.end_headers()
        engine = self.server.engine
        if engine.args.access_log:
            engine.log.access(self.client_address[:2], self.command, self.path, status)

    def raw(self, status: int, body: bytes, content_type: str, vary: bool = True) -> None:
        headers = [("content-length", str(len(body)))]
        if content_type:
            headers.append(("content-type", content_type))
        self._start(status, headers, vary)
        if body and self.command != "HEAD":
            self.wfile.write(body)
        self._resp_size = len(body)

    def json(self, status: int, obj: Any) -> None:
        self.raw(status, dumps(obj).encode("utf-8"), "application/json")

    def sse_start(self) -> None:
        self._start(
            200,
            [("content-type", "text/event-stream; charset=utf-8")],
            trailing=(("transfer-encoding", "chunked"),),
        )

    def sse_send(self, data: str) -> bool:
        payload = f"data: {data}\n\n".encode()
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        except OSError:
            self.close_connection = True
            return False
        self._resp_size += len(payload)
        return True

    def sse_end(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    def gone(self) -> bool:
        """Whether the client closed its connection while its answer was being made (an
        HTTP/1.1 client sends nothing while it waits, so a readable socket with nothing
        to read is a close)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def abort(self) -> None:
        """Drop the connection mid-response (no terminating chunk)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    # --- dispatch ---------------------------------------------------------------------------
    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _dispatch(self, method: str) -> None:
        engine = self.server.engine
        start = time.monotonic()
        self._status = 500
        self._resp_size = 0
        path = urlsplit(self.path).path
        headers = {k.lower(): v for k, v in self.headers.items()}
        self._request_id = None
        if engine.args.request_id_headers:
            self._request_id = headers.get("x-request-id") or secrets.token_hex(16)
        try:
            body = self._read_body()
        except (OSError, ValueError):
            self.close_connection = True
            return
        try:
            if (
                engine.args.api_keys
                and path.startswith("/v1")
                and not self.server.authorized(headers.get("authorization"))
            ):
                self.raw(401, b'{"error":"Unauthorized"}', "application/json", vary=False)
            elif path not in ROUTES:
                self.json(404, {"detail": "Not Found"})
            elif method not in ROUTES[path]:
                self.json(405, {"detail": "Method Not Allowed"})
            else:
                self._route(engine, method, path, body, headers)
        except err.ApiError as exc:
            self.json(exc.status, exc.body())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug in the emulator: answer like FastAPI's 500
            engine.log.error(engine.api_prefix, "server.py:1", f"emulator error: {exc!r}")
            self.json(500, err.internal(str(exc)).body())
        finally:
            if path in ROUTES:
                engine.metrics.http(
                    path, method, self._status, len(body), self._resp_size, time.monotonic() - start
                )

    def _route(
        self, engine: Engine, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> None:
        if path in ("/health", "/ping"):
            self.raw(503 if engine.dead else 200, b"", "")
        elif path == "/version":
            self.json(200, {"version": engine.knobs.version})
        elif path == "/load":
            self.json(200, {"server_load": engine.metrics.running})
        elif path == "/metrics":
            self.raw(200, engine.metrics.render().encode(), METRICS_CONTENT_TYPE)
        elif path == "/v1/models":
            self.json(200, api.models(engine))
        elif path == "/tokenize":
            self.json(200, api.tokenize(engine, body))
        elif path == "/detokenize":
            self.json(200, api.detokenize(engine, body))
        elif path == "/v1/chat/completions":
            with engine.in_flight():
                api.chat_completions(engine, body, headers, self)
        elif path == "/v1/completions":
            with engine.in_flight():
                api.completions(engine, body, headers, self)
