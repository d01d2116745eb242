"""``pytest --spark-api-url=URL`` alone, against each kind of bad server a newcomer meets
(issue #25 section 1): the run ends in one failure naming the cause (test_cluster_serving),
with no traceback, and every check that needs the server skips citing it.

Each scenario is a small HTTP server on 127.0.0.1 (or a port with nothing on it, or one
that takes connections and never answers), stopped when its test ends; the serving suite
(tests_e2e) runs against it in a subprocess, as a user runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Answer:
    """What the fake server answers to every request."""

    status: int
    content_type: str
    body: bytes


MODELS = Answer(200, "application/json", b'{"object": "list", "data": [{"id": "m"}]}')
SCENARIOS: dict[str, tuple[Answer | dict[str, Answer] | str, str, str]] = {
    # name: (the server, the URL's path, a phrase the one failure says)
    "refused": ("refused", "/v1", "not reachable: ConnectError"),
    "timeout": ("silent", "/v1", "accepted the connection but GET /v1/models timed out"),
    "404": (Answer(404, "application/json", b'{"detail":"Not Found"}'), "/v1", "answered 404"),
    "html": (
        Answer(200, "text/html; charset=utf-8", b"<html>\n<body>Welcome to nginx!</body></html>"),
        "/v1",
        "answered an HTML page (text/html), not a JSON model list",
    ),
    "401": (Answer(401, "application/json", b'{"error":"no key"}'), "/v1", "requires an API key"),
    "500": (Answer(500, "text/plain", b"Internal Server Error"), "/v1", "answered 500"),
    "malformed-json": (
        Answer(200, "application/json", b'{"object": "list", "data": [{"id": '),
        "/v1",
        "did not return a model list",
    ),
    "empty-model-list": (
        Answer(200, "application/json", b'{"object": "list", "data": []}'),
        "/v1",
        "lists no model",
    ),
    # a pasted endpoint URL (/v1/chat/completions) is a usage error before any request
    # since issue #36: tests/test_setting_mistakes.py
    # the HTTP server lists a model; its engine fails every request (no node to read a
    # container log on: the message points at the server's own log)
    "engine-500": (
        {"/v1/models": MODELS, "*": Answer(500, "application/json", b'{"error": "EngineDead"}')},
        "/v1",
        "The engine is failing requests: the server's own log",
    ),
    "huge-body": (
        Answer(200, "application/json", b'{"object": "list", "data": [' + b" " * (20 << 20)),
        "/v1",
        "answered a body of more than 16 MiB (read up to there and cut)",
    ),
}


class _Handler(BaseHTTPRequestHandler):
    answers: dict[str, Answer]  # by path; "*": any other path

    def _reply(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        answer = self.answers.get(self.path) or self.answers["*"]
        self.send_response(answer.status)
        self.send_header("content-type", answer.content_type)
        self.send_header("content-length", str(len(answer.body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(answer.body)  # the suite stops reading a body it cut

    do_GET = do_POST = _reply

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of the scenario's server, stopped afterwards."""
    kind = request.param
    if kind == "refused":  # a port that was free a moment ago: nothing listens on it
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        yield f"http://127.0.0.1:{port}"
        return
    if kind == "silent":  # the kernel completes the handshake; nobody ever answers
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(8)
            yield f"http://127.0.0.1:{s.getsockname()[1]}"
        return
    answers = kind if isinstance(kind, dict) else {"*": kind}
    handler = type("Handler", (_Handler,), {"answers": answers})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def run_api_only(url: str, workdir: Path, *extra: str) -> tuple[int, str, dict[str, Any]]:
    """``pytest tests_e2e --spark-api-url=URL`` as a user runs it; exit code, output and
    the JSON results' checks by name."""
    results = workdir / "results.json"
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "tests_e2e",
        "-p",
        "no:cacheprovider",
        f"--spark-api-url={url}",
        "--spark-http-timeout=1",
        f"--spark-results={results}",
        f"--spark-history={workdir / 'history'}",
        "--rootdir",
        str(REPO),
        "-c",
        str(REPO / "pyproject.toml"),
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    data = json.loads(results.read_text()) if results.exists() else {"checks": []}
    checks = {c["nodeid"].split("::", 1)[1]: c for c in data["checks"]}
    return proc.returncode, proc.stdout + proc.stderr, checks


@pytest.mark.parametrize(
    ("server", "path", "phrase"),
    [pytest.param(*SCENARIOS[name], id=name) for name in SCENARIOS],
    indirect=["server"],
)
def test_api_only_bad_server_is_one_failure(
    server: str, path: str, phrase: str, tmp_path: Path
) -> None:
    ret, output, checks = run_api_only(server + path, tmp_path)
    failed = {k: c for k, c in checks.items() if c["outcome"] in ("failed", "error")}
    assert list(failed) == ["test_cluster_serving"], output[-3000:]
    message = failed["test_cluster_serving"]["message"]
    assert phrase in message, message
    assert "\n" not in message.strip(), message  # one line: the cause and its fix
    assert ret == 1, output[-3000:]
    for word in ("Traceback", "ValueError", "no head node", "INTERNALERROR", "docker logs"):
        assert word not in output, output[-3000:]
    if phrase != "answered a body of more than 16 MiB (read up to there and cut)":
        assert "not reachable" not in message or "ConnectError" in message, message
    # every check that needs the server skips citing the cause
    cited = [
        k
        for k, c in checks.items()
        if c["outcome"] == "skipped" and "test_cluster_serving has the evidence" in c["message"]
    ]
    assert len(cited) > 30, sorted(checks)
    headline = message[:60]
    assert all(headline in checks[k]["message"] for k in cited), checks[cited[0]]["message"]


def test_api_only_timeout_is_not_called_unreachable(tmp_path: Path) -> None:
    """A server that took the connection and then said nothing timed out; it is reachable."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        from pytest_spark.access.api import ApiError, discover

        with pytest.raises(ApiError) as info:
            discover(
                f"http://127.0.0.1:{s.getsockname()[1]}", api_key=None, model=None, timeout=0.3
            )
    text = str(info.value)
    assert "not reachable" not in text
    assert "timed out: no answer within 0.3 s (ReadTimeout)" in text
    assert "--spark-http-timeout" in text


# A plain OpenAI-compatible server that is not vLLM: no /version, a chat answer, no reasoning.
CHAT = Answer(
    200,
    "application/json",
    json.dumps(
        {
            "id": "c1",
            "object": "chat.completion",
            "created": 1764720000,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "OK"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    ).encode(),
)
NOT_VLLM = {
    "/v1/models": MODELS,
    "/v1/chat/completions": CHAT,
    "/health": Answer(200, "application/json", b"{}"),
    "*": Answer(404, "application/json", b'{"detail": "Not Found"}'),
}


@pytest.mark.parametrize("server", [NOT_VLLM], ids=["not-vllm"], indirect=True)
def test_not_vllm_server_version_404_skips_and_expectations_are_said(
    server: str, tmp_path: Path
) -> None:
    """/version answered 404 by a server that is not vLLM is no failure; the header and the
    JSON say what the server is expected to do, and which profile key says so."""
    ret, output, checks = run_api_only(
        server + "/v1",
        tmp_path,
        "-k",
        "test_version_reported or test_cluster_serving",
        "--spark-profile=generic",
        "--spark-threshold=structured_output.expected=false",
    )
    version = checks["test_version_reported"]
    assert version["outcome"] == "skipped", version
    assert "/version answered 404: the server reports no version" in version["message"]
    assert checks["test_cluster_serving"]["outcome"] == "passed", output[-3000:]
    assert ret == 0, output[-3000:]
    assert (
        "pytest-dgx-spark: profile generic expects of the server:\n"
        "  a reasoning field              no   reasoning.expected\n"
        "  response_format                no   structured_output.expected (from command line "
        "--spark-threshold)\n"
        "  tool calls                     yes  tool_calls.expected\n"
        "  a call under tool_choice=auto  no   tool_calls.auto_emits_calls\n"
    ) in output
    doc = json.loads((tmp_path / "results.json").read_text())
    said = {e["key"]: e for e in doc["cluster"]["server_expectations"]}
    assert said["reasoning.expected"] == {
        "key": "reasoning.expected",
        "capability": "a reasoning field",
        "expected": False,
        "source": "profile generic",
    }
    assert said["structured_output.expected"]["source"] == "command line --spark-threshold"
    assert said["tool_calls.auto_emits_calls"]["expected"] is False
