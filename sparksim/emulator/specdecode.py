"""Speculative decoding as the emulator models it (``--speculative-config``).

A decode step with drafting proposes ``k`` tokens (``num_speculative_tokens``) and the
target verifies them in the same forward pass: the step yields 1 + the accepted prefix of
the draft, and costs the plain step plus the drafting, ``draft_cost`` plain steps per draft
token (an MTP head or a small EAGLE model: a tenth of a step each). Position ``i`` of a draft
is accepted with probability ``rate_i = first x decay**i`` (only if every earlier one was:
one uniform draw ``u`` accepts the positions whose ``rate_i > u``), so vLLM's per-position
counter falls with the position, as in real scrapes (vllm-project/vllm#48892: MTP k=8 on
gsm8k 76, 62, 51, 42, 36, 31, 27, 24%).

Healthy (MTP, k=3): 0.85, 0.70, 0.57 -> acceptance 0.71, mean accepted length 3.1, a step
1.3x as long: 2.4x the plain single-stream tok/s. The ``spec-collapse`` fault (a draft head
that does not match the target, a drafter slow on this hardware): 0.50, 0.28, 0.15 ->
acceptance 0.31, mean length 1.93, each draft token half a step: a step 2.5x as long and
0.77x the plain tok/s (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#142: ~33% acceptance,
12 tok/s against the 36 claimed).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

HEALTHY = (0.85, 0.82, 0.1)  # first-position rate, decay a position, draft cost a token
COLLAPSE = (0.50, 0.55, 0.5)


@dataclass(frozen=True)
class SpecModel:
    k: int
    first: float
    decay: float
    draft_cost: float  # plain decode steps one draft token costs

    @classmethod
    def of(cls, config: dict[str, Any] | None, collapse: bool) -> SpecModel | None:
        """The model a speculative config asks for (None: no drafting)."""
        if not config:
            return None
        k = int(config.get("num_speculative_tokens") or 1)
        if k < 1:
            return None
        return cls(k, *(COLLAPSE if collapse else HEALTHY))

    def rates(self) -> tuple[float, ...]:
        return tuple(self.first * self.decay**i for i in range(self.k))

    @property
    def step_factor(self) -> float:
        """A drafting step's length in plain decode steps."""
        return 1.0 + self.draft_cost * self.k

    def mean_length(self) -> float:
        return 1.0 + sum(self.rates())

    def accepted(self, u: float) -> int:
        """Positions accepted for the uniform draw ``u`` (a prefix: rates fall)."""
        return sum(1 for r in self.rates() if r > u)


class Drafts:
    """The engine's draws (seeded: runs repeat)."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def draw(self, model: SpecModel) -> int:
        with self._lock:
            u = self._rng.random()
        return model.accepted(u)
