"""The accuracy checks' pure parts: the canaries and their grading, the fingerprint read
from both wire forms, the findings' messages, the baseline store, the profile's section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_spark.serving.validate.accuracy import Answer, canaries, check_alone, check_under_load
from pytest_spark.serving.validate.accuracyprobe import (
    BaselineKey,
    BaselineStore,
    computing_args,
    expected_canaries,
    load_concurrency,
)
from pytest_spark.serving.validate.fingerprint import (
    Baseline,
    Fingerprint,
    FingerprintError,
    check_fingerprint,
    fingerprint_of,
)
from pytest_spark.serving.validate.mathset import MathScore, check_math, math_problems
from pytest_spark.settings.profiles import ProfileError, load_profile
from pytest_spark.settings.sections import CANARY_KINDS, AccuracySection

SERVER = "qwen at http://198.18.0.1:8000"


def by_kind(kind: str):  # type: ignore[no-untyped-def]
    return next(c for c in canaries() if c.kind == kind)


def test_the_built_in_set_is_fixed_and_covers_every_kind() -> None:
    assert [c.kind for c in canaries()] == list(CANARY_KINDS)
    assert canaries() == canaries()  # every run asks the same questions
    assert canaries(seed=1) != canaries()
    assert sum(c.max_tokens for c in canaries()) <= 200  # the quick budget counts tokens


@pytest.mark.parametrize(
    ("kind", "content", "right"),
    [
        ("add", "{expected}", True),
        ("add", "The answer is {expected}.", True),
        ("add", "12 + 7 = 12", False),
        ("arithmetic", "{expected_commas}", True),
        ("count", "{expected}", True),
        ("count", "1, 2, 3", False),
        ("sort", "{expected_commas_list}", True),
        ("copy", "`{expected}`", True),
        ("copy", "{expected}x", False),
        ("reverse", "The reversed string is: {expected}", True),
        ("json_sum", '{{"sum": {expected}}}', True),
        ("json_sum", '{{"sum": "{expected}"}}', False),  # a string is not the integer
        ("json_sum", "{expected}", False),  # no JSON
    ],
)
def test_grading_reads_the_answer_not_the_phrasing(kind: str, content: str, right: bool) -> None:
    canary = by_kind(kind)
    expected = canary.expected
    text = content.format(
        expected=expected,
        expected_commas=f"{int(expected):,}" if expected.isdigit() else expected,
        expected_commas_list=", ".join(expected.split()),
    )
    assert canary.grade(text)[0] is right, text


def answers(right: bool, content: str = "12 + 7 = 12") -> list[Answer]:
    out = []
    for canary in canaries(("add", "count")):
        text = canary.expected if right else content
        ok, read = canary.grade(text)
        out.append(Answer(canary, text, ok, read, tokens=3))
    return out


def test_a_wrong_answer_quotes_prompt_answer_expected_and_the_layer() -> None:
    finding = check_alone(answers(False), SERVER)
    assert not finding.ok
    add = by_kind("add")
    assert add.prompt in finding.message
    assert "'12 + 7 = 12'" in finding.message
    assert f"expected {add.expected!r}" in finding.message
    assert "wrong when alone" in finding.message and "--enforce-eager" in finding.message
    assert "TP=1" in finding.message and "image and vLLM" in finding.message
    assert check_alone(answers(True), SERVER).ok


CLUSTER_WORDS = ("tensor-parallel", "TP=1", "CUDA graphs", "every node", "across nodes")


def test_api_only_advice_is_the_servers_not_the_clusters() -> None:
    """Issue #25: with --spark-api-url alone there is no cluster; the advice of a wrong
    model, of wrong answers under load, of a drifted fingerprint and of low math accuracy
    names what the server's operator can change (its model, quantization and kernels,
    chat template, speculative decoding), never ranks, nodes or image parity."""
    alone = answers(True)
    wrong = answers(False)
    base = Fingerprint(-2.0, 0.7, 150, "prompt_logprobs")
    score = MathScore(10, 50, [(math_problems(1)[0], "7")])
    findings = {
        "alone": check_alone(wrong, SERVER, api_only=True),
        "under load": check_under_load(
            alone, [[alone[0], wrong[0]], [alone[1]]], 4, SERVER, api_only=True
        ),
        "drift": check_fingerprint(
            Fingerprint(-2.2, 0.6, 150, "x"),
            Baseline(base, "h"),
            max_logprob_delta=0.05,
            max_top1_delta=0.03,
            server=SERVER,
            api_only=True,
        ),
        "math": check_math(score, 0.9, 0.08, SERVER, api_only=True),
    }
    for where, finding in findings.items():
        assert not finding.ok, where
        for word in CLUSTER_WORDS:
            assert word not in finding.message, (where, word, finding.message)
    said = findings["alone"].message
    for phrase in ("/v1/models", "quantization", "chat template", "speculative decoding"):
        assert phrase in said, said
    assert "speculative decoding" in findings["under load"].message
    assert "quantization" in findings["drift"].message
    assert "chat template" in findings["math"].message
    # the cluster's advice is unchanged where there is a cluster
    assert "tensor-parallel" in check_alone(wrong, SERVER).message


def test_under_load_compares_with_the_single_stream_answers() -> None:
    alone = answers(True)
    same = [[a, a] for a in alone]
    assert check_under_load(alone, same, 4, SERVER).ok
    wrong = answers(False)
    broken = [[alone[0], wrong[0]], [alone[1]]]
    finding = check_under_load(alone, broken, 4, SERVER)
    assert not finding.ok
    assert "right alone and wrong under load" in finding.message
    assert "4 requests in flight" in finding.message and "CUDA graphs" in finding.message
    # a canary wrong alone is the alone check's: under load does not count it twice
    assert check_under_load(wrong, [[w] for w in wrong], 4, SERVER).ok


def prompt_logprobs_answer() -> dict:  # type: ignore[type-arg]
    return {
        "choices": [
            {
                "text": " The",
                "prompt_logprobs": [
                    None,
                    {"791": {"logprob": -1.5, "rank": 1, "decoded_token": " river"}},
                    {
                        "11": {"logprob": -3.0, "rank": 4, "decoded_token": " runs"},
                        "12": {"logprob": -0.5, "rank": 1, "decoded_token": " flows"},
                    },
                    {"13": {"logprob": float("-inf"), "rank": 1, "decoded_token": " x"}},
                ],
            }
        ]
    }


def test_fingerprint_from_vllm_prompt_logprobs() -> None:
    fp = fingerprint_of(prompt_logprobs_answer())
    assert fp.source == "prompt_logprobs" and fp.tokens == 3
    assert fp.mean_logprob == pytest.approx((-1.5 - 3.0 - 100.0) / 3)  # the token's own
    assert fp.top1_agreement == pytest.approx(2 / 3)


def test_fingerprint_from_echo_logprobs() -> None:
    data = {
        "usage": {"prompt_tokens": 3},
        "choices": [
            {
                "logprobs": {
                    "tokens": ["The", " river", " runs", " X"],
                    "token_logprobs": [None, -1.0, -2.0, -9.0],
                    "top_logprobs": [None, {" river": -1.0}, {" flows": -0.4, " runs": -2.0}, {}],
                }
            }
        ],
    }
    fp = fingerprint_of(data)
    assert fp.source == "echo" and fp.tokens == 2  # the answer token is not the passage
    assert fp.mean_logprob == pytest.approx(-1.5) and fp.top1_agreement == pytest.approx(0.5)


def test_no_logprobs_is_said() -> None:
    with pytest.raises(FingerprintError, match="no prompt logprobs"):
        fingerprint_of({"choices": [{"text": "x", "logprobs": None}]})


def test_fingerprint_against_its_baseline() -> None:
    base = Fingerprint(-2.0, 0.7, 150, "prompt_logprobs")
    kw = {"max_logprob_delta": 0.05, "max_top1_delta": 0.03, "server": SERVER}
    assert check_fingerprint(Fingerprint(-2.01, 0.69, 150, "echo"), Baseline(base, "h"), **kw).ok
    drift = check_fingerprint(Fingerprint(-2.2, 0.6, 150, "x"), Baseline(base, "run 3"), **kw)
    assert not drift.ok
    assert "-0.2000 nats/token" in drift.message and "baseline (run 3)" in drift.message
    assert "precision or quantization" in drift.message
    other = check_fingerprint(Fingerprint(-3.0, 0.6, 149, "x"), Baseline(base, "h"), **kw)
    assert "another tokenizer" in other.message
    first = check_fingerprint(Fingerprint(-2.0, 0.7, 150, "x"), None, **kw)
    assert first.ok and "no baseline yet" in first.message


def test_math_floor_is_expected_less_tolerance_and_the_baseline() -> None:
    problems = math_problems(50)
    assert len({p.question for p in problems}) > 40 and all(p.answer > 0 for p in problems)
    score = MathScore(42, 50, [(problems[0], "7")])
    assert check_math(score, 0.9, 0.08, SERVER).ok  # 0.84 >= 0.82
    low = check_math(score, 0.95, 0.08, SERVER)
    assert not low.ok and "42/50" in low.message and problems[0].question in low.message
    assert not check_math(score, 0.5, 0.08, SERVER, baseline=0.96).ok


def key_of(**changes: str) -> BaselineKey:
    facts = {
        "head": "10.1.230.180",
        "model": "qwen",
        "serve_args": "vllm serve /m --tp 2",
        "version": "0.32.0",
        "engine": "vllm (uvicorn)",
    }
    return BaselineKey(**{**facts, **changes})


def test_baseline_store_history_and_pinned(tmp_path: Path) -> None:
    key = key_of()
    other = key_of(serve_args="vllm serve /m --tp 1")
    fp = Fingerprint(-2.0, 0.7, 150, "prompt_logprobs")
    history = BaselineStore(None, tmp_path / "hist")
    assert history.load(key) is None
    assert history.save(key, fp) == tmp_path / "hist" / "accuracy-baselines.json"
    loaded = history.load(key)
    assert loaded is not None and loaded.fingerprint == fp and "the history" in loaded.origin
    assert loaded.canaries is None  # a fingerprint alone: no answers recorded
    assert history.load(other) is None  # another serve line: another baseline
    pinned = BaselineStore(tmp_path / "tp1.json", tmp_path / "hist")
    assert pinned.load(other) is None
    pinned.save(other, fp)
    assert pinned.load(key) is not None  # a pinned file is compared whatever the key
    said = pinned.passed_over(key)
    assert len(said) == 1 and "serve args vllm serve /m --tp 1 (this run: " in said[0], said
    assert BaselineStore(None, None).save(key, fp) is None  # --spark-history=off
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nothing": 1}))
    with pytest.raises(ValueError, match="not an accuracy baseline"):
        BaselineStore(bad, None).load(key)


def test_profile_section_and_concurrency() -> None:
    spark = load_profile("dgx-spark-2node").accuracy
    assert set(spark.canaries) == set(CANARY_KINDS)
    assert spark.budget_tokens == 1800 and spark.math_tolerance == 0.08
    assert load_concurrency(spark, None) == 8
    assert load_concurrency(spark, 64) == 64  # at least --max-num-seqs
    assert load_concurrency(spark, 1024) == 256  # capped
    some = load_profile("sim").with_overrides({"accuracy.canaries": "add;copy"}).accuracy
    assert [c.kind for c in expected_canaries(some)] == ["add", "copy"]
    with pytest.raises(ValueError, match="not a built-in canary"):
        expected_canaries(AccuracySection(canaries=("add", "poem")))


def test_a_profile_canaries_list_must_hold_names(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('extends = "sim"\n[accuracy]\ncanaries = [1, 2]\n')
    with pytest.raises(ProfileError, match=r"canaries = \[1, 2\].*a list of names"):
        load_profile(str(path))
    path.write_text('extends = "sim"\n[accuracy]\ncanaries = []\n')
    assert load_profile(str(path)).accuracy.canaries == ()


def test_the_baseline_key_ignores_where_the_server_listens() -> None:
    a = "vllm serve /m --tensor-parallel-size 2 --host 0.0.0.0 --port 8000 --node-rank 0"
    b = "vllm serve /m --tensor-parallel-size 2 --port=9000 --master-addr 198.19.0.1"
    assert computing_args(a) == computing_args(b) == "vllm serve /m --tensor-parallel-size 2"
    assert computing_args("vllm serve /m --dtype float16") != computing_args(a)
