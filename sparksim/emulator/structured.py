"""Structured output (``response_format``) as vLLM serves it: the request's checks, and the
JSON the emulated model writes under guided decoding.

vLLM's request model (``vllm/entrypoints/openai/protocol.py``): ``response_format`` is
``{"type": "text" | "json_object" | "json_schema" | "structural_tag", "json_schema":
{"name", "description", "schema", "strict"}}``. ``json_object`` and ``json_schema`` become
structured-output parameters (``json_object=True`` / ``json=<schema>``) that the guided
decoding backend (xgrammar by default) compiles into a grammar before the request is
scheduled; a schema it cannot compile is refused with HTTP 400 ``Failed to transform json
schema into a grammar: ...`` (``vllm/v1/structured_output/backend_xgrammar.py``,
``validate_xgrammar_grammar``). Under guided decoding the answer (after any reasoning: the
reasoning parser ends thinking before the grammar applies) is JSON that the grammar
allows, so it parses and validates against the schema.
"""

from __future__ import annotations

import json
import re
from typing import Any

from . import errors as err
from . import toolcalls as tc

FORMAT_TYPES = ("text", "json_object", "json_schema", "structural_tag")
JSON_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
GRAMMAR_ERROR = "Failed to transform json schema into a grammar: "


def requested(body: dict[str, Any]) -> dict[str, Any] | None:
    """The request's ``response_format`` when it asks for JSON; None for none or text.
    Raises vLLM's 400 for a format it would not accept."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise err.validation(
            "model_attributes_type",
            "body.response_format",
            "Input should be a valid dictionary or object to extract fields from",
            fmt,
        )
    kind = fmt.get("type")
    if kind not in FORMAT_TYPES:
        expected = ", ".join(f"'{t}'" for t in FORMAT_TYPES)
        raise err.validation(
            "literal_error",
            "body.response_format.type",
            f"Input should be {expected}",
            kind,
            {"expected": expected},
        )
    if kind == "text" or kind == "structural_tag":
        return None
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise err.bad_request(
                "response_format of type json_schema requires a json_schema field",
                "response_format",
            )
        schema = spec.get("schema", {})
        problem = schema_problem(schema)
        if problem is not None:
            raise err.bad_request(GRAMMAR_ERROR + problem)
    return fmt


def schema_problem(schema: Any, path: str = "$") -> str | None:
    """Why the grammar compiler would refuse ``schema`` (an unknown type, a property map
    that is not an object, ...), or None."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return f"{path}: a schema must be an object or a boolean, got {json.dumps(schema)}"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in JSON_TYPES:
            return f"{path}: unsupported type {json.dumps(k)}"
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            return f"{path}.properties: must be an object"
        for name, sub in props.items():
            problem = schema_problem(sub, f"{path}.{name}")
            if problem is not None:
                return problem
    required = schema.get("required")
    if required is not None and not (
        isinstance(required, list) and all(isinstance(r, str) for r in required)
    ):
        return f"{path}.required: must be an array of strings"
    items = schema.get("items")
    if items is not None:
        return schema_problem(items, f"{path}[]")
    return None


def answer(fmt: dict[str, Any], prompt: str, text: str) -> str:
    """The JSON the model writes under guided decoding: an instance of the schema (values
    taken from the prompt where it names them), or for ``json_object`` an object holding
    the plain answer ``text``."""
    if fmt.get("type") == "json_object":
        return json.dumps({"answer": text}, ensure_ascii=False)
    schema = (fmt.get("json_schema") or {}).get("schema", {})
    if re.fullmatch(r"-?\d+", text.strip()):  # a computed number: the model writes it first
        prompt = f"{text.strip()} {prompt}"
    return json.dumps(instance(schema, prompt, text), ensure_ascii=False)


def instance(schema: Any, prompt: str, text: str) -> Any:
    """A value ``schema`` accepts, deterministic for one prompt."""
    if not isinstance(schema, dict):
        return {}
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        named = [
            e for e in enum if isinstance(e, str) and re.search(rf"\b{re.escape(e)}\b", prompt)
        ]
        return named[0] if named else enum[0]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return instance(options[0], prompt, text)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties") or {}
        fn = {"parameters": {"properties": _scalars(props), "required": []}}
        args = tc.synth_args(fn, prompt)
        out: dict[str, Any] = {}
        for name, sub in props.items():
            if name in args:
                out[name] = args[name]
            else:
                out[name] = instance(sub, prompt, text)
        return out
    if kind == "array":
        count = max(int(schema.get("minItems", 1) or 0), 1)
        return [instance(schema.get("items", {}), prompt, text) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum")
        return int(low) if isinstance(low, int | float) else 1
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return text


def _names(prompt: str, word: str) -> bool:
    return re.search(rf"\b{re.escape(word)}\b", prompt) is not None


def _scalars(props: dict[str, Any]) -> dict[str, Any]:
    """The properties synth_args fills from what the prompt names (strings, integers,
    enums); the others get ``instance``'s values."""
    return {
        name: sub
        for name, sub in props.items()
        if isinstance(sub, dict) and (sub.get("enum") or sub.get("type") in ("string", "integer"))
    }
