"""Speculative decoding in the emulator (issue #27 part 1): served with
--speculative-config it drafts, exports vLLM's spec-decode counters under their real names
(``_total``, labels engine and model_name, per-position ``position``) with the per-position
counts falling, and decodes faster than without drafting; the spec-collapse fault accepts
~31% and decodes slower than without drafting. Without a speculative config the counters
are absent, as in vLLM (SpecDecodingProm registers nothing then)."""

from __future__ import annotations

import time
from typing import Any

from conftest import Emu
from pytest_spark.serving.load import specdec
from pytest_spark.serving.load.metricsnap import Snapshot
from sparksim.emulator.specdecode import SpecModel

SPEC = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}']
ARGS = ["--served-model-name", "m"]
PACED = {"SPARKSIM_EMU_DECODE_TOK_S": "100"}
TOKENS = 120


def _decode_s(emu: Emu) -> float:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Count words for me."}],
        "max_tokens": TOKENS,
        "ignore_eos": True,
    }
    t0 = time.perf_counter()
    resp = emu.chat(body)
    assert resp.json()["usage"]["completion_tokens"] == TOKENS
    return time.perf_counter() - t0


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


def test_drafting_exports_vllms_counters_and_decodes_faster(emu_factory: Any) -> None:
    plain = emu_factory(ARGS, PACED)
    assert _spec(plain) is None
    assert "spec_decode" not in plain.request("GET", "/metrics").body.decode()
    plain_s = _decode_s(plain)
    emu = emu_factory(ARGS + SPEC, PACED)
    before = _spec(emu)
    assert before is not None and before["drafts"] == 0
    drafting_s = _decode_s(emu)
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
    assert drafting_s < plain_s * 0.7


def test_spec_collapse_accepts_little_and_decodes_slower(emu_factory: Any) -> None:
    plain_s = _decode_s(emu_factory(ARGS, PACED))
    emu = emu_factory(ARGS + SPEC, {**PACED, "SPARKSIM_EMU_FAULT": "spec-collapse"})
    collapsed_s = _decode_s(emu)
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
    assert collapsed_s > plain_s * 1.1
