"""Fixtures for the vLLM emulator tests: start ``python -m emulator serve`` on 127.0.0.1
with fast phases, talk to it with http.client, read its log, stop it."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SIM_DIR = REPO / "sparksim"
TRANSCRIPTS = Path(__file__).resolve().parent / "transcripts"

FAST_ENV = {
    "SPARKSIM_EMU_TIME_SCALE": "0.0005",
    "SPARKSIM_EMU_SHARDS": "4",
    "SPARKSIM_EMU_TTFT_S": "0.02",
    "SPARKSIM_EMU_PREFILL_TOK_S": "0",
    "SPARKSIM_EMU_DECODE_TOK_S": "400",
    "SPARKSIM_EMU_REASONING_TOKENS": "12",
    "SPARKSIM_EMU_CONTROL_POLL_S": "0.05",
    "SPARKSIM_EMU_HEARTBEAT_S": "0.1",
    "SPARKSIM_EMU_HEARTBEAT_TIMEOUT_S": "0.6",
    "SPARKSIM_EMU_PG_WAIT_S": "0.2",
    "SPARKSIM_EMU_PG_BACKOFF": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def refused(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:port (connection refused, not an answer)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def emulator_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "emulator", *args]


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSIM_EMU_")}
    env.pop("VLLM_API_KEY", None)
    env["PYTHONPATH"] = str(SIM_DIR)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(FAST_ENV)
    env.update(extra or {})
    return env


@dataclass
class Resp:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def header_names(self) -> list[str]:
        return [k.lower() for k, _ in self.headers]

    def events(self) -> list[str]:
        """SSE data payloads in order."""
        text = self.body.decode()
        assert text.endswith("\n\n"), "SSE body must end with a blank line"
        return [block[len("data: ") :] for block in text.split("\n\n") if block]


class Proc:
    """A running emulator (or worker) process whose stdout is collected line by line."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(REPO),
            text=True,
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = 10.0, start: int = 0) -> int:
        """Index of the first log line from ``start`` matching the regex."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            i = start
            while True:
                while i < len(self.lines):
                    if rx.search(self.lines[i]):
                        return i
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    tail = "\n".join(self.lines[-30:])
                    raise AssertionError(f"no log line matching {pattern!r}; tail:\n{tail}")
                self._cond.wait(min(left, 0.1))

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_exit(self, timeout: float = 10.0) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Emu(Proc):
    control: Path | None = None

    def __init__(
        self, args: list[str], env: dict[str, str] | None = None, model: str = "/models/test-model"
    ) -> None:
        self.port = free_port()
        self.model = model
        cmd = emulator_cmd("serve", model, "--host", "127.0.0.1", "--port", str(self.port), *args)
        super().__init__(cmd, base_env(env))

    def ready(self, timeout: float = 15.0) -> Emu:
        self.wait_for(r"^INFO:     Application startup complete\.$", timeout)
        return self

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> Resp:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
            hdrs = {"content-type": "application/json"} if data is not None else {}
            hdrs.update(headers or {})
            conn.request(method, path, body=data, headers=hdrs)
            r = conn.getresponse()
            return Resp(r.status, r.getheaders(), r.read())
        finally:
            conn.close()

    def chat(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> Resp:
        body = {"model": "qwen", **body}
        return self.request("POST", "/v1/chat/completions", body, headers)


@pytest.fixture
def emu_factory() -> Iterator[Any]:
    started: list[Proc] = []

    def make(
        args: list[str], env: dict[str, str] | None = None, wait: bool = True, **kw: Any
    ) -> Emu:
        emu = Emu(args, env, **kw)
        started.append(emu)
        return emu.ready() if wait else emu

    yield make
    for p in started:
        p.stop()


@pytest.fixture
def proc_factory() -> Iterator[Any]:
    started: list[Proc] = []

    def make(cmd: list[str], env: dict[str, str] | None = None) -> Proc:
        p = Proc(cmd, base_env(env))
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()


QWEN_ARGS = [
    "--served-model-name",
    "qwen",
    "--max-model-len",
    "4096",
    "--reasoning-parser",
    "qwen3",
    "--tool-call-parser",
    "qwen3_coder",
    "--enable-auto-tool-choice",
]


@pytest.fixture(scope="session")
def control_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("emu-control")


@pytest.fixture(scope="session")
def qwen(control_dir: Path) -> Iterator[Emu]:
    """One shared emulator: qwen3 reasoning, qwen3_coder tools, a control file for faults."""
    control = control_dir / "control.json"
    emu = Emu(QWEN_ARGS, {"SPARKSIM_EMU_CONTROL": str(control)})
    emu.control = control
    try:
        yield emu.ready()
    finally:
        emu.stop()


@pytest.fixture(scope="session")
def plain() -> Iterator[Emu]:
    """Configured like the recorded server: hermes tools, no reasoning parser."""
    args = [
        "--served-model-name",
        "qwen",
        "--max-model-len",
        "4096",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    emu = Emu(args, model="/models/qwen2.5-coder-0.5b-instruct")
    try:
        yield emu.ready()
    finally:
        emu.stop()


def set_faults(emu: Emu, faults: list[str], **extra: Any) -> None:
    """Write the control file and wait until the emulator has read it."""
    path = emu.control
    assert path is not None
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"faults": faults, **extra}))
    os.replace(tmp, path)
    time.sleep(0.15)


@pytest.fixture
def faulty(qwen: Emu) -> Iterator[Any]:
    """Set run-time faults on the shared emulator; cleared afterwards."""

    def apply(*faults: str, **extra: Any) -> Emu:
        set_faults(qwen, list(faults), **extra)
        return qwen

    yield apply
    set_faults(qwen, [])


def load_transcript(name: str) -> dict[str, Any]:
    """Split a recorded transcript into request, status, headers and raw body."""
    text = (TRANSCRIPTS / name).read_text()
    head, _, rest = text.partition("\n--- HTTP ")
    request_line, _, request_body = head.partition("\n")
    status_line, _, after = rest.partition("\n")
    header_block, _, body = after.partition("\n\n")
    headers = [tuple(h.split(": ", 1)) for h in header_block.splitlines() if h]
    return {
        "method": request_line.split()[0],
        "path": request_line.split()[1],
        "request": json.loads(request_body) if request_body.strip() else None,
        "status": int(status_line.split()[0]),
        "headers": headers,
        "body": body,
    }
