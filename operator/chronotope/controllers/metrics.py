"""Prometheus metrics of the operator: reconcile latency, decisions, jobs and queues.

`chronotope operator --metrics-port N` serves them on /metrics:

* `chronotope_trainingjob_reconcile_seconds{result}` (histogram; ok, error):
  one job's reconcile, enacting its verdict (the scheduling pass it reads is
  timed on its own)
* `chronotope_trainingjob_schedule_pass_seconds` (histogram): one scheduling
  pass, every waiting TrainingJob decided at once (`workloads.training_pass`)
* `chronotope_trainingjob_schedule_pass_jobs`: jobs the latest pass decided
* `chronotope_trainingjob_pass_invalidations_total{kind,event}`: watch events
  that made the latest scheduling pass stale (something it did not predict:
  `trainingjob_loop.TrainingJobLoop._predicted`), by resource and event type
* `chronotope_trainingjob_events_total{reason}`: every decision posted as an
  event (Started, Waiting, Unschedulable, Preempting, Replanning, ...)
* `chronotope_trainingjob_preemptions_total{cause,queue}`: TrainingJobs
  checkpointed and stopped for another workload (Kueue's
  `kueue_preempted_workloads_total`), counted once each, when the victim's
  own reconcile re-queues it: `cause` `Reclaim` (`queue` reclaims the quota it
  lent), `FairShare` (`queue` borrows for its fair share: `reclaim.fairShare`),
  `WithinQueue` (higher priority in its own `queue`), `Drain` (its
  `queue` is drained: `stopPolicy: HoldAndDrain`), `Priority` (priority
  preemption for GPUs, `queue` empty) or `Lease` (the cluster policy gave its
  lease to other work of its priority, or moved it: `workloads.fleet`, `queue`
  empty)
* `chronotope_trainingjob_admission_wait_seconds{queue}` (histogram): from a
  job's creation, or from when it last stopped running (preempted, re-planned),
  until its gang is created (Kueue's `kueue_admission_wait_time_seconds`),
  by its Queue (empty without queues)
* `chronotope_trainingjobs{phase}`: jobs by phase, from the latest reconcile
  of each job seen in the last `stale_after_s` seconds (deleted jobs drop out)
* `chronotope_trainingjob_waiting_gpus{gpu_type}`: GPUs that waiting jobs
  planned but could not get, by the first GPU type they accept (the queue's
  demand, as Kueue reports pending workloads)
* `chronotope_serving_group_replicas{namespace,group}`: base replicas of each
  ModelVariant serving group, as last planned
* `chronotope_variant_residency{namespace,group,variant,residency}`: 1 for
  where each variant's delta is (GPU, Host, Disk)
* `chronotope_serving_group_passes_total{namespace,group,result}`: group
  passes (re-plans), `planned` or `unplannable`
* `chronotope_pipeline_replicas{namespace,pipeline,stage,kind}`: per
  InferencePipeline stage, `current` replicas (the tuner's) and `planned`
  replicas (the planner's), as last reconciled
* `chronotope_pipeline_cost_per_hour{namespace,pipeline}` and
  `chronotope_pipeline_predicted_p99_seconds{namespace,pipeline}`: the
  running configuration's cost and the planner's predicted P99
* `chronotope_pipeline_events_total{reason}`: InferencePipeline decisions
  posted as events (Planned, ScaledUp, ScaledDown, SloViolated, ...)
* `chronotope_queue_gpus{queue,gpu_type,kind}`: per Queue and GPU type,
  whole GPUs `nominal`, `used`, `borrowed` and `lent` (`kind` with a
  `_share_milli` suffix: the same for GPU shares, in thousandths of a GPU),
  and `borrowing_limit` / `lending_limit` where the Queue sets them (Kueue's
  `cluster_queue_borrowing_limit` / `cluster_queue_lending_limit`)
* `chronotope_queue_workloads{queue,state}`: `admitted` and `pending` jobs
* `chronotope_operator_api_requests_total{verb,resource}`: requests the
  operator's API client made (GET, WATCH, POST, PATCH, PUT, DELETE), by the
  resource each names (pods, trainingjobs, events, ...); kopf's own client
  (the timers of the other kinds) is not counted
* `chronotope_operator_leader`: 1 while this process runs the controllers
  (holds the leader Lease, or runs without `--leader-elect`), 0 while it
  stands by
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["OperatorMetrics"]

_WAITING = ("Waiting", "Pending", "Resizing")


K = TypeVar("K")
V = TypeVar("V")


class _Recent(Generic[K, V]):
    """Values by key with when each was last put; one not put for `stale_after_s` drops out."""

    def __init__(self, stale_after_s: float, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[K, tuple[float, V]] = {}
        self._stale_after_s = stale_after_s

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._seen[key] = (self._clock(), value)

    def forget(self, key: K) -> None:
        with self._lock:
            self._seen.pop(key, None)

    def fresh(self) -> dict[K, V]:
        """The values put within `stale_after_s`; the others are dropped."""
        now = self._clock()
        with self._lock:
            self._seen = {k: v for k, v in self._seen.items() if now - v[0] <= self._stale_after_s}
            return {k: v for k, (_, v) in self._seen.items()}


class _Jobs(Collector):
    def __init__(self, stale_after_s: float, clock: Callable[[], float]) -> None:
        self._recent: _Recent[str, tuple[str, str, float]]
        self._recent = _Recent(stale_after_s, clock)

    def observe(self, key: str, phase: str, gpu_type: str, gpus: float) -> None:
        self._recent.put(key, (phase, gpu_type, gpus))

    def forget(self, key: str) -> None:
        self._recent.forget(key)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fresh = self._recent.fresh()
        phases = GaugeMetricFamily(
            "chronotope_trainingjobs", "TrainingJobs by phase", labels=["phase"]
        )
        counts: dict[str, int] = {}
        waiting: dict[str, float] = {}
        for phase, gpu_type, gpus in fresh.values():
            counts[phase] = counts.get(phase, 0) + 1
            if phase in _WAITING and gpu_type:
                waiting[gpu_type] = waiting.get(gpu_type, 0.0) + gpus
        for phase, n in sorted(counts.items()):
            phases.add_metric([phase], n)
        yield phases
        demand = GaugeMetricFamily(
            "chronotope_trainingjob_waiting_gpus",
            "GPUs wanted by waiting TrainingJobs, by the first GPU type they accept",
            labels=["gpu_type"],
        )
        for gpu_type, gpus in sorted(waiting.items()):
            demand.add_metric([gpu_type], gpus)
        yield demand


class _Groups(Collector):
    """Serving groups as last planned; a group not planned for a while drops out."""

    def __init__(self, stale_after_s: float, clock: Callable[[], float]) -> None:
        self._recent: _Recent[tuple[str, str], tuple[int, dict[str, str]]] = _Recent(
            stale_after_s, clock
        )

    def observe(
        self, namespace: str, group: str, replicas: int, residency: Mapping[str, str]
    ) -> None:
        self._recent.put((namespace, group), (replicas, dict(residency)))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fresh = self._recent.fresh()
        replicas = GaugeMetricFamily(
            "chronotope_serving_group_replicas",
            "Base-model replicas of a ModelVariant serving group, as last planned",
            labels=["namespace", "group"],
        )
        residency = GaugeMetricFamily(
            "chronotope_variant_residency",
            "1 for the tier that holds a variant's delta (GPU, Host or Disk)",
            labels=["namespace", "group", "variant", "residency"],
        )
        for (namespace, group), (n, where) in sorted(fresh.items()):
            replicas.add_metric([namespace, group], n)
            for variant, tier in sorted(where.items()):
                residency.add_metric([namespace, group, variant, tier], 1)
        yield replicas
        yield residency


class _Pipelines(Collector):
    """InferencePipelines as last reconciled; one not reconciled for a while drops out."""

    def __init__(self, stale_after_s: float, clock: Callable[[], float]) -> None:
        self._recent: _Recent[tuple[str, str], Mapping[str, Any]]
        self._recent = _Recent(stale_after_s, clock)

    def observe(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self._recent.put((namespace, name), status)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fresh = self._recent.fresh()
        replicas = GaugeMetricFamily(
            "chronotope_pipeline_replicas",
            "Replicas of an InferencePipeline stage: current (the tuner's) and planned",
            labels=["namespace", "pipeline", "stage", "kind"],
        )
        cost = GaugeMetricFamily(
            "chronotope_pipeline_cost_per_hour",
            "What an InferencePipeline's running configuration costs per hour",
            labels=["namespace", "pipeline"],
        )
        p99 = GaugeMetricFamily(
            "chronotope_pipeline_predicted_p99_seconds",
            "The planner's predicted end-to-end P99 of an InferencePipeline",
            labels=["namespace", "pipeline"],
        )
        for (namespace, name), status in sorted(fresh.items()):
            for row in status.get("stages") or []:
                stage = str(row.get("name", ""))
                for kind, field in (("current", "replicas"), ("planned", "plannedReplicas")):
                    if isinstance(row.get(field), int | float):
                        replicas.add_metric([namespace, name, stage, kind], float(row[field]))
            if isinstance(status.get("costPerHour"), int | float):
                cost.add_metric([namespace, name], float(status["costPerHour"]))
            if isinstance(status.get("predictedP99Ms"), int | float):
                p99.add_metric([namespace, name], float(status["predictedP99Ms"]) / 1000)
        yield replicas
        yield cost
        yield p99


class _Queues(Collector):
    """Queues as last reported; a Queue not reported for a while (deleted) drops out."""

    def __init__(self, stale_after_s: float, clock: Callable[[], float]) -> None:
        self._recent: _Recent[str, tuple[list[tuple[str, str, float]], dict[str, int]]] = _Recent(
            stale_after_s, clock
        )

    def observe(self, name: str, spec: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        rows: list[tuple[str, str, float]] = []
        for quota in spec.get("quotas") or []:
            gpu_type = str(quota.get("gpuType"))
            rows.append((gpu_type, "nominal", float(quota.get("gpus") or 0)))
            milli = float(quota.get("shareMilli") or 0)
            rows.append((gpu_type, "nominal_share_milli", milli))
            for field, kind in (
                ("borrowingLimit", "borrowing_limit"),
                ("lendingLimit", "lending_limit"),
            ):
                if quota.get(field) is not None:  # as Kueue: a limit that is not set has no series
                    rows.append((gpu_type, kind, float(quota[field])))
        for row in status.get("gpus") or []:
            for field, kind in _QUEUE_FIELDS:
                rows.append((str(row.get("gpuType")), kind, float(row.get(field) or 0)))
        counts = {
            "admitted": int(status.get("admittedWorkloads") or 0),
            "pending": int(status.get("pendingWorkloads") or 0),
        }
        self._recent.put(name, (rows, counts))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fresh = self._recent.fresh()
        gpus = GaugeMetricFamily(
            "chronotope_queue_gpus",
            "Quota and usage of a Queue per GPU type: nominal, used, borrowed, lent, limits",
            labels=["queue", "gpu_type", "kind"],
        )
        workloads = GaugeMetricFamily(
            "chronotope_queue_workloads",
            "TrainingJobs of a Queue: admitted (started) and pending",
            labels=["queue", "state"],
        )
        for name, (rows, counts) in sorted(fresh.items()):
            for gpu_type, kind, value in rows:
                gpus.add_metric([name, gpu_type, kind], value)
            for state, n in sorted(counts.items()):
                workloads.add_metric([name, state], n)
        yield gpus
        yield workloads


_QUEUE_FIELDS = (
    ("used", "used"),
    ("borrowed", "borrowed"),
    ("lent", "lent"),
    ("usedShareMilli", "used_share_milli"),
    ("borrowedShareMilli", "borrowed_share_milli"),
    ("lentShareMilli", "lent_share_milli"),
)


class OperatorMetrics:
    """The operator's metrics on their own registry (tests may build several)."""

    def __init__(
        self,
        stale_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        group_stale_after_s: float = 120.0,
    ) -> None:
        """Build the metrics; a job not seen for `stale_after_s` seconds drops out of the gauges.

        A serving group drops out when not planned for `group_stale_after_s`
        (groups are re-planned on change, and at least every refresh period).
        """
        self.registry = CollectorRegistry()
        self.reconcile_seconds = Histogram(
            "chronotope_trainingjob_reconcile_seconds",
            "Time to reconcile one TrainingJob",
            ["result"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.pass_seconds = Histogram(
            "chronotope_trainingjob_schedule_pass_seconds",
            "Time of one scheduling pass over every waiting TrainingJob",
            registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.pass_jobs = Gauge(
            "chronotope_trainingjob_schedule_pass_jobs",
            "Jobs the latest scheduling pass decided",
            registry=self.registry,
        )
        self.pass_invalidations = Counter(
            "chronotope_trainingjob_pass_invalidations_total",
            "Watch events that made the latest scheduling pass stale",
            ["kind", "event"],
            registry=self.registry,
        )
        self.events = Counter(
            "chronotope_trainingjob_events_total",
            "Decisions posted as events on TrainingJobs",
            ["reason"],
            registry=self.registry,
        )
        self.preemptions = Counter(
            "chronotope_trainingjob_preemptions_total",
            "TrainingJobs checkpointed and stopped for another workload, by cause and the queue",
            ["cause", "queue"],
            registry=self.registry,
        )
        self.admission_wait = Histogram(
            "chronotope_trainingjob_admission_wait_seconds",
            "Time from a TrainingJob's creation or last requeue until its gang is created",
            ["queue"],
            registry=self.registry,
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400),
        )
        self._jobs = _Jobs(stale_after_s, clock)
        self.registry.register(self._jobs)
        self.group_passes = Counter(
            "chronotope_serving_group_passes_total",
            "Passes (re-plans) of ModelVariant serving groups",
            ["namespace", "group", "result"],
            registry=self.registry,
        )
        self._groups = _Groups(group_stale_after_s, clock)
        self.registry.register(self._groups)
        self._queues = _Queues(stale_after_s, clock)
        self.registry.register(self._queues)
        self._pipelines = _Pipelines(group_stale_after_s, clock)
        self.registry.register(self._pipelines)
        self.pipeline_events = Counter(
            "chronotope_pipeline_events_total",
            "Decisions posted as events on InferencePipelines",
            ["reason"],
            registry=self.registry,
        )
        self.api_requests = Counter(
            "chronotope_operator_api_requests_total",
            "Requests the operator's API client made, by verb (WATCH: a watch opened) and resource",
            ["verb", "resource"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "chronotope_operator_leader",
            "1 while this replica runs the controllers (holds the leader Lease), else 0",
            registry=self.registry,
        )

    def observe_pass(self, seconds: float, jobs: int) -> None:
        """One scheduling pass: how long it took and how many jobs it decided."""
        self.pass_seconds.observe(seconds)
        self.pass_jobs.set(jobs)

    def observe_group(
        self,
        namespace: str,
        group: str,
        replicas: int | None,
        residency: Mapping[str, str],
    ) -> None:
        """Record a serving group's pass: replicas (None: it could not be planned), residency."""
        result = "unplannable" if replicas is None else "planned"
        self.group_passes.labels(namespace, group, result).inc()
        self._groups.observe(namespace, group, replicas or 0, residency)

    def observe_pipeline(
        self, namespace: str, name: str, status: Mapping[str, Any], reasons: list[str]
    ) -> None:
        """Record an InferencePipeline's reconcile: its status for the gauges, its events."""
        if status:
            self._pipelines.observe(namespace, name, status)
        for reason in reasons:
            self.pipeline_events.labels(reason).inc()

    def observe_queue(self, name: str, spec: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """Record a Queue's quota (`spec`) and usage (`status`, as written) for the gauges."""
        self._queues.observe(name, spec, status)

    def observe_job(self, job: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """Record a job's phase (from `status`, else the job's) and GPU demand for the gauges."""
        meta = job.get("metadata") or {}
        spec = job.get("spec") or {}
        phase = str(status.get("phase") or (job.get("status") or {}).get("phase") or "New")
        types = spec.get("gpuTypes") or [{}]
        gpu = spec.get("gpu") or {}
        try:
            gpus = float(spec.get("replicas", 0)) * float(gpu.get("count") or 1)
        except (TypeError, ValueError):  # a spec the models reject: its phase still counts
            gpus = 0.0
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        self._jobs.observe(key, phase, str(types[0].get("name", "")), gpus)

    def forget_job(self, key: str) -> None:
        """Drop a deleted job (`namespace/name`) from the gauges at once."""
        self._jobs.forget(key)

    def serve(self, port: int, address: str) -> None:
        """Serve /metrics over HTTP on `address:port`, from a background thread."""
        from prometheus_client import start_http_server

        start_http_server(port, addr=address, registry=self.registry)
