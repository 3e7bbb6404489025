"""Order within a queue: who goes first when jobs of one queue wait for the same GPUs (pure).

Jobs name a queue (`spec.queue`). Among the waiting jobs of a queue the
policy order is: higher priority first, then the earlier deadline (the
utility's soft deadline, else its hard one), then the older job. A job ahead
of another in its queue, wanting an overlapping set of GPU types, holds back
only the GPUs its own planned start now needs (backfill by reservation, in
`workloads.gates.QueueGate`): a job behind it may start on the GPUs left
over, and jobs ahead that cannot start yet hold nothing back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.workloads.job_spec import job_spec_or_none

__all__ = ["blocking_job", "jobs_ahead", "queue_key"]

_FAR = datetime.max.isoformat()
_WAITING = (None, "", "Pending", "Waiting", "Resizing")


def queue_key(job: Mapping[str, Any]) -> tuple[int, str, str, str]:
    """Sort key: earlier means served first."""
    spec = job.get("spec") or {}
    utility = spec.get("utility") or {}
    deadline = str(utility.get("softDeadline") or utility.get("deadline") or _FAR)
    meta = job.get("metadata") or {}
    return (
        -int(spec.get("priority", 0)),
        deadline,
        str(meta.get("creationTimestamp", "")),
        str(meta.get("name", "")),
    )


def jobs_ahead(
    me: Mapping[str, Any], spec: TrainingJobSpec, jobs: Sequence[Mapping[str, Any]]
) -> Iterator[tuple[Mapping[str, Any], TrainingJobSpec]]:
    """The waiting jobs ahead of `me` in its queue that want a GPU type it accepts, in order.

    A job whose spec does not validate is left out: a broken job never holds its queue back.
    """
    my_key = queue_key(me)
    my_types = {t.name for t in spec.gpu_types}
    my_name = (me.get("metadata") or {}).get("name")
    my_ns = (me.get("metadata") or {}).get("namespace")
    for job in sorted(jobs, key=queue_key):
        meta = job.get("metadata") or {}
        if queue_key(job) >= my_key:
            break
        other = job.get("spec") or {}
        if (meta.get("name") == my_name and meta.get("namespace") == my_ns) or other.get(
            "queue", "default"
        ) != spec.queue:
            continue
        if (job.get("status") or {}).get("phase") not in _WAITING:
            continue
        if not my_types & {t.get("name") for t in other.get("gpuTypes") or []}:
            continue
        other_spec = job_spec_or_none(job)
        if other_spec is None:
            continue
        yield job, other_spec


def blocking_job(
    me: Mapping[str, Any],
    spec: TrainingJobSpec,
    jobs: Sequence[Mapping[str, Any]],
    could_start: Callable[[Mapping[str, Any], TrainingJobSpec], bool],
) -> str | None:
    """The name of a job ahead of `me` in its queue that could start now, or None."""
    for job, other_spec in jobs_ahead(me, spec, jobs):
        if could_start(job, other_spec):
            meta = job.get("metadata") or {}
            return f"{meta.get('namespace')}/{meta.get('name')}"
    return None
