"""From text and JSON to a config field's type: what ``--set``, presets and a checkpoint's ``config.json`` pass
through before a section's dataclass checks the value, and the one-line docstrings ``--help`` lists."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import math
import typing
from typing import Any, Literal

from utils.errors import ConfigError


def field_types(section_cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(section_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(section_cls)}


def construct(section_cls: type, kwargs: dict[str, Any]) -> Any:
    try:
        return section_cls(**kwargs)
    except TypeError as error:  # a missing or unexpected argument: report it as a config problem
        raise ConfigError(f"config section {section_cls.__name__}: {error}") from None


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return "one of " + "|".join(str(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        return f"comma-separated list of {getattr(item, '__name__', item)}"
    return getattr(hint, "__name__", str(hint))


def coerce(key: str, hint: Any, value: Any) -> Any:
    """Convert ``value`` (a string from the command line, or a JSON value) to the field's type."""
    expected = _type_name(hint)
    origin = typing.get_origin(hint)
    try:
        if origin is Literal:
            if value not in typing.get_args(hint):
                raise ValueError
            return value
        if origin is tuple and typing.get_args(hint)[0] is float:
            items = value.strip("[] ").split(",") if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)) or any(isinstance(v, bool) for v in items):
                raise ValueError
            numbers = tuple(float(v) for v in items)
            if not all(math.isfinite(v) for v in numbers):
                raise ValueError
            return numbers
        if origin is tuple:
            if isinstance(value, str):
                return tuple(item.strip() for item in value.split(",") if item.strip())
            if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                return tuple(value)
            raise ValueError
        if hint is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
                return value.lower() in ("true", "1", "yes")
            raise ValueError
        if hint is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, int):
                return value
            if isinstance(value, str):
                return int(value.replace("_", ""))
            raise ValueError
        if hint is float:
            if isinstance(value, bool):
                raise ValueError
            number = float(value) if isinstance(value, (int, float, str)) else math.nan
            if not math.isfinite(number):
                raise ValueError
            return number
        if hint is str:
            if not isinstance(value, str):
                raise ValueError
            return value
    except ValueError:
        pass
    raise ConfigError(f"config key {key} expects {expected}, got {value!r}")


def field_docstrings(cls: type) -> dict[str, str]:
    """Field docstrings: the string literal right after each annotated assignment in the class body."""
    source = inspect.getsource(cls)
    tree = ast.parse(source)
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, following in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = following.value.value.strip()
    return docs
