"""What the server was started with: read from the serving container on the head, in one
SSH round trip, so a check can say which flag is missing and quote the line.

Sources, first found wins:

1. the container's own command (``docker inspect``) when it is ``vllm serve ...``;
2. a ``vllm serve`` process inside the container (``docker top -eo pid,args -ww``: Docker
   refuses a ``ps`` format without the PID column, and without ``-ww`` ps may cut each
   line at 80 columns, before the flags: seen on sparksim's real dockerd): the launcher's
   model where the container runs ``sleep infinity`` and the server is a ``docker exec``;
   the server's own process (``python3 .../vllm serve ...``) before the ``bash -c`` that
   started it;
3. vLLM's ``non-default args: {...}`` log line of the container's current start
   (``docker logs --since`` its StartedAt, so an earlier run's line is never read; a
   sparkrun container's is its serve log file inside it, /tmp/sparkrun_serve.log);
4. the ``--spark-serve-args`` the suite launched with.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from pytest_spark.infra.serveargs import ServeArgs, parse_serve_args

NON_DEFAULT = "non-default args: "
MARK = "@@spark-servercmd "
SHELLS = {"bash", "sh", "dash", "zsh"}
# Where a ``bash -c`` string stops being vllm's argv: redirections, ``;``, ``&&``, pipes.
SHELL_OPERATOR = re.compile(r"^(\d*[<>]|[;&|])")


@dataclass(frozen=True)
class ServerCommand:
    """The parsed flags, where they were read, and the line itself (to quote)."""

    args: ServeArgs
    source: str
    line: str


def serve_line_of(argv: list[str]) -> str | None:
    """``vllm serve ...`` (or the api_server module) out of an argv, else None: a
    container running ``sleep infinity`` or Ray has none."""
    for i, arg in enumerate(argv):
        base = arg.rsplit("/", 1)[-1]
        if base == "vllm" and argv[i + 1 : i + 2] == ["serve"]:
            return shlex.join(["vllm", *_until_shell_operator(argv[i + 1 :])])
        if arg == "vllm.entrypoints.openai.api_server":
            return shlex.join(["vllm", "serve", *_until_shell_operator(argv[i + 1 :])])
    # ``bash -c "vllm serve ..."``: the command is one word of the argv
    for arg in argv:
        if "vllm serve" in arg:
            return serve_line_of(shlex.split(arg[arg.index("vllm serve") :]))
    return None


def _until_shell_operator(words: list[str]) -> list[str]:
    """The words before the first shell operator: a process listing shows ``bash -c``'s
    string unquoted (``vllm serve M ... >> /proc/1/fd/1 2>&1; echo $? > FILE``)."""
    for i, word in enumerate(words):
        if SHELL_OPERATOR.match(word):
            return words[:i]
    return words


def _top_argvs(top: str) -> list[list[str]]:
    """``docker top -eo pid,args`` rows as argvs (the header and the PID column dropped),
    the processes that are not a shell first: a ``bash -c "vllm serve ..."`` is the
    parent of the server itself, whose argv is the exact one."""
    rows = []
    for line in top.splitlines()[1:]:
        words = line.split()
        if words and words[0].isdigit():
            words = words[1:]
        if words:
            rows.append(words)
    return sorted(rows, key=lambda argv: argv[0].rsplit("/", 1)[-1] in SHELLS)


def parse_non_default_args(line: str) -> ServeArgs | None:
    """vLLM's ``non-default args: {'model_tag': ..., 'reasoning_parser': 'qwen3', ...}``
    (api_utils.py) as ServeArgs; None when the line has no readable dict."""
    _, sep, text = line.partition(NON_DEFAULT)
    if not sep:
        return None
    try:
        values = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return None
    if not isinstance(values, dict):
        return None
    return _from_values(values)


def _from_values(values: dict[str, Any]) -> ServeArgs:
    names = values.get("served_model_name") or []
    if isinstance(names, str):
        names = [names]
    length = values.get("max_model_len")
    return ServeArgs(
        model=values.get("model_tag") or values.get("model"),
        served_names=tuple(str(n) for n in names),
        max_model_len=int(length) if isinstance(length, int) else None,
        tensor_parallel_size=int(values.get("tensor_parallel_size") or 1),
        reasoning_parser=values.get("reasoning_parser") or None,
        tool_call_parser=values.get("tool_call_parser") or None,
        auto_tool_choice=bool(values.get("enable_auto_tool_choice")),
        api_key_set=bool(values.get("api_key")),
        speculative_config=_json_text(values.get("speculative_config")),
        quantization=values.get("quantization") or None,
        dtype=values.get("dtype") or None,
    )


def _json_text(value: Any) -> str | None:
    """A non-default args dict's value as JSON text (vLLM prints the parsed dict)."""
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else json.dumps(value)


def probe(container: str, serve_log: str | None = None) -> str:
    """One shell command for the head: the container's argv, the processes in it, and the
    last ``non-default args`` line since its current start (``serve_log``: a file inside
    the container holds vLLM's output, not docker logs), each behind a marker."""
    c = shlex.quote(container)
    if serve_log is not None:
        log = f"docker exec {c} cat {shlex.quote(serve_log)} 2>/dev/null"
    else:
        log = (
            f"since=$(docker inspect -f '{{{{.State.StartedAt}}}}' {c} 2>/dev/null); "
            f'docker logs ${{since:+--since "$since"}} {c} 2>&1'
        )
    return (
        f"echo '{MARK}inspect'; docker inspect -f '{{{{json .Path}}}} {{{{json .Args}}}}' {c}"
        f" 2>&1; echo '{MARK}top'; docker top {c} -eo pid,args -ww 2>&1; echo '{MARK}log'; "
        f"{log} | grep -F {shlex.quote(NON_DEFAULT)} | tail -n 1"
    )


def probe_parts(text: str) -> dict[str, str]:
    """The probe's output by section (the text after each ``MARK`` line)."""
    parts: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(MARK):
            current = line[len(MARK) :].strip()
            parts[current] = ""
        elif current is not None:
            parts[current] += line + "\n"
    return parts


def parse_probe(text: str, serve_args: str | None) -> ServerCommand | None:
    """The first source that names the server's flags (see the module docstring)."""
    parts = probe_parts(text)
    inspect = parts.get("inspect", "").strip()
    path, _, args = inspect.partition(" ")
    try:
        argv = [json.loads(path), *(json.loads(args) or [])] if inspect else []
    except (ValueError, TypeError):
        argv = []
    found = serve_line_of([str(a) for a in argv])
    if found:
        return ServerCommand(parse_serve_args(found), "the container's command", found)
    for argv in _top_argvs(parts.get("top", "")):
        found = serve_line_of(argv)
        if found:
            return ServerCommand(parse_serve_args(found), "the vllm serve process", found)
    log = parts.get("log", "").strip()
    parsed = parse_non_default_args(log) if log else None
    if parsed is not None:
        return ServerCommand(parsed, "vLLM's non-default args line", log[log.index(NON_DEFAULT) :])
    return parse_serve_args_text(serve_args)


def parse_serve_args_text(serve_args: str | None) -> ServerCommand | None:
    """The suite's own --spark-serve-args as a ServerCommand (the last source)."""
    if not serve_args:
        return None
    return ServerCommand(parse_serve_args(serve_args), "--spark-serve-args", serve_args)
