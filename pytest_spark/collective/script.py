"""Benchmark scripts shipped with the plugin and copied to the nodes to run there.

Each module here is standalone (stdlib, plus torch where it measures): the runner reads its
text with :func:`script_text` and sends it to the node, so nothing here may import the rest
of ``pytest_spark``.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["script_text"]


def script_text(name: str = "allreduce.py") -> str:
    """The source of a shipped benchmark script, to copy to a node."""
    return resources.files("pytest_spark").joinpath(f"collective/{name}").read_text()
