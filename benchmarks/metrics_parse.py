#!/usr/bin/env python3
"""What reading vLLM's ``/metrics`` with prometheus_client's parser costs, beside the
hand-written line splitter it replaced (issue #16 section 7), on the recorded vLLM 0.32
exposition (``fixtures/vllm/vllm-0.32.0-cpu/metrics_vllm.txt``, 48 KiB, ~560 samples).
Both give the same sums (checked first). The serving checks scrape twice per load level.

    .venv/bin/python benchmarks/metrics_parse.py [--repeats 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_spark.serving.client.wire import parse_metrics  # noqa: E402
from pytest_spark.serving.load.metricsnap import Snapshot  # noqa: E402


def hand_parser(text: str) -> dict[str, float]:
    """The parser before prometheus_client (pytest_spark.serving.client.wire until issue #16)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.partition(" ")
        name = name_part.split("{", 1)[0]
        if "{" in name_part and "}" not in name_part:
            closing = line.find("} ")
            if closing < 0:
                continue
            name, rest = line[: line.find("{")], line[closing + 2 :]
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def median_ms(fn: object, text: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(text)  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    fixture = REPO / "fixtures" / "vllm" / "vllm-0.32.0-cpu" / "metrics_vllm.txt"
    text = fixture.read_text().split("\n\n", 1)[1]
    assert hand_parser(text) == parse_metrics(text), "the parsers disagree"
    old = median_ms(hand_parser, text, args.repeats)
    new = median_ms(parse_metrics, text, args.repeats)
    snap = median_ms(lambda t: Snapshot.of(t, 0.0), text, args.repeats)
    print(f"{'parser':<34}{'median ms':>10}{'x hand':>8}")
    for name, ms in (
        ("hand-written (before)", old),
        ("parse_metrics (prometheus_client)", new),
        ("Snapshot.of (prometheus_client)", snap),
    ):
        print(f"{name:<34}{ms:>10.2f}{ms / old:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
