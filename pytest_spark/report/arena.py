"""Spark Arena figures (``--spark-arena=DIR``): the depth sweep written as the Spark Arena
publishes a run, in llama-benchy's form. A view over the sweep's measurements (the
``depth_sweep`` report of tests_e2e/test_depth_sweep.py, in the results document), not a
second benchmark.

- ``DIR/benchmark.csv``: llama-benchy 0.4.0's ``--format csv`` (``results.py``, read, not
  copied): the columns of :data:`CSV_COLUMNS`, one ``pp`` row and one ``tg`` row per
  (depth, concurrency) cell, named ``pp2048 @ d4096 (c5)`` / ``tg128 @ d4096 (c5)``: the
  ``@ dN`` part only at a depth above 0, the ``(cN)`` part only when the run's highest
  concurrency is above 1 (then on every row, ``(c1)`` included). t/s in tokens per second,
  ttfr / est_ppt / e2e_ttft in ms; a figure a row does not have is empty (a pp row has no
  peak, a tg row no times), as llama-benchy leaves it.
- ``DIR/metadata.json``: ``recipe`` {model, container, runtime, hash}, ``cluster``
  {cluster_id, node_count, hosts, tp}, ``benchmark`` {framework, profile, args}, ``timing``
  {start, end, duration}, ``runtime_info``: the keys sparkrun 0.4.2 gives an Arena upload
  (REFERENCE 6a; its ``benchmarking/base.py``, read); a value the run does not know is
  null, never guessed.

The Arena's profile runs llama-benchy with ``--enable-prefix-caching`` (sparkrun's default
for it): at a depth above 0 a context-load request first (``ctx_pp @ d4096 (c5)``,
``ctx_tg @ d4096 (c5)`` rows), then the prompt over the cached context (the ``pp`` row's
t/s is then the prompt's tokens alone). The sweep does the same when its ``prefix_caching``
is on (``--spark-depth-sweep=arena``, the spark-arena-v2 profile, ``prefix=on``); else every
request is one fresh prefill of context and prompt (llama-benchy's standard mode).
``benchmark.args.prefix_caching`` says which.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pytest_spark.report.depth import depth_report
from pytest_spark.report.figures import as_dict

# llama-benchy 0.4.0 results.py save_report(format="csv"): its header, in its order.
CSV_COLUMNS = (
    "model",
    "test_name",
    "t_s_mean",
    "t_s_std",
    "t_s_req_mean",
    "t_s_req_std",
    "peak_ts_mean",
    "peak_ts_std",
    "peak_ts_req_mean",
    "peak_ts_req_std",
    "ttfr_mean",
    "ttfr_std",
    "est_ppt_mean",
    "est_ppt_std",
    "e2e_ttft_mean",
    "e2e_ttft_std",
)
CSV_NAME = "benchmark.csv"
METADATA_NAME = "metadata.json"
BENCHMARK_FRAMEWORK = "pytest-dgx-spark depth sweep (llama-benchy 0.4.0's figures)"


def test_name(kind: str, size: int, depth: int, concurrency: int, max_concurrency: int) -> str:
    """llama-benchy's row name: ``pp2048``, ``tg128 @ d4096``, ``pp2048 @ d4096 (c5)``; a
    context-load row (kind ``ctx_pp`` / ``ctx_tg``) has no size: ``ctx_pp @ d4096 (c5)``."""
    name = kind if kind.startswith("ctx_") else f"{kind}{size}"
    if depth > 0 or kind.startswith("ctx_"):
        name += f" @ d{depth}"
    if max_concurrency > 1:
        name += f" (c{concurrency})"
    return name


def _mean_std(metric: Any) -> tuple[float | None, float | None]:
    m = as_dict(metric)
    mean, std = m.get("mean"), m.get("std")
    if not isinstance(mean, int | float):
        return None, None
    return float(mean), float(std) if isinstance(std, int | float) else 0.0


def _row(model: str, name: str, **metrics: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"model": model, "test_name": name}
    for key in ("t_s", "t_s_req", "peak_ts", "peak_ts_req", "ttfr", "est_ppt", "e2e_ttft"):
        row[f"{key}_mean"], row[f"{key}_std"] = _mean_std(metrics.get(key))
    return row


def csv_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The sweep's cells as llama-benchy's CSV rows (a pp row, then a tg row, per cell, in
    llama-benchy's order: depth, then concurrency). A cell none of whose requests answered
    has no figures and no rows, as in llama-benchy."""
    model = str(report.get("model") or "Unknown")
    cells = [as_dict(b) for b in report.get("benchmarks") or ()]
    top = report.get("max_concurrency")
    top = (
        top
        if isinstance(top, int)
        else max((int(b.get("concurrency") or 1) for b in cells), default=1)
    )
    rows = []

    def order(b: dict[str, Any]) -> tuple[int, int, bool]:  # the context-load phase first
        ctx = bool(b.get("is_context_prefill_phase"))
        return int(b.get("context_size") or 0), int(b.get("concurrency") or 1), not ctx

    for b in sorted(cells, key=order):
        depth, c = int(b.get("context_size") or 0), int(b.get("concurrency") or 1)
        ctx = "ctx_" if b.get("is_context_prefill_phase") else ""
        if _mean_std(b.get("pp_throughput"))[0] is not None:
            rows.append(
                _row(
                    model,
                    test_name(f"{ctx}pp", int(b.get("prompt_size") or 0), depth, c, top),
                    t_s=b.get("pp_throughput"),
                    t_s_req=b.get("pp_req_throughput"),
                    ttfr=b.get("ttfr"),
                    est_ppt=b.get("est_ppt"),
                    e2e_ttft=b.get("e2e_ttft"),
                )
            )
        if (
            _mean_std(b.get("tg_throughput"))[0] is not None
            or _mean_std(b.get("peak_throughput"))[0] is not None
        ):
            rows.append(
                _row(
                    model,
                    test_name(f"{ctx}tg", int(b.get("response_size") or 0), depth, c, top),
                    t_s=b.get("tg_throughput"),
                    t_s_req=b.get("tg_req_throughput"),
                    peak_ts=b.get("peak_throughput"),
                    peak_ts_req=b.get("peak_req_throughput"),
                )
            )
    return rows


def csv_text(rows: list[dict[str, Any]]) -> str:
    """The rows as llama-benchy writes them (csv.DictWriter: header, then rows; an absent
    figure is an empty field)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


@dataclass(frozen=True)
class ArenaContext:
    """What the run knows beyond the sweep's figures, as plain data (the report side builds
    it from the settings: :func:`context_of`)."""

    profile: str
    recipe: dict[str, Any] = field(default_factory=dict)  # model, container, runtime, hash
    cluster_id: str | None = None
    tp: int | None = None
    image: str | None = None
    serve_args: str | None = None


def recipe_facts(recipe: Any) -> dict[str, Any]:
    """A sparkrun recipe's facts for ``metadata.json`` (``Settings.recipe``, a
    ``settings.sparkrun.SparkRecipe``: from ``--spark-recipe`` or the running job's file):
    model, container and runtime as sparkrun resolves them (``-o`` overrides first), the
    tensor-parallel size, and the hash: sha256 of the recipe file's bytes when it was read
    from a file (``origin`` ``recipe PATH``), else null."""
    if recipe is None:
        return {}
    digest = None
    origin = str(getattr(recipe, "origin", ""))
    if origin.startswith("recipe "):
        try:
            digest = "sha256:" + hashlib.sha256(Path(origin[7:]).read_bytes()).hexdigest()
        except OSError:
            digest = None
    tp = recipe.value("tensor_parallel")
    return {
        "model": recipe.value("model") or recipe.model,
        "container": recipe.value("container") or recipe.container or None,
        "runtime": recipe.runtime,
        "hash": digest,
        "tensor_parallel": tp if isinstance(tp, int) else None,
    }


def context_of(settings: Any) -> ArenaContext:
    """The run's own facts: the profile, the recipe (``--spark-recipe`` or the running
    sparkrun job's), the job's cluster id (``--spark-job``), the image and the serve args'
    tensor-parallel size."""
    recipe = recipe_facts(getattr(settings, "recipe", None))
    job = getattr(settings, "job", None)
    tp = None
    args = getattr(settings, "serve_args", None)
    if args:
        from pytest_spark.infra.serveargs import parse_serve_args

        try:
            tp = parse_serve_args(str(args)).tensor_parallel_size
        except ValueError:
            tp = None
    return ArenaContext(
        profile=settings.profile.name,
        recipe=recipe,
        cluster_id=str(job) if job else None,
        tp=tp if tp is not None else recipe.get("tensor_parallel"),
        image=getattr(settings, "image", None),
        serve_args=str(args) if args else None,
    )


def _redacted(hosts: list[str]) -> list[str]:
    """Hosts as sparkrun publishes them: ``node-`` and 8 hex of each one's sha256."""
    return ["node-" + hashlib.sha256(h.encode()).hexdigest()[:8] for h in hosts]


def _end(started: Any, duration: Any) -> str | None:
    try:
        start = datetime.fromisoformat(str(started))
        return (start + timedelta(seconds=float(duration))).isoformat()
    except (TypeError, ValueError):
        return None


def metadata(doc: dict[str, Any], report: dict[str, Any], ctx: ArenaContext) -> dict[str, Any]:
    """``metadata.json`` in the shape sparkrun 0.4.2 gives an Arena upload (its
    ``benchmarking/base.py``, read): ``recipe``, ``timing`` {start, end, duration},
    ``cluster`` {cluster_id, node_count, hosts (redacted), tp}, ``benchmark`` {framework,
    profile, args}, ``runtime_info``; null where the run does not know. ``recipe.hash``
    stays null: sparkrun's is the sha256 of its own normalised export of the recipe, which
    this run does not make; ``recipe.file_sha256`` is the recipe file's."""
    from pytest_spark.report.environment import environment

    cluster = as_dict(doc.get("cluster"))
    serving = as_dict(doc.get("serving"))
    hosts = [
        str(as_dict(n).get("address") or as_dict(n).get("name")) for n in cluster.get("nodes") or ()
    ]
    serving_nodes = serving.get("nodes") or ()
    env = environment(doc, None, None)
    cells = [as_dict(b) for b in report.get("benchmarks") or ()]

    def fact(key: str) -> Any:
        value = env.get(key)
        return None if not value or str(value).startswith("unknown") else value

    recipe = ctx.recipe
    return {
        "recipe": {
            "model": recipe.get("model") or report.get("model"),
            "container": recipe.get("container") or ctx.image,
            "runtime": recipe.get("runtime"),
            "hash": None,
            "file_sha256": recipe.get("hash"),
        },
        "timing": {
            "start": doc.get("started"),
            "end": _end(doc.get("started"), doc.get("duration_s")),
            "duration": doc.get("duration_s"),
            "sweep_start": report.get("timestamp"),
            "sweep_wall_s": round(sum(float(b.get("wall_s") or 0.0) for b in cells), 3),
        },
        "cluster": {
            "cluster_id": ctx.cluster_id,
            "node_count": len(serving_nodes) or len(hosts) or None,
            "hosts": _redacted(hosts),
            "hosts_redacted": True,
            "tp": ctx.tp,
        },
        "benchmark": {
            "framework": BENCHMARK_FRAMEWORK,
            "profile": ctx.profile,
            "args": {
                "depth": sorted({int(b.get("context_size") or 0) for b in cells}),
                "pp": sorted({int(b.get("prompt_size") or 0) for b in cells}),
                "tg": sorted({int(b.get("response_size") or 0) for b in cells}),
                "concurrency": sorted({int(b.get("concurrency") or 1) for b in cells}),
                "runs": report.get("runs"),
                "prefix_caching": bool(report.get("prefix_caching_enabled")),
                "latency_mode": report.get("latency_mode", "none"),
            },
            "order": report.get("heat_order"),
        },
        "runtime_info": {
            "vllm_version": fact("vLLM version"),
            "serve_args": ctx.serve_args or fact("vLLM engine args"),
            "nccl_version": fact("NCCL version"),
            "gpu_driver": fact("GPU driver"),
            "suite": env.get("Suite"),
            "simulated": bool(cluster.get("sim")),
        },
    }


def write_arena(directory: Path, doc: dict[str, Any], ctx: ArenaContext) -> list[Path] | str:
    """Write ``benchmark.csv`` and ``metadata.json`` into ``directory`` from the results
    document; the paths written, or why nothing was (no depth sweep in this run)."""
    report = depth_report(doc)
    if report is None:
        return (
            "no depth sweep in this run: --spark-arena writes the sweep's figures; run it "
            "with --spark-depth-sweep or --spark-profile=spark-arena-v2"
        )
    directory.mkdir(parents=True, exist_ok=True)
    csv_path = directory / CSV_NAME
    # as llama-benchy writes it: csv's own line ends (\r\n), untranslated
    csv_path.write_text(csv_text(csv_rows(report)), encoding="utf-8", newline="")
    meta_path = directory / METADATA_NAME
    meta_path.write_text(json.dumps(metadata(doc, report, ctx), indent=2) + "\n")
    return [csv_path, meta_path]
