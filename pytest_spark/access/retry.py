"""Retrying a lost connection during a long wait: exponential backoff, a bounded number of
attempts and a bounded total, both derived from the connect timeout. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass

FIRST_DELAY_S = 1.0
FACTOR = 2.0
MIN_ATTEMPTS = 3


@dataclass(frozen=True)
class Backoff:
    """``delays[k]`` is the wait before retry k+1; ``attempt_s`` bounds one attempt (a
    connect plus a probe); ``budget_s`` bounds the whole episode from the first failure:
    every delay plus one attempt each, plus the failed attempt that started it."""

    delays: tuple[float, ...]
    attempt_s: float

    @property
    def attempts(self) -> int:
        return len(self.delays)

    @property
    def window_s(self) -> float:
        """How long a node may be gone and still heal without a failure (delays alone)."""
        return sum(self.delays)

    @property
    def budget_s(self) -> float:
        return self.window_s + (self.attempts + 1) * self.attempt_s

    def delay(self, retry: int) -> float:
        """Wait before retry ``retry`` (1-based)."""
        return self.delays[retry - 1]

    def describe(self) -> str:
        steps = ", ".join(f"{d:g}" for d in self.delays)
        return f"{self.attempts} retries after {steps} s (within {self.budget_s:.0f} s at most)"


def for_connection(connect_timeout: float, probe_timeout: float) -> Backoff:
    """Delays 1, 2, 4 ... s, each capped at the connect timeout, until they add up to twice
    the connect timeout (at least 3 retries): 1, 2, 4, 8, 10 s for the default 10 s. One
    attempt costs at most a connect (open channel, then a fresh connect: 2 x connect
    timeout) or a probe that times out, whichever is longer."""
    cap = max(FIRST_DELAY_S, connect_timeout)
    window = 2 * connect_timeout
    delays: list[float] = []
    step = FIRST_DELAY_S
    while sum(delays) < window or len(delays) < MIN_ATTEMPTS:
        delays.append(min(step, cap))
        step *= FACTOR
    return Backoff(tuple(delays), max(2 * connect_timeout, probe_timeout))


@dataclass
class RetryState:
    """One node's retry episode: when it started, retries made, when the next one is due."""

    policy: Backoff
    started: float
    last_error: str
    retries: int = 0
    next_at: float = 0.0

    def failed(self, now: float, error: str) -> float | None:
        """Record a failed attempt; return the delay before the next retry, or None when
        the retries or the budget are spent (then report the node)."""
        self.last_error = error
        if self.retries >= self.policy.attempts:
            return None
        delay = self.policy.delay(self.retries + 1)
        if now + delay + self.policy.attempt_s - self.started > self.policy.budget_s:
            return None
        self.retries += 1
        self.next_at = now + delay
        return delay

    def due(self, now: float) -> bool:
        return now >= self.next_at
