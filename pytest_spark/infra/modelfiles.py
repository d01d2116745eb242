"""The model directory's files as a node lists them: :class:`ModelListing` (sizes, the
sha256 of the small files, the sampled sha256 of the large ones), filled by the preflight
probe and completed by the full hash (``--spark-model-hash=full``), and the ``sha256sum``
output both read (:func:`parse_sha256sum`). Pure: no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["ModelListing", "parse_sha256sum"]


@dataclass(frozen=True)
class ModelListing:
    path: str
    exists: bool
    files: dict[str, int] = field(default_factory=dict)  # relative path -> bytes
    # full sha256 of config.json, tokenizer*, *.index.json and every file up to 128 KiB
    hashes: dict[str, str] = field(default_factory=dict)
    # larger files (the weight shards): their sampled sha256 (sampled_sha256)
    samples: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())


def parse_sha256sum(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^([0-9a-f]{64}) [ *](.+)$", line.strip())
        if m:
            out[m[2].removeprefix("./")] = m[1]
    return out
