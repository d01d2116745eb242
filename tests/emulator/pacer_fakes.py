"""The emulator pacer's clock for tests: time moves only when the pacer sleeps."""

from __future__ import annotations


class FakeTime:
    """The pacer's clock: sleeping moves it forward, nothing else does."""

    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
