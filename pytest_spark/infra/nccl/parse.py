"""Parser for nccl-tests output (``all_reduce_perf`` and friends) and NCCL's log lines.

One parser serves real nccl-tests output and the nccl-tests-compatible output of the
shipped benchmark script (``pytest_spark/infra/nccl/scripts/``, gloo or nccl backend):

- result rows: ``size count type redop root`` then ``time algbw busbw #wrong`` for
  out-of-place and for in-place (``#wrong`` may be ``N/A``; a row may carry only the
  in-place half, or a trailing timestamp);
- the ``# Out of bounds values`` and ``# Avg bus bandwidth`` footer, the ``# nThread ...``
  parameters line and the ``#  Rank ... on HOST device ...`` lines;
- NCCL log lines ``HOST:PID:TID [DEV] NCCL INFO|WARN ...`` (an mpirun ``--tag-output``
  prefix is tolerated): the network chosen (``NET/IB : Using [0]rocep1s0f1:1/RoCE ...``,
  ``NET/Socket : Using [0]enp1s0f1np1:198.19.0.1<0>``, ``Using network IB|Socket``), the
  settings NCCL echoes (``NCCL_IB_HCA set to ...``), ``via NET/...`` channel lines, WARN
  lines; lines between the script's ``transport NCCL would select`` markers are flagged
  ``predicted`` (computed by the script in gloo mode, not printed by NCCL);
- failures: nccl-tests' ``Test NCCL failure``, ``# error:``, and the script's
  ``init timeout`` / ``init failed`` / ``error:`` / ``deadline`` lines.

One output may hold several sweeps (the script's ``--collectives``, or the runner's chain of
``mpirun`` runs): :func:`split_sections` cuts it at the ``# pytest_spark: section NAME``
lines; the text before the first one is the ``all_reduce`` section.

Pure: text in, frozen dataclasses out. Output with nothing recognisable raises
:class:`ParseError`, as does a result row whose columns do not parse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from pytest_spark.infra.errors import ParseError

__all__ = [
    "IbDevice",
    "IbHcaSpec",
    "LogLine",
    "NcclOutput",
    "NetTransport",
    "ParseError",
    "RankDevice",
    "Row",
    "SocketIface",
    "Timing",
    "bus_factor",
    "parse_ib_hca",
    "parse_nccl_tests",
    "split_sections",
]

TOOL = "nccl-tests"
SCRIPT = "pytest_spark allreduce"
PREDICTED_BEGIN = "# pytest_spark: transport NCCL would select"
PREDICTED_END = "# pytest_spark: end of transport NCCL would select"
SECTION = "# pytest_spark: section "
MAIN_SECTION = "all_reduce"


def split_sections(text: str) -> dict[str, str]:
    """One output's sweeps by name (``all_reduce``, ``all_gather``, ``latency``), in order:
    the text before the first ``# pytest_spark: section NAME`` line is ``all_reduce``'s,
    each marker starts the next (a repeated name continues its section)."""
    parts: dict[str, list[str]] = {MAIN_SECTION: []}
    current = MAIN_SECTION
    for line in text.splitlines(keepends=True):
        stripped = _TAG.sub("", line).strip()
        if stripped.startswith(SECTION):
            current = stripped[len(SECTION) :].split()[0] if stripped[len(SECTION) :] else current
            parts.setdefault(current, [])
            continue
        parts[current].append(line)
    return {name: "".join(lines) for name, lines in parts.items()}


def bus_factor(collective: str | None, nranks: int) -> float:
    """nccl-tests' busbw / algbw (doc/PERFORMANCE.md): all-gather and reduce-scatter
    (n-1)/n, all-reduce 2(n-1)/n."""
    if collective and collective.startswith(("all_gather", "reduce_scatter")):
        return (nranks - 1) / nranks
    return 2 * (nranks - 1) / nranks


@dataclass(frozen=True)
class Timing:
    """One placement's columns: ``time algbw busbw #wrong`` (``wrong`` None for ``N/A``)."""

    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None


@dataclass(frozen=True)
class Row:
    """One result row of nccl-tests (one message size)."""

    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    out_of_place: Timing | None
    in_place: Timing

    @property
    def timings(self) -> tuple[Timing, ...]:
        return tuple(t for t in (self.out_of_place, self.in_place) if t is not None)

    @property
    def busbw_gbps(self) -> float:
        """The better of out-of-place and in-place bus bandwidth."""
        return max(t.busbw_gbps for t in self.timings)

    @property
    def algbw_gbps(self) -> float:
        return max(t.algbw_gbps for t in self.timings)

    @property
    def wrong(self) -> int:
        return sum(t.wrong or 0 for t in self.timings)


@dataclass(frozen=True)
class RankDevice:
    """``#  Rank  0 Group  0 Pid  1234 on spark-1 device  0 [000f:01:00] NVIDIA GB10``."""

    rank: int
    pid: int
    host: str
    device: int
    bus_id: str
    name: str


@dataclass(frozen=True)
class LogLine:
    """One NCCL log line: ``HOST:PID:TID [DEV] [FILE:LINE ]NCCL LEVEL MESSAGE``."""

    host: str
    pid: int
    tid: int
    device: int
    level: str
    message: str
    text: str
    source: str | None = None
    predicted: bool = False


@dataclass(frozen=True)
class IbDevice:
    """``[0]rocep1s0f1:1/RoCE`` in a ``NET/IB : Using`` line."""

    index: int
    name: str
    port: int
    link: str


@dataclass(frozen=True)
class SocketIface:
    """``enp1s0f1np1:198.19.0.1<0>`` in a ``NET/Socket`` / ``OOB`` / ``Bootstrap`` line."""

    name: str
    addr: str


@dataclass(frozen=True)
class NetTransport:
    """The network one NCCL process chose: a ``NET/IB : Using`` or ``NET/Socket : Using``."""

    kind: Literal["IB", "Socket"]
    host: str
    pid: int
    ib_devices: tuple[IbDevice, ...]
    socket_ifaces: tuple[SocketIface, ...]
    oob: SocketIface | None
    predicted: bool
    line: str

    @property
    def devices(self) -> tuple[str, ...]:
        """Device names (IB) or interface names (Socket)."""
        if self.kind == "IB":
            return tuple(d.name for d in self.ib_devices)
        return tuple(i.name for i in self.socket_ifaces)


@dataclass(frozen=True)
class NcclOutput:
    """Everything read from one output (one rank's, or mpirun's merged stdout)."""

    rows: tuple[Row, ...]
    avg_busbw_gbps: float | None
    out_of_bounds: int | None
    params: dict[str, int]
    devices: tuple[RankDevice, ...]
    collective: str | None
    tool: str
    backend: str | None
    nccl_version: str | None
    transports: tuple[NetTransport, ...]
    networks: tuple[tuple[str, str], ...]  # (host, "IB" | "Socket") from "Using network X"
    channel_nets: tuple[str, ...]  # distinct "IB" / "Socket" seen in "via NET/X/..." lines
    settings: dict[str, str]  # what NCCL echoed: NCCL_IB_HCA, NCCL_SOCKET_IFNAME, ...
    log: tuple[LogLine, ...]
    warnings: tuple[str, ...]
    errors: tuple[str, ...]
    init_timeout: str | None
    init_complete: bool

    @property
    def largest(self) -> Row | None:
        """The row of the largest message size (the one bandwidth checks read)."""
        return max(self.rows, key=lambda r: r.size_bytes) if self.rows else None

    @property
    def wrong(self) -> int:
        return sum(r.wrong for r in self.rows)

    @property
    def hung_at_init(self) -> bool:
        """No result, and the run said it timed out at init or stopped there without error."""
        if self.rows:
            return False
        quiet = not self.errors and not self.warnings
        return self.init_timeout is not None or (not self.init_complete and quiet)

    def series(self) -> list[dict[str, float | int]]:
        """busbw versus size, for JSON results and plots."""
        return [
            {
                "size_bytes": r.size_bytes,
                "busbw_gbps": r.busbw_gbps,
                "algbw_gbps": r.algbw_gbps,
                "oop_busbw_gbps": r.out_of_place.busbw_gbps if r.out_of_place else 0.0,
                "ip_busbw_gbps": r.in_place.busbw_gbps,
                "time_us": r.in_place.time_us,
            }
            for r in sorted(self.rows, key=lambda r: r.size_bytes)
        ]


# ------------------------------------------------------------------------------ patterns

_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:\s?")
_LOG = re.compile(
    r"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d+)\] "
    r"(?:(?P<src>\S+:\d+) )?NCCL (?P<level>INFO|WARN|TRACE|ABORT)\b ?(?P<msg>.*)$"
)
_ROW_HEAD = re.compile(
    r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>[A-Za-z]\w*)\s+(?P<redop>[A-Za-z]\w*)"
    r"\s+(?P<root>-?\d+)(?:\s+(?P<rest>.*))?$"
)
_TIMESTAMP = re.compile(r"\s+\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\s*$")
_FLOAT = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)"
_NUM = re.compile(rf"^{_FLOAT}$")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")
_AVG = re.compile(rf"^#\s*Avg bus bandwidth\s*:\s*({_FLOAT})")
_PARAMS = re.compile(r"^#\s*nThread\s")
_RANK = re.compile(
    r"^#\s+Rank\s+(?P<rank>\d+)(?:\s+Group\s+\d+)?\s+Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)"
    r"\s+device\s+(?P<dev>-?\d+)\s+\[(?P<bus>[^\]]*)\]\s*(?P<name>.*)$"
)
_COLLECTIVE = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_SCRIPT_HEAD = re.compile(r"^#\s*nccl-tests-compatible output from (.+?) \(backend (\w+)\)")
_SCRIPT_LINE = re.compile(r"^#\s*pytest_spark allreduce(?: rank \d+ of \d+ \(backend (\w+)\))?:?")
_VERSION = re.compile(r"^NCCL version (\S+)")
_IB_USING = re.compile(
    r"^NET/IB\s*:\s*Using\s+(?P<devs>.*?)\s*(?:\[RO\])?\s*;\s*OOB\s+(?P<oob>\S+)"
)
_IB_DEV = re.compile(r"\[(\d+)\]([^\s:]+):(\d+)/(\w+)")
_SOCK_USING = re.compile(r"^NET/Socket\s*:\s*Using\s+(?P<ifs>.*)$")
_SOCK_IF = re.compile(r"(?:\[\d+\])?([^\s:\[\]]+):(\S+?)<\d+>")
_NETWORK = re.compile(r"^(?:Using network|Initialized NET plugin)\s+(\w+)")
_VIA = re.compile(r"\bvia NET/(\w+)")
_SET_ENV = re.compile(r"^(NCCL_\w+) set (?:by environment )?to (\S+?)\.?$")
_FAILURES = (
    re.compile(r"Test (?:NCCL |CUDA )?failure"),
    re.compile(r"^#\s*error:"),
    re.compile(r"NCCL Error|ncclInternalError|ncclSystemError|ncclRemoteError"),
    re.compile(r"Watchdog caught collective operation timeout"),
)


def _number(tool: str, token: str, lineno: int, line: str) -> float:
    if not _NUM.match(token):
        raise ParseError(tool, f"expected a number, got {token!r}", line, lineno)
    return float(token)


def _timings(rest: str, lineno: int, line: str) -> tuple[Timing | None, Timing]:
    rest = _TIMESTAMP.sub("", rest)
    tokens = rest.split()
    if len(tokens) not in (4, 8):
        raise ParseError(
            TOOL, f"expected 4 or 8 columns after 'root', got {len(tokens)}", line, lineno
        )
    halves = []
    for i in range(0, len(tokens), 4):
        t, alg, bus, wrong = tokens[i : i + 4]
        if wrong == "N/A":
            nwrong: int | None = None
        else:
            nwrong = int(_number(TOOL, wrong, lineno, line))
        halves.append(
            Timing(
                _number(TOOL, t, lineno, line),
                _number(TOOL, alg, lineno, line),
                _number(TOOL, bus, lineno, line),
                nwrong,
            )
        )
    if len(halves) == 1:
        return None, halves[0]
    return halves[0], halves[1]


def _params(line: str) -> dict[str, int]:
    """``# nThread 1 nGpus 1 minBytes 8 maxBytes 128 step: 2(factor) warmup iters: 5 ...``."""
    params: dict[str, int] = {}
    for key, value in re.findall(r"([A-Za-z][A-Za-z ]*?):?\s+(-?\d+)", line.lstrip("# ")):
        params[key.strip().replace(" ", "_")] = int(value)
    return params


def _iface(text: str) -> SocketIface | None:
    match = _SOCK_IF.search(text)
    return SocketIface(match.group(1), match.group(2)) if match else None


@dataclass
class _Reading:
    """What :func:`parse_nccl_tests` has read so far, line by line."""

    rows: list[Row] = field(default_factory=list)
    log: list[LogLine] = field(default_factory=list)
    transports: list[NetTransport] = field(default_factory=list)
    networks: list[tuple[str, str]] = field(default_factory=list)
    channel_nets: list[str] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)
    devices: list[RankDevice] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    params: dict[str, int] = field(default_factory=dict)
    avg: float | None = None
    oob_count: int | None = None
    collective: str | None = None
    backend: str | None = None
    version: str | None = None
    init_timeout: str | None = None
    tool: str = TOOL
    init_complete: bool = False
    predicted: bool = False


def parse_nccl_tests(text: str) -> NcclOutput:
    """Parse nccl-tests (or the shipped script's) output; see the module doc."""
    r = _Reading()
    recognised = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = _TAG.sub("", raw.rstrip())
        if line.strip():
            recognised += _read_line(r, line, lineno)
    if not recognised:
        raise ParseError(TOOL, "no nccl-tests rows, footer or NCCL log lines in the output")
    return NcclOutput(
        rows=tuple(r.rows),
        avg_busbw_gbps=r.avg,
        out_of_bounds=r.oob_count,
        params=r.params,
        devices=tuple(r.devices),
        collective=r.collective,
        tool=r.tool,
        backend="gloo" if r.tool == SCRIPT and r.backend is None else r.backend,
        nccl_version=r.version,
        transports=tuple(r.transports),
        networks=tuple(r.networks),
        channel_nets=tuple(dict.fromkeys(r.channel_nets)),
        settings=r.settings,
        log=tuple(r.log),
        warnings=tuple(r.warnings),
        errors=tuple(r.errors),
        init_timeout=r.init_timeout,
        init_complete=r.init_complete or bool(r.rows),
    )


def _read_line(r: _Reading, line: str, lineno: int) -> bool:
    """Read one non-blank line into ``r``; whether it was one the parser knows."""
    stripped = line.strip()
    if stripped.startswith(PREDICTED_BEGIN):
        r.predicted = True
        return True
    if stripped.startswith(PREDICTED_END):
        r.predicted = False
        return True
    if log_match := _LOG.match(stripped):
        entry = LogLine(
            log_match["host"],
            int(log_match["pid"]),
            int(log_match["tid"]),
            int(log_match["dev"]),
            log_match["level"],
            log_match["msg"].strip(),
            stripped,
            log_match["src"],
            r.predicted,
        )
        r.log.append(entry)
        _read_log(entry, r)
        return True
    if any(p.search(stripped) for p in _FAILURES):
        r.errors.append(stripped)
        return True
    if not stripped.startswith("#"):
        return _read_result(r, line, lineno)
    _read_comment(r, stripped)
    return True


def _read_result(r: _Reading, line: str, lineno: int) -> bool:
    """A line that is not a comment: NCCL's version banner or a result row."""
    stripped = line.strip()
    if version_match := _VERSION.match(stripped):
        r.version = version_match.group(1)
        return True
    row_match = _ROW_HEAD.match(line)
    if not row_match:
        return False
    if not row_match["rest"]:  # the run stopped while measuring this size
        r.errors.append(f"incomplete result row (stopped while measuring): {stripped}")
        return True
    oop, ip = _timings(row_match["rest"], lineno, line)
    r.rows.append(
        Row(
            int(row_match["size"]),
            int(row_match["count"]),
            row_match["type"],
            row_match["redop"],
            int(row_match["root"]),
            oop,
            ip,
        )
    )
    return True


def _read_comment(r: _Reading, stripped: str) -> None:
    """A ``#`` line: the footer, the parameters, a rank's device, the script's own lines."""
    if m := _OOB.match(stripped):
        r.oob_count = int(m.group(1))
    elif m := _AVG.match(stripped):
        r.avg = float(m.group(1))
    elif _PARAMS.match(stripped):
        r.params = _params(stripped)
    elif m := _RANK.match(stripped):
        r.devices.append(
            RankDevice(
                int(m["rank"]),
                int(m["pid"]),
                m["host"],
                int(m["dev"]),
                m["bus"],
                m["name"].strip(),
            )
        )
    elif m := _COLLECTIVE.match(stripped):
        r.collective = m.group(1)
    elif m := _SCRIPT_HEAD.match(stripped):
        r.tool, r.backend = SCRIPT, m.group(2)
    elif m := _SCRIPT_LINE.match(stripped):
        r.tool = SCRIPT
        r.backend = m.group(1) or r.backend
        body = stripped[m.end() :].strip()
        if body.startswith("init timeout"):
            r.init_timeout = stripped
            r.errors.append(stripped)
        elif body.startswith(("init failed", "error:", "deadline")):
            r.errors.append(stripped)
        elif body.startswith("rendezvous complete"):
            r.init_complete = True
    elif stripped.startswith("#  ") and "size" in stripped and "count" in stripped:
        r.init_complete = True  # the results header: communicators are up


def _read_log(entry: LogLine, r: _Reading) -> None:
    msg, transports, networks = entry.message, r.transports, r.networks
    channel_nets, settings, warnings = r.channel_nets, r.settings, r.warnings
    if entry.level == "WARN":
        warnings.append(entry.text)
        return
    if m := _IB_USING.match(msg):
        devs = tuple(
            IbDevice(int(i), name, int(port), link)
            for i, name, port, link in _IB_DEV.findall(m["devs"])
        )
        transports.append(
            NetTransport(
                "IB",
                entry.host,
                entry.pid,
                devs,
                (),
                _iface(m["oob"]),
                entry.predicted,
                entry.text,
            )
        )
    elif m := _SOCK_USING.match(msg):
        ifaces = tuple(SocketIface(n, a) for n, a in _SOCK_IF.findall(m["ifs"]))
        transports.append(
            NetTransport(
                "Socket",
                entry.host,
                entry.pid,
                (),
                ifaces,
                None,
                entry.predicted,
                entry.text,
            )
        )
    elif m := _NETWORK.match(msg):
        networks.append((entry.host, m.group(1)))
    elif m := _SET_ENV.match(msg):
        settings[m.group(1)] = m.group(2)
    elif m := _VIA.search(msg):
        channel_nets.append(m.group(1))


# ------------------------------------------------------------------- NCCL_IB_HCA values


@dataclass(frozen=True)
class IbHcaSpec:
    """An ``NCCL_IB_HCA`` value read as NCCL reads it: ``[^][=]dev[:port],...``.

    Without ``=`` every entry is a prefix (``mlx5`` selects ``mlx5_0``...); ``^`` inverts the
    list. An empty value selects every active device.
    """

    raw: str
    entries: tuple[tuple[str, int], ...]
    exclude: bool
    exact: bool

    def selects(self, dev: str, port: int = 1) -> bool:
        if not self.entries:
            return True
        hit = any(
            (dev == name if self.exact else dev.startswith(name)) and want in (-1, port)
            for name, want in self.entries
        )
        return hit != self.exclude


def parse_ib_hca(value: str | None) -> IbHcaSpec:
    """Parse an ``NCCL_IB_HCA`` value (None or empty: NCCL's default, every device)."""
    raw = (value or "").strip()
    spec = raw
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    entries = []
    for item in spec.split(","):
        name, _, port = item.strip().partition(":")
        if not name:
            continue
        if port and not port.isdigit():
            raise ParseError("NCCL_IB_HCA", f"port {port!r} is not a number", raw)
        entries.append((name, int(port) if port else -1))
    return IbHcaSpec(raw, tuple(entries), exclude, exact)
