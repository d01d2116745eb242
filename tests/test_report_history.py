"""Run history (one JSON file per run), --spark-compare and --spark-compare-fail."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from report_fakes import Tags, write_suite

from pytest_spark.report.figures import Metric
from pytest_spark.report.history import History, cluster_identity, compare, limit_for

CLUSTER = {
    "head": "10.0.0.1",
    "sim": False,
    "profile": "dgx-spark-2node",
    "nodes": [
        {"name": "spark-head", "role": "head", "address": "10.0.0.1"},
        {"name": "spark-worker-1", "role": "worker", "address": "10.0.0.2"},
    ],
}


def test_identity_is_stable_and_names_the_cluster() -> None:
    a = cluster_identity(CLUSTER)
    assert a == cluster_identity(json.loads(json.dumps(CLUSTER)))
    assert a["id"].startswith("dgx-spark-2node-") and a["nodes"] == ["10.0.0.1", "10.0.0.2"]
    assert cluster_identity({**CLUSTER, "profile": "lab"})["id"] != a["id"]
    assert cluster_identity({**CLUSTER, "head": "10.0.0.9"})["hash"] != a["hash"]
    sim1 = cluster_identity({**CLUSTER, "sim": True, "head": "198.18.0.11"}, ["spark-1", "s-2"])
    sim2 = cluster_identity({**CLUSTER, "sim": True, "head": "198.18.3.11"}, ["spark-1", "s-2"])
    assert sim1 == sim2 and sim1["head"] == "sparksim"
    api = cluster_identity({"profile": "sim", "nodes": []}, None, "http://u:p@10.1.1.1:8000")
    assert api["head"] == "api 10.1.1.1:8000" and "p@" not in json.dumps(api)


def _save(history: History, value: float, *, interrupted: bool = False, minute: int = 0) -> Path:
    record = {
        "commit": {"short": "abc12345"},
        "interrupted": interrupted,
        "metrics": {"tok_s@4": {"value": value, "unit": "tok/s", "better": "higher"}},
    }
    return history.save(record, datetime(2025, 1, 2, 3, 4, minute, tzinfo=UTC))


def test_files_are_numbered_like_pytest_benchmark(tmp_path: Path) -> None:
    history = History(tmp_path, cluster_identity(CLUSTER))
    first = _save(history, 100.0)
    second = _save(history, 90.0, minute=1)
    assert first.name == "0001_abc12345_20250102T030400Z.json"
    assert second.name == "0002_abc12345_20250102T030401Z.json"
    assert first.parent == tmp_path / history.identity["id"]
    _save(history, 10.0, interrupted=True, minute=2)
    assert history.find("last") is not None and history.find("last").path == second  # type: ignore[union-attr]
    assert history.find("1").path == first  # type: ignore[union-attr]
    assert history.find("0002").path == second  # type: ignore[union-attr]
    assert history.find(second.name).path == second  # type: ignore[union-attr]
    assert history.find(str(first)).path == first  # type: ignore[union-attr]
    assert history.find("7") is None


def test_compare_uses_the_most_specific_limit_and_direction(tmp_path: Path) -> None:
    specs = (("tok_s", 10.0), ("tok_s@4", 2.0), ("ttft", 5.0))
    assert limit_for("tok_s@4", specs) == 2.0
    assert limit_for("tok_s@1", specs) == 10.0
    assert limit_for("ttft_p90@1", specs) == 5.0 and limit_for("busbw", specs) is None
    history = History(tmp_path, cluster_identity(CLUSTER))
    record = {
        "metrics": {
            "tok_s@4": {"value": 100.0},
            "ttft_p90@1": {"value": 1.0},
            "busbw": {"value": 20.0},
            "load": {"value": 300.0},
        }
    }
    history.save(record, datetime(2025, 1, 1, tzinfo=UTC))
    now = {
        "tok_s@4": Metric(97.0, "tok/s", "higher"),
        "ttft_p90@1": Metric(1.04, "s", "lower"),
        "busbw": Metric(10.0, "GB/s", "higher"),
    }
    result = compare(history.find("last"), now, specs)  # type: ignore[arg-type]
    regressed = {d.name for d in result.regressions}
    assert regressed == {"tok_s@4"}  # -3% > 2%; ttft +4% < 5%; busbw has no limit
    assert result.missing == ["startup"]  # the old record's "load", read by its new name
    assert "tok_s@4: 100 -> 97 tok/s (-3.0%, limit 2%)" in result.message()


def _run(pytester: pytest.Pytester, *args: str, **figures: float) -> pytest.RunResult:
    write_suite(pytester, failures=False, **figures)
    return pytester.runpytest("--spark-results=results.json", *args)


def test_history_compare_and_compare_fail(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")  # a project: the history goes in its rootdir
    first = _run(pytester, "--spark-compare")
    assert first.ret == 0
    first.stdout.fnmatch_lines(["compare: nothing to compare with: no earlier run of cluster *"])
    files = list((pytester.path / ".spark-history").glob("*/*.json"))
    assert [f.name[:11] for f in files] == ["0001_nogit_"]
    record = json.loads(files[0].read_text())
    assert record["cluster"]["profile"] == "dgx-spark-2node" and record["commit"] is None
    assert record["machine"]["python"] and record["exitstatus"] == 0
    assert record["metrics"]["tok_s@1"] == {"value": 30.0, "unit": "tok/s", "better": "higher"}
    assert set(record["metrics"]) >= {
        "busbw",
        "tok_s@4",
        "ttft_p90@4",
        "tpot_p50@4",
        "startup",
        "startup.weights",
        "startup.graphs",
    }
    # 8 requests at one stream: too few for a p90 (10) or a p99 (100), kept out
    assert not {"ttft_p90@1", "ttft_p99@1", "ttft_p99@4"} & set(record["metrics"])

    # slower engine, degraded link: fails on both figures, names each, old -> new and pct
    second = _run(
        pytester,
        "--spark-compare-fail=tok_s:10%,busbw:5%",
        f"--html={pytester.path}/r.html",
        busbw=0.2,
        tok_s=24.0,
        load=330.0,
    )
    assert second.ret == 1
    second.stdout.fnmatch_lines(
        [
            "*5 passed, 1 skipped*",
        ]
    )
    out = second.stdout.str()
    line = next(x for x in out.splitlines() if x.startswith("REGRESSION:"))
    assert "4 figure(s) regressed against run 0001_nogit_" in line
    for part in (
        "busbw: 0.24 -> 0.2 GB/s (-16.7%, limit 5%)",
        "tok_s@1: 30 -> 24 tok/s (-20.0%, limit 10%)",
        "tok_s@4: ",
        "tok_s@16: ",
    ):
        assert part in line
    assert "startup" not in line  # slower load, but no limit was set for it
    results = json.loads((pytester.path / "results.json").read_text())
    assert results["exitstatus"] == 1
    assert len(results["report"]["compare"]["regressions"]) == 4
    assert results["report"]["compare"]["baseline_run"].startswith("0001_")
    html = (pytester.path / "r.html").read_text()
    assert "REGRESSION (session failed): 4 figure(s) regressed" in html
    deltas = html[html.index('<table id="spark-deltas"') :]
    deltas = deltas[: deltas.index("</table>")]
    assert Tags(deltas).text.count("REGRESSED") == 4
    assert "startup.weights" in deltas

    # the same figures again: compared with the last run (0002), nothing regressed
    third = _run(
        pytester, "--spark-compare-fail=tok_s:10%,busbw:5%", busbw=0.2, tok_s=24.0, load=330.0
    )
    assert third.ret == 0
    third.stdout.fnmatch_lines(["compared with run 0002_nogit_*: busbw +0.0%*"])

    # a named run: against 0001 again
    fourth = _run(
        pytester,
        "--spark-compare=0001",
        "--spark-compare-fail=ttft:1%",
        busbw=0.2,
        tok_s=24.0,
        load=330.0,
    )
    assert fourth.ret == 0  # ttft did not move
    fourth.stdout.fnmatch_lines(["compared with run 0001_nogit_*: busbw -16.7%*"])
    assert len(list((pytester.path / ".spark-history").glob("*/*.json"))) == 4


def test_history_off_and_custom_dir(pytester: pytest.Pytester) -> None:
    assert _run(pytester, "--spark-history=off").ret == 0
    assert not (pytester.path / ".spark-history").exists()
    assert _run(pytester, "--spark-history=runs").ret == 0
    assert len(list((pytester.path / "runs").glob("*/0001_*.json"))) == 1


@pytest.mark.parametrize(
    ("args", "ini", "env", "expected"),
    [
        (
            ["--spark-compare-fail=tok_s"],
            "",
            {},
            "*Invalid value 'tok_s' for spark_compare_fail "
            "from command line --spark-compare-fail: 'tok_s' is not METRIC:PCT*",
        ),
        (
            [],
            "",
            # the API URL asks for the plugin: otherwise it resolves nothing
            {"SPARK_COMPARE_FAIL": "speed:5%", "SPARK_API_URL": "http://127.0.0.1:9"},
            "*Invalid value 'speed:5%' for "
            "spark_compare_fail from environment SPARK_COMPARE_FAIL: unknown metric 'speed'*",
        ),
        (
            [],
            "spark_api_url = http://127.0.0.1:9\nspark_compare_fail = busbw:lots\n",
            {},
            "*Invalid value 'busbw:lots' for "
            "spark_compare_fail from spark_compare_fail in tox.ini: "
            "'lots' in 'busbw:lots' is not a percentage*",
        ),
        (
            ["--spark-compare", "--spark-history=off"],
            "",
            {},
            "*--spark-compare (from command line "
            "--spark-compare) compares with the run history, but --spark-history is off (from "
            "command line --spark-history)*",
        ),
        (
            ["--spark-compare=0042"],
            "",
            {},
            "*--spark-compare 0042 (from command line "
            "--spark-compare): no such run in *pytest-dgx-spark/history/dgx-spark-2node-* "
            "(latest runs there: none)*",
        ),
    ],
)
def test_bad_report_options_fail_at_start_naming_the_source(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    ini: str,
    env: dict[str, str],
    expected: str,
) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    if ini:
        pytester.makeini(f"[pytest]\n{ini}")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])


def test_bare_compare_means_last(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        def test_show(pytestconfig):
            from pytest_spark.state import SETTINGS_KEY
            s = pytestconfig.stash[SETTINGS_KEY]
            print("COMPARE", s.compare, s.compare_fail, s.history)
        """)
    result = pytester.runpytest("-s", "--spark-compare", "--spark-compare-fail=tok_s@4:7.5%")
    result.stdout.fnmatch_lines(["*COMPARE last (('tok_s@4', 7.5),) .spark-history"])


def test_default_history_is_the_rootdir_or_the_user_cache_and_says_so(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #25 §6: .spark-history/ was written into whatever directory the run started
    in. In a project (an ini file) it is the rootdir's; elsewhere the user cache's; the
    summary says where and why."""
    cache = pytester.path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    result = _run(pytester)
    assert result.ret == 0
    assert not (pytester.path / ".spark-history").exists()
    saved = list((cache / "pytest-dgx-spark" / "history").glob("*/0001_*.json"))
    assert len(saved) == 1
    result.stdout.fnmatch_lines(
        [
            f"history:      {cache}/pytest-dgx-spark/history/*/0001_*.json",
            "              the user cache directory (no ini file here, so no project "
            "rootdir); --spark-history=DIR or off",
        ]
    )
    # a project, run from a directory below its rootdir: the rootdir's .spark-history
    pytester.makeini("[pytest]\n")
    below = pytester.mkdir("below")
    monkeypatch.chdir(below)
    result = _run(pytester, str(pytester.path))
    assert not (below / ".spark-history").exists()
    assert len(list((pytester.path / ".spark-history").glob("*/0001_*.json"))) == 1
    result.stdout.fnmatch_lines(["              the rootdir's .spark-history (ini file *"])


def test_one_resolution_for_the_history_folder(tmp_path: Path) -> None:
    """The report's runs and the accuracy baselines (tests_e2e/conftest.py) go where this
    says: never the directory the run starts in unless --spark-history names it."""
    from pytest_spark.report.history import resolve_history_dir

    start, root, ini = tmp_path / "cwd", tmp_path / "proj", tmp_path / "proj" / "pytest.ini"
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    default = Path(".spark-history")
    assert resolve_history_dir(default, "default", root, ini, start, env)[0] == (
        root / ".spark-history"
    )
    assert resolve_history_dir(default, "default", start, None, start, env)[0] == (
        tmp_path / "cache" / "pytest-dgx-spark" / "history"
    )
    named = resolve_history_dir(Path("h"), "command line --spark-history", root, ini, start, env)
    assert named == (start / "h", "")
    assert (
        resolve_history_dir(None, "command line --spark-history", root, ini, start, env)[0] is None
    )
