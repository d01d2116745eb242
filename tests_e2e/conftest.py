"""Fixtures shared by the serving checks."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.facts.server import ServerCommand
from pytest_spark.fixtures import verdict_in_session
from pytest_spark.serving import ServingClient
from pytest_spark.serving.canary import WireProbe
from pytest_spark.serving.causes import STREAM_VERDICT, wire_cause, wire_verdict
from pytest_spark.serving.formatturns import FormatTurns
from pytest_spark.serving.toolturns import ToolTurns
from pytest_spark.settings.resolve import Settings


@pytest.fixture(scope="session")
def tool_turns(
    spark_api: ApiEndpoint, spark_settings: Settings, spark_server_command: ServerCommand | None
) -> Iterator[ToolTurns]:
    """The tool-call questions, each asked once per session (tool_calls and reasoning)."""
    timeout = spark_settings.profile.tool_calls.request_timeout_s
    client = ServingClient(spark_api, timeout=timeout, idle_timeout=spark_api.timeout)
    try:
        yield ToolTurns(client, spark_settings, spark_server_command)
    finally:
        client.close()


@pytest.fixture(scope="session")
def wire_probe(spark_api: ApiEndpoint) -> WireProbe:
    """The canary, plain and streamed, sent once per session (the wire verdicts' requests)."""
    return WireProbe(spark_api)


@pytest.fixture
def wire_cited(request: pytest.FixtureRequest) -> Callable[[str, str], str | None]:
    """``wire_cited(kind, message)``: the skip reason of a request that failed with a
    ``ServingError`` of ``kind`` when the wire verdict (test_stream_wire for a stream,
    test_canary_completion for a body) runs in this session and its canary broke the same
    way; None otherwise (the check reports its failure itself)."""

    def cited(kind: str, message: str) -> str | None:
        verdict = wire_verdict(kind)
        if verdict is None or not verdict_in_session(request.session, verdict):
            return None
        probe: WireProbe = request.getfixturevalue("wire_probe")
        return wire_cause(kind, message, probe.error(streamed=verdict == STREAM_VERDICT))

    return cited


@pytest.fixture(scope="session")
def format_turns(spark_api: ApiEndpoint, spark_settings: Settings) -> Iterator[FormatTurns]:
    """The structured-output questions, each asked once per session (the raw checks and
    the SDK's compare with them)."""
    timeout = spark_settings.profile.structured_output.request_timeout_s
    client = ServingClient(spark_api, timeout=timeout, idle_timeout=spark_api.timeout)
    try:
        yield FormatTurns(client, spark_settings)
    finally:
        client.close()
