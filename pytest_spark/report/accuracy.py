"""The accuracy block of the JSON results and the report's "Accuracy" section: the canary
table (prompt, expected, the baseline's answer where one was recorded, the answer alone,
the answers under load), the fingerprint against its baseline, the math score against the
expected score. Built from what the accuracy checks attached (tests_e2e/test_accuracy.py).
A canary the baseline answered wrong is judged against that answer (--spark-accuracy=record):
its cell passes when the answer is the recorded one."""

from __future__ import annotations

from typing import Any

from pytest_spark.report.templating import render

KEYS = ("accuracy_canaries", "accuracy_under_load", "accuracy_fingerprint", "accuracy_math")


def accuracy_block(checks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``{canaries: [...], concurrency, fingerprint: {...}, math: {...}, tokens}`` or None
    when no accuracy check attached anything."""
    extra: dict[str, Any] = {}
    for check in checks:
        for key, value in (check.get("extra") or {}).items():
            if key in KEYS or key == "accuracy_tokens":
                extra[key] = value
    if not any(key in extra for key in KEYS):
        return None
    block: dict[str, Any] = {}
    canaries = extra.get("accuracy_canaries") or []
    loaded = extra.get("accuracy_under_load") or {}
    copies = loaded.get("answers") or []
    if canaries:
        rows = []
        for i, row in enumerate(canaries):
            under = copies[i] if i < len(copies) else []
            base = row.get("baseline")
            if isinstance(base, dict) and not base.get("right"):
                # held to a recorded wrong answer: the same read under load is the pass
                same = all(a.get("read") == row.get("read") for a in under)
            else:
                same = all(a.get("right") for a in under)
            rows.append(
                {
                    **row,
                    "under_load": [a.get("read") for a in under],
                    "under_load_right": same if under else None,
                }
            )
        block["canaries"] = rows
    if loaded:
        block["concurrency"] = loaded.get("concurrency")
    if "accuracy_fingerprint" in extra:
        block["fingerprint"] = extra["accuracy_fingerprint"]
    if "accuracy_math" in extra:
        block["math"] = extra["accuracy_math"]
    if "accuracy_tokens" in extra:
        block["tokens_alone"] = extra["accuracy_tokens"]
    return block


def accuracy_html(block: dict[str, Any] | None) -> str:
    """The report's section (templates/accuracy.html); empty without a block."""
    if not block:
        return ""
    canaries = []
    for row in block.get("canaries") or []:
        under = row.get("under_load") or []
        under_ok = row.get("under_load_right")
        base = row.get("baseline")
        if isinstance(base, dict):
            shown = "right" if base.get("right") else f"{base.get('read')!r} (wrong, recorded)"
        else:
            shown = "-"
        canaries.append(
            {
                "kind": row.get("kind"),
                "prompt": row.get("prompt"),
                "expected": row.get("expected"),
                "baseline": shown,
                "answer": row.get("answer") or row.get("error"),
                "verdict": "pass" if row.get("accepted", row.get("right")) else "fail",
                "under": ", ".join(sorted({str(u) for u in under})) if under else "-",
                "under_verdict": "none" if under_ok is None else "pass" if under_ok else "fail",
            }
        )
    recorded = any(isinstance(row.get("baseline"), dict) for row in block.get("canaries") or [])
    fp = block.get("fingerprint")
    if fp:
        base = fp.get("baseline")
        fp = {key: fp.get(key) for key in ("source", "tokens", "mean_logprob", "key")} | {
            "top1_agreement": fp.get("top1_agreement"),
            "versus": (
                f"baseline {base['mean_logprob']:.4f} nats/token, "
                f"top-1 {base['top1_agreement']:.3f} ({fp.get('baseline_origin')})"
                if base
                else "no baseline: this run's is the first"
            ),
        }
    math = block.get("math")
    if math:
        math = {k: math.get(k) for k in ("right", "total", "accuracy", "expected", "tolerance")}
    return render(
        "accuracy.html",
        canaries=canaries,
        recorded=recorded,
        concurrency=block.get("concurrency"),
        fingerprint=fp,
        math=math,
    )
