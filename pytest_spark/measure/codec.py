"""Typed dataclasses to JSON and back, losslessly, for results shared between processes
(an xdist worker's measurement read by the others from the run directory).

``dump`` turns dataclasses, tuples, lists, str-keyed mappings and scalars into JSON data;
``load(T, data)`` rebuilds a ``T`` from the field annotations (nested dataclasses,
``tuple[X, ...]``, fixed tuples, ``list``, ``dict``/``Mapping``, ``X | None`` and other
unions, ``Literal``, ``Any``), so ``load(T, json.loads(json.dumps(dump(x)))) == x``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin, get_type_hints

T = TypeVar("T")


class CodecError(TypeError):
    """The value (or the data) does not fit the type."""


def dump(value: Any) -> Any:
    """JSON data for ``value`` (dataclasses as objects of their fields)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [dump(v) for v in value]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise CodecError(f"mapping keys must be str: {list(value)[:5]}")
        return {k: dump(v) for k, v in value.items()}
    if value is None or isinstance(value, str | int | float):
        return value
    raise CodecError(f"cannot encode {type(value).__name__}: {value!r:.80}")


def load(tp: Any, data: Any) -> Any:
    """The ``tp`` that :func:`dump` turned into ``data``."""
    if tp is Any:
        return data
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union or origin is types.UnionType:
        for arm in args:
            if _fits(arm, data):
                return load(arm, data)
        raise CodecError(f"{data!r:.80} fits none of {tp}")
    if origin is Literal:
        if data not in args:
            raise CodecError(f"{data!r:.80} is not one of {args}")
        return data
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise CodecError(f"{tp.__name__}: expected an object, got {data!r:.80}")
        hints = get_type_hints(tp)
        kwargs = {
            f.name: load(hints[f.name], data[f.name])
            for f in dataclasses.fields(tp)
            if f.init and f.name in data
        }
        return tp(**kwargs)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(load(args[0], v) for v in _list(data))
        return tuple(load(a, v) for a, v in zip(args, _list(data), strict=True))
    if origin is list:
        return [load(args[0] if args else Any, v) for v in _list(data)]
    if origin in (dict, Mapping, typing.Mapping):
        if not isinstance(data, dict):
            raise CodecError(f"expected an object, got {data!r:.80}")
        return {k: load(args[1] if args else Any, v) for k, v in data.items()}
    if tp is type(None):
        if data is not None:
            raise CodecError(f"expected null, got {data!r:.80}")
        return None
    if tp is float and isinstance(data, int | float) and not isinstance(data, bool):
        return float(data)
    if tp in (str, int, bool) and _fits(tp, data):
        return data
    raise CodecError(f"cannot decode {data!r:.80} as {tp}")


def load_as(tp: type[T], data: Any) -> T:
    """:func:`load` for a plain class, typed."""
    return cast(T, load(tp, data))


def _list(data: Any) -> list[Any]:
    if not isinstance(data, list):
        raise CodecError(f"expected an array, got {data!r:.80}")
    return data


def _fits(tp: Any, data: Any) -> bool:
    """Whether ``data`` has the JSON shape of ``tp`` (to pick a union's arm)."""
    origin = get_origin(tp)
    if tp is Any:
        return True
    if tp is type(None):
        return data is None
    if origin is Literal:
        return data in get_args(tp)
    if origin is Union or origin is types.UnionType:
        return any(_fits(a, data) for a in get_args(tp))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return isinstance(data, dict)
    if origin in (tuple, list):
        return isinstance(data, list)
    if origin in (dict, Mapping, typing.Mapping):
        return isinstance(data, dict)
    if tp is bool:
        return isinstance(data, bool)
    if tp is int:
        return isinstance(data, int) and not isinstance(data, bool)
    if tp is float:
        return isinstance(data, int | float) and not isinstance(data, bool)
    if tp is str:
        return isinstance(data, str)
    return False
