"""Run history and regressions, stored like pytest-benchmark's: one JSON file per run,
``DIR/<profile>-<cluster hash>/NNNN_<commit>_<time>.json``, with machine and cluster
identity, the suite's git commit, time, profile and the run's figures."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pytest_spark.report.figures import Metric, renamed_metric, spec_matches

FORMAT_VERSION = 1
_NAME = re.compile(r"^(\d{4,})_([^_]+)_(\d{8}T\d{6}Z)(?:_\d+)?\.json$")


def cluster_identity(
    cluster: dict[str, Any], sim_nodes: list[str] | None = None, api_url: str | None = None
) -> dict[str, Any]:
    """Head address + node names + profile, and a stable hash of them. A sparksim cluster
    is identified by its node hostnames, not by its per-instance addresses; a run with
    ``--spark-api-url`` alone by the API's host and port."""
    sim = bool(cluster.get("sim"))
    head = "sparksim" if sim else str(cluster.get("head") or "")
    if not head and api_url:
        head = "api " + urlsplit(api_url).netloc.rsplit("@", 1)[-1]
    if sim and sim_nodes:
        nodes = list(sim_nodes)
    else:
        nodes = [str(n.get("address") or n.get("name")) for n in cluster.get("nodes") or ()]
    profile = str(cluster.get("profile") or "")
    key = json.dumps({"head": head, "nodes": nodes, "profile": profile}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()
    slug = re.sub(r"[^\w.-]", "_", profile)[:40] or "cluster"
    return {
        "id": f"{slug}-{digest[:10]}",
        "hash": digest,
        "head": head,
        "nodes": nodes,
        "profile": profile,
        "sim": sim,
    }


def git_commit(path: Path) -> dict[str, Any] | None:
    """The suite's commit (None outside a git checkout or without git)."""

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(
                ["git", "-C", str(path), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    try:
        dirty = (
            subprocess.run(
                ["git", "-C", str(path), "diff-index", "--quiet", "HEAD", "--"],
                capture_output=True,
                timeout=20,
                check=False,
            ).returncode
            == 1
        )
    except (OSError, subprocess.SubprocessError):
        dirty = None
    return {"id": commit, "short": commit[:8], "branch": branch, "dirty": dirty}


def suite_version() -> str:
    """pytest-dgx-spark's version, as installed (not through the package root: the report
    must not import the plugin's public surface, which imports the report)."""
    try:
        return importlib.metadata.version("pytest-dgx-spark")
    except importlib.metadata.PackageNotFoundError:  # run from a bare source tree
        return "unknown"


def machine_info() -> dict[str, Any]:
    return {
        "node": platform.node(),
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "pytest_dgx_spark": suite_version(),
        "argv0": Path(sys.argv[0]).name if sys.argv else None,
    }


def default_history_dir(
    rootpath: Path, inipath: Path | None, environ: Mapping[str, str]
) -> tuple[Path, str]:
    """Where the run history goes when --spark-history is not given, and why there: the
    project's rootdir (an ini file makes one), else the user's cache directory, never
    whatever directory the run happens to start in."""
    if inipath is not None:
        return rootpath / ".spark-history", f"the rootdir's .spark-history (ini file {inipath})"
    cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (
        Path(cache) / "pytest-dgx-spark" / "history",
        "the user cache directory (no ini file here, so no project rootdir)",
    )


def resolve_history_dir(
    history: Path | None,
    source: str,
    rootpath: Path,
    inipath: Path | None,
    invocation_dir: Path,
    environ: Mapping[str, str],
) -> tuple[Path | None, str]:
    """The run history's folder (None: --spark-history=off) and, when the default chose
    it, why there; a relative --spark-history is taken from where the run started."""
    if history is None:
        return None, ""
    if source == "default":
        return default_history_dir(rootpath, inipath, environ)
    return (history if history.is_absolute() else invocation_dir / history), ""


@dataclass(frozen=True)
class Run:
    number: int
    path: Path

    @property
    def label(self) -> str:
        return self.path.stem

    def load(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.path.read_text())
        return data


class History:
    """The runs of one cluster identity under the history root."""

    def __init__(self, root: Path, identity: dict[str, Any]) -> None:
        self.root = root
        self.identity = identity
        self.dir: Path = root / str(identity["id"])

    def runs(self) -> list[Run]:
        if not self.dir.is_dir():
            return []
        found = [Run(int(m.group(1)), p) for p in self.dir.iterdir() if (m := _NAME.match(p.name))]
        return sorted(found, key=lambda r: (r.number, r.path.name))

    def find(self, ref: str) -> Run | None:
        """``last`` (the latest run that was not interrupted), a number, a file name or
        stem in this cluster's history, or a path to any history file."""
        runs = self.runs()
        if ref == "last":
            for run in reversed(runs):
                try:
                    if not run.load().get("interrupted"):
                        return run
                except (OSError, ValueError):
                    continue
            return None
        if ref.isdigit():
            return next((r for r in reversed(runs) if r.number == int(ref)), None)
        for run in runs:
            if ref in (run.path.name, run.path.stem) or run.path.name.startswith(ref + "_"):
                return run
        path = Path(ref).expanduser()
        if path.is_file():
            m = _NAME.match(path.name)
            return Run(int(m.group(1)) if m else 0, path)
        return None

    def save(self, record: dict[str, Any], when: datetime) -> Path:
        """Write the next ``NNNN_<commit>_<time>.json`` (claimed with O_EXCL: parallel
        sessions never overwrite each other)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        commit = (record.get("commit") or {}).get("short") or "nogit"
        stamp = when.strftime("%Y%m%dT%H%M%SZ")
        number = (self.runs()[-1].number if self.runs() else 0) + 1
        for attempt in range(100):
            path = self.dir / f"{number + attempt:04d}_{commit}_{stamp}.json"
            record["run"] = number + attempt
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(record, indent=2, default=str) + "\n")
            return path
        raise OSError(f"no free run number in {self.dir}")


def history_record(
    *,
    identity: dict[str, Any],
    metrics: dict[str, Metric],
    started: datetime,
    exitstatus: int,
    outcomes: dict[str, int],
    commit: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "version": FORMAT_VERSION,
        "run": None,
        "datetime": started.astimezone(UTC).isoformat(),
        "commit": commit,
        "machine": machine_info(),
        "cluster": identity,
        "profile": identity["profile"],
        "exitstatus": exitstatus,
        "interrupted": exitstatus == 2,
        "outcomes": outcomes,
        "metrics": {name: m.to_dict() for name, m in sorted(metrics.items())},
    }


@dataclass(frozen=True)
class Delta:
    name: str
    old: float
    new: float
    unit: str
    better: str
    limit: float | None  # the --spark-compare-fail percentage that applies, if any

    @property
    def pct(self) -> float | None:
        if self.old == 0:
            return None
        return (self.new - self.old) / abs(self.old) * 100.0

    @property
    def worse_pct(self) -> float | None:
        """How much worse (positive) or better (negative), in percent."""
        pct = self.pct
        if pct is None:
            return None
        return -pct if self.better == "higher" else pct

    @property
    def regressed(self) -> bool:
        worse = self.worse_pct
        return self.limit is not None and worse is not None and worse > self.limit

    def describe(self) -> str:
        pct = self.pct
        shown = "n/a" if pct is None else f"{pct:+.1f}%"
        limit = f", limit {self.limit:g}%" if self.limit is not None else ""
        return f"{self.name}: {fmt(self.old)} -> {fmt(self.new)} {self.unit} ({shown}{limit})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.name,
            "old": self.old,
            "new": self.new,
            "unit": self.unit,
            "better": self.better,
            "pct": None if self.pct is None else round(self.pct, 2),
            "limit_pct": self.limit,
            "regressed": self.regressed,
        }


def fmt(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"


@dataclass(frozen=True)
class Comparison:
    baseline: Run
    baseline_doc: dict[str, Any]
    deltas: list[Delta]
    missing: list[str]  # measured in the baseline, not in this run

    @property
    def regressions(self) -> list[Delta]:
        return [d for d in self.deltas if d.regressed]

    @property
    def baseline_desc(self) -> str:
        doc = self.baseline_doc
        commit = (doc.get("commit") or {}).get("short") or "no commit"
        when = str(doc.get("datetime") or "?")[:19].replace("T", " ")
        return f"run {self.baseline.label} ({commit}, {when} UTC)"

    def message(self) -> str:
        regs = self.regressions
        if not regs:
            return ""
        return f"{len(regs)} figure(s) regressed against {self.baseline_desc}: " + "; ".join(
            d.describe() for d in regs
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": str(self.baseline.path),
            "baseline_run": self.baseline.label,
            "deltas": [d.to_dict() for d in self.deltas],
            "missing": self.missing,
            "regressions": [d.describe() for d in self.regressions],
            "message": self.message(),
        }


def limit_for(name: str, specs: tuple[tuple[str, float], ...]) -> float | None:
    """The most specific ``--spark-compare-fail`` entry covering ``name``."""
    matching = [(len(spec), pct) for spec, pct in specs if spec_matches(spec, name)]
    return max(matching)[1] if matching else None


def compare(
    baseline: Run, metrics: dict[str, Metric], specs: tuple[tuple[str, float], ...]
) -> Comparison:
    doc = baseline.load()
    # a record written before issue #27 names the load time "load": read it as "startup"
    old = {renamed_metric(k): v for k, v in (doc.get("metrics") or {}).items()}
    deltas = []
    for name, metric in metrics.items():
        before = old.get(name)
        if not isinstance(before, dict) or not isinstance(before.get("value"), int | float):
            continue
        deltas.append(
            Delta(
                name,
                float(before["value"]),
                metric.value,
                metric.unit,
                metric.better,
                limit_for(name, specs),
            )
        )
    missing = sorted(set(old) - set(metrics))
    return Comparison(baseline, doc, deltas, missing)
