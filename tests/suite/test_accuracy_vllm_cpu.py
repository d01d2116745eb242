"""The accuracy checks on real vLLM (sparksim's ``vllm-cpu`` engine, SmolLM2-135M): the
healthy model passes twice, the second run against the fingerprint the first recorded;
the same model with noise in the upper half of its layers (``spark-sim fault
model-perturb``: the same files, names, shapes and serve args on every node) is one
failure, the fingerprint's, naming the drift and the likely layer.

Real vLLM on 2 cores takes minutes a launch: skipped without ``scripts/setup-vllm-cpu``
and without SPARK_CI_VLLM_CPU=1, the switch .ci/run reads for real vLLM."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, SuiteRun, launch_args, run_suite, sim_fault  # type: ignore[import-not-found]
from pytest_spark.access.simcontrol import SimCluster, sim_up
from sparksim import engines
from sparksim.netns import SimError

pytestmark = pytest.mark.sim
ACCURACY = str(REPO / "tests_e2e" / "test_accuracy.py")
FINGERPRINT = "tests_e2e/test_accuracy.py::test_logprob_fingerprint"


def _setup_missing() -> str | None:
    if os.environ.get("SPARK_CI_VLLM_CPU") != "1":
        return "real vLLM runs by option: SPARK_CI_VLLM_CPU=1 (minutes a launch on 2 cores)"
    try:
        engines.load_vllm_cpu()
    except SimError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def real_sim() -> Iterator[SimCluster]:
    missing = _setup_missing()
    if missing:
        pytest.skip(f"no real vLLM here: {missing}")
    sim = sim_up(2, ("--engine", "vllm-cpu"))
    try:
        yield sim
    finally:
        sim.down()


def accuracy_run(sim: SimCluster, tmp: Path, baseline: Path, *extra: str) -> SuiteRun:
    return run_suite(
        tmp,
        ACCURACY,
        *launch_args(sim),
        *extra,
        f"--spark-accuracy-baseline={baseline}",
        "--spark-history=off",
        "--spark-ready-timeout=900",
        sim=sim,
        timeout=1500,
        profile="sim-vllm-cpu",
    )


def outcomes(run: SuiteRun) -> dict[str, str]:
    return {c["nodeid"]: c["outcome"] for c in run.results["checks"]}


def test_perturbed_real_model_fails_the_fingerprint_against_a_healthy_baseline(
    real_sim: SimCluster, tmp_path: Path
) -> None:
    baseline = tmp_path / "smollm2-baseline.json"
    sim_fault(real_sim, "clear")
    first = accuracy_run(real_sim, tmp_path / "healthy1", baseline)
    assert first.ret == 0, first.output[-4000:]
    assert baseline.exists(), first.output[-2000:]
    recorded = next(c for c in first.results["checks"] if c["nodeid"] == FINGERPRINT)
    assert "recorded as the baseline" in recorded["message"], recorded

    again = accuracy_run(real_sim, tmp_path / "healthy2", baseline)
    assert again.ret == 0, again.output[-4000:]
    compared = next(c for c in again.results["checks"] if c["nodeid"] == FINGERPRINT)
    assert "within tolerance" in compared["message"], compared

    sim_fault(real_sim, "model-perturb", "--scale", "0.02", "--layers", "upper")
    try:
        perturbed = accuracy_run(real_sim, tmp_path / "perturbed", baseline)
    finally:
        sim_fault(real_sim, "clear")
    failed = [n for n, o in outcomes(perturbed).items() if o in ("failed", "error")]
    assert failed == [FINGERPRINT], perturbed.output[-4000:]
    message = next(c for c in perturbed.results["checks"] if c["nodeid"] == FINGERPRINT)["message"]
    assert "moved from its baseline" in message and "precision or quantization" in message
    drift = perturbed.results["accuracy"]["fingerprint"]
    assert drift["mean_logprob"] < drift["baseline"]["mean_logprob"] - 0.01, drift


ALONE = "tests_e2e/test_accuracy.py::test_canaries_alone"
EVERY_CANARY = (
    "--spark-threshold=accuracy.canaries=add,multiply,arithmetic,count,copy,reverse,sort,json_sum"
)


def test_a_weak_real_model_is_recorded_then_held_to_its_own_answers(
    real_sim: SimCluster, tmp_path: Path
) -> None:
    """Issue #36 part 6: SmolLM2-135M asked every canary answers 7 of 8 wrong, healthy.
    Without a baseline that is one failure naming --spark-accuracy=record and the profile's
    canaries; recorded, the next run passes; with noise in every layer its answers change
    and the same check fails on the drift."""
    baseline = tmp_path / "smollm2-answers.json"
    sim_fault(real_sim, "clear")
    first = accuracy_run(real_sim, tmp_path / "unrecorded", baseline, EVERY_CANARY)
    failed = [n for n, o in outcomes(first).items() if o in ("failed", "error")]
    assert failed == [ALONE], first.output[-4000:]
    said = next(c for c in first.results["checks"] if c["nodeid"] == ALONE)["message"]
    assert "--spark-accuracy=record" in said and "[accuracy] canaries" in said, said
    assert "weaker than the canaries" in said, said

    record = accuracy_run(
        real_sim, tmp_path / "record", baseline, EVERY_CANARY, "--spark-accuracy=record"
    )
    assert record.ret == 0, record.output[-4000:]
    kept = json.loads(baseline.read_text())
    assert len(kept["canaries"]) == 8 and kept["fingerprint"]["tokens"] > 100, kept

    judged = accuracy_run(real_sim, tmp_path / "judged", baseline, EVERY_CANARY)
    assert judged.ret == 0, judged.output[-4000:]
    said = next(c for c in judged.results["checks"] if c["nodeid"] == ALONE)["message"]
    assert "answered wrong as the baseline recorded" in said, said

    sim_fault(real_sim, "model-perturb", "--scale", "0.1", "--layers", "all")
    try:
        drifted = accuracy_run(real_sim, tmp_path / "perturbed", baseline, EVERY_CANARY)
    finally:
        sim_fault(real_sim, "clear")
    failed = [n for n, o in outcomes(drifted).items() if o in ("failed", "error")]
    assert failed == [ALONE], drifted.output[-4000:]
    said = next(c for c in drifted.results["checks"] if c["nodeid"] == ALONE)["message"]
    assert "otherwise than its baseline" in said and "a changed answer is drift" in said, said
