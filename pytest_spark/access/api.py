"""The served OpenAI-compatible API: where it is, how to authenticate, what it serves."""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from pytest_spark.access import body


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


# OpenAI API paths a user may paste whole instead of the base URL.
ENDPOINT_PATHS = (
    "/chat/completions",
    "/completions",
    "/models",
    "/embeddings",
    "/responses",
    "/health",
    "/version",
    "/metrics",
)


def pasted_endpoint(base_url: str) -> str | None:
    """The base URL meant (``http://host:port/v1``) when ``base_url`` is an endpoint's URL
    (``http://host:port/v1/chat/completions``); None when it looks like a base URL."""
    split = urlsplit(base_url)
    path = split.path.rstrip("/")
    head, sep, _ = path.partition("/v1/")
    if sep:
        prefix = head
    else:
        ends = [e for e in ENDPOINT_PATHS if path.endswith(e)]
        if not ends:
            return None
        prefix = path.removesuffix(ends[0])
    return f"{split.scheme}://{split.netloc}{prefix}/v1"


def transport_problem(base_url: str, what: str, exc: httpx.HTTPError, timeout: float) -> str:
    """Why a request got no HTTP answer, in the user's terms: nothing listening (not
    reachable) is not a server that took the connection and then said nothing."""
    name = type(exc).__name__
    if isinstance(exc, httpx.ConnectTimeout):
        return (
            f"API at {base_url} not reachable: no connection within {timeout:g} s ({name}): "
            "a firewall drops the packets, or the URL's host is wrong"
        )
    if isinstance(exc, httpx.ConnectError):
        return (
            f"API at {base_url} not reachable: {name}: {exc}: nothing listens there, or the "
            "URL's host or port is wrong (--spark-api-url)"
        )
    if isinstance(exc, httpx.TimeoutException):
        return (
            f"API at {base_url} accepted the connection but {what} timed out: no answer within "
            f"{timeout:g} s ({name}). The server is hung or overloaded, or the port is not an "
            "HTTP server; if it is only slow, raise --spark-http-timeout"
        )
    if isinstance(exc, httpx.RemoteProtocolError):
        return (
            f"API at {base_url} accepted the connection but {what} got no HTTP answer ({name}: "
            f"{exc}): the port is not an HTTP server, or it speaks TLS (https://)"
        )
    return f"API at {base_url}: {what} failed: {name}: {exc}"


NOT_AN_API = (
    "is --spark-api-url the base URL of an OpenAI-compatible API (vLLM: http://HOST:8000/v1)?"
)


def served_models(models: body.Body, base_url: str) -> tuple[Any, list[str]]:
    """The model list ``GET /v1/models`` answered (its ``data`` and their ids), or the
    ApiError that says what came back instead: a refusal (401, 403), another status, a body
    too large, an HTML page, JSON without ``data[].id``, no model at all."""
    listing = f"GET {base_url}/v1/models"
    if models.status_code == 401:
        raise ApiError(
            f"API at {base_url} refused the request (401): the server requires an "
            "API key; set SPARK_API_KEY or --spark-api-key-file"
        )
    if models.status_code == 403:
        raise ApiError(
            f"API at {base_url} refused the request (403): the API key is not allowed to list "
            "models; check SPARK_API_KEY or --spark-api-key-file"
        )
    if models.status_code != 200:
        raise ApiError(
            f"{listing} answered {models.status_code} {models.reason_phrase}: "
            f"{models.excerpt()}; {NOT_AN_API}"
        )
    if models.cut:
        raise ApiError(
            f"{listing} answered a body of more than {body.size_text(models.cap)} (read up "
            f"to there and cut): not a model list; {NOT_AN_API}"
        )
    if models.content_type == "text/html":
        raise ApiError(
            f"{listing} answered an HTML page (text/html), not a JSON model list: "
            f"{models.excerpt(200)}; {NOT_AN_API}"
        )
    try:
        data = models.json()["data"]
        ids = [str(m["id"]) for m in data]
    except (ValueError, KeyError, TypeError):
        raise ApiError(
            f"{listing} did not return a model list (JSON with data[].id): "
            f"{models.excerpt()}; {NOT_AN_API}"
        ) from None
    if not ids:
        raise ApiError(
            f"{listing} lists no model (data is empty): the server runs but serves no model "
            "yet; load one, or wait until it is loaded"
        )
    return data, ids


def discover(
    base_url: str, *, api_key: str | None, model: str | None, timeout: float
) -> ApiEndpoint:
    """Ask the server what it serves; fail with what was found, never hang. Every body is
    read up to ``MAX_BODY_BYTES``."""
    meant = pasted_endpoint(base_url)
    if meant is not None:
        raise ApiError(
            f"{base_url} is the URL of one endpoint, not the API's base URL: did you mean "
            f"the base URL {meant} (--spark-api-url={meant})?"
        )
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(
        base_url=base_url, headers=headers, timeout=timeout, verify=tls_context()
    ) as client:
        try:
            models = body.get(client, "/v1/models")
        except httpx.HTTPError as exc:
            raise ApiError(transport_problem(base_url, "GET /v1/models", exc, timeout)) from None
        try:
            version_resp: body.Body | None = body.get(client, "/version", cap=64 * 1024)
        except httpx.HTTPError:
            version_resp = None  # not every OpenAI-compatible server has it
    data, ids = served_models(models, base_url)
    if model is None:
        if len(ids) > 1:
            raise ApiError(
                f"{base_url} serves several models ({', '.join(ids)}); "
                "choose one with --spark-model"
            )
        model = ids[0]
    elif model not in ids:
        raise ApiError(f"model {model!r} is not served by {base_url}; it serves: {', '.join(ids)}")
    entry = next(m for m in data if str(m["id"]) == model)
    version = None
    if version_resp is not None and version_resp.status_code == 200:
        try:
            version = str(version_resp.json().get("version"))
        except (ValueError, AttributeError):
            version = None
    entry = entry if isinstance(entry, dict) else {}
    return ApiEndpoint(
        base_url, model, api_key, timeout, version, entry.get("max_model_len"), entry.get("root")
    )


def engine_failing(
    endpoint: ApiEndpoint, log_hint: str = "the server's own log", node: str | None = None
) -> str | None:
    """One tiny chat completion: ``None`` unless the server answers it with a 5xx (the
    engine fails every request: a dead or broken engine behind a live HTTP server) or does
    not answer it within the HTTP timeout (a hung engine behind a live HTTP server: /health
    and /v1/models answer, the model does not; sparkrun#252). Any other oddity is left to
    the checks that read responses; they say what is wrong. ``log_hint``: where the
    engine's own account is (the head's ``docker logs``, when the suite knows the head);
    ``node``: the node that serves the API (the head), named first."""
    request = {
        "model": endpoint.model,
        "max_tokens": 1,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Say OK."}],
    }
    try:
        with endpoint.client() as client:
            response = body.request(
                client, "POST", "/v1/chat/completions", json=request, cap=64 * 1024
            )
    except httpx.TimeoutException:
        where = f"{node}: " if node else ""
        return (
            f"{where}the model does not answer: {endpoint.base_url} answers /v1/models "
            f"({endpoint.model!r}) but a 1-token chat completion got no answer in "
            f"{endpoint.timeout:g} s. measured: no response within {endpoint.timeout:g} s; "
            "expected: a 1-token answer within the HTTP timeout (--spark-http-timeout). The "
            "engine takes requests and never runs them (containers stay up and `sparkrun "
            f"status` green meanwhile, sparkrun#252). fix: {log_hint} says where it stopped "
            "(a hung step, a rank stuck in a collective); restart the job (`sparkrun stop`, "
            "then run it again)"
        )
    except httpx.HTTPError:
        return None  # not a verdict on the engine: the checks' own requests will say
    if response.status_code < 500:
        return None
    return (
        f"{endpoint.base_url} serves {endpoint.model!r} but a chat completion answered HTTP "
        f"{response.status_code}: {response.text[:300]!r}. The engine is failing requests: "
        f"{log_hint} says why"
    )
