"""Wire the controllers into a kopf operator (the only module that imports kopf).

Handlers are registered on an explicit registry built here, with their
dependencies passed in, so nothing is an import-time singleton. Each
InferencePipeline and ModelVariant is reconciled by a timer
(every `interval` seconds, never overlapping itself): the reconcile is
level-based, so a missed event or an operator restart costs at most one
interval. TrainingJobs, by far the most numerous, are reconciled on events
instead (`controllers.trainingjob_loop`, started next to kopf by the CLI).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import kopf

from chronotope.controllers.inferencepipeline import PipelineOps, TunerSettings
from chronotope.controllers.inferencepipeline import reconcile as reconcile_pipeline
from chronotope.controllers.metrics import OperatorMetrics
from chronotope.controllers.modelvariant import GroupMemo, VariantOps
from chronotope.controllers.modelvariant import reconcile as reconcile_variant
from chronotope.controllers.trainingjob import Outcome, merged_status
from chronotope.controllers.trainingjob_loop import plain
from chronotope.planners.variants import GroupPlan
from chronotope.workloads.serving_group import GroupResult

__all__ = ["apply_outcome", "build_registry"]

KIND_WORKERS = 4
"""Threads that reconcile InferencePipelines, and ModelVariants, each kind its own pool."""

log = logging.getLogger(__name__)

GROUP, VERSION = "chronotope.dev", "v1alpha1"


def apply_outcome(outcome: Outcome, body: Any, patch: Any) -> None:
    """Write the outcome through kopf: status (only what changed), annotations, events."""
    old: Mapping[str, Any] = body.get("status") or {}
    new = merged_status(old, outcome.status)
    changed = {k: v for k, v in new.items() if old.get(k) != v}
    if changed:
        patch.status.update(changed)
    if outcome.annotations:
        patch.metadata.annotations.update(outcome.annotations)
    for kind, reason, message in outcome.events:
        kopf.event(body, type=kind, reason=reason, message=message)
        log.info(
            "%s/%s %s: %s", body["metadata"]["namespace"], body["metadata"]["name"], reason, message
        )


def build_registry(
    *,
    interval: float = 2.0,
    metrics: OperatorMetrics | None = None,
    pipeline_ops: PipelineOps | None = None,
    tuner: TunerSettings | None = None,
    variant_ops: VariantOps | None = None,
    memo: GroupMemo | None = None,
) -> kopf.OperatorRegistry:
    """A kopf registry with the login handler and the pipeline and variant timers.

    TrainingJobs are not kopf's (`controllers.trainingjob_loop` reconciles them on
    events), nor are Queues (`controllers.queues.run_status_loop` writes their
    status); metrics go to `metrics` (a fresh set if None). With
    `pipeline_ops`, InferencePipelines are reconciled on the same interval;
    with `variant_ops`, ModelVariants too, their serving groups' passes kept in
    `memo` (a fresh one if None) and counted in `metrics`.
    """
    registry = kopf.OperatorRegistry()
    metrics = metrics or OperatorMetrics()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        # KUBECONFIG (set by the CLI from --kubeconfig) or the pod's service account
        if os.environ.get("KUBECONFIG"):
            return kopf.login_with_kubeconfig(**kwargs)
        return kopf.login_with_service_account(**kwargs)

    if pipeline_ops is not None:
        p_ops, settings = pipeline_ops, tuner or TunerSettings()
        _isolated_timer(
            registry,
            "inferencepipelines",
            "InferencePipeline",
            interval=interval,
            reconcile_one=lambda obj, now: reconcile_pipeline(obj, p_ops, now, settings),
            on_outcome=lambda obj, out: metrics.observe_pipeline(
                obj["metadata"]["namespace"],
                obj["metadata"]["name"],
                merged_status(obj.get("status") or {}, out.status),
                [reason for _, reason, _ in out.events],
            ),
        )
    if variant_ops is not None:
        v_ops, groups = variant_ops, memo or GroupMemo()
        if groups.on_pass is None:
            groups.on_pass = _group_metrics(metrics)
        _isolated_timer(
            registry,
            "modelvariants",
            "ModelVariant",
            interval=interval,
            reconcile_one=lambda obj, now: reconcile_variant(obj, v_ops, now, groups),
        )
    return registry


def _body(body: Any) -> dict[str, Any]:
    obj: dict[str, Any] = plain(
        {
            "metadata": dict(body["metadata"]),
            "spec": dict(body["spec"]),
            "status": dict(body.get("status") or {}),
        }
    )
    return obj


def _failed(body: Any, patch: Any, kind: str, exc: Exception) -> None:
    """Mark one object whose reconcile raised: Failed with the reason, one event per message."""
    invalid = isinstance(exc, ValueError)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = "; ".join(lines[:3])[:900] or type(exc).__name__
    message = f"{'invalid spec' if invalid else 'internal error'}: {said}"
    if (body.get("status") or {}).get("whyWaiting") != message:  # said once
        if not invalid:
            meta = body["metadata"]
            log.exception("%s %s/%s failed", kind, meta.get("namespace"), meta.get("name"))
        kopf.warn(body, reason="InvalidSpec" if invalid else "ReconcileError", message=message)
    patch.status.update({"phase": "Failed", "whyWaiting": message})


def _group_metrics(metrics: OperatorMetrics) -> Any:
    def on_pass(namespace: str, result: GroupResult) -> None:
        plan = result.plan
        replicas = len(plan.replicas) if isinstance(plan, GroupPlan) else None
        residency = {
            v: str(s["residency"]) for v, s in result.statuses.items() if s.get("residency")
        }
        metrics.observe_group(namespace, result.group, replicas, residency)

    return on_pass


def _isolated_timer(
    registry: kopf.OperatorRegistry,
    plural: str,
    kind: str,
    *,
    interval: float,
    reconcile_one: Callable[[dict[str, Any], datetime], Outcome],
    on_outcome: Callable[[dict[str, Any], Outcome], None] | None = None,
) -> None:
    """A timer reconciling each object of `plural` on a thread pool of its own.

    Threads of their own: TrainingJob reconciles queued on their decide lock,
    or a slow pass of another kind (API writes, a Prometheus timeout), must not
    hold this kind up. One object whose reconcile raises marks itself Failed
    (`_failed`), never the operator. `on_outcome` sees every written outcome
    (the InferencePipeline metrics).
    """
    pool = ThreadPoolExecutor(KIND_WORKERS, thread_name_prefix=plural)

    @kopf.timer(
        GROUP,
        VERSION,
        plural,
        id=f"{plural}-timer",
        interval=interval,
        backoff=interval,
        registry=registry,
    )
    async def timer(body: Any, patch: Any, **_: Any) -> None:
        obj = _body(body)
        try:
            outcome = await asyncio.get_running_loop().run_in_executor(
                pool, reconcile_one, obj, datetime.now(UTC)
            )
        except Exception as exc:
            _failed(body, patch, kind, exc)
            return
        apply_outcome(outcome, body, patch)
        if on_outcome is not None:
            on_outcome(obj, outcome)
