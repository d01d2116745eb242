"""Tool calls, reasoning and structured output through the ``openai`` SDK, as applications
ask: ``OpenAI().chat.completions.create``, plain and streamed, with strict response
validation (the SDK types every field).

Each check asks the raw checks' question again through the SDK and asserts what the SDK
parsed: typed tool-call deltas that assemble to the same call as the raw client's,
``reasoning`` / ``reasoning_content`` reached where the SDK keeps it (``model_extra``), JSON
that validates. A response the SDK cannot parse fails, naming the field and quoting the
bytes. One root cause, one failure: where the raw check of the same request fails the same
way (or the wire verdict's canary broke the same way), this one skips citing it.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_spark import Finding, Settings, SparkCheck, verdict_in_session
from pytest_spark.infra.servecmd import ServerCommand
from pytest_spark.infra.server.check import (
    REASONING_VERDICT,
    TOOLS_VERDICT,
    missing_reasoning_parser,
    missing_tool_parser,
)
from pytest_spark.serving import (
    MISCONFIGURED_TOOLS,
    NO_REASONING_FIELD,
    ServingClient,
    ServingError,
    Turn,
    TurnCache,
    auto_declined,
    check_auto_refused,
    check_reasoning,
    check_tool_calls,
)
from pytest_spark.serving.client.prefetch import (
    confirmed_alone,
    item_params,
)
from pytest_spark.serving.client.sdk import SdkClient, SdkTurn
from pytest_spark.serving.validate.accuracyprobe import cited_wrong_model
from pytest_spark.serving.validate.causes import cited_verdict
from pytest_spark.serving.validate.formatturns import (
    SEPARATION_VERDICT,
    FormatTurns,
    cited_ignored,
    cited_reasoning_leak,
)
from pytest_spark.serving.validate.reasoningturns import ReasoningTurns
from pytest_spark.serving.validate.sdkchecks import check_stream_helper, compare_sdk
from pytest_spark.serving.validate.structured import FORMATS, FormatKind, check_structured
from pytest_spark.serving.validate.tools import Mode
from pytest_spark.serving.validate.toolturns import (
    ToolTurns,
    cited_calls_in_content,
    cited_unstreamed_arguments,
)

STREAMED = pytest.mark.parametrize("streamed", [False, True], ids=["plain", "stream"])


def plan_ahead(request: pytest.FixtureRequest, item: pytest.Item) -> None:
    """The questions ``item`` will read (the SDK's and their raw twins'), sent ahead
    (pytest_spark.serving.client.prefetch)."""
    params = item_params(item)
    name = getattr(item, "originalname", item.name)
    streamed = params.get("streamed", False)
    sdk_turns: TurnCache = request.getfixturevalue("sdk_turns")
    if name == "test_sdk_tool_call":
        tool_turns: ToolTurns = request.getfixturevalue("tool_turns")
        mode = params["mode"]
        tool_turns.plan(mode, streamed)
        body = tool_turns.body(mode, False)
        sdk_turns.plan(("tool", mode, streamed), lambda: body, streamed)
    elif name == "test_sdk_reasoning":
        # The raw twins are the raw reasoning checks' own turns (asked once a session).
        turns: ReasoningTurns = request.getfixturevalue("reasoning_turns")
        turns.plan("thinking", streamed)
        turns.plan("thinking", False)
        body = turns.body("thinking")
        sdk_turns.plan(("reasoning", streamed), lambda: body, streamed)
    elif name == "test_sdk_structured_output":
        format_turns: FormatTurns = request.getfixturevalue("format_turns")
        if format_turns.expected:
            kind = params["kind"]
            format_turns.plan(kind, streamed)
            body = format_turns.body(kind)
            sdk_turns.plan(("format", kind, streamed), lambda: body, streamed)


def _suffix(streamed: bool) -> str:
    return "stream" if streamed else "plain"


def _raw(ask: Any) -> Turn | ServingError:
    try:
        result: Turn = ask()
    except ServingError as exc:
        return exc
    return result


def _sdk_turn(
    request: pytest.FixtureRequest,
    sdk: SdkClient,
    spark_check: SparkCheck,
    asked: tuple[TurnCache, tuple[Any, ...]],
    body: dict[str, Any],
    streamed: bool,
    label: str,
    raw: Turn | ServingError,
    raw_name: str,
) -> Turn:
    """The SDK's turn, or the right verdict: a wire break the canary shows too skips citing
    the wire verdict; a request the raw client lost the same way skips citing its check;
    anything else (the SDK cannot parse what the raw client could) fails here."""
    cache, key = asked
    try:
        return cache.turn(key, lambda: body, streamed)
    except ServingError as exc:
        cited = request.getfixturevalue("wire_cited")(exc.kind, f"{label}: {exc.message}")
        if cited is not None:
            pytest.skip(cited)
        if (
            isinstance(raw, ServingError)
            and raw.kind == exc.kind
            and verdict_in_session(request.session, raw_name)
        ):
            pytest.skip(
                f"{label}: the raw request failed the same way: {raw.message} "
                f"({raw_name} has the evidence)"
            )
        spark_check.require(exc.finding(f"{sdk.server}: {label}", "a response the SDK parses"))
        raise AssertionError("unreachable") from exc


def _skip_if_wrong_model(request: pytest.FixtureRequest, label: str, finding: Finding) -> None:
    """The SDK's own answer broke (or differs from its raw twin's) where the model answers
    wrong, alone or under load (the SDK's requests go out together with the module's
    others): the accuracy verdict's failure, so skip citing it."""
    if not finding.ok:
        cited = cited_wrong_model(request, label, finding)
        if cited is not None:
            pytest.skip(cited)


def _require_same(
    request: pytest.FixtureRequest,
    spark_check: SparkCheck,
    sdk: SdkClient,
    client: ServingClient,
    raw: Turn,
    turn: Turn,
    body: dict[str, Any],
    label: str,
    what: str,
) -> None:
    """The SDK read what the raw client read; a difference between two answers sent in a
    batch is decided on the pair sent again alone (confirmed_alone), and one where the model
    answers wrong is the accuracy verdict's."""
    streamed = turn.streamed
    same = confirmed_alone(
        request.getfixturevalue("serving_prefetch"),
        compare_sdk(raw, turn, label, what=what, server=sdk.server),
        lambda: compare_sdk(
            client.turn(body, streamed),
            sdk.turn(body, streamed),
            label,
            what=what,
            server=sdk.server,
        ),
    )
    _skip_if_wrong_model(request, label, same)
    spark_check.require(same)


# --- tool calls ---------------------------------------------------------------------------


@pytest.mark.tool_calls
@STREAMED
@pytest.mark.parametrize("mode", ["auto", "required", "named"])
def test_sdk_tool_call(
    request: pytest.FixtureRequest,
    tool_turns: ToolTurns,
    sdk: SdkClient,
    sdk_turns: TurnCache,
    spark_check: SparkCheck,
    mode: Mode,
    streamed: bool,
) -> None:
    """The SDK's typed tool calls (streamed: its typed deltas, assembled) are one valid
    call of get_weather, the same call the raw client read; streamed, the SDK's own stream
    helper (ChatCompletionStreamState) types it a function call and reports it done."""
    req = tool_turns.request(mode, streamed)
    label = f"openai SDK, {req.label}"
    raw_name = f"test_tool_call[{mode}-{_suffix(streamed)}]"
    raw = _raw(lambda: tool_turns.turn(mode, streamed))
    if (
        isinstance(raw, ServingError)
        and raw.error is not None
        and raw.status is not None
        and check_auto_refused(raw.status, raw.error, {}) is not None
    ):
        missing = None
        if verdict_in_session(request.session, TOOLS_VERDICT):
            missing = missing_tool_parser(tool_turns.server_command, expected=tool_turns.expected)
        pytest.skip(
            missing
            or f"{MISCONFIGURED_TOOLS}: tool_choice=auto refused with HTTP 400 "
            "(reported by test_auto_tool_choice_enabled)"
        )
    body = tool_turns.body(mode, False)
    asked = (sdk_turns, ("tool", mode, streamed))
    turn = _sdk_turn(request, sdk, spark_check, asked, body, streamed, label, raw, raw_name)
    declined = auto_declined(turn, req)
    if not tool_turns.auto_emits_calls and declined is not None:
        pytest.skip(
            f"model does not emit tool calls under auto: {declined}; profile "
            f"{tool_turns.profile} has tool_calls.auto_emits_calls = false"
        )
    finding = check_tool_calls(turn, req, server=sdk.server, parser=tool_turns.parser)
    if not finding.ok and isinstance(raw, Turn):
        raw_finding = check_tool_calls(raw, req, parser=tool_turns.parser)
        if not raw_finding.ok and verdict_in_session(request.session, raw_name):
            cited = (
                cited_calls_in_content(request, tool_turns, raw, req)
                or cited_unstreamed_arguments(request, tool_turns, raw)
                or cited_wrong_model(request, label, raw_finding)
                or cited_verdict(raw_name, label, raw_finding)
            )
            pytest.skip(cited)
    _skip_if_wrong_model(request, label, finding)
    spark_check.require(finding)
    if isinstance(turn, SdkTurn) and turn.helper is not None:
        spark_check.require(check_stream_helper(turn, label, server=sdk.server))
    if isinstance(raw, Turn) and check_tool_calls(raw, req).ok:
        _require_same(request, spark_check, sdk, tool_turns.client, raw, turn, body, label, "calls")


# --- reasoning ----------------------------------------------------------------------------


@pytest.mark.reasoning
@STREAMED
def test_sdk_reasoning(
    request: pytest.FixtureRequest,
    reasoning_turns: ReasoningTurns,
    sdk: SdkClient,
    sdk_turns: TurnCache,
    spark_settings: Settings,
    spark_server_command: ServerCommand | None,
    spark_check: SparkCheck,
    streamed: bool,
) -> None:
    """The SDK reaches the reasoning where vLLM sends it (``reasoning`` or
    ``reasoning_content``, in the SDK's ``model_extra``), under the field the raw client
    saw, with the answer in content."""
    profile = spark_settings.profile
    if verdict_in_session(request.session, REASONING_VERDICT):
        expected = profile.reasoning.expected
        missing = missing_reasoning_parser(spark_server_command, expected=expected)
        if missing is not None:
            pytest.skip(missing)
    label = f"openai SDK, reasoning ({'streaming' if streamed else 'non-streaming'})"
    body = reasoning_turns.body("thinking")
    # the raw twin of this request (a wire break is its failure) and the verdict's answer:
    # the raw reasoning checks' own turns, the same request
    twin = _raw(lambda: reasoning_turns.turn("thinking", streamed))
    raw = _raw(lambda: reasoning_turns.turn("thinking", False))
    twin_name = f"test_reasoning_separated[{_suffix(streamed)}]"
    asked = (sdk_turns, ("reasoning", streamed))
    turn = _sdk_turn(request, sdk, spark_check, asked, body, streamed, label, twin, twin_name)
    if not profile.reasoning.expected and not (turn.reasoning or "").strip():
        pytest.skip(f"{NO_REASONING_FIELD} (profile {profile.name} has reasoning.expected = false)")
    finding = check_reasoning(turn, server=sdk.server)
    if not finding.ok and isinstance(raw, Turn):
        raw_finding = check_reasoning(raw)
        if not raw_finding.ok and verdict_in_session(request.session, SEPARATION_VERDICT):
            pytest.skip(cited_verdict(SEPARATION_VERDICT, label, raw_finding))
    spark_check.require(finding)
    if isinstance(raw, Turn) and check_reasoning(raw).ok:
        spark_check.require(compare_sdk(raw, turn, label, what="reasoning", server=sdk.server))


# --- structured output --------------------------------------------------------------------


@pytest.mark.structured_output
@STREAMED
@pytest.mark.parametrize("kind", FORMATS)
def test_sdk_structured_output(
    request: pytest.FixtureRequest,
    format_turns: FormatTurns,
    sdk: SdkClient,
    sdk_turns: TurnCache,
    spark_check: SparkCheck,
    kind: FormatKind,
    streamed: bool,
) -> None:
    """response_format through the SDK: the answer it hands over is JSON that validates,
    the same JSON the raw client read."""
    format_turns.skip_unless_expected()
    req = format_turns.request(kind, streamed)
    label = f"openai SDK, {req.label}"
    raw_name = f"test_structured_output[{kind}-{_suffix(streamed)}]"
    raw = _raw(lambda: format_turns.turn(kind, streamed))
    asked = (sdk_turns, ("format", kind, streamed))
    body = format_turns.body(kind)
    turn = _sdk_turn(request, sdk, spark_check, asked, body, streamed, label, raw, raw_name)
    finding = check_structured(turn, req, server=sdk.server)
    if not finding.ok:
        cited = cited_reasoning_leak(request, turn, label) or cited_ignored(
            request, format_turns, turn
        )
        if cited is None and isinstance(raw, Turn):
            raw_finding = check_structured(raw, req)
            if not raw_finding.ok and verdict_in_session(request.session, raw_name):
                cited = cited_wrong_model(request, label, raw_finding) or cited_verdict(
                    raw_name, label, raw_finding
                )
        if cited is not None:
            pytest.skip(cited)
    _skip_if_wrong_model(request, label, finding)
    spark_check.require(finding)
    if isinstance(raw, Turn) and check_structured(raw, req).ok:
        _require_same(
            request, spark_check, sdk, format_turns.client, raw, turn, body, label, "json"
        )
