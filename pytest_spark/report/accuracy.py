"""The accuracy block of the JSON results and the report's "Accuracy" section: the canary
table (prompt, expected, the answer alone, the answers under load), the fingerprint
against its baseline, the math score against the expected score. Built from what the
accuracy checks attached (tests_e2e/test_accuracy.py)."""

from __future__ import annotations

from typing import Any

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
            rows.append(
                {
                    **row,
                    "under_load": [a.get("read") for a in under],
                    "under_load_right": all(a.get("right") for a in under) if under else None,
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


def accuracy_html(block: dict[str, Any] | None, esc: Any) -> str:
    """The report's section (``esc`` escapes every value that reaches the page)."""
    if not block:
        return ""
    parts = ["<h3>Accuracy</h3>"]
    rows = block.get("canaries") or []
    if rows:
        concurrency = block.get("concurrency")
        head = f"under load ({esc(concurrency)} in flight)" if concurrency else "under load"
        body = []
        for row in rows:
            verdict = "pass" if row.get("right") else "fail"
            under = row.get("under_load") or []
            under_ok = row.get("under_load_right")
            under_cls = "none" if under_ok is None else "pass" if under_ok else "fail"
            shown = ", ".join(sorted({str(u) for u in under})) if under else "-"
            body.append(
                f"<tr><td>{esc(row.get('kind'))}</td><td>{esc(row.get('prompt'))}</td>"
                f"<td>{esc(row.get('expected'))}</td>"
                f'<td class="spark-{verdict}">{esc(row.get("answer") or row.get("error"))}</td>'
                f'<td class="spark-{under_cls}">{esc(shown)}</td></tr>'
            )
        parts.append(
            '<table id="spark-accuracy" class="spark-table"><tr><th>canary</th><th>prompt</th>'
            f"<th>expected</th><th>answer alone</th><th>{head}</th></tr>{''.join(body)}</table>"
        )
    fp = block.get("fingerprint")
    if fp:
        base = fp.get("baseline")
        versus = (
            f"baseline {base['mean_logprob']:.4f} nats/token, top-1 {base['top1_agreement']:.3f} "
            f"({fp.get('baseline_origin')})"
            if base
            else "no baseline: this run's is the first"
        )
        parts.append(
            f'<p id="spark-fingerprint">Fingerprint ({esc(fp.get("source"))}, '
            f"{esc(fp.get('tokens'))} tokens): mean logprob {esc(fp.get('mean_logprob'))} "
            f"nats/token, top-1 agreement {esc(fp.get('top1_agreement'))}; {esc(versus)}. "
            f"Key: {esc(fp.get('key'))}</p>"
        )
    math = block.get("math")
    if math:
        parts.append(
            f'<p id="spark-math">Math: {esc(math.get("right"))}/{esc(math.get("total"))} = '
            f"{esc(math.get('accuracy'))} against expected {esc(math.get('expected'))} "
            f"&minus; {esc(math.get('tolerance'))}</p>"
        )
    return "".join(parts)
