"""Check a pod template against the Kubernetes API types, field by field (pure).

The CRD embeds the real PodTemplateSpec schema for a TrainingJob's
`spec.template` (generated from the vendored Kubernetes OpenAPI,
`api/k8s/`), so the API server refuses a template of the wrong shape
(`containers: "x"`, `containerPort: "80"`). This check runs in the admission
webhook too: it gives the same refusals by field path with the API's own
words, warns about unknown fields (which the schema prunes), and covers
objects stored before the schema was installed. This walks the template along a type
table (the PodTemplateSpec types; `kube.admission.pod_template_types` builds
it from the Kubernetes client's models, so it follows the client's API
version) and reports, by field path:

- errors: a value of the wrong type, a required field missing, a resource
  quantity that does not parse;
- unknown fields, which the API server drops when it creates the pod (often a
  typo such as `imagePullPolcy`).

A type expression is `str`, `int`, `float`, `bool`, `quantity`, `any`,
`list:T` (a list of T), `map:T` (an object of string keys to T), or the name
of an object type in the table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_PROBLEMS", "ObjectType", "ShapeReport", "TypeTable", "check_shape"]

MAX_PROBLEMS = 20
"""Problems reported per template; a badly wrong template need not list them all."""

_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
"""A Kubernetes resource quantity: `1`, `500m`, `1.5Gi`, `2e3` (apimachinery's grammar)."""


@dataclass(frozen=True)
class ObjectType:
    """One object type: its fields (JSON name -> type expression) and the required ones."""

    fields: Mapping[str, str]
    required: frozenset[str] = frozenset()


TypeTable = Mapping[str, ObjectType]
"""Object type name -> its fields."""


@dataclass(frozen=True)
class ShapeReport:
    """What `check_shape` found: errors and unknown fields, each as `path: problem`."""

    errors: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()


@dataclass
class _Found:
    errors: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def error(self, path: str, problem: str) -> None:
        if len(self.errors) < MAX_PROBLEMS:
            self.errors.append(f"{path}: {problem}")


def check_shape(value: Any, type_name: str, table: TypeTable, path: str) -> ShapeReport:
    """Check `value` against the object type `type_name` of `table`; paths start at `path`.

    Pure. JSON null is accepted for any optional field (the API server treats
    it as unset). Raises KeyError when `type_name` or a type it refers to is
    not in `table` (a broken table, not bad input).
    """
    found = _Found()
    _walk(value, type_name, table, path, found)
    return ShapeReport(tuple(found.errors), tuple(found.unknown[:MAX_PROBLEMS]))


def _walk(value: Any, expr: str, table: TypeTable, path: str, found: _Found) -> None:
    if value is None or expr == "any":
        return
    if expr.startswith("list:"):
        if not isinstance(value, list):
            found.error(path, f"must be a list, not {_kind(value)}")
            return
        for i, item in enumerate(value):
            _walk(item, expr[5:], table, f"{path}[{i}]", found)
        return
    if expr.startswith("map:"):
        if not isinstance(value, dict):
            found.error(path, f"must be an object, not {_kind(value)}")
            return
        for key, item in value.items():
            _walk(item, expr[4:], table, f"{path}[{key}]", found)
        return
    problem = _scalar_problem(value, expr)
    if problem is not None:
        if problem:
            found.error(path, problem)
        return
    _walk_object(value, table[expr], table, path, found)


def _walk_object(value: Any, kind: ObjectType, table: TypeTable, path: str, found: _Found) -> None:
    if not isinstance(value, dict):
        found.error(path, f"must be an object, not {_kind(value)}")
        return
    for key in sorted(kind.required):
        if value.get(key) is None:
            found.error(f"{path}.{key}", "required")
    for key, item in value.items():
        expr = kind.fields.get(key)
        if expr is None:
            found.unknown.append(f"{path}.{key}")
        else:
            _walk(item, expr, table, f"{path}.{key}", found)


def _scalar_problem(value: Any, expr: str) -> str | None:
    """'' when `value` is a fine `expr` scalar, the problem when not, None if not a scalar type."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if expr == "str":
        return "" if isinstance(value, str) else f"must be a string, not {_kind(value)}"
    if expr == "int":
        whole = number and float(value).is_integer()
        return "" if whole else f"must be an integer, not {_kind(value)}"
    if expr == "float":
        return "" if number else f"must be a number, not {_kind(value)}"
    if expr == "bool":
        return "" if isinstance(value, bool) else f"must be true or false, not {_kind(value)}"
    if expr == "quantity":
        if number or (isinstance(value, str) and _QUANTITY.match(value)):
            return ""
        return f"{value!r} is not a quantity (e.g. 1, 500m, 4Gi)"
    return None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
