"""Secrets never appear: the API key (any of its three sources), bearer tokens and URL
passwords are redacted in the terminal, HTML, JSON results, JUnit XML and history."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from report_fakes import KEY, write_suite

from pytest_spark.report.redact import REDACTED, Redactor

URL_PASSWORD = "hunter2pass"
TOKEN = "tok-BEARER-987654321"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://bob:hunter2@head:8000/v1", f"http://bob:{REDACTED}@head:8000/v1"),
        ("https://u:p%40ss@x/", f"https://u:{REDACTED}@x/"),
        ("Authorization: Bearer abcdef123456", f"Authorization: Bearer {REDACTED}"),
        ("SPARK_API_KEY=abcd1234 next", f"SPARK_API_KEY={REDACTED} next"),
        ('{"api_key": "zz-1234"}', f'{{"api_key": "{REDACTED}"}}'),
        ("args: {'api_key': ['qq-9999']}", f"args: {{'api_key': ['{REDACTED}']}}"),
        (
            "vllm serve m --api-key s3cr3t --port 8000",
            f"vllm serve m --api-key {REDACTED} --port 8000",
        ),
        ("x-api-key: abcdefg", f"x-api-key: {REDACTED}"),
        ("HF_TOKEN=hf_abcdefgh", f"HF_TOKEN={REDACTED}"),
        ("a Bearer token is needed; max_tokens=256", "a Bearer token is needed; max_tokens=256"),
        ("plain http://head:8000/v1 stays", "plain http://head:8000/v1 stays"),
    ],
)
def test_patterns(text: str, expected: str) -> None:
    assert Redactor().text(text) == expected


def test_known_secret_in_every_encoding() -> None:
    secret = 'k<e>y"&/+ 42'
    r = Redactor([secret])
    import html
    import json
    from urllib.parse import quote

    from markupsafe import escape

    forms = (secret, html.escape(secret), json.dumps(secret)[1:-1], quote(secret, safe=""))
    # escape: the report's templates' form (jinja2 autoescape writes " as &#34;, ' as &#39;)
    for form in (*forms, str(escape(secret))):
        assert r.text(f"x {form} y") == f"x {REDACTED} y", form


def test_short_secrets_are_not_used_as_patterns() -> None:
    assert Redactor(["ab", None, ""]).text("ab cab") == "ab cab"


def test_nested_values_and_keys() -> None:
    r = Redactor([KEY])
    doc = {"a": [KEY, {"b": (1, f"x{KEY}")}], KEY: 3.5}
    assert r.value(doc) == {"a": [REDACTED, {"b": (1, f"x{REDACTED}")}], REDACTED: 3.5}


def _outputs(root: Path) -> dict[str, str]:
    """Every file the run wrote, text; HTML data: URIs of text extras decoded too."""
    found = {}
    for path in root.rglob("*"):
        if path.is_file() and path.suffix in (".html", ".json", ".xml"):
            text = path.read_text(errors="replace")
            found[str(path)] = text
            for uri in re.findall(
                r"data:(?:text|application)/[\w+-]+;charset=utf-8;base64,"
                r"([A-Za-z0-9+/=]+)",
                text,
            ):
                found[f"{path} data-uri"] = base64.b64decode(uri).decode(errors="replace")
    return found


SOURCES = ["env", "cli", "file"]


@pytest.mark.parametrize("source", SOURCES)
def test_no_secret_in_any_output(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """Every sink, with the key from each of its sources (the whole fake suite, with
    figures, serving facts and evidence, once; the attachments check for each source)."""
    pytester.makeini("[pytest]\njunit_family = xunit1\n")
    if source == "env":
        write_suite(pytester)
    pytester.makepyfile(
        test_extra=f"""
        import pytest
        import pytest_html

        @pytest.mark.preflight
        def test_attachments(extras, spark_check, record_property):
            record_property("api", "{KEY}")
            extras.append(pytest_html.extras.text("attached: {KEY}", name="key"))
            extras.append(pytest_html.extras.json({{"auth": "Bearer {TOKEN}"}}))
            spark_check.attach("request", {{"headers": {{"Authorization": "Bearer {TOKEN}"}}}})
            print("GET http://root:{URL_PASSWORD}@spark-head:8000/v1")
            assert "{KEY}" == "x", "api key {KEY} leaked"
        """
    )
    out = pytester.path / "out"
    args = [
        f"--html={out / 'report.html'}",
        "--self-contained-html",
        "-rA",
        f"--spark-results={out / 'results.json'}",
        f"--junitxml={out / 'junit.xml'}",
        f"--spark-history={out / 'history'}",
    ]
    if source == "env":
        monkeypatch.setenv("SPARK_API_KEY", KEY)
    elif source == "cli":
        args.append(f"--spark-api-key={KEY}")
    else:
        (pytester.path / "key.txt").write_text(KEY + "\n")
        args.append(f"--spark-api-key-file={pytester.path / 'key.txt'}")
    result = pytester.runpytest(*args)
    if source == "env":
        result.assert_outcomes(passed=5, failed=3, skipped=1)
    else:
        result.assert_outcomes(failed=1)
    outputs = _outputs(out)
    outputs["terminal"] = result.stdout.str() + result.stderr.str()
    assert {"report.html", "results.json", "junit.xml"} <= {Path(p).name for p in outputs}
    assert any("/history/" in p for p in outputs) == (source == "env")
    for where, text in outputs.items():
        for secret in (KEY, TOKEN, URL_PASSWORD):
            assert secret not in text, f"{secret} in {where}"
    assert REDACTED in outputs["terminal"]
    assert f"api key {REDACTED} leaked" in outputs["terminal"]
    junit = outputs[str(out / "junit.xml")]
    assert f'<property name="api" value="{REDACTED}"' in junit.replace("&lt;", "<").replace(
        "&gt;", ">"
    )


def test_collection_errors_are_redacted(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_broken=f"raise RuntimeError('cannot import with key {KEY}')\n")
    out = pytester.path / "junit.xml"
    result = pytester.runpytest(f"--spark-api-key={KEY}", f"--junitxml={out}")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    text = result.stdout.str() + out.read_text()
    assert "cannot import with key" in text and KEY not in text
