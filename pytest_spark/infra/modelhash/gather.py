"""The model files' full hash on every node at once (``--spark-model-hash=full``), cached
for the session, telling its progress as each shard is done. The facts and the progress
line are :mod:`pytest_spark.infra.modelhash.probe`'s; the check is test_model_dir_identical's
(:func:`pytest_spark.infra.preflight.model_check.check_model_identical`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.modelfiles import ModelListing
from pytest_spark.infra.modelhash.probe import (
    HashProgress,
    full_hash_command,
    parse_full_hash,
    with_full_hashes,
)

SHARD_TIMEOUT_S = 1800.0  # one shard of a few GB at a slow disk's 10 MB/s would be 5 min


def full_hash_listings(
    cluster: Cluster,
    model_dir: str,
    listings: Mapping[str, ModelListing | None],
    progress: Callable[[str], None],
) -> dict[str, ModelListing | None]:
    """Each node's listing with its sampled files hashed whole (nodes at once, a shard at
    a time on each); ``progress`` gets a line after every shard. A node whose hashing
    failed gets a listing with the error (the model check reports it)."""

    def compute() -> dict[str, ModelListing | None]:
        plan = {
            n: {f: m.files.get(f, 0) for f in sorted(m.samples)}
            for n, m in listings.items()
            if m is not None and m.exists and not m.error
        }
        state = HashProgress.start(plan)
        lock = threading.Lock()
        t0 = time.monotonic()
        progress(state.line(0.0))

        def hash_node(node: Node) -> ModelListing | None:
            listing = listings.get(node.name)
            if listing is None or node.name not in plan:
                return listing
            full: dict[str, str] = {}
            for name, size in plan[node.name].items():
                result = node.run(full_hash_command(model_dir, name), timeout=SHARD_TIMEOUT_S)
                try:
                    full[name] = parse_full_hash(result.stdout, name)
                except ParseError:
                    why = result.stderr.strip() or result.stdout.strip() or f"exit {result.rc}"
                    return replace(listing, error=f"full sha256 of {name} failed: {why[:300]}")
                with lock:
                    state.advance(node.name, size)
                    progress(state.line(time.monotonic() - t0))
            return with_full_hashes(listing, full)

        chosen = [n for n in cluster.nodes if n.name in listings]
        out: dict[str, ModelListing | None] = {}
        for name, r in cluster.map(hash_node, chosen).items():
            if not isinstance(r, RemoteError):
                out[name] = r
            else:
                given = listings.get(name)
                out[name] = replace(given, error=f"full sha256: {r}") if given else None
        return out

    return cluster.cached(("model-full-hash", model_dir), compute)
