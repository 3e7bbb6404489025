"""Resampled openb workloads: more or less of one kind of pod, for testing policies off-trace.

The published openb variants (`cpu050`, `gpushare40`, `multigpu20`, ...) were
made by resampling the `default` trace with more weight on one kind of pod.
`resample` does the same for any mix: pods are drawn, with replacement and a
seeded generator, from the trace's own pods of each kind, so every request
shape is a real one and only the proportions change. Kinds: `cpu` (no GPU),
`share` (part of one GPU), `single` (one whole GPU), `multi` (several GPUs).
Kinds not given keep their relative weights in what is left. Pure.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from chronotope.solver.model import PodRequest

__all__ = ["KINDS", "kind_of", "parse_mix", "resample", "write_pods"]

KINDS = ("cpu", "share", "single", "multi")


def kind_of(pod: PodRequest) -> str:
    """The pod's kind: `cpu`, `share`, `single` or `multi` (see the module docstring)."""
    if pod.num_gpus == 0:
        return "cpu"
    if pod.is_share:
        return "share"
    return "single" if pod.num_gpus == 1 else "multi"


def parse_mix(text: str) -> dict[str, float]:
    """'cpu=0.2,share=0.5' -> {'cpu': 0.2, 'share': 0.5}."""
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, value = part.partition("=")
        if kind not in KINDS:
            raise ValueError(f"unknown pod kind {kind!r}; one of {', '.join(KINDS)}")
        mix[kind] = float(value)
    if sum(mix.values()) > 1 + 1e-9 or any(v < 0 for v in mix.values()):
        raise ValueError(f"fractions must be >= 0 and add up to at most 1: {text}")
    return mix


def resample(
    pods: Sequence[PodRequest], mix: Mapping[str, float], seed: int, count: int | None = None
) -> list[PodRequest]:
    """`count` pods (default: as many as `pods`) whose kinds follow `mix`."""
    by_kind: dict[str, list[PodRequest]] = {k: [] for k in KINDS}
    for pod in pods:
        by_kind[kind_of(pod)].append(pod)
    total = count if count is not None else len(pods)
    fixed = sum(mix.values())
    rest = [k for k in KINDS if k not in mix and by_kind[k]]
    rest_weight = sum(len(by_kind[k]) for k in rest)
    fractions = dict(mix)
    for k in rest:
        fractions[k] = (1 - fixed) * len(by_kind[k]) / rest_weight
    rng = np.random.default_rng(seed)
    out: list[PodRequest] = []
    for kind in KINDS:
        want = round(total * fractions.get(kind, 0.0))
        source = by_kind[kind]
        if want and not source:
            raise ValueError(f"the trace has no {kind} pods to draw from")
        for j in rng.integers(len(source), size=want) if want else ():
            out.append(source[int(j)])
    order = rng.permutation(len(out))
    return [
        out[int(j)].model_copy(update={"name": f"openb-pod-{i:05d}"}) for i, j in enumerate(order)
    ]


def write_pods(path: Path, pods: Sequence[PodRequest]) -> None:
    """An openb pod list CSV (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec`)."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"])
        for p in pods:
            writer.writerow(
                [p.name, p.cpu_milli, p.memory_mib, p.num_gpus, p.gpu_milli, "|".join(p.gpu_models)]
            )
