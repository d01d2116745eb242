"""Goodput as vllm bench serve defines it, on synthetic request timings: the share of
requests meeting every SLO, which SLO broke most, each SLO at its percentile, and the
failure text that names the level, the shares and the fix."""

from __future__ import annotations

import json

import pytest

from pytest_spark.serving.load.slo import Slo, broken, failure_text, goodput
from pytest_spark.serving.load.sweep import RequestRecord


def rec(ttft: float, e2e: float, tokens: int = 11, error: str | None = None) -> RequestRecord:
    return RequestRecord(start=0.0, ttft=ttft, e2e=e2e, output_tokens=tokens, error=error)


SLO = Slo(ttft_s=1.0, tpot_s=0.1, e2e_s=2.0, min_goodput_pct=90.0)


def test_a_request_is_good_when_it_meets_every_slo() -> None:
    assert broken(rec(0.5, 1.5), SLO) == []  # TPOT (1.5 - 0.5) / 10 = 0.1: at the SLO
    assert broken(rec(1.2, 1.9), SLO) == ["ttft"]
    assert broken(rec(0.5, 2.5), SLO) == ["tpot", "e2e"]  # TPOT 0.2 and E2E 2.5
    assert broken(rec(0.1, 0.1, error="HTTP 500"), SLO) == ["error"]
    assert broken(rec(0.5, 0.6, tokens=1), SLO) == []  # one token: no TPOT to break
    assert broken(rec(1.5, 5.0), Slo(ttft_s=2.0)) == []  # only the SLOs given count


def test_goodput_share_rate_and_the_slo_broken_most() -> None:
    records = [rec(0.5, 1.5)] * 6 + [rec(1.5, 1.9)] * 3 + [rec(0.2, 2.2)]
    g = goodput(records, SLO, wall_s=5.0)
    assert (g.requests, g.good) == (10, 6)
    assert g.share_pct == pytest.approx(60.0) and g.rate == pytest.approx(1.2)
    assert g.broken == {"ttft": 3, "tpot": 1, "e2e": 1}
    assert g.worst() == "ttft" and not g.meets(90.0) and g.meets(60.0)
    assert g.at_pct["ttft"] == pytest.approx(1.5)  # p99 of six 0.5, one 0.2, three 1.5
    assert g.percentiles_met() == {"ttft": False, "tpot": False, "e2e": False}
    doc = g.to_dict()
    assert json.loads(json.dumps(doc)) == doc
    assert doc["goodput_pct"] == 60.0 and doc["goodput_req_s"] == 1.2
    assert doc["at_percentile"]["ttft"] == {"pct": 99.0, "value_s": 1.5, "met": False}


def test_goodput_of_nothing_never_meets() -> None:
    g = goodput([], SLO, wall_s=0.0)
    assert g.share_pct == 0.0 and g.rate == 0.0 and not g.meets(0.0) and g.worst() is None


def test_failure_text_names_level_shares_worst_slo_and_fix() -> None:
    records = [rec(0.5, 1.5)] * 7 + [rec(1.5, 1.9)] * 3
    g = goodput(records, SLO, wall_s=2.0)
    text = failure_text("qwen at http://h:8000", "4 streams", g, 90.0)
    assert text.startswith("qwen at http://h:8000: goodput at 4 streams: 7 of 10 requests (70.0%")
    assert "expected >= 90%" in text
    assert "TTFT broken by 3; most broken: TTFT" in text
    assert "TTFT p99 1.500 s (n=10, SLO 1 s)" in text  # every percentile with its count
    assert "vllm:num_requests_waiting" in text  # the fix for a TTFT that grows with the queue
    failed = goodput([rec(0.1, 0.2, error="HTTP 500")] * 2, SLO, 1.0)
    assert "2 failed; most broken: request errors" in failure_text("s", "1 streams", failed, 90)
