"""Speculative decoding in the emulator (issue #27 part 1): served with
--speculative-config it drafts, exports vLLM's spec-decode counters under their real names
(``_total``, labels engine and model_name, per-position ``position``) with the per-position
counts falling, and decodes faster than without drafting; the spec-collapse fault accepts
~31% and decodes slower than without drafting. Without a speculative config the counters
are absent, as in vLLM (SpecDecodingProm registers nothing then).

How fast it decodes is held on the pacer's own clock (no wall time: a loaded machine
stretches a served run, and the unit tier shares its cores); the served runs' wall-clock
ratios are a benchmark's (benchmarks/emu_specdecode.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pacer_fakes import FakeTime

from conftest import Emu
from pytest_spark.serving.load import specdec
from pytest_spark.serving.load.metricsnap import Snapshot
from sparksim.emulator.config import Knobs
from sparksim.emulator.generation import Pacer, StepModel, StreamClock
from sparksim.emulator.specdecode import SpecModel

SPEC = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}']
ARGS = ["--served-model-name", "m"]
PACED = {"SPARKSIM_EMU_DECODE_TOK_S": "100"}
TOKENS = 120


def _decode(emu: Emu) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Count words for me."}],
        "max_tokens": TOKENS,
        "ignore_eos": True,
    }
    resp = emu.chat(body)
    assert resp.json()["usage"]["completion_tokens"] == TOKENS


def paced_decode_s(spec: SpecModel | None, tokens: int = TOKENS, rate: float = 100.0) -> float:
    """Seconds one stream takes to decode ``tokens`` after its first, on the pacer's clock,
    drafting as ``spec`` says (None: no drafting): the emulator's own schedule."""
    k = Knobs()
    model = StepModel(rate, k.step_expert_share, k.step_expert_pick, k.step_kv_s_per_token)
    t = FakeTime()
    pacer = Pacer(
        lambda: model, lambda: 0.0, lambda _n: 0.0, clock=t.clock, sleep=t.sleep, spec=lambda: spec
    )
    stream = StreamClock(pacer)
    stream.first(32)
    start = t.now
    for _ in range(tokens - 1):
        stream.next()
    stream.done()
    return t.now - start


def _spec(emu: Emu) -> dict[str, Any] | None:
    return Snapshot.of(emu.request("GET", "/metrics").body.decode(), time.time()).spec


def test_spec_model_rates_fall_by_position_and_collapse_is_slower() -> None:
    config = {"method": "mtp", "num_speculative_tokens": 3}
    healthy, collapsed = SpecModel.of(config, False), SpecModel.of(config, True)
    assert healthy is not None and collapsed is not None
    assert list(healthy.rates()) == sorted(healthy.rates(), reverse=True)
    assert healthy.mean_length() / healthy.step_factor > 2.0  # faster than no drafting
    assert 0.25 < sum(collapsed.rates()) / 3 < 0.35  # ~0.3 acceptance
    assert collapsed.mean_length() / collapsed.step_factor < 0.85  # slower than no drafting
    assert [healthy.accepted(u) for u in (0.0, 0.6, 0.8, 0.9)] == [3, 2, 1, 0]
    assert SpecModel.of(None, False) is None


def test_the_pacer_decodes_faster_drafting_and_slower_collapsed() -> None:
    """On the pacer's clock: a drafting step is longer and yields its accepted tokens at
    once, so healthy drafting (mean length 3.1, a step 1.3x) decodes in well under 0.7 of
    the plain time, a collapsed drafter (1.93, 2.5x) in over 1.1 of it; the seeded draws
    repeat, so do the figures."""
    config = {"method": "mtp", "num_speculative_tokens": 3}
    plain = paced_decode_s(None)
    assert plain == pytest.approx((TOKENS - 1) / 100.0, rel=0.02)  # the knob's rate (+ KV)
    drafting = paced_decode_s(SpecModel.of(config, False))
    collapsed = paced_decode_s(SpecModel.of(config, True))
    assert drafting < plain * 0.7, (drafting, plain)
    assert collapsed > plain * 1.1, (collapsed, plain)
    assert paced_decode_s(SpecModel.of(config, False)) == drafting  # seeded: it repeats


def test_drafting_exports_vllms_counters(emu_factory: Any) -> None:
    plain = emu_factory(ARGS, PACED)
    assert _spec(plain) is None
    assert "spec_decode" not in plain.request("GET", "/metrics").body.decode()
    emu = emu_factory(ARGS + SPEC, PACED)
    before = _spec(emu)
    assert before is not None and before["drafts"] == 0
    _decode(emu)
    text = emu.request("GET", "/metrics").body.decode()
    for pos in range(3):
        needle = (
            "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            f'{{engine="0",model_name="m",position="{pos}"}}'
        )
        assert needle in text
    assert 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"}' in text
    after = _spec(emu)
    assert after is not None
    fig = specdec.level_spec({"before": {"spec": before}, "after": {"spec": after}})
    assert fig is not None and fig.num_spec_tokens == 3
    # every token after the first comes from a step: a draft, and its accepted tokens (the
    # last step's may run past max_tokens: vLLM counts them before it cuts the output)
    assert TOKENS - 1 <= fig.drafts + fig.accepted <= TOKENS - 1 + 3
    assert list(fig.per_pos) == sorted(fig.per_pos, reverse=True)
    assert 0.55 < (fig.acceptance or 0) < 0.85


def test_spec_collapse_accepts_little(emu_factory: Any) -> None:
    emu = emu_factory(ARGS + SPEC, {**PACED, "SPARKSIM_EMU_FAULT": "spec-collapse"})
    _decode(emu)
    spec = _spec(emu)
    assert spec is not None
    fig = specdec.level_spec(
        {
            "before": {
                "spec": {
                    **spec,
                    "drafts": 0,
                    "draft_tokens": 0,
                    "accepted": 0,
                    "per_pos": [0, 0, 0],
                }
            },
            "after": {"spec": spec},
        }
    )
    assert fig is not None and (fig.acceptance or 1) < 0.42
