"""Accuracy for any model (issue #36 part 6): ``--spark-accuracy=record`` keeps a trusted
server's canary answers and fingerprint as the baseline of its head, model, serve args,
vLLM and engine; later runs hold each canary to the truth where the baseline was right and
to the recorded answer where it was wrong, so a weak model passes as it was and a changed
answer is drift. Without a baseline a wrong answer says how to tell a weak model from a
broken one. A baseline of another cluster is left out, with a note. A model that echoes the
prompt does not pass the ``copy`` canary.

The pure parts with made-up answers; the whole path (the plugin, the options, the suite's
module, the store) against a small fake vLLM on 127.0.0.1 that answers as a weak model, an
echoing model or a changed one, in a pytest subprocess as a user runs it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving.validate.accuracy import (
    Answer,
    Canary,
    canaries,
    check_alone,
    check_under_load,
    no_baseline_hint,
)
from pytest_spark.serving.validate.accuracyprobe import (
    BaselineKey,
    BaselineStore,
    baseline_key,
    recorded_answers,
)
from pytest_spark.serving.validate.fingerprint import Baseline, Fingerprint

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "fixtures" / "vllm" / "vllm-0.32.0-cpu"
SERVER = "weak at http://127.0.0.1:8000"
RIGHT_KINDS = ("count", "copy")  # what the made-up weak model answers right


def wrong_answer(canary: Canary, salt: int = 0) -> str:
    """A weak model's own wrong answer: the same shape, another value."""
    if canary.kind == "json_sum":
        return json.dumps({"sum": int(canary.expected) + 1 + salt})
    if canary.kind in ("add", "multiply", "arithmetic"):
        return str(int(canary.expected) + 1 + salt)
    if canary.kind == "sort":
        numbers = list(reversed(canary.expected.split()))
        return ", ".join(numbers[salt:] + numbers[:salt])
    if canary.kind == "reverse":
        return canary.expected[::-1] + "x" * salt
    return "x" * (1 + salt)


def weak(prompt: str, changed: str | None = None) -> str:
    """What the made-up weak model says: right on RIGHT_KINDS, its own wrong answer on the
    others; ``changed``: that canary's answer differs (a right one turns wrong, a wrong one
    is wrong otherwise)."""
    canary = next(c for c in canaries() if c.prompt == prompt)
    if canary.kind == changed:
        return wrong_answer(canary, salt=1)
    return canary.expected if canary.kind in RIGHT_KINDS else wrong_answer(canary)


def answer(canary: Canary, content: str, baseline: Baseline | None = None) -> Answer:
    right, read = canary.grade(content)
    recorded = baseline.recorded(canary) if baseline else None
    return Answer(canary, content, right, read, tokens=3, recorded=recorded)


def ask(say: Callable[[str], str], baseline: Baseline | None = None) -> list[Answer]:
    return [answer(c, say(c.prompt), baseline) for c in canaries()]


def key_of(**changes: str) -> BaselineKey:
    facts = {
        "head": "10.1.230.180",
        "model": "qwen3.5-122b",
        "serve_args": "vllm serve /models/qwen --tensor-parallel-size 2",
        "version": "0.32.0",
        "engine": "vllm (uvicorn)",
    }
    return BaselineKey(**{**facts, **changes})


def recorded_baseline(tmp_path: Path, key: BaselineKey, say: Callable[[str], str]) -> Baseline:
    store = BaselineStore(None, tmp_path)
    store.save(key, canaries=recorded_answers(ask(say)), how="record")
    got = store.load(key)
    assert got is not None and got.canaries is not None
    return got


# ---- the pure parts ----------------------------------------------------------------


def test_a_weak_model_without_a_baseline_says_how_to_tell_it_from_a_broken_one() -> None:
    hint = no_baseline_hint(
        "dgx-spark-2node", ("add", "copy"), key_of().describe(), "/x/.spark-history/f.json"
    )
    finding = check_alone(ask(weak), SERVER, hint=hint)
    assert not finding.ok and finding.measured == len(RIGHT_KINDS)
    said = finding.message
    assert "answers wrong: 6 of 8 canaries" in said
    for phrase in (
        "--spark-accuracy=record",
        "A model weaker than the canaries is expected to fail some of them",
        "[accuracy] canaries (profile dgx-spark-2node: add, copy",
        "no baseline of this model's answers for head 10.1.230.180, model qwen3.5-122b",
        "in /x/.spark-history/f.json",
        "If this model should answer them, likely layer: wrong when alone",
    ):
        assert phrase in said, (phrase, said)
    off = no_baseline_hint("p", ("add",), key_of().describe(), None)
    assert "--spark-history=off" in off and "--spark-accuracy=record" in off


def test_record_then_judge_holds_wrong_canaries_to_the_recorded_answer(tmp_path: Path) -> None:
    baseline = recorded_baseline(tmp_path, key_of(), weak)
    again = check_alone(ask(weak, baseline), SERVER, origin=baseline.origin)
    assert again.ok, again.message
    assert again.measured == 8 and "2/8 canaries answered right" in again.message
    assert "6 answered wrong as the baseline recorded (the history, recorded " in again.message
    assert "add, multiply, arithmetic, reverse, sort, json_sum" in again.message


def test_a_changed_wrong_answer_is_drift_naming_canary_measured_expected_fix(
    tmp_path: Path,
) -> None:
    baseline = recorded_baseline(tmp_path, key_of(), weak)
    add = next(c for c in canaries() if c.kind == "add")
    was, now = wrong_answer(add), wrong_answer(add, salt=1)
    finding = check_alone(
        ask(lambda p: weak(p, changed="add"), baseline), SERVER, origin=baseline.origin
    )
    assert not finding.ok and finding.measured == 7 and finding.expected == 8
    said = finding.message
    assert "answers 1 of 8 canaries otherwise than its baseline (the history" in said
    assert f"  - add: {add.prompt!r} -> {now!r} (read {now!r}); expected {was!r}, " in said
    assert f"the baseline's own answer (wrong: the truth is {add.expected!r})" in said
    assert "a changed answer is drift" in said
    assert "Likely layer: wrong when alone" in said and "--enforce-eager" in said
    assert "record again with --spark-accuracy=record" in said
    # a wrong answer that turns right changed too: the numbers moved
    fixed = ask(lambda p: add.expected if p == add.prompt else weak(p), baseline)
    turned = check_alone(fixed, SERVER, origin=baseline.origin)
    assert not turned.ok and "(now right); expected" in turned.message


def test_a_right_canary_stays_held_to_the_truth(tmp_path: Path) -> None:
    baseline = recorded_baseline(tmp_path, key_of(), weak)
    finding = check_alone(
        ask(lambda p: weak(p, changed="copy"), baseline), SERVER, origin=baseline.origin
    )
    assert not finding.ok
    copy = next(c for c in canaries() if c.kind == "copy")
    assert f"expected {copy.expected!r} (the baseline answered it right)" in finding.message
    assert "1 of 8 canaries otherwise than its baseline" in finding.message


def test_under_load_holds_recorded_wrong_answers_to_their_single_stream_read(
    tmp_path: Path,
) -> None:
    baseline = recorded_baseline(tmp_path, key_of(), weak)
    alone = ask(weak, baseline)
    assert check_under_load(alone, [[a, a] for a in alone], 4, SERVER).ok
    other = ask(lambda p: weak(p, changed="sort"), baseline)
    loaded = [[a, b] for a, b in zip(alone, other, strict=True)]
    finding = check_under_load(alone, loaded, 4, SERVER)
    assert not finding.ok and "  - sort: alone " in finding.message


def test_an_echoing_model_fails_copy() -> None:
    """It ends with the string, so its last word was the answer: the copy canary passed
    (1 of 8 for a model that only repeats the question)."""
    echoed = ask(lambda prompt: prompt)
    assert [a.canary.kind for a in echoed if a.right] == []
    copy = next(a for a in echoed if a.canary.kind == "copy")
    assert copy.read == copy.canary.prompt  # the whole answer, not its last word
    assert copy.canary.prompt.split()[-1] == copy.canary.expected  # what the old grader read
    for content in ("{e}", "{e}.", "`{e}`", '"{e}"', "```\n{e}\n```", " {e} \n"):
        text = content.format(e=copy.canary.expected)
        assert copy.canary.grade(text)[0], text
    assert not copy.canary.grade(f"Sure! {copy.canary.expected}")[0]


def test_a_baseline_of_another_cluster_is_left_out_with_a_note(tmp_path: Path) -> None:
    """The checkout's own history held a sparksim fingerprint keyed by the model name alone
    (qwen3.5-122b): a real cluster serving a model of that name was compared with it."""
    store = BaselineStore(None, tmp_path)
    fp = Fingerprint(-2.0, 0.7, 150, "prompt_logprobs")
    sim = key_of(head="198.18.0.10")
    store.save(sim, fp, canaries=recorded_answers(ask(weak)))
    real = key_of()
    assert store.load(real) is None
    said = store.passed_over(real)
    assert len(said) == 1
    assert "is not used: head 198.18.0.10 (this run: 10.1.230.180)" in said[0], said
    for change, words in (
        ({"model": "qwen2.5-coder-0.5b"}, "model qwen3.5-122b (this run: qwen2.5-coder-0.5b)"),
        ({"engine": "sglang (uvicorn)"}, "engine vllm (uvicorn) (this run: sglang (uvicorn))"),
        ({"version": "0.33.0"}, "vLLM 0.32.0 (this run: 0.33.0)"),
    ):
        other = key_of(head="198.18.0.10", **change)
        assert store.load(other) is None
        assert words in store.passed_over(other)[0]
    assert store.load(sim) is not None and store.passed_over(sim) == []
    for n in range(5):  # many: the first few named, the rest counted
        store.save(key_of(head=f"198.18.{n + 1}.10"), fp)
    said = store.passed_over(real)
    assert len(said) == 4 and said[-1].startswith("3 more baselines in "), said
    # an entry from before the head and engine were kept: never this run's
    legacy = {"0123456789abcdef": {"fingerprint": fp.row(), "model": "qwen3.5-122b"}}
    (tmp_path / "accuracy-baselines.json").write_text(json.dumps(legacy))
    assert store.load(real) is None
    assert "head ? (this run: 10.1.230.180)" in store.passed_over(real)[0]


def test_record_replaces_each_part_and_keeps_the_other(tmp_path: Path) -> None:
    """The canaries and the fingerprint are kept by two checks (two xdist workers, maybe, in
    either order): each replaces its own part of the key's entry."""
    store = BaselineStore(None, tmp_path)
    key = key_of()
    old = Fingerprint(-2.5, 0.6, 150, "echo")
    store.save(key, old, canaries=recorded_answers(ask(lambda p: p)))
    new = Fingerprint(-2.0, 0.7, 150, "prompt_logprobs")
    store.save(key, new, how="record")
    store.save(key, canaries=recorded_answers(ask(weak)), how="record")
    got = store.load(key)
    assert got is not None and got.fingerprint == new and got.canaries is not None
    assert sum(r.right for r in got.canaries) == len(RIGHT_KINDS)  # the echo's are gone
    assert "by record on 10.1.230.180" in got.origin


# ---- a fake vLLM, and the suite against it ------------------------------------------


class FakeVllm(ThreadingHTTPServer):
    """A small OpenAI-compatible server that answers the canaries by ``say`` and serves
    real vLLM's recorded prompt logprobs; ``/v1/models``, ``/version`` and a ``Server``
    header as vLLM's."""

    daemon_threads = True
    say: Callable[[str], str] = staticmethod(weak)
    model = "weak"


class _Handler(BaseHTTPRequestHandler):
    server: FakeVllm
    server_version = "uvicorn"
    sys_version = ""

    def _json(self, status: int, data: Any) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            entry = {"id": self.server.model, "object": "model", "owned_by": "vllm"}
            self._json(200, {"object": "list", "data": [entry | {"root": "/models/weak"}]})
        elif self.path == "/version":
            self._json(200, {"version": "0.32.0"})
        elif self.path == "/health":
            self._json(200, {})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        if self.path == "/v1/chat/completions":
            prompt = body["messages"][-1]["content"]
            try:
                content = self.server.say(prompt)
            except StopIteration:  # not a canary: any short answer
                content = "OK"
            message = {"role": "assistant", "content": content}
            usage = {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            self._json(200, {"object": "chat.completion", "choices": [choice], "usage": usage})
        elif self.path == "/v1/completions":
            self._json(200, json.loads((RECORDED / "completions_prompt_logprobs.json").read_text()))
        else:
            self._json(404, {"detail": "Not Found"})

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[FakeVllm]:
    server = FakeVllm(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def url(server: FakeVllm) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_the_key_is_what_the_server_reports(fake: FakeVllm) -> None:
    api = ApiEndpoint(url(fake), "weak", None, 5.0, "0.32.0", None, "/models/weak")
    line = "vllm serve /models/weak --host 0.0.0.0 --port 8000 --tensor-parallel-size 2"
    key = baseline_key(api, "10.1.230.180", line)
    assert key == BaselineKey(
        "10.1.230.180",
        "weak (/models/weak)",
        "vllm serve /models/weak --tensor-parallel-size 2",
        "0.32.0",
        "vllm (uvicorn)",
    )
    secret = ApiEndpoint(f"http://u:pw@127.0.0.1:{fake.server_address[1]}", "weak")
    assert baseline_key(secret, None, None).head == f"api 127.0.0.1:{fake.server_address[1]}"
    gone = ApiEndpoint("http://127.0.0.1:9", "weak", None, 1.0)
    assert baseline_key(gone, "h", None).engine == ""  # nothing said: nothing kept


def run_accuracy(server: FakeVllm, tmp: Path, *extra: str) -> tuple[int, str, dict[str, Any]]:
    """``pytest tests_e2e/test_accuracy.py --spark-api-url=URL`` as a user runs it, the
    history in ``tmp``; exit code, output and the JSON results' checks by test name."""
    results = tmp / f"results-{len(list(tmp.glob('results-*')))}.json"
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "tests_e2e/test_accuracy.py",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        f"--spark-api-url={url(server)}",
        "--spark-http-timeout=5",
        f"--spark-results={results}",
        f"--spark-history={tmp / 'history'}",
        "--rootdir",
        str(REPO),
        "-c",
        str(REPO / "pyproject.toml"),
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    data = json.loads(results.read_text()) if results.exists() else {"checks": []}
    checks = {c["nodeid"].split("::", 1)[1]: c for c in data["checks"]}
    return proc.returncode, proc.stdout + proc.stderr, checks


def failed(checks: dict[str, Any]) -> list[str]:
    return [name for name, c in checks.items() if c["outcome"] in ("failed", "error")]


def test_a_weak_model_recorded_then_judged_through_the_suite(
    fake: FakeVllm, tmp_path: Path
) -> None:
    """Before a baseline: one failure that names the record step and the canaries list.
    Recorded: passes, saying what it kept. Judged: passes. One answer changed: one failure,
    that canary's drift."""
    ret, out, checks = run_accuracy(fake, tmp_path)
    assert ret == 1 and failed(checks) == ["test_canaries_alone"], out[-3000:]
    said = checks["test_canaries_alone"]["message"]
    assert "6 of 8 canaries" in said and "--spark-accuracy=record" in said, said
    assert "[accuracy] canaries" in said and "weaker than the canaries" in said, said
    assert "fingerprint" not in failed(checks)

    ret, out, checks = run_accuracy(fake, tmp_path, "--spark-accuracy=record")
    assert ret == 0, out[-3000:]
    alone = checks["test_canaries_alone"]
    assert alone["outcome"] == "passed" and "recorded as the baseline in" in alone["message"]
    assert "wrong add ('" in alone["message"], alone["message"]
    assert any("recorded as the baseline" in n for n in alone.get("notes", [])), alone
    fp = checks["test_logprob_fingerprint"]
    assert fp["outcome"] == "passed" and "recorded as the baseline" in fp["message"], fp
    assert checks["test_canaries_under_load"]["outcome"] == "passed", checks
    stored = json.loads((tmp_path / "history" / "accuracy-baselines.json").read_text())
    (entry,) = stored.values()
    assert entry["head"] == f"api 127.0.0.1:{fake.server_address[1]}"
    assert (entry["model"], entry["vllm"], entry["engine"]) == (
        "weak (/models/weak)",
        "0.32.0",
        "vllm (uvicorn)",
    )
    assert entry["fingerprint"]["tokens"] == 153 and len(entry["canaries"]) == 8

    ret, out, checks = run_accuracy(fake, tmp_path)
    assert ret == 0, out[-3000:]
    assert "6 answered wrong as the baseline recorded" in checks["test_canaries_alone"]["message"]
    assert "within tolerance" in checks["test_logprob_fingerprint"]["message"]

    fake.say = staticmethod(lambda p: weak(p, changed="sort"))
    ret, out, checks = run_accuracy(fake, tmp_path)
    assert ret == 1 and failed(checks) == ["test_canaries_alone"], out[-3000:]
    said = checks["test_canaries_alone"]["message"]
    assert "1 of 8 canaries otherwise than its baseline" in said and "  - sort: " in said, said


def test_an_echoing_model_fails_copy_through_the_suite(fake: FakeVllm, tmp_path: Path) -> None:
    fake.say = staticmethod(lambda p: p)
    ret, out, checks = run_accuracy(fake, tmp_path, "--spark-threshold=accuracy.canaries=copy")
    assert ret == 1 and failed(checks) == ["test_canaries_alone"], out[-3000:]
    said = checks["test_canaries_alone"]["message"]
    assert "answers wrong: 1 of 1 canaries" in said and "  - copy: " in said, said


def test_a_baseline_file_that_is_not_one_is_one_failure(fake: FakeVllm, tmp_path: Path) -> None:
    bad = tmp_path / "baseline.json"
    bad.write_text("[1, 2]")
    ret, out, checks = run_accuracy(fake, tmp_path, f"--spark-accuracy-baseline={bad}")
    assert ret == 1 and failed(checks) == ["test_canaries_alone"], out[-3000:]
    assert "not an accuracy baseline" in checks["test_canaries_alone"]["message"]
    skipped = checks["test_logprob_fingerprint"]
    assert skipped["outcome"] == "skipped", skipped
    assert "test_canaries_alone has the evidence" in skipped["message"], skipped
