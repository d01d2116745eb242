"""Automatic prefix caching as vLLM's v1 KV-cache manager does it, at block granularity.

A prompt's tokens are cut into full blocks of ``block_size``; each block is keyed by the
hash of its tokens chained to the previous block's key, so a block is a hit only when the
whole prefix before it matches. The last prompt token is never served from the cache (the
model has to compute at least one position to sample from), as in vLLM's
``KVCacheManager.get_computed_blocks``. Blocks are kept LRU up to the KV cache's size.

``--no-enable-prefix-caching`` disables it: no lookups hit and nothing is stored, while the
queries are still counted (vLLM counts ``vllm:prefix_cache_queries`` with caching off).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    def __init__(self, enabled: bool, block_size: int = 16, capacity_blocks: int = 65536):
        self.enabled = enabled
        self.block_size = block_size
        self.capacity = max(1, capacity_blocks)
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def _keys(self, token_ids: Sequence[int]) -> list[bytes]:
        usable = max(0, len(token_ids) - 1) // self.block_size
        keys: list[bytes] = []
        parent = b""
        for b in range(usable):
            block = token_ids[b * self.block_size : (b + 1) * self.block_size]
            parent = hashlib.sha256(parent + repr(tuple(block)).encode()).digest()
            keys.append(parent)
        return keys

    def lookup_and_store(self, token_ids: Sequence[int]) -> int:
        """Cached tokens of this prompt (a multiple of the block size); its blocks are
        stored for the next prompt."""
        if not self.enabled:
            return 0
        keys = self._keys(token_ids)
        with self._lock:
            hits = 0
            for key in keys:
                if key not in self._blocks:
                    break
                hits += 1
            for key in keys:
                self._blocks[key] = None
                self._blocks.move_to_end(key)
            while len(self._blocks) > self.capacity:
                self._blocks.popitem(last=False)
        return hits * self.block_size
