"""Spark Arena figures (issue #35 item 7): --spark-arena's benchmark.csv and metadata.json
(pytest_spark/report/arena.py) over a recorded depth sweep, held to the CSV llama-benchy
0.4.0 wrote itself against the same server (fixtures/arena/, README there); llama-benchy's
definitions of the figures (serving/load/depth.py); the spark-arena-v2 profile."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from pathlib import Path

import pytest

from pytest_spark.report.arena import (
    CSV_COLUMNS,
    ArenaContext,
    csv_rows,
    csv_text,
    metadata,
    recipe_facts,
    write_arena,
)
from pytest_spark.report.arena import (
    test_name as arena_name,
)
from pytest_spark.serving.load.depth import (
    CellResult,
    DepthResult,
    Fit,
    peak_rate,
    prompt,
    prompt_count,
    run_metrics,
    token_times,
)
from pytest_spark.serving.load.sweep import RequestRecord
from pytest_spark.settings.parsers import DepthSweep, depth_sweep
from pytest_spark.settings.profiles import ProfileError, load_profile

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "arena"
BENCHY_CSV = FIXTURES / "llama-benchy-0.4.0.csv"  # written by llama-benchy itself
SWEEP = FIXTURES / "llama-benchy-0.4.0.sweep.json"  # our sweep's report, same server, cells
NAME = re.compile(r"^(pp|tg)(\d+)(?: @ d(\d+))?(?: \(c(\d+)\))?$")


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def _sweep() -> dict:
    return json.loads(SWEEP.read_text())


def test_our_header_is_the_one_llama_benchy_writes() -> None:
    theirs = BENCHY_CSV.read_text().splitlines()[0].split(",")
    assert tuple(theirs) == CSV_COLUMNS
    ours = csv_text(csv_rows(_sweep())).splitlines()[0].split(",")
    assert ours == theirs


def test_a_recorded_sweep_gives_llama_benchys_rows_in_its_order() -> None:
    theirs = _rows(BENCHY_CSV.read_text())
    ours = _rows(csv_text(csv_rows(_sweep())))
    assert [r["test_name"] for r in ours] == [r["test_name"] for r in theirs]
    assert "pp512 @ d4096 (c5)" in [r["test_name"] for r in ours]
    for mine, row in zip(ours, theirs, strict=True):
        assert mine["model"] == row["model"] == "qwen"
        # the same fields are filled and the same left empty (pp: no peak; tg: no times)
        assert [k for k in CSV_COLUMNS if mine[k]] == [k for k in CSV_COLUMNS if row[k]], row
    # at concurrency 1 the total is the per-request figure, as llama-benchy writes it
    c1 = next(r for r in ours if r["test_name"] == "tg32 (c1)")
    assert c1["t_s_mean"] == c1["t_s_req_mean"] and c1["peak_ts_mean"]
    # times in ms, t/s in tokens per second (the same server: the same order of magnitude)
    for mine, row in zip(ours, theirs, strict=True):
        for key in ("t_s_mean", "e2e_ttft_mean"):
            if row[key]:
                assert 0.5 < float(mine[key]) / float(row[key]) < 2.0, (row["test_name"], key)


def test_every_recorded_name_follows_the_naming_rule() -> None:
    theirs = _rows(BENCHY_CSV.read_text())
    top = max(int(NAME.match(r["test_name"]).group(4) or 1) for r in theirs)  # type: ignore[union-attr]
    for row in theirs:
        m = NAME.match(row["test_name"])
        assert m, row["test_name"]
        kind, size, depth, c = m.group(1), int(m.group(2)), int(m.group(3) or 0), m.group(4)
        assert arena_name(kind, size, depth, int(c or 1), top) == row["test_name"]


def test_the_name_drops_depth_0_and_concurrency_when_the_run_has_only_1() -> None:
    assert arena_name("pp", 128, 0, 1, 1) == "pp128"
    assert arena_name("tg", 16, 0, 1, 1) == "tg16"
    assert arena_name("pp", 2048, 4096, 5, 10) == "pp2048 @ d4096 (c5)"
    assert arena_name("tg", 128, 4096, 5, 10) == "tg128 @ d4096 (c5)"
    assert arena_name("pp", 2048, 0, 1, 10) == "pp2048 (c1)"  # any c > 1 in the run: all named
    assert arena_name("ctx_pp", 2048, 4096, 5, 10) == "ctx_pp @ d4096 (c5)"  # no size
    assert arena_name("ctx_tg", 128, 4096, 1, 1) == "ctx_tg @ d4096"


def test_with_prefix_caching_the_context_load_rows_come_first() -> None:
    spec = DepthSweep((0, 1000), 100, 11, (1, 2), prefix_caching=True)
    load = CellResult(1000, 2, [_record(0.0, 0.5, 1.5, 11, 1010)] * 2, 1, 2.0, context_phase=True)
    over = CellResult(1000, 2, [_record(0.0, 0.1, 1.1, 11, 1100)] * 2, 1, 2.0)
    fresh = CellResult(0, 1, [_record(0.0, 0.1, 1.1, 11, 100)], 0, 1.1)
    # the prefill counts: the context alone, then the prompt alone over it
    assert (load.expected_prompt(spec), over.expected_prompt(spec)) == (1000, 100)
    assert fresh.expected_prompt(spec) == 100
    no_cache = CellResult(1000, 1, [], 0, 0.0)
    assert no_cache.expected_prompt(DepthSweep(pp=100)) == 1100  # both, one fresh prefill
    result = DepthResult(spec, "m", cells=[over, fresh, load])
    report = result.to_benchy()
    assert report["prefix_caching_enabled"] is True
    assert [(b["context_size"], b["is_context_prefill_phase"]) for b in report["benchmarks"]] == [
        (0, False),
        (1000, True),
        (1000, False),
    ]
    assert report["heat_order"] == [[0, 1], [1000, 2]]  # a cell once, its phases together
    names = [r["test_name"] for r in csv_rows(report)]
    assert names == [
        "pp100 (c1)",
        "tg11 (c1)",
        "ctx_pp @ d1000 (c2)",
        "ctx_tg @ d1000 (c2)",
        "pp100 @ d1000 (c2)",
        "tg11 @ d1000 (c2)",
    ]
    # the prompt over the cached context: 100 tokens (the server's 1100 is 20 % off)
    assert report["benchmarks"][2]["pp_req_throughput"]["values"] == [1000.0, 1000.0]
    meta = metadata({"checks": []}, report, ArenaContext("spark-arena-v2"))
    assert meta["benchmark"]["args"]["prefix_caching"] is True


def test_a_context_load_is_the_prompts_own_prefix() -> None:
    fit = Fit()
    full, load = prompt("n-1", 300, 64, fit), prompt("n-1", 300, 64, fit, context_only=True)
    assert load.endswith("\n.") and full.startswith(load[:-1])
    assert not prompt("n-2", 300, 64, fit).startswith(load[:-1])  # another request's: not


def _record(start: float, ttft: float, e2e: float, out: int, prompt_tokens: int) -> RequestRecord:
    record = RequestRecord(start=start, ttft=ttft, ttfr=ttft, e2e=e2e, output_tokens=out)
    record.prompt_tokens = prompt_tokens
    return record


def test_a_cell_that_failed_has_no_rows_and_an_empty_run_has_only_a_header() -> None:
    spec = DepthSweep((0,), 100, 11, (1,))
    failed = RequestRecord(start=0.0, e2e=0.1, error="400: too long", error_kind="http")
    report = {
        "model": "m",
        "max_concurrency": 1,
        "benchmarks": [CellResult(0, 1, [failed], 0, 0.1).to_benchy(spec)],
    }
    assert csv_rows(report) == []
    assert csv_text([]).strip() == ",".join(CSV_COLUMNS)
    ok = CellResult(0, 1, [_record(0.0, 0.1, 1.1, 11, 100)], 0, 1.1).to_benchy(spec)
    rows = csv_rows({"model": "m", "max_concurrency": 1, "benchmarks": [ok]})
    assert [r["test_name"] for r in rows] == ["pp100", "tg11"]
    assert rows[0]["e2e_ttft_mean"] == 100.0 and rows[0]["peak_ts_mean"] is None
    assert rows[1]["t_s_mean"] == 10.0 and rows[1]["ttfr_mean"] is None


def test_llama_benchys_definitions() -> None:
    # tokens dated by their chunks; a server count that differs is spread first..last
    r = RequestRecord(start=0.0, ttft=0.5, e2e=1.0, output_tokens=3, deltas=3, gaps=[0.1, 0.1])
    assert token_times(r) == pytest.approx([0.5, 0.6, 0.7])
    r.output_tokens = 5  # 5 tokens in 3 chunks
    assert token_times(r) == pytest.approx([0.5, 0.55, 0.6, 0.65, 0.7])
    # peak: the most tokens in 1 s; a burst shorter than 1 s over its own span
    assert peak_rate([0.0, 0.25, 0.5]) == pytest.approx(6.0)
    assert peak_rate([0.0, 0.5, 1.5, 1.6, 1.7, 2.4]) == pytest.approx(4.0)
    # the server's prompt count, unless 20 % or more off what was asked
    assert prompt_count(_record(0, 1, 2, 2, 110), 100) == 110
    assert prompt_count(_record(0, 1, 2, 2, 121), 100) == 100
    # est_ppt is TTFR (no latency subtracted); pp t/s per request = prompt / est_ppt; the
    # batch's pp t/s from the first send to the last first token, tg t/s from the first
    # first token to the last token
    a = _record(0.0, 0.5, 1.5, 11, 1100)
    a.ttfr = 0.4
    b = _record(0.0, 1.0, 2.0, 11, 1100)
    m = run_metrics([[a, b]], 1100)
    assert m.est_ppt == pytest.approx([0.4, 1.0]) and m.e2e_ttft == pytest.approx([0.5, 1.0])
    assert m.pp_req == pytest.approx([2750.0, 1100.0])
    assert m.pp_batch == pytest.approx([2200.0])
    assert m.tg_req == pytest.approx([10.0, 10.0]) and m.tg_batch == pytest.approx([20 / 1.5])
    # two runs: one batch figure each
    assert len(run_metrics([[a], [b]], 1100).pp_batch) == 2


def test_runs_group_a_cells_records_into_batches() -> None:
    spec = DepthSweep((0,), 100, 11, (2,), runs=2)
    records = [_record(0.0, 0.1 * (k + 1), 1.0 + 0.1 * k, 11, 100) for k in range(4)]
    cell = CellResult(0, 2, records, 0, 4.0, run_of=[0, 0, 1, 1])
    assert [len(b) for b in cell.batches()] == [2, 2]
    b = cell.to_benchy(spec)
    assert len(b["pp_throughput"]["values"]) == 2  # one per run (concurrency > 1)
    assert len(b["pp_req_throughput"]["values"]) == 4  # one per request
    assert b["runs"] == 2 and len(b["peak_throughput"]["values"]) == 2


def test_the_fit_sends_as_many_words_as_the_server_counts_tokens() -> None:
    fit = Fit(per_word=2.0, overhead=30.0, header=4.0)
    assert fit.context_words(1004) == 500 and fit.context_words(0) == 0
    assert fit.ask_words(130) == 50
    text = prompt("n", 1004, 130, fit)
    assert len(text.split("Context: ", 1)[1].split("\n", 1)[0].split()) == 500
    # the default: a word a token, as before the calibration
    assert Fit().context_words(300) == 300 and Fit().ask_words(64) == 52


def test_the_option_takes_runs() -> None:
    assert depth_sweep("depths=0;pp=8;tg=2;c=1;runs=3") == DepthSweep((0,), 8, 2, (1,), runs=3)
    assert depth_sweep("arena") == DepthSweep(runs=3, prefix_caching=True)
    assert depth_sweep("depths=0;prefix=on") == DepthSweep((0,), prefix_caching=True)
    with pytest.raises(ValueError, match="prefix is on or off"):
        depth_sweep("prefix=maybe")
    with pytest.raises(ValueError, match="runs is at least 1"):
        depth_sweep("runs=0")


def test_metadata_has_the_arena_keys_and_null_where_unknown(tmp_path: Path) -> None:
    doc = {
        "started": "2026-12-05T22:00:00+00:00",
        "duration_s": 12.5,
        "cluster": {"sim": False, "nodes": [{"name": "a"}, {"name": "b"}]},
        "checks": [{"extra": {"depth_sweep": _sweep()}}],
    }
    meta = metadata(doc, _sweep(), ArenaContext(profile="spark-arena-v2"))
    assert set(meta) == {"recipe", "cluster", "benchmark", "timing", "runtime_info"}
    assert set(meta["recipe"]) == {"model", "container", "runtime", "hash", "file_sha256"}
    assert meta["recipe"]["model"] == "qwen" and meta["recipe"]["hash"] is None
    assert meta["cluster"] == {
        "cluster_id": None,
        "node_count": 2,
        "hosts": ["node-ca978112", "node-3e23e816"],  # sha256("a"), sha256("b"): redacted
        "hosts_redacted": True,
        "tp": None,
    }
    bench = meta["benchmark"]
    assert bench["profile"] == "spark-arena-v2"
    assert bench["args"]["depth"] == [0, 1024, 4096] and bench["args"]["concurrency"] == [1, 2, 5]
    assert bench["args"]["pp"] == [512] and bench["args"]["tg"] == [32]
    assert bench["args"]["runs"] == 3 and bench["args"]["prefix_caching"] is False
    assert meta["timing"]["start"] == "2026-12-05T22:00:00+00:00"
    assert meta["timing"]["end"] == "2026-12-05T22:00:12.500000+00:00"
    assert meta["timing"]["duration"] == 12.5
    assert meta["runtime_info"]["vllm_version"] is None  # not recorded: null, not "unknown"
    written = write_arena(tmp_path / "arena", doc, ArenaContext(profile="p"))
    assert isinstance(written, list) and [p.name for p in written] == [
        "benchmark.csv",
        "metadata.json",
    ]
    written_csv = (tmp_path / "arena" / "benchmark.csv").read_bytes()
    assert written_csv == csv_text(csv_rows(_sweep())).encode()
    assert written_csv.count(b"\r\n") == len(csv_rows(_sweep())) + 1  # csv's line ends
    assert BENCHY_CSV.read_bytes().splitlines(keepends=True)[0].endswith(b"\r\n")
    json.loads((tmp_path / "arena" / "metadata.json").read_text())
    nothing = write_arena(tmp_path / "none", {"checks": []}, ArenaContext(profile="p"))
    assert isinstance(nothing, str) and "--spark-depth-sweep" in nothing
    assert not (tmp_path / "none").exists()


def test_a_recipe_gives_the_recipe_block(tmp_path: Path) -> None:
    from pytest_spark.settings.sparkrun import read_recipe

    path = Path(__file__).resolve().parents[1] / "fixtures" / "sparkrun" / "settings"
    path = path / "recipes" / "qwen3.5-122b-a10b-fp8-vllm.yaml"
    recipe = read_recipe(path)
    facts = recipe_facts(recipe)
    assert facts["model"] == "Qwen/Qwen3.5-122B-A10B-FP8" and facts["runtime"] == "vllm"
    assert facts["container"] == "ghcr.io/spark-arena/dgx-vllm-eugr-nightly:latest"
    assert facts["tensor_parallel"] == 2
    assert facts["hash"] == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    # an override is what ran (sparkrun's -o); a job's recipe has no file of its own to hash
    moved = recipe_facts(recipe.with_overrides({"tensor_parallel": 1}, origin="sparkrun job x"))
    assert moved["tensor_parallel"] == 1 and moved["hash"] is None
    assert recipe_facts(None) == {}
    meta = metadata({"checks": []}, _sweep(), ArenaContext("spark-arena-v2", recipe=facts, tp=2))
    assert meta["recipe"] == {
        "model": facts["model"],
        "container": facts["container"],
        "runtime": "vllm",
        "hash": None,  # sparkrun's: of its own normalised export, not made here
        "file_sha256": facts["hash"],
    }
    assert meta["cluster"]["tp"] == 2


def test_the_spark_arena_v2_profile() -> None:
    profile = load_profile("spark-arena-v2")
    sweep = profile.depth_sweep
    assert sweep.run is True
    assert sweep.depths == (0, 4096, 8192, 16384, 32768, 65535, 100000)
    assert (sweep.pp, sweep.tg, sweep.concurrency, sweep.runs) == (2048, 128, (1, 2, 5, 10), 3)
    assert sweep.prefix_caching is True  # the Arena's llama-benchy --enable-prefix-caching
    # the default's thresholds: it extends it
    assert profile.nccl == load_profile("dgx-spark-2node").nccl
    assert load_profile("dgx-spark-2node").depth_sweep.run is False
    over = profile.with_overrides({"depth_sweep.depths": "0;512"})
    assert over.depth_sweep.depths == (0, 512)
    with pytest.raises(ProfileError, match="0 or more"):
        profile.with_overrides({"depth_sweep.depths": "-1"})


def test_a_depth_of_0_is_a_depth_and_a_negative_one_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nextends = "spark-arena-v2"\n[depth_sweep]\ndepths = [0, -4]\n')
    with pytest.raises(ProfileError, match=r"\[depth_sweep\] depths.*0 or more"):
        load_profile(str(bad))


SHOW = """
def test_show(pytestconfig):
    from pytest_spark.state import SETTINGS_KEY
    s = pytestconfig.stash[SETTINGS_KEY]
    print("SWEEP", s.depth_sweep, "FROM", s.source("depth_sweep"))
    print("ARENA", s.arena, "FROM", s.source("arena"))
"""


def test_the_profile_runs_the_sweep_and_the_option_still_wins(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_API_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("SPARK_ARENA", str(pytester.path / "arena"))
    pytester.makepyfile(test_show=SHOW)
    result = pytester.runpytest("-s", "-p", "no:cacheprovider", "--spark-profile=spark-arena-v2")
    result.stdout.fnmatch_lines(
        [
            "*SWEEP DepthSweep(depths=(0, 4096, 8192, 16384, 32768, 65535, 100000), pp=2048, "
            "tg=128, concurrency=(1, 2, 5, 10), cooldown_s=0.0, runs=3, prefix_caching=True) "
            "FROM profile "
            "spark-arena-v2",
            f"ARENA {pytester.path / 'arena'} FROM environment SPARK_ARENA",
            # asked for, but no sweep ran (test_show is not the suite's): said, not failed
            f"*Spark Arena figures: nothing written to {pytester.path / 'arena'}: no depth "
            "sweep in this run*",
        ]
    )
    result = pytester.runpytest(
        "-s", "-p", "no:cacheprovider", "--spark-profile=spark-arena-v2", "--spark-depth-sweep=off"
    )
    result.stdout.fnmatch_lines(["*SWEEP None FROM command line --spark-depth-sweep"])
