"""Tool-call arguments against the tool's JSON schema, with ``jsonschema`` (Draft 2020-12:
``$ref``, ``pattern``, ``minLength``, ``format`` and every other keyword are checked).

One difference from JSON Schema, on purpose: a model's argument is an integer only when it
was written as one. ``2`` is an integer and a number; ``2.0`` is a number, not an integer
(JSON Schema would accept it); ``true`` is a boolean only; ``"2"`` a string. A parser that
turns ``2`` into ``2.0`` or ``"2"`` has broken the call, and the check says so.

Each problem is one line naming where in the arguments it is: ``$.days: "2" is a string,
expected integer``; the lines follow the order of the arguments.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

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


def _is_integer(checker: Any, instance: Any) -> bool:
    return json_type(instance) == "integer"


# Draft 2020-12 with the strict integer above (the rest of its types are JSON's already).
StrictValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _where(path: Any) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def _position(root: Any, path: Any) -> tuple[int, ...]:
    """``path`` as positions in ``root``: a property by its place in the object (the
    order the model wrote the arguments in), an item by its index."""
    out: list[int] = []
    node = root
    for step in path:
        if isinstance(node, dict):
            keys = list(node)
            out.append(keys.index(step) if step in keys else len(keys))
        else:
            out.append(step if isinstance(step, int) else 0)
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            node = None
    return tuple(out)


def _lines(error: ValidationError, root: Any) -> list[tuple[tuple[int, ...], str]]:
    """One error as (sort key, line) pairs: a few keywords in the suite's words, the
    rest in jsonschema's."""
    path = list(error.absolute_path)
    here = _position(root, path)
    where = _where(path)
    value, wanted, keyword = error.instance, error.validator_value, error.validator
    if keyword == "type":
        names = [wanted] if isinstance(wanted, str) else list(wanted)
        known = [w for w in names if w in _JSON_TYPES]
        line = f"{where}: {_show(value)} is a {json_type(value)}, expected {' or '.join(known)}"
        return [(here, line)]
    if keyword == "enum":
        return [(here, f"{where}: {_show(value)} is not one of {_show(wanted)}")]
    if keyword == "const":
        return [(here, f"{where}: {_show(value)} is not {_show(wanted)}")]
    if keyword == "required":  # one error per missing name; the name is in the message
        name = error.message.removesuffix(" is a required property")
        try:
            shown = repr(json.loads(name)) if name.startswith('"') else name
        except ValueError:
            shown = name
        return [((*here, -1), f"{where}: required property {shown} is missing")]
    if keyword == "additionalProperties" and wanted is False and isinstance(value, dict):
        schema = error.schema if isinstance(error.schema, dict) else {}
        known_props = schema.get("properties") or {}
        patterns = list(schema.get("patternProperties") or {})
        extra = [
            name
            for name in value
            if name not in known_props and not any(_matches(p, name) for p in patterns)
        ]
        keys = list(value)
        return [
            ((*here, keys.index(name)), f"{where}: property {name!r} is not in the schema")
            for name in extra
        ]
    if keyword in ("minimum", "maximum"):
        side = "below the minimum" if keyword == "minimum" else "above the maximum"
        return [(here, f"{where}: {value} is {side} {wanted}")]
    if keyword in ("minItems", "maxItems") and isinstance(value, list):
        bound = "at least" if keyword == "minItems" else "at most"
        return [(here, f"{where}: {len(value)} items, expected {bound} {wanted}")]
    if keyword in ("anyOf", "oneOf") and isinstance(wanted, list):
        failing: dict[int, str] = {}
        for sub in sorted(error.context or (), key=lambda e: list(e.relative_schema_path)):
            option = sub.relative_schema_path[0]
            if isinstance(option, int) and option not in failing:
                said = _lines(sub, root)
                failing[option] = said[0][1] if said else sub.message
        passing = len(wanted) - len(failing)
        detail = "; ".join(failing[i] for i in sorted(failing)) or "several match"
        return [(here, f"{where}: matches {passing} of the {keyword} options ({detail})")]
    if keyword == "pattern":
        return [(here, f"{where}: {_show(value)} does not match the pattern {_show(wanted)}")]
    if keyword in ("minLength", "maxLength") and isinstance(value, str):
        bound = "at least" if keyword == "minLength" else "at most"
        line = f"{where}: {_show(value)} is {len(value)} characters, expected {bound} {wanted}"
        return [(here, line)]
    if keyword == "format":
        return [(here, f"{where}: {_show(value)} is not a valid {wanted} (format)")]
    return [(here, f"{where}: {error.message}")]


def _matches(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


def validate(value: Any, schema: Any) -> list[str]:
    """Every way ``value`` breaks ``schema``, as ``"$.days: "2" is a string, expected
    integer"`` lines in the order of the arguments; empty when it conforms. A schema that
    is not a JSON object (or ``true``) checks nothing; one that is not valid JSON Schema is
    one line saying so."""
    if not isinstance(schema, dict):
        return []
    try:
        StrictValidator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return [f"$: the tool's schema is not valid JSON Schema: {exc.message}"]
    validator = StrictValidator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    errors = list(validator.iter_errors(value))
    # A value of the wrong type is that, once: the other keywords at its place (an enum,
    # a minimum) say nothing more about it.
    mistyped = [list(e.absolute_path) for e in errors if e.validator == "type"]
    kept = [
        e
        for e in errors
        if e.validator == "type" or not any(list(e.absolute_path)[: len(p)] == p for p in mistyped)
    ]
    lines = [pair for e in kept for pair in _lines(e, value)]
    return [line for _, line in sorted(lines, key=lambda pair: pair[0])]
