"""The report in a real browser: headless Chromium renders a report from a real pytest run;
the summary and the plots are in the DOM after the page's script ran, and on screen."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from report_fakes import Tags, fake_suite, run_pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
BLUE = (31, 119, 180)  # matplotlib's first line colour
PASS_BG = (223, 240, 216)
FAIL_BG = (242, 222, 222)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(
        "headless browser check: chromium is not installed (Debian: apt-get install "
        "chromium; scripts/setup installs it, CI has it)"
    )


def browse(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        return subprocess.run(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", *args, url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chromium()
    root = tmp_path_factory.mktemp("browser")
    (root / "test_fake_suite.py").write_text(fake_suite())
    path = root / "report.html"
    run = run_pytest(root, f"--html={path}", "--self-contained-html", "--spark-history=off")
    assert run.ret == 1 and path.exists(), run.output
    return path


def test_summary_plots_and_rows_are_in_the_rendered_dom(report: Path) -> None:
    proc = browse(report.as_uri(), "--dump-dom", "--virtual-time-budget=5000")
    dom = proc.stdout
    assert "spark-verdicts" in dom, proc.stderr[-2000:]
    tags = Tags(dom)
    for key in ("busbw", "throughput", "timeline"):
        assert tags.find("figure", id=f"spark-plot-{key}"), key
    images = [a.get("src") or "" for t, a in tags.tags if t == "img"]
    plots = [src for src in images if src.startswith("data:image/png;base64,")]
    assert len(plots) == 3 and all(len(src) > 10_000 for src in plots)
    # the page's script ran: one tbody per check row, with our columns and check blocks
    rows = [
        a
        for t, a in tags.tags
        if t == "tbody" and a.get("id") and "results-table-row" in (a.get("class") or "")
    ]
    assert len(rows) == 8
    assert dom.count('class="col-figures') == 8
    assert dom.count('class="spark-check spark-fail"') == 2
    # hostile strings stayed text: no element came out of them
    assert not [a for t, a in tags.tags if t == "img" and a.get("src") == "x"]
    assert not [a for _, a in tags.tags if "onerror" in a]
    assert "&lt;script&gt;alert(" in dom


def test_summary_and_plots_are_visible_on_screen(report: Path, tmp_path: Path) -> None:
    from PIL import Image

    shot = tmp_path / "shot.png"
    proc = browse(
        report.as_uri(),
        f"--screenshot={shot}",
        "--window-size=1280,2200",
        "--virtual-time-budget=5000",
    )
    assert shot.exists(), proc.stderr[-2000:]
    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 24) or []

    def near(colour: tuple[int, int, int]) -> int:
        return sum(
            n for n, c in colours if all(abs(a - b) <= 4 for a, b in zip(c, colour, strict=True))
        )

    assert near(PASS_BG) > 2000 and near(FAIL_BG) > 2000  # verdict table and banner
    assert near(BLUE) > 500  # plot lines and bars, on the first screen and a half
