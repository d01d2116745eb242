"""The heat-throttle fault's model (sparksim/emulator/thermal.py), on its own clock: a steady
batch heats the GPU and slows every step within a soak's few seconds, a short closed-loop
level or one stream at a time does not, and an idle GPU cools back to full speed."""

from __future__ import annotations

import pytest

from sparksim.emulator.config import Knobs
from sparksim.emulator.engine import step_model
from sparksim.emulator.faults import RUN_FAULTS, FaultState
from sparksim.emulator.thermal import CAP, Heat


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def hold(heat: Heat, clock: Clock, running: int, seconds: float, step: float = 0.01) -> float:
    """``running`` sequences decoding for ``seconds`` (a query a step, as the pacer makes)."""
    factor = heat.factor(running)
    for _ in range(round(seconds / step)):
        clock.t += step
        factor = heat.factor(running)
    return factor


def test_a_steady_batch_slows_a_soak_past_the_sim_profiles_drift_limit() -> None:
    clock = Clock()
    heat = Heat(clock=clock)
    first = hold(heat, clock, 4, 2.0)  # the end of a soak's first 2 s window
    onset = hold(heat, clock, 4, 5.5)  # the heat passed the GPU's thermal target (~6.5 s)
    last = hold(heat, clock, 4, 3.0)  # the start of its last window (12 s, 4 streams)
    assert first == 1.0 and 1.0 < onset < CAP and last == CAP == 10.0
    # tok/s falls by 90%: past sim.toml's 25% limit even where a loaded machine's CPU caps
    # the first window at a third of the emulated rate (the last, at a tenth, is below it)
    assert 1 - (first / last) * 3 > 0.25 * 2


def test_short_levels_and_single_streams_stay_near_full_speed() -> None:
    clock = Clock()
    heat = Heat(clock=clock)
    assert hold(heat, clock, 1, 60.0) == 1.0  # one stream: the cooler keeps up
    # a closed-loop level of 4 streams, even one a loaded machine stretches to 6 s
    assert hold(heat, clock, 4, 6.0) == 1.0
    hold(heat, clock, 4, 8.0)
    hot = heat.factor(0)
    clock.t += 60.0  # idle: cools back (tau 15 s)
    cooled = heat.factor(0)
    assert hot == CAP and cooled == 1.0


def test_the_slowdown_is_capped_and_felt_only_under_the_fault() -> None:
    clock = Clock()
    heat = Heat(clock=clock)
    assert hold(heat, clock, 16, 120.0) == CAP
    knobs = Knobs(decode_tok_s=160.0)
    cool = step_model(knobs, FaultState(set()), heat=2.0).step_s(4)
    hot = step_model(knobs, FaultState({"heat-throttle"}), heat=2.0).step_s(4)
    assert hot == pytest.approx(2 * cool)
    assert "heat-throttle" in RUN_FAULTS
