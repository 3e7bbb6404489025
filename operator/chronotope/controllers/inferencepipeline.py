"""InferencePipeline reconciliation, in the TrainingJob controller's shape.

`reconcile` reads through `PipelineOps` (the Kubernetes implementation is
`kube.pipeline_ops`), checks the stages' ModelVariant references, plans
(`workloads.pipeline.plan_pipeline`, on the traffic source's sample) when the
spec changed or no plan is recorded, applies one Deployment and Service per
stage, and reports the plan, readiness, predicted P99 and cost, and the
observed P99 against the SLO (`workloads.pipeline.observe_slo` on the answer
to `spec.slo.observedP99Query`). A stage that
names a ModelVariant is served by the variant's serving group (the
ModelVariant controller's Deployment): it gets no objects of its own. A
pipeline that cannot be planned gets a condition and one event, and nothing
is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from pydantic import ValidationError

from chronotope.api.v1alpha1.inferencepipeline import InferencePipelineSpec, Traffic
from chronotope.api.v1alpha1.modelvariant import ModelVariantSpec
from chronotope.controllers.reads import Reads
from chronotope.controllers.trainingjob import STUCK_AFTER_S, Outcome
from chronotope.planners.inferline import (
    ENVELOPE_LARGEST_S,
    ScalingStep,
    StageModel,
    TunerInput,
    cost_per_hour,
    envelope,
    envelope_windows,
    model_from_spec,
    scaling_table,
    tune,
)
from chronotope.solver.model import Reason
from chronotope.solver.online import PlacementRules
from chronotope.workloads.capacity import FreeGpus
from chronotope.workloads.pipeline import (
    DEFAULT_RATE_WINDOW_S,
    PIPELINE_LABEL,
    QUOTA_WAIT,
    PipelinePlan,
    failed_status,
    fits_free,
    grow_within,
    observe_slo,
    parse_trace,
    pipeline_status,
    plan_from_status,
    plan_pipeline,
    rate_window_s,
    sample_arrivals,
    stage_deployment_name,
    stage_objects,
    with_rate_window,
    with_replicas,
)
from chronotope.workloads.replan import parse_time
from chronotope.workloads.serving_group import object_name
from chronotope.workloads.training_quota import (
    QuotaView,
    ServingHolders,
    ServingRoom,
    reclaim_words,
    serving_admission,
    serving_demand,
    serving_holders,
    serving_reclaim,
    serving_room,
)
from chronotope.workloads.training_status import condition, unplaced_reason
from chronotope.workloads.variants import free_serving_gpus, group_name, usable_gpu_nodes

__all__ = ["PipelineOps", "TunerSettings", "reconcile"]


class PipelineOps(Reads, Protocol):
    """What `reconcile` reads from and writes to the cluster."""

    def model_variant(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ModelVariant, or None."""
        ...

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One Deployment (a serving group's), or None."""
        ...

    def deployments(self, namespace: str, pipeline: str) -> dict[str, dict[str, Any]]:
        """The pipeline's stage Deployments, by name."""
        ...

    def apply(self, deployment: dict[str, Any], service: dict[str, Any]) -> None:
        """Create or update a stage's Deployment and Service."""
        ...


@dataclass(frozen=True)
class TunerSettings:
    """How the operator's tuner scales: the delay before any scale-down, how often to re-plan."""

    down_delay_s: float = 60.0
    replan_period_s: float = 600.0
    """A pipeline on Prometheus traffic is planned again on the live rate this often."""
    envelope_s: float = ENVELOPE_LARGEST_S
    """The longest window of the live traffic envelope: the query is also asked over
    windows doubling from its own up to this (no longer than its own: the one rate)."""
    placement: PlacementRules = field(default_factory=PlacementRules)
    """How the extender places pods (its flags, which the operator takes too): a plan's
    GPU shares count as fitting the free GPUs where the extender would place them."""


def gpu_types(nodes: list[dict[str, Any]]) -> set[str]:
    """GPU types of the GPU nodes the stages' pods may use (`variants.usable_gpu_nodes`)."""
    return {product for product, _, _ in usable_gpu_nodes(nodes)}


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


def _variant_groups(
    ops: PipelineOps, namespace: str, spec: InferencePipelineSpec
) -> dict[str, str] | Reason:
    """Stage -> the serving group of the ModelVariant it names, or why one is missing."""
    groups = {}
    for stage in spec.stages:
        variant = stage.model.variant
        if not variant:
            continue
        obj = ops.model_variant(namespace, variant)
        if obj is None:
            return Reason(
                code="ModelVariantMissing",
                message=f"stage {stage.name} serves ModelVariant {namespace}/{variant}, "
                "which does not exist",
            )
        try:
            groups[stage.name] = group_name(ModelVariantSpec.model_validate(obj.get("spec")))
        except ValidationError:
            return Reason(
                code="ModelVariantInvalid",
                message=f"stage {stage.name} serves ModelVariant {namespace}/{variant}, "
                "whose spec is invalid (see its status)",
            )
    return groups


def reconcile(
    obj: Mapping[str, Any],
    ops: PipelineOps,
    now: datetime,
    settings: TunerSettings | None = None,
) -> Outcome:
    """One pass over one pipeline; see the module docstring."""
    settings = settings or TunerSettings()
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    spec = InferencePipelineSpec.model_validate(obj["spec"])
    old = obj.get("status") or {}
    out = Outcome()
    groups = _variant_groups(ops, namespace, spec)
    due = _replan_due(spec, old, meta.get("generation"), now, settings)
    view = QuotaView.parse(
        ops.queues(), ops.local_queues(), ops.namespaces()
    )  # planning and admission
    holders = _holders(ops, obj, view)  # for planning and admission alike
    own = ops.pods_matching(namespace, f"{PIPELINE_LABEL}={name}")  # its stages' pods
    plan, sample, room = (
        (groups, None, None)
        if isinstance(groups, Reason)
        else _plan(
            ops,
            obj,
            spec,
            old,
            out,
            view=view,
            holders=holders,
            own=own,
            now=now,
            replan=due,
            rules=settings.placement,
        )
    )
    if isinstance(plan, Reason):
        out.status = failed_status(obj, plan, now)
        if plan.message != old.get("whyWaiting"):
            kind = "Warning" if plan.unresolvable else "Normal"
            out.events.append((kind, plan.code, plan.message))
        return out
    assert isinstance(plan, PipelinePlan)
    planned = [c.replicas for c in plan.outcome.config]
    current = list(planned)
    if sample is None or due:
        # the recorded plan: keep the tuner's replicas; a re-plan keeps them on every
        # stage whose GPU type and batch stay (the tuner scales down only after its delay)
        kept = _kept_replicas(old, plan) if sample is not None else None
        rows = {r.get("name"): r for r in old.get("stages") or []}
        current = [
            int(rows[s.name].get("replicas", k)) if kept is None or s.name in kept else k
            for s, k in zip(plan.stages, planned, strict=True)
        ]
    model = model_from_spec(spec, {})
    tuned: tuple[dict[str, Any], dict[str, Any] | None] | None = None
    if spec.traffic.prometheus is not None:
        envelope_pts = _envelope_points(spec, sample, plan) if sample is not None else None
        table_rows = _scaling_rows(spec, sample, plan, settings) if sample is not None else None
        current, tuned = _tune(
            ops,
            spec,
            plan,
            planned=planned,
            current=current,
            old=old,
            now=now,
            out=out,
            settings=settings,
            new_envelope=envelope_pts,
            new_table=table_rows,
            checked=due,
            stages=model.stages,
        )
    assert not isinstance(groups, Reason)
    running = with_replicas(plan, current)
    held, demand, reclaiming = _apply_within_quota(
        ops, obj, spec, running, groups, view=view, holders=holders
    )
    deployments = dict(ops.deployments(namespace, name))
    for group in set(groups.values()):
        found = ops.deployment(namespace, object_name(group))
        if found is not None:
            deployments[object_name(group)] = found
    out.status = pipeline_status(
        obj, running, deployments, now, planned, groups=groups, unplaced=unplaced_reason(own)
    )
    _quota_outcome(out, old, held, demand, reclaiming)
    waiting = demand is not None
    # quotaRoom: what the queue admitted when it was planned; a cut plan, or one quota
    # holds back with nothing running, is planned again once the queue admits more (`_plan`)
    out.status["quotaRoom"] = room.rows() if room is not None and (running.cut or waiting) else None
    out.status["costPerHour"] = round(cost_per_hour(model, running.outcome.config), 3)
    if tuned is not None:
        out.status["tuner"] = tuned[0]
        if tuned[1] is not None:
            out.status["conditions"].append(tuned[1])
    _observe(ops, spec, obj, out, now)
    return out


def _quota_outcome(
    out: Outcome,
    old: Mapping[str, Any],
    held: str | None,
    demand: list[dict[str, Any]] | None,
    reclaiming: str | None,
) -> None:
    """The status and events of what quota holds back (`_apply_within_quota`'s answer).

    `demand`: what it asks of its queue while quota holds all of it back (None:
    something of it runs, or nothing is held): `status.quotaDemand`.
    """
    waiting = demand is not None
    if reclaiming is not None:
        out.events.append(("Normal", "ReclaimingQuota", reclaiming))
        if out.status.get("whyWaiting"):
            out.status["whyWaiting"] += f"; {reclaiming}"
    if held is not None and old.get("quotaHeld") != held:
        text = (
            f"{QUOTA_WAIT}{held}"
            if waiting
            else f"scaling up only as far as its queue's quota admits: {held}"
        )
        out.events.append(("Normal", "QuotaExceeded", text))
    out.status["quotaHeld"] = held
    out.status["quotaDemand"] = demand
    if waiting:  # nothing of it runs: it waits for its queue's quota (the plan is kept)
        out.status |= {"phase": "Pending", "whyWaiting": f"{QUOTA_WAIT}{held}"}


def _apply_within_quota(
    ops: PipelineOps,
    obj: Mapping[str, Any],
    spec: InferencePipelineSpec,
    running: PipelinePlan,
    groups: Mapping[str, str],
    *,
    view: QuotaView,
    holders: ServingHolders | None,
) -> tuple[str | None, list[dict[str, Any]] | None, str | None]:
    """Apply the stages' Deployments and Services as far as the pipeline's queue quota admits.

    Returns why quota holds (part of) them back (None: all applied), what it
    asks of its queue if it therefore waits (nothing of it runs yet; None
    otherwise: `training_quota.serving_demand`), and, for a target (a new
    pipeline's, or a serving one's scale-up) that fits its nominal quota only
    once the borrowers its queue lent to give it back, what is reclaimed: its
    Deployments are applied, their pods take the quota, and the queue loop stops
    the borrowed TrainingJobs (`controllers.queues.reclaim_for_serving`). A
    serving pipeline whose target does not fit even so grows as far as the quota
    admits (`pipeline.grow_within`: shrinking stages shrink, then one replica at
    a time to the stage furthest below its target), and keeps what runs if not
    even that fits. A target its Deployments already ask for is neither applied
    nor reclaimed again (after a reclaim, its pods are being created). Quotas
    are off until a Queue exists; the pipeline's own pods do not count against
    it (`training_quota.serving_admission`).
    """
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    target = [c.replicas for c in running.outcome.config]

    def objects(replicas: Sequence[int]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return stage_objects(obj, spec, with_replicas(running, replicas), groups)

    def why(built: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> str | None:
        if holders is None:  # quotas off
            return None
        return serving_admission(
            view, holders, local_queue=spec.queue, objects=[d for d, _ in built]
        )

    def apply(built: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> None:
        for deployment, service in built:
            ops.apply(deployment, service)

    built = objects(target)
    held = why(built)
    if held is None:
        apply(built)
        return None, None, None
    assert holders is not None  # quota held it back: quotas are on
    deployed = ops.deployments(namespace, name)
    have = [
        target[i]
        if stage.model.variant
        else int(
            (deployed.get(stage_deployment_name(name, stage.name, groups)) or {})
            .get("spec", {})
            .get("replicas", 0)
        )
        for i, stage in enumerate(running.stages)
    ]
    if deployed and have == target:
        return None, None, None  # applied already (a reclaim's): its pods are being created
    reclaim = serving_reclaim(view, holders, local_queue=spec.queue, objects=[d for d, _ in built])
    if reclaim is not None:  # its pods take the quota it lent; the queue loop stops the borrowers
        apply(built)
        return None, None, reclaim_words(*reclaim)
    if not deployed:
        return held, serving_demand(namespace, [d for d, _ in built]), None
    grown = grow_within(have, target, lambda r: why(objects(r)) is None)
    if grown is not None:
        apply(objects(grown))
    return held, None, None


def _observe(
    ops: PipelineOps,
    spec: InferencePipelineSpec,
    obj: Mapping[str, Any],
    out: Outcome,
    now: datetime,
) -> None:
    """Read the observed P99 (if the spec asks) and add it, its history and `SloMet` to `out`."""
    query = spec.slo.observed_p99_query
    answer: float | str | None = None
    if query:
        source = spec.traffic.prometheus
        answer = ops.query_rate(source.address if source is not None else None, query)
    seen = observe_slo(
        obj.get("status") or {},
        spec.slo.p99_latency_ms,
        answer,
        predicted_ms=out.status.get("predictedP99Ms"),
        now=now,
        generation=obj["metadata"].get("generation"),
    )
    out.status |= seen.fields
    out.status["conditions"].append(seen.condition)
    out.events += seen.events


def _replan_due(
    spec: InferencePipelineSpec,
    old: Mapping[str, Any],
    gen: Any,
    now: datetime,
    settings: TunerSettings,
) -> bool:
    """A pipeline on Prometheus traffic whose plan is `replan_period_s` old is planned again.

    Only a plan of the current generation: a changed spec is planned anew anyway.
    """
    planned_at = (old.get("tuner") or {}).get("plannedAt")
    if spec.traffic.prometheus is None or not planned_at or old.get("observedGeneration") != gen:
        return False
    when = parse_time(planned_at)
    return when is not None and (now - when).total_seconds() >= settings.replan_period_s


def _kept_replicas(old: Mapping[str, Any], plan: PipelinePlan) -> set[str]:
    """Stages a new plan gives the same GPU type and batch as the recorded one."""
    was = {r.get("name"): (r.get("gpuType"), r.get("batchSize")) for r in old.get("stages") or []}
    return {
        s.name
        for s, c in zip(plan.stages, plan.outcome.config, strict=True)
        if was.get(s.name) == (c.gpu_type, c.batch)
    }


def _plan(
    ops: PipelineOps,
    obj: Mapping[str, Any],
    spec: InferencePipelineSpec,
    old: Mapping[str, Any],
    out: Outcome,
    *,
    view: QuotaView,
    holders: ServingHolders | None,
    own: Sequence[Mapping[str, Any]],
    now: datetime,
    replan: bool = False,
    rules: PlacementRules,
) -> tuple[PipelinePlan | Reason, list[float] | None, ServingRoom | None]:
    """The recorded plan if it still holds, else a new one (and its sample), else why not.

    The third value is what the pipeline's queue admits (None: quotas off).

    With `replan` (a low-frequency re-plan on live traffic) a new plan is made even
    though the recorded one holds; it is announced only if a stage's GPU type,
    batch or planned replicas change, and if it cannot be made the recorded plan stays.
    A recorded plan cut to fit its queue's quota, or one the quota holds back with
    nothing running, is planned again once the queue admits more than when it was
    planned (`status.quotaRoom`): a waiting pipeline takes the new plan, a serving
    one only a plan that is not cut (its stages are not moved for every change of
    room, only back to the plan the quota held them from). Plans are made on the GPUs
    free now too (`plan_pipeline`'s `free`): a pipeline whose pods (`own`) wait in
    vain on its recorded plan is planned again on them (`_unstick`), and a plan moved
    to them goes back to the cheapest plan (within its quota) once they hold it
    (`_back`).
    """
    meta = obj["metadata"]
    namespace = meta["namespace"]
    types = gpu_types(ops.nodes())
    room = serving_room(view, namespace, spec.queue, now=holders)
    recorded: PipelinePlan | None = None
    more_room = False
    if old.get("observedGeneration") == meta.get("generation"):
        recorded = plan_from_status(spec, old, types, room)
        if recorded is not None and not replan:
            waiting = old.get("phase") == "Pending" and bool(old.get("quotaHeld"))
            if not ((recorded.cut or waiting) and _room_grew(old, room)):
                look = _FreeLook(ops, obj, spec, own, types, room, now, rules)
                moved = _moved(look, recorded, out)
                return (recorded, None, room) if moved is None else (*moved, room)
            more_room = True
    arrivals = _arrivals(ops, namespace, spec.traffic)
    if isinstance(arrivals, Reason):
        plan: PipelinePlan | Reason = arrivals
    else:  # on the GPUs free now (`plan_pipeline`'s `free`)
        free = _free_gpus(ops, own, rules)
        plan = plan_pipeline(spec, arrivals, types, room, free)
        _seen(obj, _BACK, now, free)  # `_back` looks again in BACK_EVERY_S
    if more_room:
        assert recorded is not None
        if not isinstance(plan, PipelinePlan) or (plan.cut and old.get("phase") != "Pending"):
            return recorded, None, room  # nothing better it may take now
    if isinstance(plan, PipelinePlan):
        assert not isinstance(arrivals, Reason)
        _announce(plan, old, out, arrivals, replan=replan, more_room=more_room)
        return plan, arrivals, room
    if old.get("observedGeneration") == meta.get("generation"):
        # nothing better now (its GPU types not Ready, traffic unreadable): keep what runs
        kept = plan_from_status(spec, old, None)
        if kept is not None:
            return kept, None, room
    return plan, None, room


def _moved(
    look: _FreeLook, recorded: PipelinePlan, out: Outcome
) -> tuple[PipelinePlan, list[float]] | None:
    """A new plan on the GPUs free now (within its queue's room), or None.

    For its pods that wait in vain (`_unstick`), or back to its cheapest plan (`_back`).
    """
    moved = _unstick(look, recorded, out)
    if moved is None and recorded.fitted:
        moved = _back(look, recorded, out)
    return moved


def _free_gpus(
    ops: PipelineOps, own: Sequence[Mapping[str, Any]], rules: PlacementRules
) -> dict[str, FreeGpus]:
    """The free GPUs per type, the pipeline's `own` pods' counted as free."""
    keys = frozenset(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in own)
    return free_serving_gpus(ops.nodes(), ops.pods_matching(), keys, rules)


FreeSeen = int
"""The free GPUs per type, as `_SEEN` keeps them: a hash (a large cluster's GPU rooms are
thousands of entries; equal free GPUs hash equal)."""
_UNSTICK, _BACK = "unstick", "back"
_SEEN: dict[tuple[str, str, str], tuple[float, FreeSeen]] = {}
"""(pipeline uid, generation, `_UNSTICK` or `_BACK`) -> when, and on which free GPUs, it
was last planned for that reason (for `_BACK`, also its own planning)."""
_SEEN_KEPT = 8192
"""The most entries `_SEEN` keeps (all are forgotten past it)."""


def _seen(
    obj: Mapping[str, Any], what: str, now: datetime, free: Mapping[str, FreeGpus]
) -> tuple[tuple[float, FreeSeen] | None, FreeSeen]:
    """Remember that the pipeline was planned on `free` at `now` for `what`.

    Returns what was remembered before (None: nothing), and `free` as remembered.
    """
    meta = obj["metadata"]
    key = (str(meta.get("uid")), str(meta.get("generation")), what)
    before, seen = _SEEN.get(key), hash(tuple(sorted(free.items())))
    if len(_SEEN) >= _SEEN_KEPT:
        _SEEN.clear()
    _SEEN[key] = (now.timestamp(), seen)
    return before, seen


@dataclass(frozen=True)
class _FreeLook:
    """What a look at the GPUs free now reads for one pipeline (`_unstick`, `_back`)."""

    ops: PipelineOps
    obj: Mapping[str, Any]
    spec: InferencePipelineSpec
    own: Sequence[Mapping[str, Any]]
    """The pipeline's own pods (their GPUs count as free)."""
    types: set[str]
    room: ServingRoom | None
    """What its queue admits now (None: no queue, or quotas off)."""
    now: datetime
    rules: PlacementRules

    def free(self) -> dict[str, FreeGpus]:
        """The GPUs free now, per type (`_free_gpus`)."""
        return _free_gpus(self.ops, self.own, self.rules)

    def seen(
        self, what: str, free: Mapping[str, FreeGpus]
    ) -> tuple[tuple[float, FreeSeen] | None, FreeSeen]:
        """`_seen` for this pipeline, now."""
        return _seen(self.obj, what, self.now, free)

    def plan(self, free: Mapping[str, FreeGpus]) -> tuple[PipelinePlan, list[float]] | None:
        """A new plan on the GPUs `free` now, within its room (with its sample), or None."""
        arrivals = _arrivals(self.ops, self.obj["metadata"]["namespace"], self.spec.traffic)
        if isinstance(arrivals, Reason):
            return None
        plan = plan_pipeline(self.spec, arrivals, self.types, self.room, free)
        return None if isinstance(plan, Reason) else (plan, arrivals)


def _unstick(
    look: _FreeLook, recorded: PipelinePlan, out: Outcome
) -> tuple[PipelinePlan, list[float]] | None:
    """A plan on the GPUs free now for a pipeline whose pods wait in vain, or None.

    The training controller's stuck rule, for serving: a pod of the pipeline unplaced
    for over `STUCK_AFTER_S`, on a plan the free GPUs no longer hold (other work took
    them since it was planned, or a replica lost its node), is planned again on the
    GPUs free now. Tried once per state of the free GPUs (a plan that still finds
    nothing better is not remade every pass); kept only if it moves (`fitted`).
    """
    said = unplaced_reason(look.own, now=look.now, longer_than_s=STUCK_AFTER_S)
    if said is None:
        return None
    free = look.free()
    if fits_free(recorded, free):
        return None  # its GPUs are free: kube-scheduler waits for something else
    before, seen = look.seen(_UNSTICK, free)
    if before is not None and before[1] == seen:
        return None
    made = look.plan(free)
    if made is None or not made[0].fitted:
        return None
    words = f"its pods could not be placed for {STUCK_AFTER_S:.0f}s (kube-scheduler: {said})"
    out.events.append(("Normal", "Replanned", f"{words}: {_plan_words(made[0])}"))
    return made


BACK_EVERY_S = 60.0
"""How often a plan moved to the free GPUs looks whether its cheapest plan fits again."""


def _back(
    look: _FreeLook, recorded: PipelinePlan, out: Outcome
) -> tuple[PipelinePlan, list[float]] | None:
    """A cheaper plan for a plan moved to the free GPUs, once they hold one; or None.

    Looked at every `BACK_EVERY_S` at most, and planned again only when the free GPUs
    changed since the last look (or its planning); taken if the new plan is not
    moved (the planner's own, or its cut to the queue's quota: as a plan cut to its
    queue's quota goes back once the queue admits it), or is moved but costs less
    than the recorded one (GPUs of a cheaper type freed up, not yet the cheapest's).
    """
    meta = look.obj["metadata"]
    last = _SEEN.get((str(meta.get("uid")), str(meta.get("generation")), _BACK))
    if last is not None and look.now.timestamp() - last[0] < BACK_EVERY_S:
        return None
    free = look.free()
    _, seen = look.seen(_BACK, free)
    if last is not None and last[1] == seen:
        return None
    made = look.plan(free)
    if made is None:
        return None
    plan = made[0]
    if not plan.fitted:
        words = f"the GPUs of its cheapest plan are free again: {_plan_words(plan)}"
    elif plan.outcome.cost_per_hour < recorded.outcome.cost_per_hour * (1 - _CHEAPER):
        words = f"a cheaper plan fits the GPUs free now: {_plan_words(plan)}"
    else:
        return None
    out.events.append(("Normal", "Replanned", words))
    return made


_CHEAPER = 1e-6
"""How much less (relative) a moved plan must cost for `_back` to take it (not float noise)."""


def _announce(
    plan: PipelinePlan,
    old: Mapping[str, Any],
    out: Outcome,
    arrivals: list[float],
    *,
    replan: bool,
    more_room: bool,
) -> None:
    """A new plan's event: `Planned`; `Replanned` only if a stage's choice changed."""
    rows = [
        (r.get("name"), r.get("gpuType"), r.get("batchSize"), r.get("plannedReplicas"))
        for r in old.get("stages") or []
    ]
    new = [
        (s.name, c.gpu_type, c.batch, c.replicas)
        for s, c in zip(plan.stages, plan.outcome.config, strict=True)
    ]
    if not replan and not more_room:
        out.events.append(("Normal", "Planned", _plan_words(plan)))
    elif rows != new and more_room:
        words = f"its queue's quota admits more now: {_plan_words(plan)}"
        out.events.append(("Normal", "Replanned", words))
    elif rows != new:
        rate = len(arrivals) / max(arrivals[-1] - arrivals[0], 1e-9)
        words = f"re-planned on live traffic ({rate:.1f} queries/s): {_plan_words(plan)}"
        out.events.append(("Normal", "Replanned", words))


def _holders(ops: PipelineOps, obj: Mapping[str, Any], view: QuotaView) -> ServingHolders | None:
    """What everyone else holds of the queues now (every namespace's serving pods count)."""
    if not view.on:
        return None
    return serving_holders(view, ops.training_jobs(), ops.pods_matching(), _key(obj))


def _key(obj: Mapping[str, Any]) -> str:
    """The pipeline as a quota holder (`training_quota.serving_workloads`' key)."""
    return f"{obj['metadata']['namespace']}/pipeline:{obj['metadata']['name']}"


def _room_grew(old: Mapping[str, Any], room: ServingRoom | None) -> bool:
    """Whether the queue admits more of some GPU type than `status.quotaRoom` recorded."""
    before = old.get("quotaRoom")
    if room is None or before is None:
        return False
    was = {r.get("gpuType"): r for r in before}
    return any(
        row[k] > int((was.get(row["gpuType"]) or {}).get(k) or 0)
        for row in room.rows()
        for k in ("gpus", "shareMilli")
    )


def _plan_words(plan: PipelinePlan) -> str:
    cfg = ", ".join(
        f"{s.name}: {c.replicas}x {c.gpu_type} batch {c.batch}"
        for s, c in zip(plan.stages, plan.outcome.config, strict=True)
    )
    return (
        f"{cfg}; predicted P99 {plan.outcome.p99_s * 1000:.0f} ms, "
        f"{plan.outcome.cost_per_hour:.2f}/h{plan.note}"
    )


def _envelope_points(
    spec: InferencePipelineSpec, sample: list[float], plan: PipelinePlan
) -> list[dict[str, Any]]:
    stages = model_from_spec(spec.model_copy(update={"stages": list(plan.stages)}), {}).stages
    service = min(
        st_.latency(c.gpu_type, c.batch) for st_, c in zip(stages, plan.outcome.config, strict=True)
    )
    points = [
        {"windowSeconds": round(w, 4), "maxQueries": q} for w, q in envelope(sample, service, 60.0)
    ]
    # the whole sample last: its mean rate is the rate the plan was made for
    span = max(sample[-1] - sample[0], 1e-9)
    points.append({"windowSeconds": round(span, 4), "maxQueries": len(sample)})
    return points


def _windows(query: str, settings: TunerSettings) -> list[float]:
    """The windows the tuner asks the traffic query over: its own, doubling to the longest.

    A query without a range selector (a recording rule, say) is asked as it is.
    """
    window = rate_window_s(query)
    if with_rate_window(query, 2 * window) == query:  # no window of its own to change
        return [window]
    return envelope_windows(window, max(window, settings.envelope_s))


def _scaling_rows(
    spec: InferencePipelineSpec, sample: list[float], plan: PipelinePlan, settings: TunerSettings
) -> list[dict[str, Any]]:
    """The plan's scaling table (`planners.inferline.scaling_table`) as status rows."""
    model = model_from_spec(spec.model_copy(update={"stages": list(plan.stages)}), {})
    source = spec.traffic.prometheus
    windows = _windows(source.query, settings) if source is not None else [DEFAULT_RATE_WINDOW_S]
    table = scaling_table(
        model, plan.outcome.config, sample, window_s=windows[0], largest_s=windows[-1]
    )
    return [
        {
            "rateQPS": round(row.rate_qps, 3),
            "replicas": list(row.replicas),
            "envelope": [{"windowSeconds": w, "rateQPS": round(r, 3)} for w, r in row.envelope[1:]],
        }
        for row in table
    ]


def _table(rows: Sequence[Mapping[str, Any]], stages: int) -> tuple[ScalingStep, ...]:
    """Status rows back to a scaling table; none if any row does not fit the stages.

    A row's `envelope` holds its longer windows; its first window is `rateQPS`'s.
    A row recorded before envelopes has none: it is compared on its rate alone.
    """
    try:
        out = tuple(
            ScalingStep(
                float(r["rateQPS"]),
                tuple(int(k) for k in r["replicas"]),
                tuple(
                    (float(p["windowSeconds"]), float(p["rateQPS"]))
                    for p in r.get("envelope") or []
                ),
            )
            for r in rows
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return ()
    return out if all(len(r.replicas) == stages for r in out) else ()


def _tune(
    ops: PipelineOps,
    spec: InferencePipelineSpec,
    plan: PipelinePlan,
    *,
    planned: list[int],
    current: list[int],
    old: Mapping[str, Any],
    now: datetime,
    out: Outcome,
    settings: TunerSettings,
    new_envelope: list[dict[str, Any]] | None,
    new_table: list[dict[str, Any]] | None,
    checked: bool,
    stages: Sequence[StageModel],
) -> tuple[list[int], tuple[dict[str, Any], dict[str, Any] | None]]:
    """One tuner pass on the live rate; holds the replicas when Prometheus does not answer."""
    source = spec.traffic.prometheus
    assert source is not None
    old_tuner = old.get("tuner") or {}
    envelope_pts = new_envelope or old_tuner.get("plannedEnvelope") or []
    table_rows = new_table if new_table is not None else old_tuner.get("scalingTable") or []
    last = old_tuner.get("lastScaleTime")
    last_s = parse_time(last).timestamp() if last else None  # type: ignore[union-attr]
    delay = settings.down_delay_s
    windows = _windows(source.query, settings)
    # the live envelope: the query over each window now, and each one's most over the delay
    asked = [source.query] + [with_rate_window(source.query, w) for w in windows[1:]]
    now_rates = [ops.query_rate(source.address, q) for q in asked]
    recents = [
        ops.query_rate(source.address, f"max_over_time(({q})[{delay:.0f}s:])") for q in asked
    ]
    rate, recent = now_rates[0], recents[0]
    # a new plan, or a due re-plan that could not be made (the running plan stays and is
    # not tried again on every pass): the period starts again now
    fresh = new_table is not None or checked
    planned_at = now.strftime("%Y-%m-%dT%H:%M:%SZ") if fresh else old_tuner.get("plannedAt")
    status = {
        "mode": "Steady",
        "lastScaleTime": last,
        "plannedAt": planned_at,
        "plannedEnvelope": envelope_pts,
        "scalingTable": table_rows,
        "observedEnvelope": old_tuner.get("observedEnvelope") or [],
    }
    failed = [r for r in (*now_rates, *recents) if isinstance(r, str)]
    if failed:
        why = str(failed[0])
        message = f"holding {sum(current)} replica(s) on the last plan: {why}"
        risk = condition(
            "SLOAtRisk", True, "PrometheusUnreachable", message, now=now, generation=None
        )
        return current, (status, risk)
    anchor = 0.0
    if envelope_pts:
        widest = envelope_pts[-1]
        anchor = float(widest["maxQueries"]) / float(widest["windowSeconds"])
    assert not isinstance(rate, str)
    assert not isinstance(recent, str)
    longer = [float(r) for r in now_rates[1:]]
    longer_recent = [float(r) for r in recents[1:]]
    decision = tune(
        stages,
        planned,
        current,
        TunerInput(
            rate_qps=rate,
            recent_max_qps=recent,
            now_s=now.timestamp(),
            envelope_qps=tuple(zip(windows[1:], longer, strict=True)),
            recent_envelope_qps=tuple(zip(windows[1:], longer_recent, strict=True)),
        ),
        anchor_qps=anchor or rate,
        last_scale_s=last_s,
        down_delay_s=delay,
        table=_table(table_rows, len(stages)),
    )
    status["mode"] = decision.mode
    # the most queries in a window of each length over the last delay, as Prometheus saw them
    status["observedEnvelope"] = [
        {"windowSeconds": w, "maxQueries": round(r * w)}
        for w, r in zip(windows, [recent, *longer_recent], strict=True)
    ]
    if decision.changed:
        status["lastScaleTime"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        reason = "ScaledUp" if decision.mode == "ScalingUp" else "ScaledDown"
        out.events.append(("Normal", reason, decision.changed))
    return list(decision.replicas), (status, None)
