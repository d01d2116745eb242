"""Does the cluster answer correctly? Greedy canaries graded exactly, alone and under load,
a logprob fingerprint against a baseline, and (``--spark-accuracy=math``) a seeded math set.

``--spark-accuracy=record``, against a server the operator trusts, keeps its canary answers
and fingerprint as the baseline of this head, model, serve args, vLLM and engine; later
runs hold each canary to the truth where the recorded answer was right and to the recorded
answer where it was wrong (a model weaker than the canaries passes as it was; a changed
answer is drift).

A cluster can be up, linked, fast and parse-clean and still compute garbage; guided
decoding keeps tool-call and structured-output JSON valid whatever the weights say. These
checks run before every other serving check that reads content: a wrong model is one
failure (the first accuracy check that sees it), and the tool-call, structured-output and
needle checks whose answers break because of it skip citing ``test_canaries_alone``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace

import pytest

from pytest_spark import Finding, Settings, SparkCheck, verdict_in_session
from pytest_spark.serving import ServingError
from pytest_spark.serving.validate.accuracy import (
    ALONE_VERDICT,
    check_alone,
    check_under_load,
    no_baseline_hint,
)
from pytest_spark.serving.validate.accuracyprobe import (
    AccuracyProbe,
    BaselineKey,
    BaselineNote,
    BaselineStore,
    recorded_answers,
)
from pytest_spark.serving.validate.fingerprint import Baseline, FingerprintError, check_fingerprint
from pytest_spark.serving.validate.mathset import check_math

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


def _load_baseline(
    store: BaselineStore, key: BaselineKey, check: SparkCheck, cited: str | None = None
) -> Baseline | None:
    """The baseline of this key (a note for one of another key left out); a file that is
    not one is this check's failure, or its skip citing ``cited`` (the check that fails on
    it in this session)."""
    try:
        baseline = store.load(key)
    except ValueError as exc:
        if cited is not None:
            pytest.skip(f"{exc} ({cited} has the evidence)")
        check.require(
            Finding.failed(
                None,
                "an accuracy baseline",
                message=f"{exc}: fix or remove the file (--spark-accuracy-baseline), or give "
                "another path; --spark-accuracy=record writes a new one",
            )
        )
        return None
    for line in store.passed_over(key):
        warnings.warn(BaselineNote(line), stacklevel=2)
    return baseline


def test_canaries_alone(
    request: pytest.FixtureRequest,
    accuracy_probe: AccuracyProbe,
    accuracy_baselines: BaselineStore,
    accuracy_key: BaselineKey,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    """Every canary the profile expects, one request at a time, greedy: the answer read
    from the content equals the one right answer (arithmetic, counting, copying,
    reversing, sorting, a computed sum in JSON under guided decoding); where this cluster's
    baseline (--spark-accuracy=record) answered wrong, the answer it recorded."""
    if not accuracy_probe.canaries:
        pytest.skip(
            "the profile expects no canary of this model ([accuracy] canaries = []): "
            "the fingerprint alone reads its numbers"
        )
    recording = spark_settings.accuracy == "record"
    baseline = None if recording else _load_baseline(accuracy_baselines, accuracy_key, spark_check)
    answers = accuracy_probe.alone()
    spark_check.attach("accuracy_canaries", [a.row() for a in answers])
    spark_check.attach("accuracy_tokens", accuracy_probe.tokens)
    _require_requests(request, accuracy_probe, spark_check)
    if recording:
        _record_canaries(accuracy_probe, accuracy_baselines, accuracy_key, spark_check)
        return
    own, cited = accuracy_probe.judged(_in_session(request))
    if not own:
        pytest.skip("; ".join(cited))  # every answer is another behaviour's failure
    hint = None
    if not any(a.recorded is not None for a in own):  # no recorded answer to these questions
        where = accuracy_baselines.where
        hint = no_baseline_hint(
            spark_settings.profile.name,
            tuple(c.kind for c in accuracy_probe.canaries),
            accuracy_key.describe(),
            None if where is None else str(where),
            tuple(a.canary.kind for a in own if a.right),
        )
    finding = check_alone(
        own,
        accuracy_probe.server,
        api_only=spark_settings.api_only,
        origin=None if baseline is None else baseline.origin,
        hint=hint,
    )
    if cited and finding.ok:
        finding = replace(
            finding, message=f"{finding.message}; judged elsewhere: {'; '.join(cited)}"
        )
    spark_check.require(finding)


def _record_canaries(
    probe: AccuracyProbe, store: BaselineStore, key: BaselineKey, check: SparkCheck
) -> None:
    """--spark-accuracy=record: keep the answers as this key's baseline (the fingerprint
    test keeps its fingerprint beside them) and pass, saying what was kept."""
    answers = probe.alone()
    where = store.save(key, canaries=recorded_answers(answers), how="record")
    probe.adopt_own()
    right = [a.canary.kind for a in answers if a.right]
    wrong = [f"{a.canary.kind} ({a.read!r})" for a in answers if not a.right]
    kept = (
        f"recorded as the baseline in {where}"
        if where
        else "not recorded: --spark-history=off and no --spark-accuracy-baseline"
    )
    said = (
        f"{probe.server}: {len(answers)} canary answers {kept} for {key.describe()}: right "
        f"{', '.join(right) or 'none'}; wrong {', '.join(wrong) or 'none'} (later runs expect "
        "these answers again)"
    )
    warnings.warn(BaselineNote(said), stacklevel=2)
    check.require(Finding.passed(len(right), None, "canaries", message=said))


def test_canaries_under_load(
    request: pytest.FixtureRequest,
    accuracy_probe: AccuracyProbe,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    """The canaries right alone, sent again with ``concurrency`` requests in flight (at
    least the serve args' --max-num-seqs): every answer equals its single-stream one."""
    if spark_settings.accuracy == "record":
        accuracy_probe.adopt_own()  # the answers alone are what is recorded: held to them
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
    head, model, serve args, vLLM version and engine: the mean token logprob and the top-1
    agreement within the profile's tolerance. --spark-accuracy=record, or the first
    accepted run (every expected canary right), records the baseline."""
    section = spark_settings.profile.accuracy
    if not section.fingerprint:
        pytest.skip("the profile reads no fingerprint ([accuracy] fingerprint = false)")
    if spark_settings.accuracy == "record":
        accuracy_probe.adopt_own()  # a weak model's wrong answers are what is recorded
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
    recording = spark_settings.accuracy == "record"
    owner = ALONE_VERDICT if accuracy_probe.canaries else None
    if owner is not None and not verdict_in_session(request.session, owner):
        owner = None
    baseline = (
        None if recording else _load_baseline(accuracy_baselines, accuracy_key, spark_check, owner)
    )
    spark_check.attach(
        "accuracy_fingerprint",
        {
            **now.row(),
            "baseline": (
                None
                if baseline is None or baseline.fingerprint is None
                else baseline.fingerprint.row()
            ),
            "baseline_origin": None if baseline is None else baseline.origin,
            "key": accuracy_key.describe(),
        },
    )
    if recording:
        where = accuracy_baselines.save(accuracy_key, now, how="record")
        said = (
            f"{accuracy_probe.server}: fingerprint mean logprob {now.mean_logprob:.4f}, top-1 "
            f"{now.top1_agreement:.3f} over {now.tokens} tokens "
            + (
                f"recorded as the baseline in {where}"
                if where
                else "not recorded: --spark-history=off and no --spark-accuracy-baseline"
            )
            + f" for {accuracy_key.describe()}"
        )
        warnings.warn(BaselineNote(said), stacklevel=2)
        spark_check.require(
            Finding.passed(round(now.mean_logprob, 4), None, "nats/token", message=said)
        )
        return
    finding = check_fingerprint(
        now,
        baseline,
        max_logprob_delta=section.max_logprob_delta,
        max_top1_delta=section.max_top1_delta,
        server=accuracy_probe.server,
        api_only=spark_settings.api_only,
    )
    if baseline is None or baseline.fingerprint is None:
        alone = accuracy_probe.alone()
        accepted = accuracy_probe.error is None and all(a.accepted for a in alone)
        where = None
        if accepted:
            where = accuracy_baselines.save(
                accuracy_key,
                now,
                canaries=recorded_answers(alone) if baseline is None and alone else None,
            )
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
