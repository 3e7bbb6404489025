"""The policy order: who goes first when waiting jobs want the same GPUs (pure).

Higher priority first, then the earlier deadline (the utility's soft deadline,
else its hard one), then the older job. The scheduling pass
(`workloads.training_pass`) decides waiting jobs in this order; a job ahead
holds back only the GPUs its own start now takes (backfill by reservation):
a job behind it may start on the GPUs left over, and jobs ahead that cannot
start yet hold nothing back. Quota admission uses the same order.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

__all__ = ["queue_key"]

_FAR = datetime.max.isoformat()


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
