"""The served OpenAI-compatible API: where it is, how to authenticate, what it serves."""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass, field
from typing import Any

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The one verifying TLS context of every HTTP client in the process (httpx's default,
    SSL_CERT_FILE / SSL_CERT_DIR honoured). Left to itself, httpx builds one per client and
    loads the CA bundle each time: ~0.15 CPU-s a client, a dozen clients a whole-suite run,
    even against plain-HTTP servers."""
    return httpx.create_ssl_context()


class ApiError(Exception):
    """The API could not be reached or answered nonsense; the message says which."""


@dataclass(frozen=True)
class ApiEndpoint:
    """Base URL (no ``/v1``), served model id and credentials. The key is never shown."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 30.0
    version: str | None = None
    max_model_len: int | None = None
    root: str | None = None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("verify", tls_context())
        return httpx.Client(
            base_url=self.base_url, headers=self.headers(), timeout=self.timeout, **kwargs
        )

    def async_client(self, **kwargs: Any) -> httpx.AsyncClient:
        kwargs.setdefault("verify", tls_context())
        return httpx.AsyncClient(
            base_url=self.base_url, headers=self.headers(), timeout=self.timeout, **kwargs
        )


def read_api_key(key: str | None, key_file: Any) -> str | None:
    if key:
        return key
    if key_file is not None:
        try:
            text: str = key_file.read_text().strip()
        except OSError as exc:
            raise ApiError(f"cannot read the API key file {key_file}: {exc.strerror}") from None
        return text or None
    return None


def discover(
    base_url: str, *, api_key: str | None, model: str | None, timeout: float
) -> ApiEndpoint:
    """Ask the server what it serves; fail with what was found, never hang."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(
            base_url=base_url, headers=headers, timeout=timeout, verify=tls_context()
        ) as client:
            models = client.get("/v1/models")
            version_resp = client.get("/version")
    except httpx.HTTPError as exc:
        raise ApiError(f"API at {base_url} not reachable: {type(exc).__name__}: {exc}") from None
    if models.status_code == 401:
        raise ApiError(
            f"API at {base_url} refused the request (401): the server requires an "
            "API key; set SPARK_API_KEY or --spark-api-key-file"
        )
    if models.status_code != 200:
        raise ApiError(
            f"GET {base_url}/v1/models answered {models.status_code}: {models.text[:300]}"
        )
    try:
        data = models.json()["data"]
        ids = [str(m["id"]) for m in data]
    except (ValueError, KeyError, TypeError):
        raise ApiError(
            f"GET {base_url}/v1/models did not return a model list: {models.text[:300]}"
        ) from None
    if not ids:
        raise ApiError(f"{base_url}/v1/models lists no model")
    if model is None:
        if len(ids) > 1:
            raise ApiError(
                f"{base_url} serves several models ({', '.join(ids)}); "
                "choose one with --spark-model"
            )
        model = ids[0]
    elif model not in ids:
        raise ApiError(f"model {model!r} is not served by {base_url}; it serves: {', '.join(ids)}")
    entry = next(m for m in data if m["id"] == model)
    version = None
    if version_resp.status_code == 200:
        try:
            version = str(version_resp.json().get("version"))
        except ValueError:
            version = None
    return ApiEndpoint(
        base_url, model, api_key, timeout, version, entry.get("max_model_len"), entry.get("root")
    )


def engine_failing(endpoint: ApiEndpoint) -> str | None:
    """One tiny chat completion: ``None`` unless the server answers it with a 5xx (the
    engine fails every request: a dead or broken engine behind a live HTTP server). Any
    other oddity is left to the checks that read responses; they say what is wrong."""
    body = {
        "model": endpoint.model,
        "max_tokens": 1,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Say OK."}],
    }
    try:
        with endpoint.client() as client:
            response = client.post("/v1/chat/completions", json=body)
    except httpx.HTTPError:
        return None  # not a verdict on the engine: the checks' own requests will say
    if response.status_code < 500:
        return None
    return (
        f"{endpoint.base_url} serves {endpoint.model!r} but a chat completion answered HTTP "
        f"{response.status_code}: {response.text[:300]!r}. The engine is failing requests: "
        "the head's container log (`docker logs`) says why"
    )
