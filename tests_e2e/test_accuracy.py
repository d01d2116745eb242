"""Does the cluster answer correctly? Greedy canaries graded exactly, alone and under load,
a logprob fingerprint against a baseline, and (``--spark-accuracy=math``) a seeded math set.

A cluster can be up, linked, fast and parse-clean and still compute garbage; guided
decoding keeps tool-call and structured-output JSON valid whatever the weights say. These
checks run before every other serving check that reads content: a wrong model is one
failure (the first accuracy check that sees it), and the tool-call, structured-output and
needle checks whose answers break because of it skip citing ``test_canaries_alone``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from pytest_spark import Finding, Settings, SparkCheck, verdict_in_session
from pytest_spark.serving import ServingError
from pytest_spark.serving.validate.accuracy import (
    ALONE_VERDICT,
    FingerprintError,
    check_alone,
    check_fingerprint,
    check_math,
    check_under_load,
)
from pytest_spark.serving.validate.accuracyprobe import AccuracyProbe, BaselineKey, BaselineStore

pytestmark = pytest.mark.accuracy


def _require_requests(
    request: pytest.FixtureRequest, probe: AccuracyProbe, check: SparkCheck
) -> None:
    """A request that broke is not a wrong answer: the wire verdict's skip, or its own
    failure."""
    error = probe.error
    if error is None:
        return
    cited = request.getfixturevalue("wire_cited")(error.kind, f"accuracy canary: {error.message}")
    if cited is not None:
        pytest.skip(cited)
    check.require(error.finding(f"{probe.server}: accuracy canary"))


def _in_session(request: pytest.FixtureRequest) -> Callable[[str], bool]:
    return lambda name: verdict_in_session(request.session, name)


def _skip_if_wrong_alone(request: pytest.FixtureRequest, probe: AccuracyProbe, what: str) -> None:
    if not verdict_in_session(request.session, ALONE_VERDICT):
        return
    if probe.wrong_alone(_in_session(request)):
        pytest.skip(f"{what}: the model answers wrong alone ({ALONE_VERDICT} has the evidence)")
    own, cited = probe.judged(_in_session(request))
    if cited and not any(a.right for a in own):  # no answer of the model's own to go on
        pytest.skip(f"{what}: " + "; ".join(cited))


def test_canaries_alone(
    request: pytest.FixtureRequest,
    accuracy_probe: AccuracyProbe,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    """Every canary the profile expects, one request at a time, greedy: the answer read
    from the content equals the one right answer (arithmetic, counting, copying,
    reversing, sorting, a computed sum in JSON under guided decoding)."""
    if not accuracy_probe.canaries:
        pytest.skip(
            "the profile expects no canary of this model ([accuracy] canaries = []): "
            "the fingerprint alone reads its numbers"
        )
    answers = accuracy_probe.alone()
    spark_check.attach("accuracy_canaries", [a.row() for a in answers])
    spark_check.attach("accuracy_tokens", accuracy_probe.tokens)
    _require_requests(request, accuracy_probe, spark_check)
    own, cited = accuracy_probe.judged(_in_session(request))
    if not own:
        pytest.skip("; ".join(cited))  # every answer is another behaviour's failure
    finding = check_alone(own, accuracy_probe.server, api_only=spark_settings.api_only)
    if cited and finding.ok:
        finding = replace(
            finding, message=f"{finding.message}; judged elsewhere: {'; '.join(cited)}"
        )
    spark_check.require(finding)


def test_canaries_under_load(
    request: pytest.FixtureRequest,
    accuracy_probe: AccuracyProbe,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    """The canaries right alone, sent again with ``concurrency`` requests in flight (at
    least the serve args' --max-num-seqs): every answer equals its single-stream one."""
    _skip_if_wrong_alone(request, accuracy_probe, "under load")
    alone = accuracy_probe.alone()
    _require_requests(request, accuracy_probe, spark_check)  # a broken request, not an answer
    if not any(a.right for a in alone):
        pytest.skip("no canary is answered right alone: nothing to compare under load")
    loaded = accuracy_probe.under_load()
    spark_check.attach(
        "accuracy_under_load",
        {
            "concurrency": accuracy_probe.concurrency,
            "answers": [[a.row() for a in copies] for copies in loaded],
        },
    )
    _require_requests(request, accuracy_probe, spark_check)
    spark_check.require(
        check_under_load(
            alone,
            loaded,
            accuracy_probe.concurrency,
            accuracy_probe.server,
            api_only=spark_settings.api_only,
        )
    )


def test_logprob_fingerprint(
    request: pytest.FixtureRequest,
    accuracy_probe: AccuracyProbe,
    accuracy_baselines: BaselineStore,
    accuracy_key: BaselineKey,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    """The teacher-forced logprobs of a fixed passage against the baseline of the same
    model, serve args and vLLM version: the mean token logprob and the top-1 agreement
    within the profile's tolerance. The first accepted run (every expected canary right)
    records the baseline."""
    section = spark_settings.profile.accuracy
    if not section.fingerprint:
        pytest.skip("the profile reads no fingerprint ([accuracy] fingerprint = false)")
    _skip_if_wrong_alone(request, accuracy_probe, "fingerprint")
    try:
        now = accuracy_probe.fingerprint()
    except FingerprintError as exc:
        pytest.skip(
            f"{exc}: no fingerprint (vLLM serves prompt_logprobs on /v1/completions; set "
            "[accuracy] fingerprint = false for a server that does not)"
        )
    except ServingError as exc:
        cited = request.getfixturevalue("wire_cited")(exc.kind, f"fingerprint: {exc.message}")
        if cited is not None:
            pytest.skip(cited)
        spark_check.require(exc.finding(f"{accuracy_probe.server}: fingerprint completion"))
        return
    try:
        baseline = accuracy_baselines.load(accuracy_key)
    except ValueError as exc:
        spark_check.require(
            Finding.failed(
                None,
                "a fingerprint baseline",
                message=f"{exc}: fix or remove the file (--spark-accuracy-baseline), or give "
                "another path: this run then records its own",
            )
        )
        return
    spark_check.attach(
        "accuracy_fingerprint",
        {
            **now.row(),
            "baseline": None if baseline is None else baseline.fingerprint.row(),
            "baseline_origin": None if baseline is None else baseline.origin,
            "key": accuracy_key.describe(),
        },
    )
    finding = check_fingerprint(
        now,
        baseline,
        max_logprob_delta=section.max_logprob_delta,
        max_top1_delta=section.max_top1_delta,
        server=accuracy_probe.server,
        api_only=spark_settings.api_only,
    )
    if baseline is None:
        accepted = accuracy_probe.error is None and all(a.right for a in accuracy_probe.alone())
        where = accuracy_baselines.save(accuracy_key, now) if accepted else None
        note = (
            f"recorded as the baseline in {where}"
            if where
            else "not recorded: some expected canary was wrong"
            if not accepted
            else "not recorded: --spark-history=off and no --spark-accuracy-baseline"
        )
        finding = Finding.passed(
            finding.measured, None, finding.unit, message=f"{finding.message} ({note})"
        )
    spark_check.require(finding)


def test_math_accuracy(
    request: pytest.FixtureRequest,
    accuracy_probe: AccuracyProbe,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    """``--spark-accuracy=math``: the seeded word problems' accuracy is no more than the
    tolerance below the profile's expected accuracy for the model."""
    if spark_settings.accuracy != "math":
        pytest.skip("the math set is opt-in: --spark-accuracy=math")
    _skip_if_wrong_alone(request, accuracy_probe, "math")
    section = spark_settings.profile.accuracy
    score = accuracy_probe.math()
    spark_check.attach(
        "accuracy_math",
        {
            "right": score.right,
            "total": score.total,
            "accuracy": round(score.accuracy, 4),
            "expected": section.math_expected,
            "tolerance": section.math_tolerance,
        },
    )
    _require_requests(request, accuracy_probe, spark_check)
    spark_check.require(
        check_math(
            score,
            section.math_expected,
            section.math_tolerance,
            accuracy_probe.server,
            api_only=spark_settings.api_only,
        )
    )
