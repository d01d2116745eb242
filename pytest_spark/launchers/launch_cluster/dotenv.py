"""The launcher's ``.env`` beside launch-cluster.sh, parsed as the script reads it (no I/O;
what it overrides of the suite's command line is ``driver.apply_dotenv``'s)."""

from __future__ import annotations

import posixpath


def dotenv_path(script: str) -> str:
    """The ``.env`` the launcher reads: beside the script."""
    return posixpath.join(posixpath.dirname(script) or ".", ".env")


def parse_dotenv(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of a launcher ``.env`` (comments, ``export``, quotes allowed)."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.removeprefix("export ").partition("=")
        if not eq or not key.strip().isidentifier():
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        values[key.strip()] = value
    return values
