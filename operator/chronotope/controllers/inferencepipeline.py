"""InferencePipeline reconciliation, in the TrainingJob controller's shape.

`reconcile` reads through `PipelineOps` (the Kubernetes implementation is
`kube.pipeline_ops`), checks the stages' ModelVariant references, plans
(`workloads.pipeline.plan_pipeline`, on the traffic source's sample) when the
spec changed or no plan is recorded, applies one Deployment and Service per
stage, and reports the plan, readiness, predicted P99 and cost. A pipeline
that cannot be planned gets a condition and one event, and nothing is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from chronotope.api.v1alpha1.inferencepipeline import InferencePipelineSpec, Traffic
from chronotope.controllers.trainingjob import Outcome
from chronotope.sharing.labels import GPU_PRODUCT_LABEL, GPU_RESOURCE
from chronotope.solver.model import Reason
from chronotope.workloads.pipeline import (
    PipelinePlan,
    failed_status,
    parse_trace,
    pipeline_status,
    plan_from_status,
    plan_pipeline,
    sample_arrivals,
    stage_objects,
)

__all__ = ["PipelineOps", "reconcile"]


class PipelineOps(Protocol):
    """What `reconcile` reads from and writes to the cluster."""

    def nodes(self) -> list[dict[str, Any]]:
        """All nodes."""
        ...

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap, or None."""
        ...

    def model_variant_exists(self, namespace: str, name: str) -> bool:
        """Whether the ModelVariant exists."""
        ...

    def query_rate(self, address: str | None, query: str) -> float | str:
        """Queries per second from Prometheus, or why it could not be read."""
        ...

    def deployments(self, namespace: str, pipeline: str) -> dict[str, dict[str, Any]]:
        """The pipeline's stage Deployments, by name."""
        ...

    def apply(self, deployment: dict[str, Any], service: dict[str, Any]) -> None:
        """Create or update a stage's Deployment and Service."""
        ...


def gpu_types(nodes: list[dict[str, Any]]) -> set[str]:
    """GPU types of Ready, schedulable nodes that advertise GPUs."""
    out = set()
    for node in nodes:
        meta, status = node.get("metadata") or {}, node.get("status") or {}
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        gpus = (status.get("capacity") or {}).get(GPU_RESOURCE)
        product = (meta.get("labels") or {}).get(GPU_PRODUCT_LABEL)
        if ready and product and gpus and str(gpus) != "0":
            out.add(str(product))
    return out


def _arrivals(ops: PipelineOps, namespace: str, traffic: Traffic) -> list[float] | Reason:
    if traffic.fixed_qps is not None:
        return sample_arrivals(traffic.fixed_qps)
    if traffic.trace is not None:
        cm = ops.config_map(namespace, traffic.trace.config_map)
        if cm is None:
            return Reason(
                code="TraceMissing",
                message=f"trace ConfigMap {namespace}/{traffic.trace.config_map} not found",
            )
        text = (cm.get("data") or {}).get(traffic.trace.key)
        if text is None:
            return Reason(
                code="TraceMissing",
                message=f"ConfigMap {traffic.trace.config_map} has no key {traffic.trace.key}",
            )
        return parse_trace(text)
    assert traffic.prometheus is not None
    rate = ops.query_rate(traffic.prometheus.address, traffic.prometheus.query)
    if isinstance(rate, str):
        return Reason(code="PrometheusUnreachable", message=rate)
    if rate <= 0:
        return Reason(code="NoTraffic", message=f"Prometheus reports {rate:g} queries/s")
    return sample_arrivals(rate)


def _missing_variant(
    ops: PipelineOps, namespace: str, spec: InferencePipelineSpec
) -> Reason | None:
    for stage in spec.stages:
        variant = stage.model.variant
        if variant and not ops.model_variant_exists(namespace, variant):
            return Reason(
                code="ModelVariantMissing",
                message=f"stage {stage.name} serves ModelVariant {namespace}/{variant}, "
                "which does not exist",
            )
    return None


def reconcile(obj: Mapping[str, Any], ops: PipelineOps, now: datetime) -> Outcome:
    """One pass over one pipeline; see the module docstring."""
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    spec = InferencePipelineSpec.model_validate(obj["spec"])
    old = obj.get("status") or {}
    out = Outcome()
    types = gpu_types(ops.nodes())
    plan: PipelinePlan | Reason | None = None
    why = _missing_variant(ops, namespace, spec)
    if why is None and old.get("observedGeneration") == meta.get("generation"):
        plan = plan_from_status(spec, old, types)
    if why is None and plan is None:
        arrivals = _arrivals(ops, namespace, spec.traffic)
        plan = arrivals if isinstance(arrivals, Reason) else plan_pipeline(spec, arrivals, types)
        if isinstance(plan, PipelinePlan):
            cfg = ", ".join(
                f"{s.name}: {c.replicas}x {c.gpu_type} batch {c.batch}"
                for s, c in zip(plan.stages, plan.outcome.config, strict=True)
            )
            out.events.append(
                (
                    "Normal",
                    "Planned",
                    f"{cfg}; predicted P99 {plan.outcome.p99_s * 1000:.0f} ms, "
                    f"{plan.outcome.cost_per_hour:.2f}/h",
                )
            )
    if why is None and isinstance(plan, Reason):
        why = plan
    if why is not None:
        out.status = failed_status(obj, why, now)
        if why.message != old.get("whyWaiting"):
            out.events.append(("Warning" if why.unresolvable else "Normal", why.code, why.message))
        return out
    assert isinstance(plan, PipelinePlan)
    for deployment, service in stage_objects(obj, spec, plan):
        ops.apply(deployment, service)
    out.status = pipeline_status(obj, plan, ops.deployments(namespace, name), now)
    return out
