"""What a serving workload's queue admits: the seam between serving plans and quota (pure).

InferencePipelines (`pipeline.plan_pipeline`) and ModelVariant serving groups
(`variants.fit_now`) plan within it; `training_quota.ServingRoom` is what the
controllers pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["QueueRoom"]


class QueueRoom(Protocol):
    """What a serving workload's queue could ever hold, and now (`training_quota.ServingRoom`)."""

    @property
    def queue(self) -> str:
        """The Queue's name."""
        ...

    def holds(
        self, gpu_type: str, limits: Mapping[str, str], annotations: Mapping[str, str]
    ) -> bool:
        """Whether one pod with GPU `limits` and share `annotations` could ever be admitted."""
        ...

    def pod_quota(
        self, gpu_type: str, limits: Mapping[str, str], annotations: Mapping[str, str]
    ) -> tuple[Any, int] | None:
        """The quota pool one such pod takes, and how much (None: no GPU)."""
        ...

    def excess(self, usage: Mapping[Any, int]) -> float:
        """How far `usage` (per pool) exceeds what the queue admits now, in GPUs; 0 if unknown."""
        ...

    def rows(self) -> list[dict[str, Any]]:
        """What the queue admits now per GPU type, as `status.quotaRoom` rows."""
        ...
