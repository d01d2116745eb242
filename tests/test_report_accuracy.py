"""The JSON accuracy block and the report's Accuracy section, from what the checks attach."""

from __future__ import annotations

from pytest_spark.report.accuracy import accuracy_block, accuracy_html


def checks() -> list[dict]:  # type: ignore[type-arg]
    canary = {
        "kind": "add",
        "prompt": "What is 19 + 13? <b>",
        "expected": "32",
        "answer": "19 + 13 = 19",
        "read": "19",
        "right": False,
        "tokens": 7,
        "error": None,
    }
    right = {**canary, "kind": "copy", "answer": "x", "read": "x", "right": True}
    return [
        {"extra": {"accuracy_canaries": [canary, right], "accuracy_tokens": 14}},
        {
            "extra": {
                "accuracy_under_load": {
                    "concurrency": 8,
                    "answers": [[], [{"read": "x", "right": True}, {"read": "y", "right": False}]],
                }
            }
        },
        {
            "extra": {
                "accuracy_fingerprint": {
                    "mean_logprob": -1.2,
                    "top1_agreement": 0.7,
                    "tokens": 151,
                    "source": "prompt_logprobs",
                    "baseline": {"mean_logprob": -1.0, "top1_agreement": 0.71},
                    "baseline_origin": "the history, recorded 2026-12-03",
                    "key": "qwen, vLLM 0.32.0",
                }
            }
        },
        {"extra": {"accuracy_math": {"right": 40, "total": 50, "accuracy": 0.8}}},
        {"extra": {"busbw_series": []}},
    ]


def test_block_joins_alone_and_under_load_per_canary() -> None:
    block = accuracy_block(checks())
    assert block is not None
    add, copy = block["canaries"]
    assert add["under_load"] == [] and add["under_load_right"] is None
    assert copy["under_load"] == ["x", "y"] and copy["under_load_right"] is False
    assert block["concurrency"] == 8 and block["tokens_alone"] == 14
    assert block["fingerprint"]["baseline"]["mean_logprob"] == -1.0
    assert block["math"]["right"] == 40
    assert accuracy_block([{"extra": {"busbw_series": []}}]) is None


def test_section_escapes_and_shows_the_verdicts() -> None:
    html = accuracy_html(accuracy_block(checks()))
    assert "<h3>Accuracy</h3>" in html and 'id="spark-accuracy"' in html
    assert "What is 19 + 13? &lt;b&gt;" in html and "13? <b>" not in html
    assert 'class="spark-fail">19 + 13 = 19<' in html
    assert "under load (8 in flight)" in html
    assert "baseline -1.0000 nats/token" in html and "40/50" in html
    assert accuracy_html(None) == ""


def test_the_report_and_the_json_read_the_same_document(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The HTML section is built from the recorder's document, as the JSON is (it was
    only in the JSON's generate hook: the report showed no Accuracy section)."""
    from pytest_spark.report.results import ResultsRecorder

    recorder = ResultsRecorder.__new__(ResultsRecorder)
    recorder.checks = {str(i): c for i, c in enumerate(checks())}
    recorder.cluster_info = {}
    import time
    from datetime import UTC, datetime

    recorder.started, recorder._t0 = datetime.now(UTC), time.monotonic()
    assert recorder.document()["accuracy"]["concurrency"] == 8


def test_a_recorded_wrong_answer_is_shown_and_judged_against_the_baseline() -> None:
    """--spark-accuracy=record: a canary the baseline answered wrong passes when it reads
    the recorded answer again, alone and under load; the table shows the baseline column."""
    held = {
        "kind": "add",
        "prompt": "What is 19 + 13?",
        "expected": "32",
        "answer": "19 + 13 = 22",
        "read": "22",
        "right": False,
        "baseline": {"read": "22", "right": False},
        "accepted": True,
    }
    drift = {**held, "kind": "sort", "read": "23", "answer": "23", "accepted": False}
    loaded = {"concurrency": 4, "answers": [[{"read": "22", "right": False}], []]}
    attached = [{"extra": {"accuracy_canaries": [held, drift], "accuracy_under_load": loaded}}]
    block = accuracy_block(attached)
    assert block is not None and block["canaries"][0]["under_load_right"] is True
    html = accuracy_html(block)
    assert "<th>baseline</th>" in html and "&#39;22&#39; (wrong, recorded)" in html
    assert 'class="spark-pass">19 + 13 = 22<' in html and 'class="spark-fail">23<' in html
    assert "<th>baseline</th>" not in accuracy_html(accuracy_block(checks()))
