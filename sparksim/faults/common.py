"""What every fault module shares: the record of active faults (DIR/faults.json, which
``spark-sim status`` lists and ``fault clear`` undoes) and the argparse of its kinds
(``spark-sim fault KIND NODE ...``)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..netns import SimError
from ..node import write_atomic
from ..topology import NodeSpec, Topology, resolve_node

FAULTS_JSON = "faults.json"
NODE_HELP = "node: index (1..N), hostname, 'head' or 'worker-N'"

Entry = dict[str, Any]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def resolve(topo: Topology, spec: str) -> NodeSpec:
    """The node a fault's NODE argument names (index, hostname, head, worker-N)."""
    try:
        return resolve_node(topo, spec)
    except ValueError as exc:
        raise SimError(str(exc)) from exc


def load_faults(state_dir: Path) -> list[Entry]:
    try:
        data = json.loads((state_dir / FAULTS_JSON).read_text())
    except (OSError, json.JSONDecodeError):
        return []
    return data if isinstance(data, list) else []


def save_faults(state_dir: Path, entries: list[Entry]) -> None:
    write_atomic(state_dir / FAULTS_JSON, json.dumps(entries, indent=2) + "\n")


def stamp() -> str:
    """The time an entry's ``since`` gives (local time, with its offset)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def record(
    state_dir: Path,
    kind: str,
    node: str,
    ifname: str,
    value: Any,
    *,
    replaces: Callable[[Entry], bool] | None = None,
    active: bool = True,
    since: str | None = None,
) -> None:
    """Record one fault: drop the entries it supersedes (``replaces``; by default the same
    kind on the same node and interface), then add it unless it is no fault any more
    (``active=False``: a value set back to healthy)."""
    same = replaces or (
        lambda f: (f.get("kind"), f.get("node"), f.get("if")) == (kind, node, ifname)
    )
    entries = [f for f in load_faults(state_dir) if not same(f)]
    if active:
        entries.append(
            {"kind": kind, "node": node, "if": ifname, "value": value, "since": since or stamp()}
        )
    save_faults(state_dir, entries)


def forget(state_dir: Path, drop: Callable[[Entry], bool]) -> None:
    """Remove the entries ``drop`` matches (their faults undone)."""
    save_faults(state_dir, [f for f in load_faults(state_dir) if not drop(f)])


@dataclass(frozen=True)
class Kinds:
    """The ``spark-sim fault`` subcommands, where each fault module adds its kinds."""

    sub: Any  # argparse's subparsers action
    common: argparse.ArgumentParser  # --state-dir, accepted after the kind too

    def add(self, kind: str, help: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = self.sub.add_parser(
            kind, parents=[self.common], help=help
        )
        return parser

    def on_node(self, kind: str, help: str, metavar: str = "NODE") -> argparse.ArgumentParser:
        """A kind whose first argument is the node it hits."""
        parser = self.add(kind, help)
        parser.add_argument("node", metavar=metavar, help=NODE_HELP)
        return parser
