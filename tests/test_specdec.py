"""Speculative decoding read from /metrics (issue #27 part 1): the counters under vLLM's
names, the per-level deltas, vLLM's formulas (acceptance, mean accepted length, per
position) and the verdict naming a collapse."""

from __future__ import annotations

import time

import pytest

from pytest_spark.serving.load import specdec
from pytest_spark.serving.load.metricsnap import Snapshot

L = 'engine="0",model_name="m"'


def scrape(drafts: int, accepted: int, per_pos: list[int], k: int = 3) -> str:
    lines = [
        f"vllm:num_requests_waiting{{{L}}} 0.0",
        f"vllm:spec_decode_num_drafts_total{{{L}}} {drafts}.0",
        f"vllm:spec_decode_num_draft_tokens_total{{{L}}} {drafts * k}.0",
        f"vllm:spec_decode_num_accepted_tokens_total{{{L}}} {accepted}.0",
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{L},position="{i}"}} {v}.0'
        for i, v in enumerate(per_pos)
    ]
    return "\n".join(lines) + "\n"


def test_snapshot_reads_the_spec_decode_counters() -> None:
    snap = Snapshot.of(scrape(184, 243, [120, 80, 43]), 0.0)
    assert snap.spec == {
        "drafts": 184.0,
        "draft_tokens": 552.0,
        "accepted": 243.0,
        "per_pos": [120.0, 80.0, 43.0],
    }
    assert snap.to_dict()["spec"] == snap.spec
    plain = Snapshot.of(f"vllm:num_requests_waiting{{{L}}} 0.0\n", 0.0)
    assert plain.spec is None and "spec" not in plain.to_dict()


def test_vllms_formulas_over_a_level() -> None:
    # the deployment README's figures (notes section 6): 184 drafts of 3, 243 accepted
    before = Snapshot.of(scrape(16, 20, [10, 6, 4]), 0.0).to_dict()
    after = Snapshot.of(scrape(200, 263, [130, 86, 47]), time.time()).to_dict()
    fig = specdec.level_spec({"before": before, "after": after})
    assert fig is not None
    assert (fig.drafts, fig.draft_tokens, fig.accepted) == (184, 552, 243)
    assert fig.acceptance == pytest.approx(243 / 552)  # 44%
    assert fig.mean_length == pytest.approx(1 + 243 / 184)
    assert fig.per_pos_rate == pytest.approx((120 / 184, 80 / 184, 43 / 184))
    assert fig.num_spec_tokens == 3
    assert fig.text().startswith("acceptance 44.0% (243 of 552 draft tokens), mean accepted")
    assert fig.to_dict()["per_pos"] == [0.6522, 0.4348, 0.2337]
    assert specdec.level_spec({"before": {}, "after": after}) is None
    assert specdec.level_spec(None) is None


def test_total_sums_levels() -> None:
    a = specdec.SpecFigures(10, 30, 15, (8, 5, 2))
    b = specdec.SpecFigures(5, 15, 5, (4, 1))
    both = specdec.total([a, None, b])
    assert both == specdec.SpecFigures(15, 45, 20, (12, 6, 2))
    assert specdec.total([None]) is None


def test_spec_config_parses_the_json() -> None:
    assert specdec.spec_config('{"method": "mtp", "num_speculative_tokens": 2}') == {
        "method": "mtp",
        "num_speculative_tokens": 2,
    }
    assert specdec.spec_config(None) is None
    assert specdec.spec_config("{not json") is None
    assert specdec.spec_config("[1]") is None


def test_judge_names_a_collapse_only_below_no_drafting() -> None:
    # MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#142: ~33% acceptance, 12 tok/s vs 36
    low = specdec.SpecFigures(100, 300, 99, (60, 30, 9))
    collapse = specdec.judge(low, 12.0, 36.0, 0.4, "spec_decode.no_draft_tok_s")
    assert collapse.kind == "collapse"
    assert "acceptance 33.0%" in collapse.measured and "12.0 tok/s" in collapse.measured
    assert "36 tok/s expected without drafting" in collapse.measured
    assert "num_speculative_tokens" in collapse.fix and "draft model matches" in collapse.fix
    just_low = specdec.judge(low, 40.0, 36.0, 0.4, "x")
    assert just_low.kind == "low" and "below the minimum 40%" in just_low.measured
    healthy = specdec.SpecFigures(100, 300, 212, (85, 70, 57))
    assert specdec.judge(healthy, 90.0, 36.0, 0.4, "x").kind == "ok"
    assert specdec.judge(low, None, 36.0, 0.4, "x").kind == "low"  # no tok/s: not a collapse
