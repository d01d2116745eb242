"""GPU heat under sustained batched decode: the ``heat-throttle`` fault.

A DGX Spark is a small box: a GB10 that decodes a batch for minutes heats past what its
cooler carries and clocks down; one stream's power, or a short burst, the cooler keeps up
with. So a short closed-loop sweep (a few seconds a level, idle between) runs at full
speed while a soak slows as it goes, and recovers once the load stops: the slowdown is
seen only by a steady load, as the tok/s drift between its first and last window.

Heat ``h`` (in stream-seconds above what the cooler carries) grows by ``running - 1`` a
second while ``running`` sequences decode and cools toward 0 with time constant ``tau_s``:

    dh/dt = max(0, running - 1) - h / tau_s

Every decode step and prefill takes ``1 + per_unit * h`` times as long, at most ``cap``
times (the lowest clock the GPU throttles to). The time scale is the sim's, seconds where a
Spark takes minutes, so that a soak of a few seconds shows it: at the defaults 4 streams
slow ~2.3x within 8 s (h ~17); a 2-3 s level of 4 streams, ~1.4-1.6x; 15 s idle cools off
two thirds of the heat.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

TAU_S = 15.0  # cooling time constant
PER_UNIT = 0.08  # step-time factor added per unit of heat
CAP = 3.0  # the slowest a throttled GPU gets: a third of its clocks


class Heat:
    """The heat of one GPU, integrated as the batch changes; safe from any thread.

    ``factor(running)`` integrates the span since the last call with the batch size seen
    then (a step apart while decoding; an idle span after the last stream left at <= 1,
    cooling) and records ``running`` for the next span."""

    def __init__(
        self,
        tau_s: float = TAU_S,
        per_unit: float = PER_UNIT,
        cap: float = CAP,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tau_s, self.per_unit, self.cap, self._clock = tau_s, per_unit, cap, clock
        self._lock = threading.Lock()
        self._t = clock()
        self._running = 0
        self.heat = 0.0

    def factor(self, running: int) -> float:
        with self._lock:
            now = self._clock()
            dt, self._t = max(0.0, now - self._t), now
            drive = max(0, self._running - 1) * self.tau_s  # the level this batch heats to
            self.heat = drive + (self.heat - drive) * math.exp(-dt / self.tau_s)
            self._running = running
            return min(self.cap, 1.0 + self.per_unit * self.heat)
