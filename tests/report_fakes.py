"""Fake suite checks for the report tests: they record findings and attach the figures the
real checks attach (busbw series, throughput sweep, startup timeline), with chosen values,
hostile strings and secrets, so the report layer can be tested without a cluster."""

from __future__ import annotations

import html.parser
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

try:  # imported once here: pytester's in-process runs would re-import it every time
    import matplotlib.backends.backend_agg
    import matplotlib.figure  # noqa: F401
except ImportError:
    pass

KEY = "sk-test-SECRET-0123456789"
HOSTILE = '<script>alert("x")</script>"><img src=x onerror=alert(1)>'

FAKE_SUITE = """
import json
import pytest
from pytest_spark import Finding
from pytest_spark.state import RUN_DIR_KEY

BUSBW = {busbw!r}
TOK_S = {tok_s!r}
LOAD = {load!r}
HOSTILE = {hostile!r}
SECRET = {secret!r}


@pytest.mark.nccl
def test_allreduce_busbw(spark_check):
    series = [{{"bytes": 2 ** i, "algbw_gbps": BUSBW * i / 24 * 0.8,
                "busbw_gbps": BUSBW * i / 24}} for i in range(10, 25)]
    spark_check.attach("busbw_series", series)
    spark_check.attach("nccl_version", "2.27.3")
    spark_check.require(Finding.passed(BUSBW, 0.2, "GB/s", message="busbw ok"))


@pytest.mark.throughput
def test_sweep_completes(spark_check):
    levels = [{{"concurrency": c, "output_tok_s": TOK_S * c ** 0.8,
                "ttft_s": {{"count": 8 * c, "median": 0.2 * c, "p90": 0.3 * c, "p99": 0.4 * c}},
                "tpot_s": {{"count": 8 * c, "median": 0.03, "p90": 0.035, "p99": 0.04}}}}
              for c in (1, 4, 16)]
    spark_check.attach("sweep", {{"server": HOSTILE + " at http://head:8000", "levels": levels}})
    spark_check.require(Finding.passed({{1: TOK_S}}, "every request completes", "tok/s"))


@pytest.mark.readiness
def test_startup_within_budget(spark_check, pytestconfig):
    ends = [LOAD * f for f in (0.1, 0.6, 0.75, 0.95, 1.0)]
    names = ["start", "weights", "kv", "graphs", "api"]
    timeline = [{{"phase": n, "start_s": ([0.0] + ends)[i], "end_s": ends[i]}}
                for i, n in enumerate(names)]
    timeline.append({{"phase": "ready", "start_s": LOAD, "end_s": LOAD}})
    serving = {{"status": "ready", "launched": True, "ready_s": LOAD, "timeline": timeline,
               "facts": {{"version": "0.11.0", "kv_memory.gib": "40.1",
                         "log": "vllm serve m --api-key " + SECRET}}}}
    (pytestconfig.stash[RUN_DIR_KEY] / "serving.json").write_text(json.dumps(serving))
    spark_check.attach("startup_timeline", timeline)
    spark_check.attach("vllm_version", HOSTILE)
    spark_check.require(Finding.passed(LOAD, "<= 1200", "s", message="ready"))


@pytest.mark.link
@pytest.mark.parametrize("node", ["spark-head", "spark-worker-1"])
def test_link_rate(spark_check, node):
    spark_check.require(Finding.passed(200.0, 200.0, "Gb/s", node=node))


@pytest.mark.tool_calls
def test_tool_call_skipped():
    pytest.skip("tool-call parser not configured")
"""

FAILING = """

@pytest.mark.readiness
def test_health_endpoint(spark_check):
    spark_check.require(Finding.failed(
        503, 200, message="GET http://admin:hunter2pass@head:8000/health answered 503: the "
        "engine is not healthy. Read the head's container log\\n"
        "--- last 2 log lines of spark-head ---\\nERROR engine died " + HOSTILE +
        "\\nINFO bye\\n--- last 1 log lines of spark-worker-1 ---\\nworker line",
        evidence={{"response": "HTTP 503\\n\\n" + HOSTILE,
                   "request": "GET /health\\nAuthorization: Bearer " + SECRET}}))


@pytest.mark.link
def test_link_rate_degraded(spark_check, record_property):
    print("the key is", SECRET)
    record_property("api", SECRET)
    spark_check.require(Finding.failed(
        100.0, 200.0, "Gb/s", node="spark-worker-1",
        message="spark-worker-1 enp1s0f1np1: link rate 100 Gb/s, expected 200 Gb/s. Likely "
        "a cable rated for 100G; see ethtool -s. (key " + SECRET + ")",
        evidence={{"ethtool enp1s0f1np1": "Speed: 100000Mb/s\\n" + HOSTILE}}))
"""


def fake_suite(
    *,
    busbw: float = 0.24,
    tok_s: float = 30.0,
    load: float = 300.0,
    secret: str = KEY,
    failures: bool = True,
) -> str:
    """The fake checks: 5 pass, 1 skips, and (``failures``) 2 fail."""
    source = FAKE_SUITE + (FAILING if failures else "")
    return source.format(busbw=busbw, tok_s=tok_s, load=load, hostile=HOSTILE, secret=secret)


def write_suite(pytester: pytest.Pytester, name: str = "test_fake_suite", **figures: Any) -> None:
    pytester.makepyfile(**{name: fake_suite(**figures)})


class Tags(html.parser.HTMLParser):
    """Every start tag with its attributes, and the text, of an HTML document/fragment."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        return [
            a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in attrs.items())
        ]


def report_data(html_text: str) -> dict[str, Any]:
    """pytest-html's JSON blob (rows, logs, extras, environment) from the report."""
    blob = Tags(html_text).find("div", id="data-container")[0]["data-jsonblob"]
    assert blob is not None
    data: dict[str, Any] = json.loads(blob)
    return data


def html_fragments(data: dict[str, Any]) -> list[str]:
    """Every piece of the blob that the report's script inserts as HTML."""
    out: list[str] = []
    for key, value in data["environment"].items():
        out.append(f"<div>{key}</div>")
        if isinstance(value, dict):
            out += [f"<li>{k}: {v}</li>" for k, v in value.items()]
        else:
            out.append(f"<div>{value}</div>")
    for rows in data["tests"].values():
        for row in rows:
            out += row["resultsTableRow"]
            out.append(row.get("log") or "")
            out += [e["content"] for e in row.get("extras", []) if e["format_type"] == "html"]
    return out


def assert_no_injected_markup(fragment: str) -> None:
    tags = Tags(fragment).tags
    allowed_scripts = 1 if "<html" in fragment[:200] else 0
    scripts = [t for t, _ in tags if t == "script"]
    assert len(scripts) <= allowed_scripts, fragment[:500]
    for tag, attrs in tags:
        handlers = {k: v for k, v in attrs.items() if k.startswith("on")}
        assert handlers in ({}, {"onclick": "location.reload()"}), (tag, attrs)  # pytest-html
        assert not (tag == "img" and attrs.get("src") == "x"), (tag, attrs)


@dataclass
class SuiteRun:
    ret: int
    output: str


def run_pytest(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> SuiteRun:
    """A real ``pytest`` in a subprocess (no SPARK_*/PYTEST_* leaking in from outside)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
    clean.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean,
    )
    return SuiteRun(proc.returncode, proc.stdout + proc.stderr)
