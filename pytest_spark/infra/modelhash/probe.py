"""The model files' full hash (``--spark-model-hash=full``): sha256 of every byte of each
weight shard, one shard per command so that progress can be told as it goes (it reads
the whole checkpoint: 119 GB on a Spark, minutes per node).

The preflight probe already hashes config.json, the tokenizer files, *.index.json and
every small file whole; the larger files (the shards) it samples
(:func:`pytest_spark.infra.preflight.probe.sampled_sha256`: 16 blocks of 64 KiB, the first, the
last and evenly between), which misses a change between the sampled blocks. This module
hashes exactly those sampled files whole and puts the full sha256 in their place.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.modelfiles import ModelListing, parse_sha256sum

__all__ = ["HashProgress", "full_hash_command", "parse_full_hash", "with_full_hashes"]


def full_hash_command(model_dir: str, name: str) -> str:
    """``sha256sum`` of one file of the model directory (a path relative to it)."""
    if not name or name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"not a file inside the model directory: {name!r}")
    return f"cd {shlex.quote(model_dir)} && sha256sum -- {shlex.quote(name)}"


def parse_full_hash(text: str, name: str) -> str:
    """The file's sha256 from ``sha256sum`` output, or ParseError."""
    found = parse_sha256sum(text)
    if name not in found:
        raise ParseError("sha256sum", f"no sha256 line for {name}", text.strip()[:200] or None)
    return found[name]


def with_full_hashes(listing: ModelListing, full: Mapping[str, str]) -> ModelListing:
    """The listing with the sampled files' full sha256 among its hashes, their samples
    gone: the model check then compares them as it compares every small file."""
    return replace(
        listing,
        hashes={**listing.hashes, **full},
        samples={n: h for n, h in listing.samples.items() if n not in full},
    )


@dataclass
class HashProgress:
    """How far each node's full hash has got; ``line()`` is the progress line."""

    files: dict[str, int]  # node -> files to hash
    total: dict[str, int]  # node -> bytes to hash
    done_files: dict[str, int]
    done: dict[str, int]

    @classmethod
    def start(cls, plan: Mapping[str, Mapping[str, int]]) -> HashProgress:
        """``plan``: node -> {file: bytes}."""
        return cls(
            {n: len(f) for n, f in plan.items()},
            {n: sum(f.values()) for n, f in plan.items()},
            dict.fromkeys(plan, 0),
            dict.fromkeys(plan, 0),
        )

    def advance(self, node: str, nbytes: int) -> None:
        self.done_files[node] += 1
        self.done[node] += nbytes

    @property
    def finished(self) -> bool:
        return all(self.done_files[n] >= self.files[n] for n in self.files)

    def line(self, elapsed_s: float) -> str:
        done, total = sum(self.done.values()), sum(self.total.values())
        rate = done / elapsed_s / 1e9 if elapsed_s > 0 else 0.0
        nodes = ", ".join(
            f"{n} {self.done_files[n]}/{self.files[n]} files {self.done[n] / 1e9:.1f}/"
            f"{self.total[n] / 1e9:.1f} GB"
            for n in self.files
        )
        pct = 100.0 * done / total if total else 100.0
        return f"model sha256 (full): {pct:.0f}% ({nodes}; {rate:.2f} GB/s, {elapsed_s:.0f} s)"
