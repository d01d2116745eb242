"""Long context end to end, against ``max_model_len`` as ``/v1/models`` reports it:

- a prompt filled to ``long_context.fill`` of it (counted by the server's ``/tokenize``)
  succeeds and answers a needle question (``long_context.needle``: a small model cannot);
  a wrong answer is asked again at an eighth of the length: answered there, the context is
  lost beyond some length (served past the model's native context without its rope
  scaling); not answered, the model does not retrieve at all;
- a prompt just over ``max_model_len`` gets vLLM's 400, and the message is
  vLLM's own (``pytest_spark.serving.validate.context``);
- with a sparkrun recipe (``--spark-recipe``, or the running job's file), the served
  ``max_model_len`` is the one it sets, the job's overrides applied.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from pytest_spark import Finding, Settings, SparkCheck
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving import ServingClient, ServingError, Turn
from pytest_spark.serving.validate.context import (
    LongPrompt,
    long_prompt,
    max_model_len,
    needle_problem,
    needle_verdict,
    over_limit_prompt,
    tokenize_count,
    too_long_problem,
)

pytestmark = pytest.mark.context
SHORTER_SHARE = 8  # a lost needle is asked again at max_model_len / this


@pytest.fixture(scope="module")
def long_client(spark_api: ApiEndpoint, spark_settings: Settings) -> Iterator[ServingClient]:
    timeout = spark_settings.profile.long_context.request_timeout_s
    client = ServingClient(spark_api, timeout=timeout, idle_timeout=timeout)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def model_len(long_client: ServingClient) -> int:
    try:
        data = long_client.get("/v1/models").json()
    except (ServingError, ValueError) as exc:
        pytest.skip(f"long context: /v1/models unreadable: {exc}")
    limit = max_model_len(data, long_client.api.model)
    if limit is None:
        pytest.skip(f"long context: /v1/models gives no max_model_len for {long_client.api.model}")
    return limit


def test_context_is_the_recipes(
    long_client: ServingClient, spark_check: SparkCheck, spark_settings: Settings
) -> None:
    """The served max_model_len is the sparkrun recipe's (--spark-recipe, or the running
    job's file with its -o overrides): a server started with other arguments, or from
    another recipe, says so here rather than as a context check gone strange."""
    recipe = spark_settings.recipe
    if recipe is None or recipe.max_model_len is None:
        pytest.skip("no sparkrun recipe sets max_model_len (--spark-recipe, or a running job)")
    server = long_client.server
    try:
        data = long_client.get("/v1/models").json()
    except (ServingError, ValueError) as exc:
        pytest.skip(f"{server}: /v1/models unreadable: {exc}")
    served = max_model_len(data, long_client.api.model)
    if served is None:
        pytest.skip(f"{server}: /v1/models gives no max_model_len for {long_client.api.model}")
    want = recipe.max_model_len
    if served == want:
        spark_check.require(
            Finding.passed(
                served,
                want,
                "tokens",
                message=f"{server}: max_model_len {served}, as {recipe.origin}",
            )
        )
        return
    spark_check.require(
        Finding.failed(
            served,
            want,
            "tokens",
            message=f"{server}: /v1/models says max_model_len {served}; {recipe.origin} sets "
            f"{want}. The server was started with other arguments (another -o max_model_len, "
            "or another recipe): start it again from the recipe (sparkrun run), or give "
            "--spark-recipe the recipe it runs",
        )
    )


def _counted(request: pytest.FixtureRequest, client: ServingClient, what: str) -> None:
    """Skip when the server cannot count tokens (no /tokenize): the checks need its count."""
    try:
        tokenize_count(client, [{"role": "user", "content": "hello"}])
    except ServingError as exc:
        if exc.status in (404, 405):
            pytest.skip(f"{what}: the server has no /tokenize to count the prompt with")
        cited = request.getfixturevalue("wire_cited")(exc.kind, f"{what}: {exc.message}")
        if cited is not None:
            pytest.skip(cited)
        raise


def _fail(
    request: pytest.FixtureRequest, spark_check: SparkCheck, exc: ServingError, what: str
) -> None:
    """The request's failure, or a skip citing the wire verdict when the server's JSON body
    or SSE stream is broken for every request (one root cause, one failure)."""
    cited = request.getfixturevalue("wire_cited")(exc.kind, f"{what}: {exc.message}")
    if cited is not None:
        pytest.skip(cited)
    spark_check.require(exc.finding(what))


def _ask_needle(client: ServingClient, target: int, max_tokens: int) -> tuple[LongPrompt, Turn]:
    prompt = long_prompt(client, target)
    body = client.body(
        prompt.messages,
        max_tokens=max_tokens,
        temperature=0.0,
        chat_template_kwargs={"enable_thinking": False},
    )
    return prompt, client.chat(body)


def _shorter_answer(client: ServingClient, model_len: int, max_tokens: int) -> tuple[int, bool]:
    """The needle asked again at an eighth of max_model_len, after a long prompt lost it:
    (its tokens, whether it was answered). Tells a context lost beyond some length from a
    model that does not retrieve at all."""
    prompt, turn = _ask_needle(client, max(256, model_len // SHORTER_SHARE), max_tokens)
    return prompt.tokens, needle_problem(turn.content, turn.reasoning, prompt.code) is None


def test_long_context_needle(
    request: pytest.FixtureRequest,
    long_client: ServingClient,
    model_len: int,
    spark_check: SparkCheck,
    spark_settings: Settings,
) -> None:
    """A request near max_model_len succeeds and answers the needle question; a wrong answer
    is asked again at an eighth of the length, to say whether the context is lost beyond
    some length (the served max_model_len past the model's native one) or never read."""
    section = spark_settings.profile.long_context
    server = long_client.server
    what = f"{server}: long context"
    _counted(request, long_client, what)
    target = min(int(model_len * section.fill), model_len - section.max_tokens)
    try:
        prompt, turn = _ask_needle(long_client, target, section.max_tokens)
    except ServingError as exc:
        where = f"{what}: a {target}-token prompt (max_model_len {model_len})"
        _fail(request, spark_check, exc, where)
        return
    spark_check.attach("long_context", {"prompt_tokens": prompt.tokens, "max_model_len": model_len})
    if not section.needle:
        pytest.skip(
            f"{what}: a {prompt.tokens}-token prompt of max_model_len {model_len} succeeded; "
            "the needle answer is not checked (long_context.needle = false: the profile's "
            "model is too small to retrieve a fact from a long prompt)"
        )
    problem = needle_problem(turn.content, turn.reasoning, prompt.code)
    if problem is None:
        spark_check.require(
            Finding.passed(
                prompt.tokens,
                model_len,
                "tokens",
                message=f"a {prompt.tokens}-token prompt (max_model_len {model_len}) answered "
                f"the needle question",
            )
        )
        return
    cited = request.getfixturevalue("accuracy_cited")()
    if cited is not None:
        pytest.skip(f"{what}: needle missed ({problem}); {cited}")
    short: tuple[int | None, bool | None] = (None, None)
    with contextlib.suppress(ServingError):
        short = _shorter_answer(long_client, model_len, section.max_tokens)
    spark_check.attach("long_context_shorter", {"prompt_tokens": short[0], "answered": short[1]})
    spark_check.require(
        Finding.failed(
            problem,
            f"the code {prompt.code}",
            message=f"{what}: a {prompt.tokens}-token prompt (max_model_len {model_len}): "
            f"{problem}; expected the answer to name {prompt.code}. "
            + needle_verdict(prompt.tokens, *short),
            evidence=turn.evidence(prompt.code),
        )
    )


def test_context_over_limit(
    request: pytest.FixtureRequest,
    long_client: ServingClient,
    model_len: int,
    spark_check: SparkCheck,
    spark_settings: Settings,
) -> None:
    """A prompt just over max_model_len gets vLLM's own 400 (every version refuses it; 0.32
    serves a prompt that fits with max_tokens cut to the room left)."""
    out = spark_settings.profile.long_context.max_tokens
    server = long_client.server
    what = f"{server}: over-long prompt"
    _counted(request, long_client, what)
    try:
        prompt = over_limit_prompt(long_client, model_len)
    except ServingError as exc:
        _fail(request, spark_check, exc, what)
        return
    messages, count = prompt.messages, prompt.tokens
    body = long_client.body(messages, max_tokens=out, temperature=0.0)
    try:
        long_client.chat(body)
    except ServingError as exc:
        message = exc.error.message if exc.error else exc.message
        problem = too_long_problem(exc.status, message, model_len, count)
        if problem is None:
            spark_check.require(
                Finding.passed(
                    400, 400, message=f"{count} prompt tokens over {model_len}: {message}"
                )
            )
            return
        evidence = exc.exchange.evidence(failure=exc.kind)
    else:
        problem, evidence = "HTTP 200: the server answered it", {}
    spark_check.require(
        Finding.failed(
            problem,
            "HTTP 400 with vLLM's context-length message",
            message=f"{what}: {count} prompt tokens (max_tokens {out}) against max_model_len "
            f"{model_len}: {problem}. Expected vLLM's 400 (the prompt alone does not fit); a "
            "server that answers it truncates silently or serves a larger context than "
            "/v1/models says",
            evidence=evidence,
        )
    )
