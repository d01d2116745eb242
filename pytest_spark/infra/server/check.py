"""The server's command line against what the profile expects of it: a reasoning parser,
and the tool flags for ``tool_choice=auto``. One missing flag is one failure that quotes the
line; the checks that depend on the flag skip citing it."""

from __future__ import annotations

from pytest_spark.infra.finding import Finding, Skip
from pytest_spark.infra.servecmd import ServerCommand

REASONING_VERDICT = "test_server_has_reasoning_parser"
TOOLS_VERDICT = "test_server_has_tool_parser"


def _quote(cmd: ServerCommand) -> str:
    line = cmd.line if len(cmd.line) <= 600 else cmd.line[:597] + "..."
    return f"{cmd.source}: {line}"


def check_reasoning_parser(
    cmd: ServerCommand | None, *, expected: bool, profile: str
) -> Finding | Skip:
    """``--reasoning-parser`` set when the profile expects reasoning to be separated."""
    if not expected:
        return Skip(f"profile {profile} has reasoning.expected = false: no reasoning parser needed")
    if cmd is None:
        return Skip("the server's command line could not be read (no container, no log line)")
    parser = cmd.args.reasoning_parser
    if parser:
        return Finding.passed(parser, "a reasoning parser", message=f"--reasoning-parser {parser}")
    return Finding.failed(
        None,
        "--reasoning-parser",
        message=(
            f"the server was started without --reasoning-parser, but profile {profile} expects "
            "the model's thinking in the reasoning field: without a parser it stays in content. "
            f"Read from {_quote(cmd)}. Fix: add --reasoning-parser (qwen3 for Qwen3/Qwen3.5, "
            "deepseek_r1 for DeepSeek-R1) to the serve command; or, if this server is not "
            "meant to separate reasoning (not vLLM, or a model without thinking), "
            "--spark-threshold=reasoning.expected=false (or --spark-profile=generic)"
        ),
    )


def missing_reasoning_parser(cmd: ServerCommand | None, *, expected: bool) -> str | None:
    """The skip reason of a reasoning check when the verdict above fails, else None."""
    if expected and cmd is not None and not cmd.args.reasoning_parser:
        return f"the server has no --reasoning-parser ({REASONING_VERDICT} has the evidence)"
    return None


def _tool_flags_missing(cmd: ServerCommand) -> list[str]:
    missing = []
    if not cmd.args.auto_tool_choice:
        missing.append("--enable-auto-tool-choice")
    if not cmd.args.tool_call_parser:
        missing.append("--tool-call-parser")
    return missing


def check_tool_parser(cmd: ServerCommand | None, *, expected: bool, profile: str) -> Finding | Skip:
    """``--enable-auto-tool-choice`` and ``--tool-call-parser`` set when the profile expects
    tool calls under ``tool_choice=auto``."""
    if not expected:
        return Skip(f"profile {profile} has tool_calls.expected = false: no tool parser needed")
    if cmd is None:
        return Skip("the server's command line could not be read (no container, no log line)")
    missing = _tool_flags_missing(cmd)
    if not missing:
        parser = cmd.args.tool_call_parser
        flags = f"--enable-auto-tool-choice --tool-call-parser {parser}"
        return Finding.passed(parser, "a tool-call parser", message=flags)
    return Finding.failed(
        None,
        " ".join(missing),
        message=(
            f"the server was started without {' and '.join(missing)}, but profile {profile} "
            "expects tool calls under tool_choice=auto: vLLM refuses auto with HTTP 400 or "
            f"leaves the calls in content. Read from {_quote(cmd)}. Fix: add "
            "--enable-auto-tool-choice --tool-call-parser PARSER (qwen3_coder for "
            "Qwen3.5/Qwen3-Coder, hermes for Qwen2.5/Qwen3) to the serve command; or, if this "
            "server is not meant to call tools under tool_choice=auto, "
            "--spark-threshold=tool_calls.expected=false"
        ),
    )


def missing_tool_parser(cmd: ServerCommand | None, *, expected: bool) -> str | None:
    """The skip reason of an auto tool-call check when the verdict above fails, else None."""
    if expected and cmd is not None and _tool_flags_missing(cmd):
        flags = " and ".join(_tool_flags_missing(cmd))
        return f"the server has no {flags} ({TOOLS_VERDICT} has the evidence)"
    return None
