"""Tool calls end to end: the server's --tool-call-parser turns the model's calls into
``tool_calls`` (auto, required, named; non-streaming and streaming; parallel calls).

Runs against any OpenAI-compatible server (``--spark-api-url``). Every failure names the
behaviour that broke and carries the request and the response or stream excerpt.
"""

from __future__ import annotations

import pytest

from pytest_spark import Finding, Settings, SparkCheck, verdict_in_session
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.servecmd import ServerCommand
from pytest_spark.infra.server.check import TOOLS_VERDICT, check_tool_parser, missing_tool_parser
from pytest_spark.serving import (
    MISCONFIGURED_TOOLS,
    ServingError,
    ToolRequest,
    Turn,
    auto_declined,
    check_auto_refused,
    check_tool_calls,
    compare_arguments,
)
from pytest_spark.serving.client.prefetch import confirmed_alone, item_params
from pytest_spark.serving.validate.accuracyprobe import cited_wrong_model
from pytest_spark.serving.validate.tools import Mode
from pytest_spark.serving.validate.toolturns import (
    ToolTurns,
    cited_calls_in_content,
    cited_unstreamed_arguments,
)

pytestmark = pytest.mark.tool_calls


def plan_ahead(request: pytest.FixtureRequest, item: pytest.Item) -> None:
    """The questions ``item`` will read, sent ahead (pytest_spark.serving.client.prefetch)."""
    tool_turns: ToolTurns = request.getfixturevalue("tool_turns")
    params = item_params(item)
    name = getattr(item, "originalname", item.name)
    if name == "test_auto_tool_choice_enabled":
        tool_turns.plan("auto", False)
    elif name == "test_tool_call":
        tool_turns.plan(params["mode"], params["streamed"])
        tool_turns.plan(params["mode"], False)  # the streamed call is compared with it
    elif name == "test_parallel_tool_calls":
        tool_turns.plan("auto", params["streamed"], parallel=True)


def tools_flags_missing(request: pytest.FixtureRequest, turns: ToolTurns) -> str | None:
    """Why the auto checks skip: the server lacks the tool flags (the verdict says so)."""
    if not verdict_in_session(request.session, TOOLS_VERDICT):
        return None
    return missing_tool_parser(turns.server_command, expected=turns.expected)


def _ask(
    request: pytest.FixtureRequest,
    turns: ToolTurns,
    spark_check: SparkCheck,
    mode: Mode,
    streamed: bool,
    parallel: bool = False,
) -> Turn:
    """The turn, or the right verdict when there is none: misconfiguration (skip here,
    reported once by test_server_has_tool_parser or test_auto_tool_choice_enabled) or a
    request failure (fail)."""
    req = turns.request(mode, streamed, parallel)
    try:
        return turns.turn(mode, streamed, parallel)
    except ServingError as exc:
        if exc.error is not None and exc.status is not None:
            refused = check_auto_refused(exc.status, exc.error, exc.exchange.evidence())
            if refused is not None:
                pytest.skip(
                    tools_flags_missing(request, turns)
                    or f"{MISCONFIGURED_TOOLS}: tool_choice=auto refused with HTTP 400 "
                    "(reported by test_auto_tool_choice_enabled)"
                )
        skip_if_wire_broken(request, exc, req.label)
        spark_check.require(exc.finding(f"{turns.client.server}: {req.label}"))
        raise AssertionError("unreachable") from exc


def skip_if_wire_broken(request: pytest.FixtureRequest, exc: ServingError, label: str) -> None:
    """A request broken on the wire (stream framing, a body that does not parse) when the
    canary broke the same way: the wire verdict's failure, so skip citing it."""
    cited = request.getfixturevalue("wire_cited")(exc.kind, f"{label}: {exc.message}")
    if cited is not None:
        pytest.skip(cited)


def _skip_if_model_declined(turns: ToolTurns, turn: Turn, req: ToolRequest) -> None:
    """Under auto the model decides: where the profile says this model does not emit tool
    calls, a plain-text answer (no markup, no JSON call: not a parser failure) is skipped
    with the reason. Raw markup in content still fails."""
    if turns.auto_emits_calls:
        return
    why = auto_declined(turn, req)
    if why is not None:
        pytest.skip(
            f"model does not emit tool calls under auto: {why}; profile {turns.profile} has "
            "tool_calls.auto_emits_calls = false"
        )


def test_server_has_tool_parser(
    spark_api: ApiEndpoint,
    spark_server_command: ServerCommand | None,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    """The server was started with --enable-auto-tool-choice and --tool-call-parser where
    the profile expects tool calls (read from the container's command, the vllm serve
    process or vLLM's non-default args line); the auto checks skip citing this one."""
    profile = spark_settings.profile
    result = check_tool_parser(
        spark_server_command,
        expected=profile.tool_calls.expected,
        profile=profile.name,
    )
    if isinstance(result, Skip):
        pytest.skip(result.reason)
    spark_check.require(result)


def test_auto_tool_choice_enabled(
    request: pytest.FixtureRequest, tool_turns: ToolTurns, spark_check: SparkCheck
) -> None:
    """tool_choice auto is accepted: a 400 about the server flags is a misconfiguration
    (not a model failure) and says which flags are missing."""
    missing = tools_flags_missing(request, tool_turns)
    if missing is not None:
        pytest.skip(missing)
    try:
        tool_turns.turn("auto", False)
    except ServingError as exc:
        if exc.error is not None:
            spark_check.attach("error_body_shape", exc.error.shape)
        refused = (
            check_auto_refused(
                exc.status, exc.error, exc.exchange.evidence(), server=tool_turns.client.server
            )
            if exc.error is not None and exc.status is not None
            else None
        )
        if refused is None:
            skip_if_wire_broken(request, exc, "tool_choice=auto")
            spark_check.require(exc.finding(f"{tool_turns.client.server}: tool_choice=auto"))
            return
        if not tool_turns.expected:
            spark_check.record(refused)
            pytest.skip(
                f"{MISCONFIGURED_TOOLS} (profile {tool_turns.profile} has "
                "tool_calls.expected = false)"
            )
        spark_check.require(refused)
        return
    spark_check.require(
        Finding.passed("accepted", "accepted", message="tool_choice=auto accepted by the server")
    )


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("mode", ["auto", "required", "named"])
def test_tool_call(
    request: pytest.FixtureRequest,
    tool_turns: ToolTurns,
    spark_check: SparkCheck,
    mode: Mode,
    streamed: bool,
) -> None:
    """One call of get_weather: type function, right name, arguments a JSON string valid
    against the schema (days an integer), finish_reason by mode, no markup in content;
    streamed: fragments join into the same JSON with stable ids and indexes."""
    req = tool_turns.request(mode, streamed)
    turn = _ask(request, tool_turns, spark_check, mode, streamed)
    _skip_if_model_declined(tool_turns, turn, req)
    _require(request, tool_turns, spark_check, turn, req)
    if streamed:
        try:
            plain = tool_turns.turn(mode, False)
        except ServingError:
            return  # the non-streaming test reports it
        if check_tool_calls(plain, tool_turns.request(mode, False)).ok:
            server = tool_turns.client.server
            same = confirmed_alone(
                request.getfixturevalue("serving_prefetch"),
                compare_arguments(plain, turn, req, server=server),
                lambda: compare_arguments(
                    tool_turns.client.turn(tool_turns.body(mode, False), False),
                    tool_turns.client.turn(tool_turns.body(mode, False), True),
                    req,
                    server=server,
                ),
            )
            if not same.ok and (wrong := cited_wrong_model(request, req.label, same)):
                pytest.skip(wrong)  # the model answers wrong (under load: both in a batch)
            spark_check.require(same)


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "stream"])
def test_parallel_tool_calls(
    request: pytest.FixtureRequest, tool_turns: ToolTurns, spark_check: SparkCheck, streamed: bool
) -> None:
    """Two cities, one tool: two calls come back (parallel tool calls), each valid, with
    distinct ids and indexes 0 and 1."""
    req = tool_turns.request("auto", streamed, parallel=True)
    turn = _ask(request, tool_turns, spark_check, "auto", streamed, parallel=True)
    _skip_if_model_declined(tool_turns, turn, req)
    _require(request, tool_turns, spark_check, turn, req)


def _require(
    request: pytest.FixtureRequest,
    turns: ToolTurns,
    spark_check: SparkCheck,
    turn: Turn,
    req: ToolRequest,
) -> None:
    finding = check_tool_calls(turn, req, server=turns.client.server, parser=turns.parser)
    if not finding.ok:
        cited = (
            cited_calls_in_content(request, turns, turn, req)
            or cited_unstreamed_arguments(request, turns, turn)
            or cited_wrong_model(request, req.label, finding)
        )
        if cited is not None:
            pytest.skip(cited)
    spark_check.require(finding)
