"""The probe framing every node probe shares: a probe is one ``sh -c`` command whose sections
are framed by marker lines (:func:`probe_script`), several probes share one round trip
(:func:`joint_probe`), and :func:`split_probe` cuts the output back into
:class:`ProbeSection` entries, each topic's parser reading its own::

    MARKER probe v1 HOSTNAME
    MARKER begin NAME
    ...stdout of the command...
    MARKER stderr NAME
    ...stderr of the command...
    MARKER end NAME rc=N

A missing tool gives ``rc=127`` and ``TOOL: command not found`` on its stderr; every other
section still runs. A tool that hangs is stopped after the timeout (``rc=124``) where
coreutils ``timeout`` exists. No I/O here: the caller runs the command on the node.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from pytest_spark.infra.errors import ParseError

__all__ = ["PROBE_CONTAINER_PREFIX", "ProbeSection", "joint_probe", "probe_script", "split_probe"]

# The name of a throwaway container a probe runs (``docker run --rm --name PREFIX$$``: the
# nodes-alike probe reads the image's versions in one). Another check that lists the
# node's containers (the GPU holders) knows it as the suite's own: under xdist one worker's
# probe runs while another worker's lists containers.
PROBE_CONTAINER_PREFIX = "pytest-spark-probe-"

_FRAME = r"""
export LC_ALL=C
PATH="$PATH:/usr/sbin:/sbin"
M=@MARKER@
t=$(mktemp 2>/dev/null) || t="/tmp/.pytest-spark-@NAME@.$$"
T=''
command -v timeout >/dev/null 2>&1 && T='timeout @TIMEOUT@'
s() {
  n=$1; shift
  echo "$M begin $n"
  if command -v "$1" >/dev/null 2>&1; then
    $T "$@" 2>"$t"; r=$?
  else
    echo "$1: command not found" >"$t"; r=127
  fi
  echo
  echo "$M stderr $n"
  cat "$t" 2>/dev/null
  echo
  echo "$M end $n rc=$r"
}
echo "$M probe v1 $(uname -n 2>/dev/null)"
"""


def probe_script(marker: str, name: str, timeout_s: int, body: str) -> str:
    """A marker-framed probe as one ``sh -c`` command: ``s NAME CMD...`` in ``body`` runs
    CMD (bounded by ``timeout``) and frames its stdout, stderr and exit code for
    :func:`split_probe`; a missing tool is a section with rc 127, not a failed probe."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    frame = (
        _FRAME.replace("@MARKER@", shlex.quote(marker))
        .replace("@NAME@", name)
        .replace("@TIMEOUT@", str(int(timeout_s)))
    )
    return "sh -c " + shlex.quote((frame + body).strip() + "\n")


_JOINT = r"""
d=$(mktemp -d 2>/dev/null) || { d="/tmp/.pytest-spark-joint.$$"; mkdir -p "$d"; }
i=0
for c in "$@"; do
  i=$((i+1))
  sh -c "$c" >"$d/$i" 2>"$d/$i.err" </dev/null &
done
wait
i=0
for c in "$@"; do
  i=$((i+1))
  cat "$d/$i"
  cat "$d/$i.err" >&2
done
rm -rf "$d"
"""


def joint_probe(commands: list[str]) -> str:
    """Several probe commands as one ``sh -c`` command (one round trip): they run side by
    side on the node, their outputs are printed one after another in the given order (each
    probe's own marker keeps its sections apart; the parsers skip lines outside their
    own), and the scratch directory holding them is removed."""
    if not commands:
        raise ValueError("joint_probe needs at least one command")
    if len(commands) == 1:
        return commands[0]
    return shlex.join(["sh", "-c", _JOINT.strip() + "\n", "_", *commands])


@dataclass(frozen=True)
class ProbeSection:
    """One framed section of the probe output. ``rc`` is ``None`` when the output was
    cut before the section's end marker."""

    name: str
    stdout: str
    stderr: str
    rc: int | None

    @property
    def missing(self) -> bool:
        """The tool is not installed on the node."""
        return self.rc == 127

    def problem(self) -> str | None:
        """Why this section carries no usable output, or ``None`` when it may."""
        first = next((ln.strip() for ln in self.stderr.splitlines() if ln.strip()), "")
        tool = self.name.split(":", 1)[0]
        if self.missing:
            return f"command not found: {tool}"
        if self.rc is None:
            return f"{tool}: output cut short (no end marker)"
        if self.rc == 124:
            return f"{tool}: timed out"
        if self.rc != 0 and not self.stdout.strip():
            return f"{tool}: exit {self.rc}" + (f": {first}" if first else "")
        return None


def _mark_line(marker: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(marker)} (?P<kind>probe|begin|stderr|end)(?: (?P<rest>.*))?$")


_END_REST = re.compile(r"^(?P<name>\S+) rc=(?P<rc>-?\d+)$")


def _join(lines: list[str]) -> str:
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""


def split_probe(text: str, marker: str, what: str) -> tuple[str | None, dict[str, ProbeSection]]:
    """Split output framed by ``marker`` (:func:`probe_script`) into (hostname, sections);
    ``what`` names the probe in a :class:`ParseError`. Lines outside sections (a login
    banner, shell noise) are ignored."""
    mark_line = _mark_line(marker)
    hostname: str | None = None
    seen_marker = False
    sections: dict[str, ProbeSection] = {}
    name: str | None = None
    out: list[str] = []
    err: list[str] = []
    target = out

    def close(rc: int | None) -> None:
        if name is not None:
            sections[name] = ProbeSection(name, _join(out), _join(err), rc)

    for raw in text.splitlines():
        m = mark_line.match(raw.rstrip())
        if m is None:
            if name is not None:
                target.append(raw)
            continue
        seen_marker = True
        kind, rest = m["kind"], (m["rest"] or "").strip()
        if kind == "probe":
            parts = rest.split()
            hostname = parts[1] if len(parts) > 1 else None
        elif kind == "begin":
            close(None)  # a begin inside an open section: the previous one was cut
            name, out, err = rest, [], []
            target = out
        elif kind == "stderr" and name is not None:
            target = err
        elif kind == "end" and name is not None:
            e = _END_REST.match(rest)
            close(int(e["rc"]) if e else None)
            name = None
    close(None)
    if not seen_marker:
        first = next((ln for ln in text.splitlines() if ln.strip()), None)
        raise ParseError(what, f"no {marker} marker lines: not {what} output", first)
    return hostname, sections
