"""Profile-driven plans for a TrainingJob's gang: the SAILOR planner applied to workers (pure).

When a job names a model profile (`spec.parallelism.modelProfile`), the
per-type speed and the parallelisation come from the elastic planner
(`chronotope.planners.elastic`) instead of `gpuTypes[].relativeSpeed` and the
hints alone: for a GPU type and a range of worker counts it picks the GPU
count (whole workers), data/tensor/pipeline degrees and microbatch that
maximise the job's objective (samples per second, or per unit of cost),
within GPU memory and the job's allowed degrees. Tensor parallelism stays
inside one worker (its degree divides the worker's GPUs).

Run time follows from throughput: the job's estimate (seconds on the
reference type at `spec.replicas` workers) times the predicted samples per
second there, divided by the samples per second of the plan at hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from chronotope.api.v1alpha1.trainingjob import GpuTypeOption, PlanObjective, TrainingJobSpec
from chronotope.planners.elastic import ElasticPlan, PlannerSettings, plan_elastic
from chronotope.planners.profile import ModelProfile
from chronotope.solver.model import Node
from chronotope.workloads.capacity import Capacity, NodeCapacity, of_type
from chronotope.workloads.parallelism import Degrees

__all__ = ["GangPlan", "ProfilePlanner"]

_MIB = 1024 * 1024


@dataclass(frozen=True)
class GangPlan:
    """A worker count with the parallelisation and throughput the profile predicts."""

    workers: int
    samples_per_second: float
    score: float
    """The objective's value: samples/s, or samples per unit of cost."""
    degrees: Degrees
    note: str


@dataclass(frozen=True)
class ProfilePlanner:
    """Plans gangs of one job from its model profile."""

    profile: ModelProfile
    profile_name: str
    spec: TrainingJobSpec
    settings: PlannerSettings = field(default_factory=PlannerSettings)

    @property
    def objective(self) -> PlanObjective:
        """The job's plan objective: its hints' objective, else throughput."""
        hints = self.spec.parallelism
        return hints.objective if hints is not None else PlanObjective.THROUGHPUT

    @property
    def per_cost(self) -> bool:
        """Whether the objective is throughput per unit of cost."""
        return self.objective is PlanObjective.THROUGHPUT_PER_DOLLAR

    def _option(self, gpu_type: str) -> GpuTypeOption | None:
        return next((o for o in self.spec.gpu_types if o.name == gpu_type), None)

    def plan(
        self,
        gpu_type: str,
        nodes: Sequence[NodeCapacity],
        least: int,
        most: int,
        *,
        free: bool,
    ) -> GangPlan | str:
        """Best gang of `least`..`most` workers on `nodes` (their free or all GPUs), or why not."""
        if gpu_type not in self.profile.gpus:
            known = ", ".join(sorted(self.profile.gpus)) or "none"
            return f"model profile {self.profile_name} has no layer times for {gpu_type} ({known})"
        per_worker = self.spec.gpu.count or 1
        option = self._option(gpu_type)
        gpu_nodes = []
        for n in nodes:
            memory = n.memory_mib or (option.memory_mib if option is not None else None) or 0
            if memory <= 0:
                return (
                    f"the memory of a {gpu_type} GPU is unknown (node label "
                    "nvidia.com/gpu.memory or gpuTypes[].memoryMiB)"
                )
            usable = (n.free if free else n.total) // per_worker * per_worker
            if usable > 0 and (n.schedulable or not free):
                gpu_nodes.append(
                    Node.with_gpus(n.name, gpu_type, usable, gpu_memory_mib=memory, zone=n.zone)
                )
        return self._best(gpu_type, gpu_nodes, least, most)

    def _best(self, gpu_type: str, nodes: list[Node], least: int, most: int) -> GangPlan | str:
        per_worker = self.spec.gpu.count or 1
        hints = self.spec.parallelism
        profile = self.profile
        if hints is not None and hints.global_batch_size is not None:
            config = profile.config.model_copy(
                update={"global_batch_size": hints.global_batch_size}
            )
            profile = profile.model_copy(update={"config": config})
        prices = {o.name: o.price_per_gpu_hour for o in self.spec.gpu_types if o.price_per_gpu_hour}
        settings = self.settings.model_copy(update={"prices_per_gpu_hour": prices})
        tensor = [t for t in range(1, per_worker + 1) if per_worker % t == 0]
        if hints is not None and hints.tensor_degrees:
            tensor = [t for t in tensor if t in hints.tensor_degrees]
        result = plan_elastic(
            profile,
            nodes,
            settings,
            objective="throughput"
            if self.objective is PlanObjective.THROUGHPUT
            else "throughput_per_dollar",
            min_gpus=least * per_worker,
            max_gpus=most * per_worker,
            gpu_multiple=per_worker,
            tensor_degrees=tensor,
            pipeline_degrees=hints.pipeline_degrees if hints is not None else (),
            data_degrees=hints.data_degrees if hints is not None else (),
        )
        if result.plan is None:
            return "; ".join(result.reasons) or "the planner found no configuration"
        return self._gang(result.plan, per_worker)

    def _gang(self, plan: ElasticPlan, per_worker: int) -> GangPlan:
        score = (
            plan.throughput_samples_s
            if self.objective is PlanObjective.THROUGHPUT
            else plan.samples_per_dollar
        )
        note = (
            f"profile {self.profile_name}: {plan.gpus} {plan.gpu_type} GPU(s) as "
            f"data {plan.dp} x tensor {plan.tp} x pipeline {plan.pp}, microbatch "
            f"{plan.microbatch}, {plan.throughput_samples_s:.1f} samples/s predicted "
            f"({plan.iteration_s:.2f} s per iteration, {plan.link})"
        )
        return GangPlan(
            workers=plan.gpus // per_worker,
            samples_per_second=plan.throughput_samples_s,
            score=score,
            degrees=Degrees(plan.dp, plan.tp, plan.pp, plan.microbatch),
            note=note,
        )

    def reference(self, capacity: Capacity) -> GangPlan | str:
        """The plan the duration estimate describes: the reference type at `spec.replicas`.

        Uses the cluster's nodes of that type as if free; without any, one
        virtual node per worker with `gpuTypes[].memoryMiB`.
        """
        ref = self.spec.estimate.reference_gpu_type
        want = self.spec.replicas
        nodes: Sequence[NodeCapacity] = of_type(capacity, ref)
        if not nodes:
            option = self._option(ref)
            per_worker = self.spec.gpu.count or 1
            nodes = [
                NodeCapacity(
                    name=f"virtual-{i}",
                    gpu_model=ref,
                    total=per_worker,
                    free=per_worker,
                    schedulable=True,
                    memory_mib=(option.memory_mib or 0) if option is not None else 0,
                )
                for i in range(want)
            ]
        got = self.plan(ref, nodes, 1, want, free=False)
        if isinstance(got, str):
            return f"cannot predict the estimate's reference run on {ref}: {got}"
        return got

    def duration(self, reference: GangPlan, plan: GangPlan) -> timedelta:
        """How long `plan` runs: the estimate scaled by `reference`'s throughput over `plan`'s."""
        seconds = (
            self.spec.estimate.duration_seconds
            * reference.samples_per_second
            / plan.samples_per_second
        )
        return timedelta(seconds=seconds)
