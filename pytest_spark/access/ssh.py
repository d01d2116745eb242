"""SSH to the nodes with paramiko: one connection per node, reused for the session.

- ``TCP_NODELAY`` on the transport socket (without it every command pays ~40 ms).
- Host keys are checked strictly against known_hosts / UserKnownHostsFile by default.
- OpenSSH config honoured: Host aliases, HostName, User, IdentityFile, Port, ProxyJump,
  UserKnownHostsFile, IdentitiesOnly.
- Every connect and every command is bounded by a timeout, also when a node goes silent
  (packets dropped, no reset): the socket carries TCP keepalives and ``TCP_USER_TIMEOUT``
  of the connect timeout, so a connection whose data goes unacknowledged that long is
  aborted by the kernel (paramiko's transport then ends and every wait on it returns), and
  the exec request, which paramiko waits on without a bound, is watched by a timer that
  drops the connection when no answer comes.
"""

from __future__ import annotations

import codecs
import getpass
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import paramiko

from pytest_spark.access.base import (
    CommandResult,
    CommandTimeout,
    HostKeyError,
    NodeUnreachable,
)

DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts",)
# The channel's pipe wakes select() on output, EOF and close (paramiko closes every
# channel when its transport dies), so this bound only sets how late the deadline and
# transport checks may run; a short one cost CPU in every waiting thread (one per node).
POLL_S = 0.1


@dataclass(frozen=True)
class SSHTarget:
    """Where and how to log in to one node, after ssh_config and options."""

    alias: str
    hostname: str
    port: int = 22
    user: str = ""
    identity_files: tuple[str, ...] = ()
    known_hosts: tuple[str, ...] = DEFAULT_KNOWN_HOSTS
    proxy_jump: str | None = None
    identities_only: bool = False

    def describe(self) -> str:
        where = self.hostname if self.port == 22 else f"{self.hostname}:{self.port}"
        return where if self.alias == self.hostname else f"{self.alias} ({where})"


def _split_host(spec: str) -> tuple[str | None, str, int | None]:
    """``user@host:port`` (as ProxyJump writes it) -> parts."""
    user, _, hostport = spec.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") else None
    elif hostport.count(":") == 1:
        host, _, p = hostport.partition(":")
        port = int(p)
    return user or None, host, port


def resolve_target(
    alias: str,
    *,
    ssh_config: Path | None = None,
    user: str | None = None,
    identity: Path | None = None,
) -> SSHTarget:
    """Resolve an alias through ssh_config; explicit ``user``/``identity`` win (like -l/-i)."""
    cfg = paramiko.SSHConfig()
    if ssh_config is not None and ssh_config.expanduser().is_file():
        cfg = paramiko.SSHConfig.from_path(str(ssh_config.expanduser()))
    spec_user, host, spec_port = _split_host(alias)
    found: dict[str, Any] = dict(cfg.lookup(host))
    port = spec_port or int(found.get("port", 22))
    known = found.get("userknownhostsfile")
    known_hosts = tuple(known.split()) if known else DEFAULT_KNOWN_HOSTS
    identities: tuple[str, ...] = tuple(found.get("identityfile", ()))
    if identity is not None:
        identities = (str(identity),)
    jump = found.get("proxyjump")
    if jump and jump.lower() == "none":
        jump = None
    return SSHTarget(
        alias=alias,
        hostname=found.get("hostname", host),
        port=port,
        user=user or spec_user or found.get("user") or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(p) for p in identities),
        known_hosts=tuple(os.path.expanduser(p) for p in known_hosts),
        proxy_jump=jump,
        identities_only=identity is not None
        or str(found.get("identitiesonly", "no")).lower() == "yes",
    )


def keepalive_interval(connect_timeout: float) -> int:
    """Seconds between SSH keepalives: often enough that a silent peer is noticed (by
    ``TCP_USER_TIMEOUT``) about one connect timeout after it went quiet."""
    return max(1, min(15, round(connect_timeout / 2)))


def tune_socket(sock: socket.socket, connect_timeout: float) -> None:
    """TCP_NODELAY, and a connection that dies (instead of hanging) about
    ``connect_timeout`` after its peer stopped acknowledging: TCP keepalives while idle and
    ``TCP_USER_TIMEOUT`` (Linux) for unacknowledged data."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = keepalive_interval(connect_timeout)
    for name, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", 1),
        ("TCP_KEEPCNT", max(1, round(connect_timeout))),
        ("TCP_USER_TIMEOUT", max(1000, round(connect_timeout * 1000))),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


class _AcceptPolicy(paramiko.MissingHostKeyPolicy):
    """--spark-hostkey-check=off: accept, never write anything to known_hosts."""

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        return None


def quiet_paramiko() -> None:
    """Keep paramiko's own log off the terminal: its transport thread logs a dropped
    connection ("Socket exception: Bad file descriptor (9)") and its tracebacks at ERROR,
    which with no handler configured reach stderr through logging's last resort, between
    the tests' lines. The suite reports every such failure itself, with the node and the
    fix. A level the user set on the ``paramiko`` logger is left alone."""
    logger = logging.getLogger("paramiko")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.CRITICAL)


class SSHConnection:
    """One reusable SSH connection to one node. Thread-safe; reconnects once if dropped."""

    def __init__(
        self,
        name: str,
        target: SSHTarget,
        *,
        connect_timeout: float = 10.0,
        command_timeout: float = 60.0,
        strict_host_keys: bool = True,
        jump: SSHConnection | None = None,
    ) -> None:
        self.name = name
        self.target = target
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.strict_host_keys = strict_host_keys
        self.jump = jump
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        quiet_paramiko()

    # -- connection -------------------------------------------------------------------
    def _open_socket(self) -> Any:
        t = self.target
        if self.jump is not None:
            transport = self.jump.transport()
            try:
                return transport.open_channel(
                    "direct-tcpip",
                    (t.hostname, t.port),
                    ("127.0.0.1", 0),
                    timeout=self.connect_timeout,
                )
            except (paramiko.SSHException, OSError) as exc:
                raise NodeUnreachable(
                    self.name,
                    f"cannot reach {t.describe()} through jump host "
                    f"{self.jump.target.describe()}: {exc or type(exc).__name__}",
                ) from exc
        try:
            sock = socket.create_connection((t.hostname, t.port), timeout=self.connect_timeout)
        except TimeoutError as exc:
            raise NodeUnreachable(
                self.name,
                f"SSH connect to {t.describe()} timed out after "
                f"{self.connect_timeout:g} s (host down, or a firewall drops port {t.port})",
            ) from exc
        except ConnectionRefusedError as exc:
            raise NodeUnreachable(
                self.name, f"SSH connection to {t.describe()} refused (is sshd running?)"
            ) from exc
        except OSError as exc:
            raise NodeUnreachable(
                self.name, f"cannot connect to {t.describe()}: {exc.strerror or exc}"
            ) from exc
        tune_socket(sock, self.connect_timeout)
        return sock

    def _connect(self) -> paramiko.SSHClient:
        t = self.target
        client = paramiko.SSHClient()
        if self.strict_host_keys:
            loaded = []
            for path in t.known_hosts:
                if os.path.isfile(path):
                    client.get_host_keys().load(path)
                    loaded.append(path)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:
            client.set_missing_host_key_policy(_AcceptPolicy())
        sock = self._open_socket()
        try:
            client.connect(
                t.hostname,
                port=t.port,
                username=t.user,
                # one file or a list of them (paramiko's SSHClient.connect); its stubs
                # name only the one
                key_filename=cast("str | None", list(t.identity_files) or None),
                look_for_keys=not t.identities_only,
                allow_agent=not t.identities_only,
                sock=sock,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                channel_timeout=self.connect_timeout,
            )
        except paramiko.BadHostKeyException as exc:
            sock.close()
            raise HostKeyError(
                self.name,
                f"host key of {t.describe()} has CHANGED (got "
                f"{exc.key.get_name()} {exc.key.fingerprint}). This may be a reinstalled node "
                f"or an attack: verify it, then update {', '.join(t.known_hosts)}",
            ) from exc
        except paramiko.AuthenticationException as exc:
            sock.close()
            keys = ", ".join(t.identity_files) or "agent/default keys"
            raise NodeUnreachable(
                self.name,
                f"SSH authentication as {t.user!r} on {t.describe()} failed "
                f"({keys}). Check --spark-user / --spark-ssh-key or the ssh_config entry",
            ) from exc
        except paramiko.SSHException as exc:
            sock.close()
            if "known_hosts" in str(exc):
                raise HostKeyError(
                    self.name,
                    f"host key of {t.describe()} is not in "
                    f"{', '.join(t.known_hosts)}. Verify the node's fingerprint, then add it "
                    f"(ssh-keyscan -p {t.port} {t.hostname} >> known_hosts), or run with "
                    "--spark-hostkey-check=off to accept any key",
                ) from exc
            raise NodeUnreachable(self.name, f"SSH to {t.describe()} failed: {exc}") from exc
        except (OSError, EOFError) as exc:
            sock.close()
            raise NodeUnreachable(
                self.name, f"SSH to {t.describe()} failed: {exc or type(exc).__name__}"
            ) from exc
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(keepalive_interval(self.connect_timeout))
        return client

    def transport(self) -> paramiko.Transport:
        with self._lock:
            if self._client is not None:
                transport = self._client.get_transport()
                if transport is not None and transport.is_active():
                    return transport
                self._client.close()
            self._client = self._connect()
            transport = self._client.get_transport()
            assert transport is not None
            return transport

    def connect(self) -> None:
        self.transport()

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- commands ---------------------------------------------------------------------
    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> CommandResult:
        """Run ``command`` through the node's shell; bounded by ``timeout``. ``on_output``
        gets stdout as it arrives (decoded text, in the pieces it came in: a live view of a
        long command), the whole of it still in the result."""
        limit = self.command_timeout if timeout is None else timeout
        start = time.monotonic()
        for attempt in (1, 2):
            try:
                chan = self.transport().open_session(timeout=self.connect_timeout)
                break
            except (paramiko.SSHException, EOFError, OSError) as exc:
                self.close()
                if attempt == 2:
                    raise NodeUnreachable(self.name, f"SSH session lost: {exc}") from exc
        self._exec(chan, command)
        out, err = bytearray(), bytearray()
        live = codecs.getincrementaldecoder("utf-8")(errors="replace")
        deadline = start + limit
        try:
            while True:
                while chan.recv_ready():
                    piece = chan.recv(65536)
                    out += piece
                    if on_output is not None and piece:
                        on_output(live.decode(piece))
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                if (
                    chan.exit_status_ready()
                    and (chan.eof_received or chan.closed)
                    and not (chan.recv_ready() or chan.recv_stderr_ready())
                ):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommandTimeout(self.name, command, limit, out.decode(errors="replace"))
                if not self.transport_alive():
                    raise NodeUnreachable(self.name, f"connection lost while running: {command}")
                select.select([chan], [], [], min(remaining, POLL_S))
            rc = chan.recv_exit_status()
        finally:
            chan.close()
        return CommandResult(
            node=self.name,
            command=command,
            rc=rc,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            duration_s=time.monotonic() - start,
        )

    def _exec(self, chan: paramiko.Channel, command: str) -> None:
        """``chan.exec_command`` bounded: paramiko waits for sshd's answer to the request
        without a timeout, forever on a node that went silent (on a jump channel no socket
        option of ours sees it). A timer drops the connection, which ends that wait."""
        bound = max(self.connect_timeout, 1.0)
        fired = threading.Event()

        def drop() -> None:
            fired.set()
            chan.get_transport().close()

        timer = threading.Timer(bound, drop)
        timer.daemon = True
        timer.start()
        try:
            chan.exec_command(command)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self.close()
            why = f"no answer within {bound:g} s" if fired.is_set() else str(exc) or "closed"
            raise NodeUnreachable(
                self.name, f"SSH connection lost starting a command ({why}): {command}"
            ) from exc
        finally:
            timer.cancel()

    def transport_alive(self) -> bool:
        client = self._client
        transport = client.get_transport() if client is not None else None
        return transport is not None and transport.is_active()

    def with_jump(self, jump: SSHConnection) -> SSHConnection:
        """The same node reached through ``jump``."""
        return SSHConnection(
            self.name,
            replace(self.target, proxy_jump=None),
            connect_timeout=self.connect_timeout,
            command_timeout=self.command_timeout,
            strict_host_keys=self.strict_host_keys,
            jump=jump,
        )
