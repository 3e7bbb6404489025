"""Data/tensor/pipeline degrees and microbatch for a chosen GPU set, from the job's hints (pure).

The GPU count is fixed by the placement decision (workers x GPUs per worker).
Tensor parallelism stays inside a worker (a node's NVLink), so its degree
divides the GPUs per worker; the pipeline is kept as short as the allowed
degrees permit (bubbles cost throughput); data parallelism takes the rest and
must divide the global batch. Empty hint lists mean "any". When no
combination satisfies the hints, the plan falls back to pure data
parallelism and says so. A job that names a model profile gets its degrees
from the SAILOR planner instead (`workloads.profiled`).
"""

from __future__ import annotations

from dataclasses import dataclass

from chronotope.api.v1alpha1.trainingjob import ParallelismHints

__all__ = ["Degrees", "choose_degrees"]


@dataclass(frozen=True)
class Degrees:
    """A gang's data, tensor and pipeline degrees and microbatch; `note` says if hints failed."""

    data: int
    tensor: int
    pipeline: int
    micro_batch_size: int | None
    note: str = ""


def _allowed(values: list[int], value: int) -> bool:
    return not values or value in values


def choose_degrees(hints: ParallelismHints | None, workers: int, gpus_per_worker: int) -> Degrees:
    """Degrees for `workers` x `gpus_per_worker` GPUs within `hints` (see the module docstring).

    Without hints the whole gang is data-parallel. Larger tensor degrees are tried
    first, then shorter pipelines.
    """
    total = workers * gpus_per_worker
    if hints is None:
        return Degrees(total, 1, 1, None)
    batch = hints.global_batch_size
    tensors = sorted(
        {t for t in range(1, gpus_per_worker + 1) if gpus_per_worker % t == 0}, reverse=True
    )
    for tensor in tensors:
        if not _allowed(hints.tensor_degrees, tensor):
            continue
        for pipeline in range(1, total // tensor + 1):
            if (total // tensor) % pipeline or not _allowed(hints.pipeline_degrees, pipeline):
                continue
            data = total // (tensor * pipeline)
            if not _allowed(hints.data_degrees, data) or (batch is not None and batch % data):
                continue
            return Degrees(data, tensor, pipeline, _micro_batch(batch, data, pipeline))
    return Degrees(
        total,
        1,
        1,
        None,
        note=f"no data/tensor/pipeline degrees within the hints fit {total} GPU(s); "
        "using pure data parallelism",
    )


def _micro_batch(batch: int | None, data: int, pipeline: int) -> int | None:
    """Per-replica batch split into 4 microbatches per pipeline stage (a small bubble)."""
    if batch is None:
        return None
    per_replica = batch // data
    chunks = 4 * pipeline if pipeline > 1 else 1
    return per_replica // chunks if per_replica % chunks == 0 else per_replica
