"""Every HTTP client of a whole-suite run shares one TLS context: httpx builds one per client
otherwise, loading the CA bundle each time (~0.15 CPU-s a client, a dozen clients a run)."""

from __future__ import annotations

import ssl
from typing import Any

import pytest

from pytest_spark.access import api as api_module
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving.client.sdk import SdkClient


def test_clients_share_one_ca_bundle_load(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[Any] = []
    real = ssl.SSLContext.load_verify_locations

    def counting(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loads.append(args or kwargs)
        real(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    cached = getattr(api_module, "tls_context", None)  # the one context, built on first use
    if cached is not None:
        cached.cache_clear()
    endpoint = ApiEndpoint("http://127.0.0.1:9", "m")
    clients = [endpoint.client(), endpoint.client(), endpoint.async_client()]
    sdk = SdkClient(endpoint, timeout=5.0)
    try:
        assert len(loads) == 1, f"{len(loads)} CA bundle loads for 4 clients"
    finally:
        for c in clients[:2]:
            c.close()
        sdk.close()
