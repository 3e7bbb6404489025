"""Kubernetes resource quantities ("500m", "32", "128Gi", "1e3") as CPU milli-cores and MiB.

The scheduler's cluster model counts CPU in milli-cores and memory in MiB, as
the openb trace does; node allocatable and pod requests arrive as quantity
strings. Pure.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

__all__ = ["QuantityError", "base_units", "cpu_milli", "memory_mib", "parse_quantity"]

_SUFFIX = {
    "Ki": Decimal(1024),
    "Mi": Decimal(1024) ** 2,
    "Gi": Decimal(1024) ** 3,
    "Ti": Decimal(1024) ** 4,
    "Pi": Decimal(1024) ** 5,
    "Ei": Decimal(1024) ** 6,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_FORM = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


class QuantityError(ValueError):
    """Not a Kubernetes quantity."""


def parse_quantity(value: object) -> Decimal:
    """The quantity's value in base units (cores, bytes)."""
    text = str(value).strip()
    match = _FORM.match(text)
    if match is None:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity") from exc
    return number * _SUFFIX[match.group(2) or ""]


def cpu_milli(value: object) -> int:
    """CPU in milli-cores, rounded up as kube-scheduler does."""
    return math.ceil(parse_quantity(value) * 1000)


def memory_mib(value: object) -> int:
    """Memory in MiB, rounded up."""
    return math.ceil(parse_quantity(value) / (1024 * 1024))


def base_units(value: object) -> int:
    """Any other resource in its base unit (bytes, devices), rounded up."""
    return math.ceil(parse_quantity(value))
