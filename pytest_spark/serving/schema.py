"""A JSON-schema validator for the subset tool definitions use.

Keywords: ``type`` (one or a list), ``properties``, ``required``, ``enum``, ``const``,
``items``, ``additionalProperties`` (false or a schema), ``anyOf``/``oneOf``,
``minimum``/``maximum``, ``minItems``/``maxItems``. Integer, number, string and boolean are
told apart as JSON does: ``2`` is an integer and a number, ``2.0`` a number, ``"2"`` a
string, ``true`` a boolean only. Unknown keywords are ignored (as JSON Schema says).
"""

from __future__ import annotations

import json
from typing import Any

_JSON_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


def json_type(value: Any) -> str:
    """The JSON type name of a decoded value (``integer`` for whole numbers like ``2``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"  # strict: 2.0 is not an integer argument (JSON Schema would allow it)
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _type_ok(value: Any, wanted: str) -> bool:
    actual = json_type(value)
    if wanted == "number":
        return actual in ("integer", "number")
    return actual == wanted


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def validate(value: Any, schema: Any, path: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema``, as ``"$.days: "2" is a string, expected
    integer"`` lines; empty when it conforms."""
    if not isinstance(schema, dict):
        return []
    errors: list[str] = []
    if "type" in schema:
        wanted = schema["type"]
        wanted_list = [wanted] if isinstance(wanted, str) else list(wanted)
        known = [w for w in wanted_list if w in _JSON_TYPES]
        if known and not any(_type_ok(value, w) for w in known):
            errors.append(
                f"{path}: {_show(value)} is a {json_type(value)}, expected {' or '.join(known)}"
            )
            return errors
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {_show(value)} is not one of {_show(schema['enum'])}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: {_show(value)} is not {_show(schema['const'])}")
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            results = [validate(value, option, path) for option in options]
            passing = sum(1 for r in results if not r)
            if passing == 0 or (key == "oneOf" and passing > 1):
                detail = "; ".join(r[0] for r in results if r) or "several match"
                errors.append(f"{path}: matches {passing} of the {key} options ({detail})")
    if isinstance(value, bool):
        return errors
    if isinstance(value, int | float):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} is above the maximum {schema['maximum']}")
    if isinstance(value, dict):
        errors += _validate_object(value, schema, path)
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{path}: {len(value)} items, expected at least {schema['minItems']}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: {len(value)} items, expected at most {schema['maxItems']}")
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                errors += validate(item, items, f"{path}[{i}]")
    return errors


def _validate_object(value: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
    errors: list[str] = []
    props = schema.get("properties") or {}
    for name in schema.get("required") or []:
        if name not in value:
            errors.append(f"{path}: required property {name!r} is missing")
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in props:
            errors += validate(item, props[name], f"{path}.{name}")
        elif extra is False:
            errors.append(f"{path}: property {name!r} is not in the schema")
        elif isinstance(extra, dict):
            errors += validate(item, extra, f"{path}.{name}")
    return errors
