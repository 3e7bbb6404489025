"""Quantity parsing: the forms node allocatable and pod requests use."""

from __future__ import annotations

import pytest

from chronotope.api.quantity import QuantityError, cpu_milli, memory_mib


@pytest.mark.parametrize(
    ("text", "milli"),
    [("32", 32_000), ("500m", 500), ("0.5", 500), ("1e3", 1_000_000), ("250u", 1)],
)
def test_cpu_quantities_become_milli_cores(text: str, milli: int) -> None:
    assert cpu_milli(text) == milli


@pytest.mark.parametrize(
    ("text", "mib"),
    [("256Gi", 262_144), ("131072Ki", 128), ("1G", 954), ("64Mi", 64), ("1", 1)],
)
def test_memory_quantities_become_mib(text: str, mib: int) -> None:
    assert memory_mib(text) == mib


@pytest.mark.parametrize("text", ["", "lots", "12Qi", "1.2.3"])
def test_bad_quantities_are_refused(text: str) -> None:
    with pytest.raises(QuantityError):
        cpu_milli(text)
