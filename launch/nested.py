"""Nested dicts addressed by dotted keys (`optim.lr`), and the YAML reading every config file goes
through: the one place for lookup, assignment, merge, flattening and the line for an unknown key."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import Any

import yaml

_Loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~20x faster


class _Yaml12Loader(_Loader):
    """YAML 1.2's float rule: PyYAML (YAML 1.1) reads `1e-3` (no dot) as a string, so a learning
    rate written that way would otherwise arrive as text."""


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"),
    list("-+0123456789."),
)


def load_yaml(text: str | bytes) -> Any:
    """Safe YAML with 1.2 number rules (`1e-3` is a float, `10` stays an int)."""
    return yaml.load(text, Loader=_Yaml12Loader)


def yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML error in one line: where PyYAML found the problem (line and column, from 1), what it
    is, and the construct it was reading (`while parsing a flow sequence` at the `[`)."""
    mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
    if mark is None or not problem:
        return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    line = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, where = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and where is not None and (where.line, where.column) != (mark.line, mark.column):
        line += f" ({context} at line {where.line + 1}, column {where.column + 1})"
    return line


def dotted_get(tree: Any, dotted: str, default: Any = None) -> Any:
    """tree["a"]["b"] for "a.b", or `default` where a level is missing."""
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """tree["a"]["b"] = value for "a.b", creating sections; ValueError if a level is not a mapping."""
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ValueError(f"'{part}' is not a section")
        node = child
    node[parts[-1]] = value


def unknown_key(what: str, key: str, valid: Sequence[str], section: str = "") -> str:
    """The one-line error for a `key` of `section` (a dotted prefix, "optim.") that is none of
    `valid`: the closest valid one first when one is close (a typo: `optim.nmae` -> `optim.name`),
    then all of them."""
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f"; did you mean '{section}{close[0]}'?" if close else ""
    return f"unknown {what} '{section}{key}'{hint} (valid keys here: {', '.join(valid)})"


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` updated by `extra`, recursively for mappings present in both (neither is modified)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def as_overrides(keys: dict[str, Any]) -> list[str]:
    """`key=value` overrides of dotted `keys` (None as YAML's null)."""
    return [f"{key}={'null' if value is None else value}" for key, value in keys.items()]
