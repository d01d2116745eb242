"""Prefix caching end to end: two requests share a long prompt prefix (unique to the run);
the second's TTFT must be lower and ``vllm:prefix_cache_hits`` must grow. A server with
prefix caching off (``--no-enable-prefix-caching``) is reported as such when the profile
expects it on (``prefix_cache.expected``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_spark import Finding, Settings, SparkCheck
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving import ServingClient, ServingError
from pytest_spark.serving.load.metricsnap import prefix_cache_problem
from pytest_spark.serving.validate.context import run_prefix_pair

pytestmark = pytest.mark.context


@pytest.fixture
def context_client(spark_api: ApiEndpoint, spark_settings: Settings) -> Iterator[ServingClient]:
    timeout = spark_settings.profile.prefix_cache.request_timeout_s
    client = ServingClient(spark_api, timeout=timeout, idle_timeout=spark_api.timeout)
    try:
        yield client
    finally:
        client.close()


def test_prefix_cache(
    request: pytest.FixtureRequest,
    context_client: ServingClient,
    spark_check: SparkCheck,
    spark_settings: Settings,
) -> None:
    """The second of two requests sharing a long prefix is served from the prefix cache:
    lower TTFT, and vllm:prefix_cache_hits grows."""
    section = spark_settings.profile.prefix_cache
    if not section.expected:
        pytest.skip("prefix_cache.expected = false in the profile: prefix caching not checked")
    server = context_client.server
    # At most half the served context, so that the pair fits a model served shorter than
    # the profile's prefix assumes.
    limit = context_client.api.max_model_len
    prefix = min(section.prefix_tokens, limit // 2) if limit else section.prefix_tokens
    try:
        run = run_prefix_pair(context_client, prefix)
    except ServingError as exc:
        cited = request.getfixturevalue("wire_cited")(exc.kind, f"prefix cache: {exc.message}")
        if cited is not None:
            pytest.skip(cited)
        spark_check.require(exc.finding(f"{server}: prefix cache"))
        return
    if isinstance(run, str):
        pytest.skip(f"prefix cache: {run}")
    spark_check.attach(
        "prefix_cache",
        {
            "ttft_cold_s": run.ttft_cold_s,
            "ttft_warm_s": run.ttft_warm_s,
            "hits": run.hits,
            "queries": run.queries,
            "prefix_caching": run.after.prefix_caching,
        },
    )
    problem = prefix_cache_problem(run)
    if problem is None:
        spark_check.require(
            Finding.passed(
                run.ttft_warm_s,
                f"< {run.ttft_cold_s:.3f}",
                "s",
                message=run.figures(),
            )
        )
        return
    measured, fix = problem
    spark_check.require(
        Finding.failed(
            {"ttft_cold_s": run.ttft_cold_s, "ttft_warm_s": run.ttft_warm_s, "hits": run.hits},
            "prefix caching on: the second request's TTFT lower, vllm:prefix_cache_hits grows",
            message=f"{server}: {measured}; expected prefix caching on "
            f"(prefix_cache.expected = true). Fix: {fix}",
        )
    )
