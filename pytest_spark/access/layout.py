"""Where the serving containers are and where their vLLM output is: the serving layout,
found once per session (``Cluster.layout``).

Two layouts serve vLLM on Sparks:

- **launch-cluster.sh** (eugr/spark-vllm-docker, the default): one container name on every
  node (``--spark-container``, default ``vllm_node``), vLLM's output in ``docker logs``.
- **sparkrun** (spark-arena/sparkrun 0.4.2, field reference 6a): one container per node
  named ``sparkrun_<intent>_<hash>_node_<rank>`` (``_head``/``_worker`` under Ray,
  ``_solo`` alone), labelled ``sparkrun.cluster_id``, ``sparkrun.rank``,
  ``sparkrun.runtime``, ``sparkrun.served_model_name``, ``sparkrun.model``,
  ``sparkrun.recipe``; PID 1 is ``sleep infinity`` and ``vllm serve`` is ``docker exec``'d
  with its output in ``/tmp/sparkrun_serve.log`` inside the container (``docker logs``
  holds none of it).

Without ``--spark-container``, each node is asked once (``docker ps`` filtered on the
``sparkrun.cluster_id`` label, all nodes at once); no sparkrun container anywhere keeps the
launch-cluster.sh layout exactly as before. Several jobs on the nodes need
``--spark-job=CLUSTER_ID``: :class:`LayoutError` lists them.

Readers take the per-node container name (:meth:`ServingLayout.container`) and read the
serve log through :func:`log_tail_command` (or, for a cursor, ``serve_log``), never a
fixed name.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_spark.access.files import write_json


class Named(Protocol):
    """A node as the layout needs it (``access.cluster.Node``): its name."""

    name: str


SPARKRUN_LOG = "/tmp/sparkrun_serve.log"
LAYOUT_FILE = "layout.json"  # in the run directory: the controller's discovery, for workers
ID_LABEL = "sparkrun.cluster_id"
# docker ps columns, in this order (a label missing on a container prints empty).
PS_FIELDS = (
    "name",
    "state",
    "cluster_id",
    "rank",
    "runtime",
    "served_model_name",
    "model",
    "recipe",
)
_PS_FORMAT = "\t".join(
    ["{{.Names}}", "{{.State}}"] + [f'{{{{.Label "sparkrun.{f}"}}}}' for f in PS_FIELDS[2:]]
)
DISCOVERY_COMMAND = (
    f"docker ps -a --filter label={ID_LABEL} --format {shlex.quote(_PS_FORMAT)} 2>/dev/null; true"
)
LIVE_STATES = ("running", "restarting", "paused")


class LayoutError(Exception):
    """The layout cannot be chosen (several sparkrun jobs, or --spark-job names none)."""


@dataclass(frozen=True)
class RankContainer:
    """One sparkrun rank container as ``docker ps`` lists it on a node."""

    node: str
    name: str
    state: str
    cluster_id: str
    rank: int | None
    runtime: str = ""
    served_model_name: str = ""
    model: str = ""
    recipe: str = ""


def parse_ps(node: str, text: str) -> list[RankContainer]:
    """:data:`DISCOVERY_COMMAND`'s output on ``node`` -> its sparkrun containers (a line
    that is not one, such as a docker error, is left out)."""
    found = []
    for line in text.splitlines():
        cols = line.split("\t")
        if len(cols) != len(PS_FIELDS) or not cols[0] or not cols[2]:
            continue
        values = dict(zip(PS_FIELDS, cols, strict=True))
        rank = values.pop("rank")
        found.append(
            RankContainer(
                node=node,
                rank=int(rank) if rank.strip().isdigit() else None,
                **{k: v.strip() for k, v in values.items()},
            )
        )
    return found


def parse_inspect_labels(data: list[dict[str, Any]]) -> dict[str, str]:
    """``docker inspect NAME``'s JSON -> the container's ``sparkrun.*`` labels."""
    if not data:
        return {}
    labels = (data[0].get("Config") or {}).get("Labels") or {}
    return {k: str(v) for k, v in labels.items() if k.startswith("sparkrun.")}


@dataclass(frozen=True)
class SparkrunJob:
    """A sparkrun job as its containers' labels say: its id, what it serves, its ranks."""

    cluster_id: str
    runtime: str
    served_model_name: str
    model: str
    recipe: str
    ranks: tuple[RankContainer, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.node for r in self.ranks))

    def describe(self) -> str:
        """One line: id, recipe, served model, nodes (the listing of several jobs)."""
        where = ", ".join(f"{r.node} rank {r.rank} ({r.state})" for r in self.ranks)
        return (
            f"{self.cluster_id}: recipe {self.recipe or '?'}, serves "
            f"{self.served_model_name or self.model or '?'} ({self.runtime or '?'}) on {where}"
        )


def jobs_of(containers: list[RankContainer]) -> list[SparkrunJob]:
    """The containers grouped by job, in order of first appearance (head first)."""
    grouped: dict[str, list[RankContainer]] = {}
    for c in containers:
        grouped.setdefault(c.cluster_id, []).append(c)
    jobs = []
    for cid, ranks in grouped.items():
        ranks.sort(key=lambda r: (r.rank is None, r.rank or 0))
        first = ranks[0]
        jobs.append(
            SparkrunJob(
                cid, first.runtime, first.served_model_name, first.model, first.recipe,
                tuple(ranks),
            )
        )  # fmt: skip
    return jobs


@dataclass(frozen=True)
class ServingLayout:
    """The serving containers: each node's name (``default`` where none is its own), where
    vLLM's output is (``serve_log``: a file inside the container; None: ``docker logs``),
    and the sparkrun job they belong to (None: launch-cluster.sh's layout)."""

    default: str
    containers: Mapping[str, str] = field(default_factory=dict)
    serve_log: str | None = None
    job: SparkrunJob | None = None

    @property
    def kind(self) -> str:
        return "sparkrun" if self.job is not None else "launch-cluster.sh"

    def container(self, node: Named | str) -> str:
        """The serving container on ``node`` (a Node or its name)."""
        name = node if isinstance(node, str) else node.name
        return self.containers.get(name, self.default)

    def names(self) -> tuple[str, ...]:
        """Every container name the layout uses (one for launch-cluster.sh)."""
        return tuple(dict.fromkeys([*self.containers.values()] or [self.default]))

    def describe(self) -> str:
        """For notices and the header: what was found and where the log is read."""
        if self.job is None:
            return f"container {self.default!r} on every node, its log in docker logs"
        per_node = ", ".join(f"{n}: {c}" for n, c in self.containers.items())
        return (
            f"sparkrun job {self.job.cluster_id} (recipe {self.job.recipe or '?'}, "
            f"{self.job.runtime or '?'}): {per_node}; serve log {self.serve_log} in each"
        )

    def log_hint(self, node: str) -> str:
        """Where an operator reads ``node``'s vLLM output, as a command."""
        return f"`{log_tail_command(self.container(node), self.serve_log, 100)}` on {node}"

    def to_json(self) -> dict[str, Any]:
        job = None
        if self.job is not None:
            job = {
                "cluster_id": self.job.cluster_id,
                "runtime": self.job.runtime,
                "served_model_name": self.job.served_model_name,
                "model": self.job.model,
                "recipe": self.job.recipe,
                "ranks": [vars(r) for r in self.job.ranks],
            }
        return {
            "default": self.default,
            "containers": dict(self.containers),
            "serve_log": self.serve_log,
            "job": job,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServingLayout:
        raw = data.get("job")
        job = None
        if raw:
            ranks = tuple(RankContainer(**r) for r in raw.get("ranks", ()))
            job = SparkrunJob(
                raw["cluster_id"], raw.get("runtime", ""), raw.get("served_model_name", ""),
                raw.get("model", ""), raw.get("recipe", ""), ranks,
            )  # fmt: skip
        return cls(data["default"], dict(data.get("containers", {})), data.get("serve_log"), job)


def launcher_layout(container: str) -> ServingLayout:
    """launch-cluster.sh's: one name on every node, vLLM's output in docker logs."""
    return ServingLayout(container)


def sparkrun_layout(job: SparkrunJob, node_names: list[str]) -> ServingLayout:
    """The job's rank container on each node. A node of the cluster with none of the job's
    containers (a rank gone with its ``--rm`` container) gets the name it would have,
    ``<stem>_node_<index>``, so that its checks say what is missing there."""
    containers = {r.node: r.name for r in job.ranks}
    stem = next((r.name.rsplit("_node_", 1)[0] for r in job.ranks if "_node_" in r.name), None)
    for index, node in enumerate(node_names):
        if node not in containers and stem is not None:
            containers[node] = f"{stem}_node_{index}"
    ordered = {n: containers[n] for n in node_names if n in containers}
    ordered.update({n: c for n, c in containers.items() if n not in ordered})
    head = ordered.get(node_names[0]) if node_names else None
    return ServingLayout(head or job.ranks[0].name, ordered, SPARKRUN_LOG, job)


def choose(
    found: list[RankContainer],
    node_names: list[str],
    container: str,
    want: str | None,
) -> ServingLayout:
    """The layout from the nodes' sparkrun containers: none (and no ``want``) keeps
    launch-cluster.sh's ``container``; one job, or the one ``want`` names, is sparkrun's.
    Jobs with a running container come before stopped leftovers."""
    jobs = jobs_of(found)
    if want is not None:
        picked = [j for j in jobs if j.cluster_id == want]
        if not picked:
            listing = "; ".join(j.describe() for j in jobs) or "none"
            raise LayoutError(
                f"--spark-job={want}: no sparkrun container on the nodes carries "
                f"{ID_LABEL}={want}. Jobs found: {listing}. Give one of their ids, or "
                "leave --spark-job out"
            )
        return sparkrun_layout(picked[0], node_names)
    live = [j for j in jobs if any(r.state in LIVE_STATES for r in j.ranks)]
    candidates = live or jobs
    if not candidates:
        return launcher_layout(container)
    if len(candidates) > 1:
        listing = "\n".join(f"  {j.describe()}" for j in candidates)
        raise LayoutError(
            f"{len(candidates)} sparkrun jobs run on the nodes; pick the one to test with "
            f"--spark-job=CLUSTER_ID (or SPARK_JOB, ini spark_job):\n{listing}"
        )
    return sparkrun_layout(candidates[0], node_names)


class LayoutSource(Protocol):
    """What :func:`discover` asks (``access.cluster.Cluster``)."""

    def discover_layout(self, settings: Any = None) -> ServingLayout: ...


def discover(cluster: LayoutSource, settings: Any = None) -> ServingLayout:
    """The serving layout on the cluster's nodes now (``Cluster.discover_layout``): the
    sparkrun job's rank containers (``settings.job`` picks one of several), else
    launch-cluster.sh's one name. Raises :class:`LayoutError`."""
    return cluster.discover_layout(settings)


def log_tail_command(container: str, serve_log: str | None, lines: int) -> str:
    """The last ``lines`` lines of vLLM's output in ``container`` (stdout, errors on
    stderr): ``docker logs --tail`` or ``tail`` of the serve log inside it."""
    c = shlex.quote(container)
    if serve_log is None:
        return f"docker logs --tail {int(lines)} {c} 2>&1"
    return f"docker exec {c} tail -n {int(lines)} {shlex.quote(serve_log)}"


def log_read_command(container: str, serve_log: str | None) -> str:
    """vLLM's whole output in ``container`` so far (the shell's stdout)."""
    c = shlex.quote(container)
    if serve_log is None:
        return f"docker logs {c} 2>&1"
    return f"docker exec {c} cat {shlex.quote(serve_log)} 2>/dev/null"


def save(run_dir: Path, layout: ServingLayout) -> None:
    """The session's layout, for the xdist workers (:func:`load`)."""
    write_json(run_dir / LAYOUT_FILE, layout.to_json())


def load(run_dir: Path) -> ServingLayout | None:
    """The layout the controller found (None: it found none to hand over)."""
    try:
        data = json.loads((run_dir / LAYOUT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return ServingLayout.from_json(data) if isinstance(data, dict) else None
