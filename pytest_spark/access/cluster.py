"""The cluster under test: its nodes, their roles, and concurrent access to them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pytest_spark.access.base import (
    CommandResult,
    HostKeyError,
    NodeUnreachable,
    RemoteError,
)
from pytest_spark.access.layout import (
    DISCOVERY_COMMAND,
    RankContainer,
    ServingLayout,
    choose,
    launcher_layout,
    parse_ps,
)
from pytest_spark.access.ssh import SSHConnection, resolve_target
from pytest_spark.settings.resolve import Settings

T = TypeVar("T")


@dataclass
class Node:
    """One node: ``name`` is its role id (``spark-head``, ``spark-worker-1``)."""

    name: str
    role: str
    address: str
    conn: SSHConnection
    _error: RemoteError | None = field(default=None, repr=False)

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> CommandResult:
        if on_output is None:
            return self.conn.run(command, timeout=timeout)
        return self.conn.run(command, timeout=timeout, on_output=on_output)

    def describe(self) -> str:
        return f"{self.name} ({self.conn.target.describe()})"


def node_names(settings: Settings) -> list[tuple[str, str, str]]:
    """(name, role, address) of every node, head first, from the settings alone."""
    if settings.head is None:  # the plugin refuses cluster tests without one first
        raise ValueError("no head node: give --spark-head=HOST (or --spark-sim)")
    nodes = [("spark-head", "head", settings.head)]
    nodes += [(f"spark-worker-{i}", "worker", w) for i, w in enumerate(settings.workers, 1)]
    return nodes


class Cluster:
    """Nodes plus a per-session cache of facts gathered from them."""

    _layout: ServingLayout | None = None  # the serving layout, once found or set

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.profile = settings.profile
        self.nodes: list[Node] = []
        for name, role, address in node_names(settings):
            target = resolve_target(
                address,
                ssh_config=settings.ssh_config,
                user=settings.user,
                identity=settings.ssh_key,
            )
            conn = SSHConnection(
                name,
                target,
                connect_timeout=settings.connect_timeout,
                command_timeout=settings.command_timeout,
                strict_host_keys=settings.hostkey_check == "strict",
            )
            self.nodes.append(Node(name, role, address, conn))
        self._cache: dict[Any, Any] = {}
        self._cache_lock = threading.Lock()
        self._key_locks: dict[Any, threading.Lock] = {}
        self._connected = False

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> list[Node]:
        return self.nodes[1:]

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if name in (node.name, node.address):
                return node
        raise KeyError(f"no node {name!r}; nodes: {', '.join(n.name for n in self.nodes)}")

    # -- the serving containers ----------------------------------------------------------
    def discover_layout(self, settings: Settings | None = None) -> ServingLayout:
        """The layout on the nodes now (no cache; ``settings`` default: the cluster's):
        ``--spark-container`` given keeps its one name (no discovery), unless
        ``--spark-job`` names a sparkrun job; otherwise each reachable node's sparkrun
        containers, all nodes at once (``access.layout.choose`` decides)."""
        settings = settings or self.settings
        if settings.source("container") != "default" and settings.job is None:
            return launcher_layout(settings.container)
        nodes = [n for n in self.nodes if self.unreachable(n) is None]
        results = self.map(lambda n: n.run(DISCOVERY_COMMAND, timeout=20), nodes)
        found: list[RankContainer] = []
        for node in nodes:
            result = results[node.name]
            if isinstance(result, CommandResult):
                found += parse_ps(node.name, result.stdout)
        names = [n.name for n in self.nodes]
        return choose(found, names, settings.container, settings.job)

    @property
    def layout(self) -> ServingLayout:
        """Where the serving containers are and where their vLLM output is
        (:mod:`pytest_spark.access.layout`): set by the session (the controller's discovery,
        a launch), else found here once: ``--spark-launch`` (launch-cluster.sh) and
        ``--spark-container`` keep one name; otherwise the nodes' sparkrun containers are
        looked for. Raises ``LayoutError`` when several jobs run and none is picked."""
        if self._layout is None:
            if self.settings.launch:
                layout = launcher_layout(self.settings.container)
            else:
                layout = self.cached(("serving-layout",), self.discover_layout)
            self._layout = layout
        return self._layout

    @layout.setter
    def layout(self, value: ServingLayout) -> None:
        self._layout = value

    @property
    def layout_known(self) -> ServingLayout | None:
        """The layout when already found or set (no SSH), else None."""
        return self._layout

    def container(self, node: Node | str) -> str:
        """The serving container's name on ``node`` (:attr:`layout`)."""
        return self.layout.container(node)

    # -- connecting -------------------------------------------------------------------
    def _jump_for(self, node: Node) -> SSHConnection | None:
        jump_alias = node.conn.target.proxy_jump
        if not jump_alias:
            return None
        hops = [h.strip() for h in jump_alias.split(",") if h.strip()]
        jump: SSHConnection | None = None
        for hop in hops:
            if hop in (self.head.address, self.head.conn.target.alias):
                jump = self.head.conn
                continue
            target = resolve_target(hop, ssh_config=self.settings.ssh_config)
            jump = SSHConnection(
                f"{node.name} jump {hop}",
                target,
                connect_timeout=self.settings.connect_timeout,
                strict_host_keys=self.settings.hostkey_check == "strict",
                jump=jump,
            )
        return jump

    def _connect_node(self, node: Node) -> None:
        jump = self._jump_for(node)
        if jump is not None:
            node.conn = node.conn.with_jump(jump)
        try:
            node.conn.connect()
            return
        except HostKeyError:
            raise
        except NodeUnreachable as direct_error:
            if node.role == "head" or jump is not None or self.head._error is not None:
                raise
            # Workers often sit on a network only the head reaches: try it as a jump host.
            via_head = node.conn.with_jump(self.head.conn)
            try:
                via_head.connect()
            except NodeUnreachable as jump_error:
                raise NodeUnreachable(
                    node.name, f"{direct_error}; also through the head: {jump_error}"
                ) from jump_error
            node.conn = via_head

    def connect(self) -> None:
        """Connect to every node (head first, workers concurrently); remember failures."""
        if self._connected:
            return
        self._connected = True
        try:
            self._connect_node(self.head)
        except RemoteError as exc:
            self.head._error = exc
        with ThreadPoolExecutor(max_workers=max(1, len(self.workers))) as pool:
            futures = {pool.submit(self._connect_node, w): w for w in self.workers}
            for future, worker in futures.items():
                problem = future.exception()
                if isinstance(problem, RemoteError):
                    worker._error = problem
                elif problem is not None:
                    raise problem

    def unreachable(self, node: Node) -> RemoteError | None:
        self.connect()
        return node._error

    def mark_lost(self, node: Node, error: RemoteError) -> None:
        """A node that stopped answering mid-session: unreachable from now on (every later
        ``unreachable(node)`` and ``map`` gives ``error``), its connection closed."""
        node._error = error
        node.conn.close()

    # -- concurrent work --------------------------------------------------------------
    def map(
        self, fn: Callable[[Node], T], nodes: Iterable[Node] | None = None
    ) -> dict[str, T | RemoteError]:
        """Apply ``fn`` to every node at once; a node's RemoteError is returned, not raised."""
        self.connect()
        chosen = list(self.nodes if nodes is None else nodes)
        results: dict[str, T | RemoteError] = {}

        def call(node: Node) -> T | RemoteError:
            if node._error is not None:
                return node._error
            try:
                return fn(node)
            except RemoteError as exc:
                return exc

        with ThreadPoolExecutor(max_workers=max(1, len(chosen))) as pool:
            for node, value in zip(chosen, pool.map(call, chosen), strict=True):
                results[node.name] = value
        return results

    def __contains__(self, key: Any) -> bool:
        """Whether ``key`` has been computed (see :meth:`cached`)."""
        with self._cache_lock:
            return key in self._cache

    def cached(self, key: Any, compute: Callable[[], T]) -> T:
        """Compute once per session (per key), even when tests race for it."""
        with self._cache_lock:
            if key in self._cache:
                return self._cache[key]  # type: ignore[no-any-return]
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            with self._cache_lock:
                if key in self._cache:
                    return self._cache[key]  # type: ignore[no-any-return]
            value = compute()
            with self._cache_lock:
                self._cache[key] = value
            return value

    def close(self) -> None:
        for node in reversed(self.nodes):
            node.conn.close()
