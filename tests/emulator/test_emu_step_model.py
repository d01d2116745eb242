"""The emulator's decode step model (issue #16 section 9), in process and on its own clock:
a batch's step grows with the distinct experts it reads, so the aggregate bends (the
published 1.9x at 4 streams on two Sparks) while the 1-stream rate stays the knob's."""

from __future__ import annotations

import pytest
from pacer_fakes import FakeTime

from sparksim.emulator.config import Knobs
from sparksim.emulator.engine import step_model
from sparksim.emulator.faults import FaultState
from sparksim.emulator.generation import Pacer, StepModel, StreamClock

PUBLISHED_4_OVER_1 = 59.7 / 31.5  # bjk110 vllm-spark README (REFERENCE.md): 1.90x


def default_model(rate: float = 40.0, extra_s: float = 0.0) -> StepModel:
    k = Knobs()
    return StepModel(
        rate, k.step_expert_share, k.step_expert_pick, k.step_kv_s_per_token, extra_s=extra_s
    )


def paced_aggregate(model: StepModel, streams: int, tokens: int, prompt: int = 128) -> float:
    """Output tok/s of ``streams`` sequences decoding ``tokens`` each through the Pacer,
    counted on its own clock (streams stepped in turn: their schedules are in step)."""
    t = FakeTime()
    pacer = Pacer(lambda: model, lambda: 0.0, lambda _n: 0.0, clock=t.clock, sleep=t.sleep)
    clocks = [StreamClock(pacer) for _ in range(streams)]
    for c in clocks:
        c.first(prompt)
    start = t.now
    for _ in range(tokens - 1):
        for c in clocks:
            c.next()
    assert pacer.running == streams
    for c in clocks:
        c.done()
        c.done()  # idempotent: an aborted stream's generator may close twice
    assert (pacer.running, pacer.context_tokens) == (0, 0)
    return streams * (tokens - 1) / (t.now - start)


def test_one_stream_keeps_the_knob_rate() -> None:
    model = default_model(40.0)
    assert paced_aggregate(model, 1, 65) == pytest.approx(40.0, rel=0.002)  # KV: 128..192 tok


def test_aggregate_bends_like_the_published_curve() -> None:
    model = default_model(40.0)
    one, four, sixteen = (paced_aggregate(model, n, 33) for n in (1, 4, 16))
    ratio = four / one
    assert ratio == pytest.approx(PUBLISHED_4_OVER_1, rel=0.15), ratio
    # It bends: each stream is slower in a bigger batch, and 4x the streams gives less
    # than 4x the tokens, less again from 4 to 16 than from 1 to 4.
    assert one > four / 4 > sixteen / 16
    assert sixteen / four < ratio < 4.0
    # The pacer's count matches the model's closed form.
    assert sixteen == pytest.approx(model.aggregate_tok_s(16, 128 + 16), rel=0.01)


def test_experts_read_saturate_at_every_expert() -> None:
    model = default_model()
    assert model.experts(1) == pytest.approx(1.0)
    assert model.experts(4) == pytest.approx(3.82, abs=0.01)
    assert model.experts(10_000) == pytest.approx(1 / model.expert_pick)  # 256 / 8


def test_linear_when_the_share_is_zero() -> None:
    flat = StepModel(40.0, expert_share=0.0, expert_pick=1 / 32)
    assert paced_aggregate(flat, 8, 21) == pytest.approx(8 * 40.0, rel=0.002)


def test_kv_reads_slow_long_contexts() -> None:
    model = default_model()
    short = model.step_s(4, 4 * 1000)
    long = model.step_s(4, 4 * 100_000)
    assert long - short == pytest.approx(4 * 99_000 * model.kv_s_per_token)


def test_slow_decode_costs_every_step_the_same() -> None:
    """slow-decode: one stream at a tenth of its rate; a batch keeps more of its aggregate
    (the added cost is per step, shared by the batch), so 4 streams still scale >= 2.25x,
    what the sim profile's floors expect (min_agg_tok_s_4 / min_decode_tok_s_1)."""
    slow = default_model(160.0, extra_s=9.0 / 160.0)
    one, four = (paced_aggregate(slow, n, 17) for n in (1, 4))
    assert one == pytest.approx(16.0, rel=0.01)
    assert four / one >= 45.0 / 20.0


def test_engine_step_follows_knobs_and_faults() -> None:
    knobs = Knobs(decode_tok_s=50.0)
    step = step_model(knobs, FaultState(set()))
    assert (step.rate, step.extra_s, step.expert_share) == (50.0, 0.0, knobs.step_expert_share)
    assert step_model(knobs, FaultState({"slow-decode"})).step_s(1) == pytest.approx(10 / 50.0)
