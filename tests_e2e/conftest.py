"""Fixtures shared by the serving checks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.facts.server import ServerCommand
from pytest_spark.serving import ServingClient
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
