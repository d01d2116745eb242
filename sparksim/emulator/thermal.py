"""GPU heat under sustained batched decode: the ``heat-throttle`` fault.

A DGX Spark is a small box: a GB10 that decodes a batch for minutes heats past what its
cooler carries and clocks down; one stream's power, or a short burst, the cooler keeps up
with. So a short closed-loop sweep (a few seconds a level, idle between) runs at full
speed while a soak slows as it goes, and recovers once the load stops: the slowdown is
seen only by a steady load, as the tok/s drift between its first and last window.

Heat ``h`` (in stream-seconds above what the cooler carries) grows by ``running - 1`` a
second while ``running`` sequences decode and cools toward 0 with time constant ``tau_s``:

    dh/dt = max(0, running - 1) - h / tau_s

Like a GPU, which holds its clocks until it reaches its thermal target and only then
clocks down, the steps keep full speed until the heat passes ``onset``; past it every
decode step and prefill takes ``1 + per_unit * (h - onset)`` times as long, at most
``cap`` times (the floor a GPU past its thermal limit clocks down to: a tenth). The time
scale is the sim's, seconds where a Spark takes minutes, so that a soak of a few seconds
shows it: at the defaults 4 streams pass the onset after ~6.5 s and run at the cap from
~10 s (h ~22); a closed-loop level of 4 streams stays under the onset even when a loaded
machine stretches it to 6 s, at full speed; 15 s idle cools off two thirds of the heat.
The soak runs last in a session (tests_e2e/conftest.py), so its heat never reaches the
closed-loop levels.

The onset and the deep floor are also what keep the fault visible where the emulator is
CPU-bound (a loaded 2-core CI machine: its tok/s then tops out below what the emulated
steps allow, as low as ~100 tok/s at 4 streams, which hides a mild slowdown): the first
window runs at full speed, whatever its CPU ceiling, and the last at a tenth of the
emulated rate (~30 tok/s at 4 streams), below any such ceiling, so the drift holds well
past the profile's limit.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

TAU_S = 15.0  # cooling time constant
ONSET = 16.0  # the heat at which the GPU reaches its thermal target and starts to clock down
PER_UNIT = 1.5  # step-time factor added per unit of heat past the onset
CAP = 10.0  # the slowest a throttled GPU gets: a tenth of its clocks


class Heat:
    """The heat of one GPU, integrated as the batch changes; safe from any thread.

    ``factor(running)`` integrates the span since the last call with the batch size seen
    then (a step apart while decoding; an idle span after the last stream left at <= 1,
    cooling) and records ``running`` for the next span."""

    def __init__(
        self,
        tau_s: float = TAU_S,
        onset: float = ONSET,
        per_unit: float = PER_UNIT,
        cap: float = CAP,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tau_s, self.onset, self.per_unit = tau_s, onset, per_unit
        self.cap, self._clock = cap, clock
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
            return min(self.cap, 1.0 + self.per_unit * max(0.0, self.heat - self.onset))
