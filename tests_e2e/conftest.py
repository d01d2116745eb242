"""Fixtures shared by the serving checks."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_spark import Settings, progress_line_writer, verdict_in_session
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.infra.counters.gather import counted
from pytest_spark.infra.servecmd import ServerCommand
from pytest_spark.infra.server.check import (
    REASONING_VERDICT,
    TOOLS_VERDICT,
    missing_reasoning_parser,
    missing_tool_parser,
)
from pytest_spark.measure.once import measure_dir, measure_once
from pytest_spark.report.history import resolve_history_dir
from pytest_spark.serving import ServingClient, TurnCache
from pytest_spark.serving.client.prefetch import Prefetch, ask_ahead, plan_workers
from pytest_spark.serving.client.sdk import SdkClient
from pytest_spark.serving.load.closedloop import Sweep, decode_sweep, encode_sweep, measure_sweep
from pytest_spark.serving.load.specs import load_spec
from pytest_spark.serving.validate.accuracy import ALONE_VERDICT, LOAD_VERDICT, check_under_load
from pytest_spark.serving.validate.accuracyprobe import (
    AccuracyProbe,
    BaselineKey,
    BaselineStore,
    baseline_key,
)
from pytest_spark.serving.validate.canary import WireProbe
from pytest_spark.serving.validate.causes import STREAM_VERDICT, wire_cause, wire_verdict
from pytest_spark.serving.validate.formatturns import FormatTurns
from pytest_spark.serving.validate.reasoningturns import ReasoningTurns
from pytest_spark.serving.validate.toolturns import ToolTurns

# The soak runs last in the session: it holds the GPUs under a steady batch for its whole
# duration (minutes on a Spark), heating them and filling the KV cache, and the checks
# measured after it (the closed-loop levels, TTFT, the prefix cache) would see that state,
# not the cluster's. A stable sort: everything else keeps its order.
RUNS_LAST = "test_soak.py"
# The accuracy checks run before every other serving check: a model that answers wrong is
# their one failure, and the checks whose answers break because of it (tool-call arguments,
# structured output, the needle) skip citing it, so they must find its verdict made.
RUNS_FIRST = "test_accuracy.py"


@pytest.hookimpl(trylast=True)  # after the plugin's own ordering of named checks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Reorders the serving checks among themselves, in the places they hold: every other
    check keeps its place. The infra checks still come first (testpaths order), so with
    --spark-launch the link, GPU and preflight verdicts come before the model's load, not
    after it (ranking the accuracy checks before every check put them behind the load)."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if item.path.parent == here]

    def rank(item: pytest.Item) -> int:
        return {RUNS_FIRST: 0, RUNS_LAST: 2}.get(item.path.name, 1)

    ours = sorted((items[i] for i in slots), key=rank)
    for slot, item in zip(slots, ours, strict=True):
        items[slot] = item


@pytest.fixture(scope="session")
def serving_prefetch(
    request: pytest.FixtureRequest, spark_settings: Settings
) -> Iterator[Prefetch]:
    """The pool on which the functional modules (tool calls, reasoning, structured output,
    the SDK's) send their selected checks' requests ahead together, at most
    ``--spark-serving-concurrency`` at once, at most the serve args' ``--max-num-seqs``,
    one under xdist (pytest_spark.serving.client.prefetch.plan_workers)."""
    under_xdist = hasattr(request.config, "workerinput")
    seqs = None
    if not under_xdist and spark_settings.serving_concurrency > 1:
        command: ServerCommand | None = request.getfixturevalue("spark_server_command")
        seqs = command.args.max_num_seqs if command is not None else None
    prefetch = Prefetch(plan_workers(spark_settings.serving_concurrency, seqs, under_xdist))
    try:
        yield prefetch
    finally:
        prefetch.close()


@pytest.fixture(scope="module", autouse=True)
def _ask_ahead(request: pytest.FixtureRequest) -> Iterator[None]:
    """A functional module's (one with ``plan_ahead``) selected checks' questions, and those
    of the functional modules that run right after it, sent together before the first of
    them runs (pytest_spark.serving.client.prefetch.ask_ahead)."""
    yield from ask_ahead(request)


@pytest.fixture(scope="session")
def accuracy_probe(
    request: pytest.FixtureRequest,
    spark_api: ApiEndpoint,
    spark_settings: Settings,
    spark_server_command: ServerCommand | None,
) -> AccuracyProbe:
    """The accuracy requests (tests_e2e/test_accuracy.py), each sent once per session, and
    the baseline their answers are judged against (none while --spark-accuracy=record
    records one; a file that is not one is test_canaries_alone's failure)."""
    section = spark_settings.profile.accuracy
    seqs = spark_server_command.args.max_num_seqs if spark_server_command else None
    try:
        probe = AccuracyProbe(spark_api, section, max_num_seqs=seqs)
    except ValueError as exc:  # a canary name the profile got wrong
        raise pytest.UsageError(f"profile {spark_settings.profile.name}: {exc}") from None
    if spark_settings.accuracy != "record":
        store: BaselineStore = request.getfixturevalue("accuracy_baselines")
        with contextlib.suppress(ValueError):
            probe.baseline = store.load(request.getfixturevalue("accuracy_key"))
    return probe


@pytest.fixture(scope="session")
def accuracy_baselines(pytestconfig: pytest.Config, spark_settings: Settings) -> BaselineStore:
    """The pinned baseline, else the run history's folder (where the report keeps runs)."""
    history, _ = resolve_history_dir(
        spark_settings.history,
        spark_settings.source("history"),
        pytestconfig.rootpath,
        pytestconfig.inipath,
        pytestconfig.invocation_params.dir,
        os.environ,
    )
    return BaselineStore(spark_settings.accuracy_baseline, history)


@pytest.fixture(scope="session")
def accuracy_key(
    spark_api: ApiEndpoint, spark_settings: Settings, spark_server_command: ServerCommand | None
) -> BaselineKey:
    """What the accuracy baseline is kept for: the head (or the API's host and port), the
    model, the serve args, the vLLM version and the engine the server reports."""
    line = spark_server_command.line if spark_server_command else None
    return baseline_key(spark_api, spark_settings.head, line)


@pytest.fixture
def accuracy_cited(request: pytest.FixtureRequest) -> Callable[[], str | None]:
    """``accuracy_cited()``: the skip reason of a check whose answer broke (tool-call
    arguments off their schema, structured output cut, a needle missed) when the model
    answers the canaries wrong and that verdict runs in this session; None otherwise."""

    def cited() -> str | None:
        if not verdict_in_session(request.session, ALONE_VERDICT):
            return None
        probe: AccuracyProbe = request.getfixturevalue("accuracy_probe")
        wrong = probe.wrong_alone(lambda name: verdict_in_session(request.session, name))
        if wrong:
            return (
                f"the model answers wrong ({len(wrong)} of {len(probe.alone())} canaries, e.g. "
                f"{wrong[0].quoted()}): {ALONE_VERDICT} has the evidence"
            )
        return cited_under_load(probe)

    def cited_under_load(probe: AccuracyProbe) -> str | None:
        # This check's request went out beside the other functional ones (sent ahead together):
        # a model right alone and wrong under load breaks it as it broke the canaries.
        prefetch: Prefetch = request.getfixturevalue("serving_prefetch")
        if not prefetch.concurrent or not verdict_in_session(request.session, LOAD_VERDICT):
            return None
        if probe.error is not None or probe.concurrency < 2:
            return None
        verdict = check_under_load(probe.alone(), probe.under_load(), probe.concurrency, "")
        if verdict.ok:
            return None
        return (
            f"the model answers right alone and wrong under load, and this request ran "
            f"with up to {prefetch.workers} others (--spark-serving-concurrency): "
            f"{LOAD_VERDICT} has the evidence"
        )

    return cited


@pytest.fixture(scope="session")
def tool_turns(
    spark_api: ApiEndpoint,
    spark_settings: Settings,
    spark_server_command: ServerCommand | None,
    serving_prefetch: Prefetch,
) -> Iterator[ToolTurns]:
    """The tool-call questions, each asked once per session (tool_calls and reasoning)."""
    timeout = spark_settings.profile.tool_calls.request_timeout_s
    client = ServingClient(spark_api, timeout=timeout, idle_timeout=spark_api.timeout)
    try:
        yield ToolTurns(client, spark_settings, spark_server_command, serving_prefetch)
    finally:
        client.close()


@pytest.fixture(scope="session")
def reasoning_turns(
    request: pytest.FixtureRequest,
    spark_api: ApiEndpoint,
    spark_settings: Settings,
    spark_server_command: ServerCommand | None,
    serving_prefetch: Prefetch,
) -> Iterator[ReasoningTurns]:
    """The reasoning questions, each asked once per session (the raw reasoning checks)."""
    timeout = spark_settings.profile.reasoning.request_timeout_s
    client = ServingClient(spark_api, timeout=timeout, idle_timeout=spark_api.timeout)
    expected = spark_settings.profile.reasoning.expected
    no_parser = missing_reasoning_parser(spark_server_command, expected=expected)
    if not verdict_in_session(request.session, REASONING_VERDICT):
        no_parser = None  # nothing else reports it: the checks below do
    reasoning = ReasoningTurns(client, spark_settings, no_parser, serving_prefetch)
    if verdict_in_session(request.session, TOOLS_VERDICT):
        tools_expected = spark_settings.profile.tool_calls.expected
        reasoning.no_tools = missing_tool_parser(spark_server_command, expected=tools_expected)
    try:
        yield reasoning
    finally:
        client.close()


@pytest.fixture(scope="session")
def sdk(spark_api: ApiEndpoint, spark_settings: Settings) -> Iterator[SdkClient]:
    """The openai SDK client on the suite's endpoint, key and timeout; closed at the end."""
    timeout = max(
        spark_settings.profile.tool_calls.request_timeout_s,
        spark_settings.profile.structured_output.request_timeout_s,
    )
    client = SdkClient(spark_api, timeout=timeout)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def sdk_turns(sdk: SdkClient, serving_prefetch: Prefetch) -> TurnCache:
    """The SDK's answers by key, sent ahead with the other functional requests."""
    return TurnCache(sdk, serving_prefetch)


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
def format_turns(
    spark_api: ApiEndpoint, spark_settings: Settings, serving_prefetch: Prefetch
) -> Iterator[FormatTurns]:
    """The structured-output questions, each asked once per session (the raw checks and
    the SDK's compare with them)."""
    timeout = spark_settings.profile.structured_output.request_timeout_s
    client = ServingClient(spark_api, timeout=timeout, idle_timeout=spark_api.timeout)
    try:
        yield FormatTurns(client, spark_settings, serving_prefetch)
    finally:
        client.close()


@pytest.fixture(scope="session")
def _sweep(
    request: pytest.FixtureRequest, spark_api: ApiEndpoint, spark_settings: Settings
) -> tuple[Sweep, dict[str, Any]]:
    """The closed-loop sweep (tests_e2e/test_throughput.py's checks; the open-loop knee
    reads its goodput gate's level), once per session."""
    spec = load_spec(spark_settings.profile, spark_api)

    def sweep() -> Any:
        # Alone: nothing the functional checks sent ahead is still in flight (a run of
        # functional modules spans test_throughput.py: serving.client.prefetch.SPANS).
        request.getfixturevalue("serving_prefetch").drain()
        return measure_sweep(spark_api, spec, progress_line_writer(request.config))

    compute: Callable[[], Any] = sweep
    if not spark_settings.api_only:  # every node's fabric counters before and after it
        cluster = request.getfixturevalue("spark_cluster")
        compute = counted(measure_dir(request.config), cluster, "throughput-sweep", sweep)
    # Once per session, alone on the cluster, also under xdist (pytest_spark.measure.once):
    # tok/s taken while other tests send requests would not be a measurement.
    measured = measure_once(
        request.config,
        "throughput-sweep",
        compute,
        encode=encode_sweep,
        decode=decode_sweep,
    )
    return Sweep(f"{spark_api.model} at {spark_api.base_url}", measured.value), measured.record
