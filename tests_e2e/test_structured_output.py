"""Structured output end to end: ``response_format`` json_schema and json_object, plain and
streamed. The answer must parse as JSON (an object for json_object) and validate against the
schema (``jsonschema``); a server that ignores ``response_format`` fails, quoting what came
back, once: the json_schema non-streaming check is the verdict, the others skip citing it.
"""

from __future__ import annotations

import pytest

from pytest_spark import SparkCheck
from pytest_spark.serving import ServingError, Turn
from pytest_spark.serving.client.prefetch import item_params
from pytest_spark.serving.validate.formatturns import (
    FormatTurns,
    cited_ignored,
    cited_reasoning_leak,
)
from pytest_spark.serving.validate.structured import (
    FORMATS,
    FormatKind,
    FormatRequest,
    check_structured,
)

pytestmark = pytest.mark.structured_output


def plan_ahead(request: pytest.FixtureRequest, item: pytest.Item) -> None:
    """The questions ``item`` will read, sent ahead (pytest_spark.serving.client.prefetch)."""
    format_turns: FormatTurns = request.getfixturevalue("format_turns")
    params = item_params(item)
    if format_turns.expected and "kind" in params:
        format_turns.plan(params["kind"], params["streamed"])


def ask(
    request: pytest.FixtureRequest,
    turns: FormatTurns,
    spark_check: SparkCheck,
    req: FormatRequest,
) -> Turn:
    """The answer, or the right verdict when there is none: a request broken on the wire
    like the canary's skips citing the wire verdict; any other failure fails here."""
    try:
        return turns.turn(req.kind, req.streamed)
    except ServingError as exc:
        cited = request.getfixturevalue("wire_cited")(exc.kind, f"{req.label}: {exc.message}")
        if cited is not None:
            pytest.skip(cited)
        spark_check.require(exc.finding(f"{turns.client.server}: {req.label}"))
        raise AssertionError("unreachable") from exc


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("kind", FORMATS)
def test_structured_output(
    request: pytest.FixtureRequest,
    format_turns: FormatTurns,
    spark_check: SparkCheck,
    kind: FormatKind,
    streamed: bool,
) -> None:
    """The answer is JSON: an object (json_object), valid against the schema (json_schema,
    checked with jsonschema); streamed, the content deltas join into it."""
    format_turns.skip_unless_expected()
    req = format_turns.request(kind, streamed)
    turn = ask(request, format_turns, spark_check, req)
    finding = check_structured(turn, req, server=format_turns.client.server)
    if not finding.ok:
        cited = cited_reasoning_leak(request, turn, req.label) or cited_ignored(
            request, format_turns, turn
        )
        if cited is None and (wrong := request.getfixturevalue("accuracy_cited")()):
            cited = f"{req.label}: {finding.message.splitlines()[0][:300]}; {wrong}"
        if cited is not None:
            pytest.skip(cited)
    spark_check.require(finding)
