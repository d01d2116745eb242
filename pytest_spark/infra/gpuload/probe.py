"""The pre-serving GPU load of one node, and its facts.

``gpuload_probe_command(image=..., load_s=..., interval_s=...)`` is one ``sh -c`` command
(marker-framed sections, :func:`pytest_spark.infra.probe.probe_script`)::

    samples  the load program (:mod:`pytest_spark.infra.gpuload.load_probe`, sent base64 on the
             command line) started in the background, in the serving image where the node
             has it (``docker run --rm -i --gpus all --network host``: the container's
             torch, as the engine will run) else by the host's ``python3``; while it runs,
             ``nvidia-smi --query-gpu=SAMPLE_FIELDS`` every ``interval_s`` seconds (one
             CSV row per GPU per sample)
    load     the load program's output (its summary line last)

It runs alone (``load_s`` plus the container's start), never in the shared host round
trip; every node runs it at once. The parsers are in :mod:`pytest_spark.infra.gpuload.parse`.
"""

from __future__ import annotations

import base64
import shlex
from dataclasses import dataclass
from importlib import resources

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.gpuload.parse import (
    SAMPLE_FIELDS,
    GpuSample,
    LoadSummary,
    parse_load_summary,
    parse_samples,
)
from pytest_spark.infra.probe import ProbeSection, probe_script, split_probe

__all__ = ["MARKER", "NodeLoad", "gpuload_probe_command", "parse_gpuload_probe"]

MARKER = "@@pytest-spark-gpuload@@"
START_S = 60  # a container's start (and the image's torch import) on top of the load

_BODY = r"""
o="$t.load"
s samples sh -c 'o=$1; img=$2; secs=$3; every=$4; n=$5
  printf %s "$6" | base64 -d >"$o.py" || exit 2
  if [ -n "$img" ] && docker image inspect "$img" >/dev/null 2>&1; then
    docker run --rm -i --gpus all --network host --ipc host --name "pytest-spark-gpuload-$$" \
      --entrypoint python3 "$img" - "$secs" "$img" <"$o.py" >"$o" 2>&1 &
  else
    python3 "$o.py" "$secs" host >"$o" 2>&1 &
  fi
  p=$!; i=0; r=0
  while [ "$i" -lt "$n" ]; do
    sleep "$every"
    nvidia-smi --query-gpu=@FIELDS@ --format=csv,noheader,nounits || r=$?
    i=$((i+1))
    kill -0 "$p" 2>/dev/null || break
  done
  wait "$p"; w=$?
  rm -f "$o.py"
  [ "$r" -ne 0 ] && exit "$r"
  exit "$w"' _ "$o" @IMAGE@ @SECONDS@ @EVERY@ @COUNT@ @PROGRAM@
s load sh -c 'cat "$1"; rm -f "$1"' _ "$o"
rm -f "$t"
"""


def load_program() -> str:
    """The load program's source, as sent to the node."""
    return resources.files("pytest_spark").joinpath("infra/gpuload/load_probe.py").read_text()


def gpuload_probe_command(*, image: str | None, load_s: float, interval_s: float) -> str:
    """The node's load-and-sample command; ``image``: the serving image (None: the host's
    python3 runs the load)."""
    if load_s <= 0 or interval_s <= 0:
        raise ValueError(f"load {load_s} s every {interval_s} s: both must be positive")
    count = max(1, int(load_s / interval_s))
    program = base64.b64encode(load_program().encode()).decode()
    body = (
        _BODY.replace("@FIELDS@", ",".join(SAMPLE_FIELDS))
        .replace("@IMAGE@", shlex.quote(image or ""))
        .replace("@SECONDS@", f"{load_s:g}")
        .replace("@EVERY@", f"{interval_s:g}")
        .replace("@COUNT@", str(count))
        .replace("@PROGRAM@", program)
    )
    return probe_script(MARKER, "gpuload", int(load_s) + START_S, body)


@dataclass(frozen=True)
class NodeLoad:
    """One node's samples under the load and what the load says it ran; ``error`` says
    why there are no samples or no summary (the facts present are kept)."""

    samples: tuple[GpuSample, ...]
    summary: LoadSummary | None
    error: str | None = None
    raw: str = ""  # the samples' CSV, for evidence


def _why(section: ProbeSection | None) -> str:
    if section is None:
        return "not in the probe output"
    if section.rc is None:
        return "output cut short"
    if section.rc == 124:
        return "timed out"
    first = next((ln.strip() for ln in section.stderr.splitlines() if ln.strip()), "")
    return f"exit {section.rc}" + (f": {first}" if first else "")


def parse_gpuload_probe(text: str) -> NodeLoad:
    """The facts from the probe's ``samples`` and ``load`` sections."""
    _, sections = split_probe(text, marker=MARKER, what="GPU load probe")
    samples_section, load_section = sections.get("samples"), sections.get("load")
    errors = []
    summary = None
    if load_section is not None:
        try:
            summary = parse_load_summary(load_section.stdout)
        except ParseError:
            tail = " | ".join(load_section.stdout.strip().splitlines()[-3:])
            errors.append(f"the load program gave no summary ({tail or 'no output'})")
    samples: list[GpuSample] = []
    raw = samples_section.stdout if samples_section is not None else ""
    rows = [ln for ln in raw.splitlines() if "," in ln]
    try:
        samples = parse_samples("\n".join(rows))
    except ParseError as exc:
        errors.append(str(exc))
    if not samples:
        errors.append(f"no nvidia-smi sample ({_why(samples_section)})")
    return NodeLoad(tuple(samples), summary, "; ".join(errors) or None, "\n".join(rows))
