"""``date`` of a node under the ``clock`` fault: the one faked clock of sparksim.

The wrapper exists in the node's tools directory (first on PATH) only while the fault is
set; it runs the real ``date`` at the machine's time plus ``clock_offset_s`` from
state.json, so ``date +%s.%N`` and every other format read the skewed clock. Explicit
``-d``/``-r``/``-s``/``-f`` uses are passed through untouched.
"""

from __future__ import annotations

import os
import time

from .ports import load_state

LONG = ("--date", "--reference", "--set", "--file")
SHORT = ("-d", "-r", "-s", "-f")


def _explicit(argv: list[str]) -> bool:
    """The caller names the time itself (``-d @0``, ``--date=...``, ``-r FILE``...)."""
    for a in argv:
        if a in LONG or a.startswith(tuple(f"{o}=" for o in LONG)):
            return True
        if not a.startswith("--") and a[:2] in SHORT:
            return True
    return False


def date(node_dir: str, real: str, argv: list[str]) -> int:
    try:
        offset = float(load_state(node_dir).get("clock_offset_s") or 0.0)
    except (OSError, ValueError):
        offset = 0.0
    if offset == 0.0 or _explicit(argv):
        os.execv(real, [real, *argv])
    now = time.time() + offset
    os.execv(real, [real, "-d", f"@{now:.9f}", *argv])
    return 0  # not reached
