"""Base model and rule machinery shared by every Chronotope API type.

Why this exists: a cross-field rule (say `minReplicas <= maxReplicas`) must be
enforced in two places, by the API server (as a CEL `x-kubernetes-validations`
rule in the generated CRD) and by the Python models (so samples, the
simulator and the controllers reject the same input without a cluster). A
`Rule` states the rule once, as a CEL expression and a Python predicate with
one message, so the two can never drift apart in what they say.

Pure: no Kubernetes client imports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, GetJsonSchemaHandler, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema as cs

__all__ = ["ApiModel", "KindInfo", "PrinterColumn", "Rule", "ScaleSubresource", "camel_alias"]

# Unit spellings Kubernetes users expect inside camelCase names (`memoryMiB`, `fixedQPS`).
_UNITS = {"Mib": "MiB", "Qps": "QPS"}


def camel_alias(name: str) -> str:
    """JSON name of a field: `memory_mib` -> `memoryMiB`, `gpu_types` -> `gpuTypes`."""
    camel = to_camel(name)
    for wrong, right in _UNITS.items():
        camel = camel.replace(wrong, right)
    return camel


@dataclass(frozen=True)
class Rule:
    """One cross-field validation rule, enforced by the API server and by the models.

    `cel` is evaluated by the API server with `self` bound to the object the
    rule is attached to; `check` is the same predicate in Python, called with
    the validated model. `field` is the path, relative to that object, of the
    field the message is about (for example `.minReplicas`); the API server
    reports it as the offending field, and Python errors are prefixed with it.
    """

    cel: str
    message: str
    check: Callable[[Any], bool]
    field: str | None = None
    # FieldValueDuplicate is avoided: the API server drops the message for that reason.
    reason: str = "FieldValueInvalid"

    def to_crd(self) -> dict[str, str]:
        """The `x-kubernetes-validations` entry for this rule."""
        entry = {"rule": self.cel, "message": self.message}
        if self.field:
            entry["fieldPath"] = self.field
        entry["reason"] = self.reason
        return entry

    def error_text(self) -> str:
        field = self.field.lstrip(".") if self.field else ""
        return f"{field}: {self.message}" if field else self.message


class ApiModel(BaseModel):
    """Base of every API type: camelCase JSON names, no unknown fields, cross-field rules.

    Subclasses list their cross-field rules in `rules`; they are checked after
    field validation and emitted as `x-kubernetes-validations` in the schema.
    """

    model_config = ConfigDict(
        alias_generator=camel_alias,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=False,
        validate_default=False,
    )

    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> ApiModel:
        failed = [rule.error_text() for rule in type(self).rules if not rule.check(self)]
        if failed:
            raise ValueError("; ".join(failed))
        return self

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: cs.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(core_schema)
        if cls.rules:
            target = handler.resolve_ref_schema(json_schema)
            target["x-kubernetes-validations"] = [rule.to_crd() for rule in cls.rules]
        return json_schema


@dataclass(frozen=True)
class PrinterColumn:
    """One `additionalPrinterColumns` entry: what `kubectl get` shows."""

    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0  # 1: only with `kubectl get -o wide`

    def to_crd(self) -> dict[str, Any]:
        column: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            column["description"] = self.description
        if self.priority:
            column["priority"] = self.priority
        return column


@dataclass(frozen=True)
class ScaleSubresource:
    """Where `kubectl scale` reads and writes the replica count."""

    spec_replicas_path: str
    status_replicas_path: str
    label_selector_path: str | None = None


@dataclass(frozen=True)
class KindInfo:
    """Everything about a kind's CRD that is not its schema: names, columns, subresources."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    spec_model: type[ApiModel]
    status_model: type[ApiModel]
    columns: tuple[PrinterColumn, ...]
    scale: ScaleSubresource | None = None
    categories: tuple[str, ...] = ("chronotope",)
    namespaced: bool = True  # False: a cluster-scoped kind (Queue)

    @property
    def singular(self) -> str:
        return self.kind.lower()
