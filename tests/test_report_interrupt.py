"""An interrupted session (a real SIGINT) still leaves the HTML report and JSON results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from report_fakes import Tags, report_data

SUITE = """
import time
import pytest
from pathlib import Path
from pytest_spark import Finding


@pytest.mark.link
def test_link_done(spark_check):
    spark_check.require(Finding.passed(200.0, 200.0, "Gb/s", node="spark-head"))


@pytest.mark.nccl
def test_nccl_hangs(spark_check):
    spark_check.attach("busbw_series", [{"bytes": 1 << 20, "busbw_gbps": 0.2}])
    Path("started").write_text("x")
    time.sleep(120)


@pytest.mark.throughput
def test_never_reached():
    pass
"""


def test_sigint_leaves_a_report(tmp_path: Path) -> None:
    (tmp_path / "test_hang.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--html=out/report.html",
        "--self-contained-html",
        "--spark-results=out/results.json",
        "--spark-history=off",
    ]
    proc = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C's default in the child: started in the background (`cmd &`, as some CI
        # runners do), it would inherit SIGINT ignored and never see the signal.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "the hanging test never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, output
    assert "KeyboardInterrupt" in output
    assert "session interrupted: partial results" in output

    html = (tmp_path / "out" / "report.html").read_text()
    assert "Session INTERRUPTED: the results below are partial" in html
    verdicts = html[html.index('<table id="spark-verdicts"') :]
    assert 'class="spark-pass">PASS' in verdicts[: verdicts.index("</table>")]
    assert Tags(html).find("p", id="spark-plot-busbw") or Tags(html).find(
        "figure", id="spark-plot-busbw"
    )
    rows = report_data(html)["tests"]
    assert list(rows) == ["test_hang.py::test_link_done"]

    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["exitstatus"] == 2
    assert [c["outcome"] for c in results["checks"]] == ["passed"]
