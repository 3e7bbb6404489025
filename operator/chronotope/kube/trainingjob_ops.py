"""The API calls the TrainingJob controller makes (`controllers.trainingjob.ClusterOps`).

Reads come from the operator's watch-fed cache when there is one (else they
list from the API server); writes go to the API server. Model profiles are
ConfigMaps, read at most once per `PROFILE_TTL_S` and parsed again only when
their resourceVersion changes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chronotope.kube import workloads as kw
from chronotope.kube.events import post_event
from chronotope.kube.reads import LOCALQUEUES, QUEUES, TRAININGJOBS, KubeReads
from chronotope.kube.store import OperatorCache
from chronotope.planners.profile import ModelProfile, profile_from_data
from chronotope.ratelimit import EVENT_WINDOW_S, RepeatLimiter
from chronotope.sharing.labels import PLANNED_FOR_ANNOTATION, PREEMPTED_BY_ANNOTATION
from chronotope.workloads.gang import JOB_LABEL

__all__ = ["PROFILE_TTL_S", "KubeClusterOps"]

PROFILE_TTL_S = 5.0
"""How long a model profile read is reused (one reconcile plans many jobs)."""

EVENT_POSTERS = 4
"""Threads posting the jobs' events, off the reconciling workers (as client-go's recorder)."""

log = logging.getLogger(__name__)

_NOT_FOUND = 404


class KubeClusterOps(KubeReads):
    """`ClusterOps` on a real API server; see the module docstring.

    Nodes, pods, TrainingJobs, Queues and LocalQueues are read as `KubeReads` reads them.
    """

    def __init__(
        self,
        api: client.ApiClient,
        cache: OperatorCache | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Use the API server `api`; reads go to `cache` when given; `clock` ages profile reads."""
        super().__init__(api, cache)
        self.clock = clock
        # decide-and-start is one critical section across all jobs: the next decision
        # must see the workers the previous one created
        self.decide_lock = threading.Lock()
        self._profiles: dict[tuple[str, str], tuple[str, ModelProfile | str]] = {}
        self._profile_reads: dict[tuple[str, str], tuple[float, ModelProfile | str]] = {}
        self._same_event = RepeatLimiter(EVENT_WINDOW_S, clock=clock)
        """An identical event on one job at most once per EVENT_WINDOW_S (a reason that flaps)."""
        self._posters = ThreadPoolExecutor(EVENT_POSTERS, thread_name_prefix="trainingjob-events")
        self._posting: set[Future[None]] = set()
        self._posting_lock = threading.Lock()
        self._warned_old_crd = False

    def model_profile(self, namespace: str, name: str) -> ModelProfile | str:
        """The model profile in ConfigMap `namespace/name`, or why it cannot be used."""
        recent = self._profile_reads.get((namespace, name))
        if recent is not None and self.clock() - recent[0] < PROFILE_TTL_S:
            return recent[1]
        result = self._read_profile(namespace, name)
        self._profile_reads[(namespace, name)] = (self.clock(), result)
        return result

    def _read_profile(self, namespace: str, name: str) -> ModelProfile | str:
        cm = kw.read_config_map(self.api, namespace, name)
        if cm is None:
            return (
                f"model profile {name} not found: no ConfigMap {namespace}/{name} "
                "(create it with `chronotope profile configmap`)"
            )
        version = str(cm["metadata"].get("resourceVersion", ""))
        cached = self._profiles.get((namespace, name))
        if cached is not None and cached[0] == version:
            return cached[1]
        parsed: ModelProfile | str
        try:
            parsed = profile_from_data(cm.get("data") or {}, source=f"ConfigMap {namespace}/{name}")
        except ValueError as exc:
            parsed = f"model profile {name} is unusable: {exc}"
        self._profiles[(namespace, name)] = (version, parsed)
        return parsed

    def pods(
        self, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        """The pods in `namespace` (all namespaces if None) matching the label `selector`."""
        return self.pods_matching(namespace, selector)

    def start(
        self, namespace: str, service: dict[str, Any] | None, pods: list[dict[str, Any]]
    ) -> None:
        """Create the gang's headless service (if any) and worker pods (both idempotent)."""
        kw.create_gang(self.api, namespace, service, pods)
        if self.cache is not None:  # the next decision must count them (watch may lag)
            self.cache.pods.put(pods)

    def stop(self, namespace: str, names: Sequence[str]) -> None:
        """Ask the named pods to checkpoint, then delete them with a grace period."""
        kw.delete_pods(self.api, namespace, names)

    def training_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One TrainingJob as the cache has it (read from the API server without a cache)."""
        if self.cache is not None:
            return self.cache.training_jobs.get(namespace, name)
        try:
            obj: dict[str, Any] = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
                *TRAININGJOBS[:2], namespace, TRAININGJOBS[2], name
            )
        except ApiException as exc:
            if exc.status == _NOT_FOUND:
                return None
            raise
        return obj

    def write(
        self,
        job: Mapping[str, Any],
        status: Mapping[str, Any],
        annotations: Mapping[str, str],
        events: Sequence[tuple[str, str, str]],
    ) -> None:
        """Patch the job's annotations and status (changed fields only), then post its events.

        The patched object goes into the cache at once, so the next reconcile reads
        what was just written (the watch event may still be coming). A job deleted
        meanwhile is left alone. The events are posted by a thread pool of their own
        (`EVENT_POSTERS`), each write's in order, as client-go's event recorder posts
        in the background: a start's reconcile does not wait for them.
        """
        meta = job["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        group, version, plural = TRAININGJOBS
        custom = client.CustomObjectsApi(self.api)
        written: dict[str, Any] | None = None

        def annotate(values: Mapping[str, str]) -> dict[str, Any]:
            return custom.patch_namespaced_custom_object(  # type: ignore[no-any-return]
                group, version, namespace, plural, name, {"metadata": {"annotations": dict(values)}}
            )

        try:
            if annotations:
                written = annotate(annotations)
            if status:
                written = custom.patch_namespaced_custom_object_status(
                    group, version, namespace, plural, name, {"status": dict(status)}
                )
                if (kept := self._planned_for_pruned(status, written)) is not None:
                    written = annotate({PLANNED_FOR_ANNOTATION: kept})
        except ApiException as exc:
            if exc.status == _NOT_FOUND:
                return
            raise
        if written is not None and self.cache is not None:
            self.cache.training_jobs.on_event("MODIFIED", written)
        involved = {
            "apiVersion": f"{group}/{version}",
            "kind": "TrainingJob",
            "name": name,
            "namespace": namespace,
            "uid": meta.get("uid"),
        }
        job_id = meta.get("uid") or f"{namespace}/{name}"
        fresh = [
            (kind, reason, message)
            for kind, reason, message in events
            # said already, moments ago (a reason that flaps back and forth)
            if self._same_event.admit((job_id, kind, reason, message)) is not None
        ]
        if fresh:  # posted in the background, in order: the worker goes on to the next job
            future = self._posters.submit(self._post, involved, fresh)
            with self._posting_lock:
                self._posting.add(future)
            future.add_done_callback(self._posted)

    def _planned_for_pruned(
        self, status: Mapping[str, Any], written: Mapping[str, Any] | None
    ) -> str | None:
        """The plan's replicas, when the API server pruned them from the written status.

        An upgrade with Helm leaves the CRDs as they were (Helm never upgrades a
        chart's crds/): a TrainingJob CRD older than the operator has no
        `status.plan.plannedForReplicas` and prunes it. The reconcile then reads the
        replicas from the annotation older operators wrote, so a resize is still seen.
        """
        planned = (status.get("plan") or {}).get("plannedForReplicas")
        if planned is None or written is None:
            return None
        if ((written.get("status") or {}).get("plan") or {}).get("plannedForReplicas") is not None:
            return None
        if not self._warned_old_crd:
            self._warned_old_crd = True
            log.warning(
                "the TrainingJob CRD prunes status.plan.plannedForReplicas: it is older than "
                "this operator; apply the chart's CRDs (kubectl apply --server-side -f crds/). "
                "Until then the operator also writes the annotation %s",
                PLANNED_FOR_ANNOTATION,
            )
        return str(planned)

    def _posted(self, future: Future[None]) -> None:
        with self._posting_lock:
            self._posting.discard(future)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the events written so far are posted; False if `timeout` ran out first."""
        with self._posting_lock:
            pending = set(self._posting)
        return not wait(pending, timeout=timeout).not_done

    def _post(self, involved: Mapping[str, Any], events: Sequence[tuple[str, str, str]]) -> None:
        try:
            for kind, reason, message in events:
                post_event(
                    self.api, involved, reason, message, type_=kind, component="chronotope-operator"
                )
        except Exception:  # an event is best effort; the status says the same
            log.exception("posting events on TrainingJob %s failed", involved.get("name"))

    def write_queue_status(self, name: str, status: Mapping[str, Any]) -> None:
        """Patch Queue `name`'s status subresource (a Queue deleted meanwhile is left alone)."""
        group, version, plural = QUEUES
        try:
            written = client.CustomObjectsApi(self.api).patch_cluster_custom_object_status(
                group, version, plural, name, {"status": dict(status)}
            )
        except ApiException as exc:
            if exc.status == _NOT_FOUND:
                return
            raise
        if self.cache is not None:
            self.cache.queues.on_event("MODIFIED", written)

    def write_local_queue_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Patch LocalQueue `namespace/name`'s status subresource."""
        group, version, plural = LOCALQUEUES
        try:
            written = client.CustomObjectsApi(self.api).patch_namespaced_custom_object_status(
                group, version, namespace, plural, name, {"status": dict(status)}
            )
        except ApiException as exc:
            if exc.status == _NOT_FOUND:
                return
            raise
        if self.cache is not None:
            self.cache.local_queues.on_event("MODIFIED", written)

    def preempt(self, job_key: str, by: str, why: str, grace_seconds: int) -> None:
        """Mark the victim (its own reconcile reports it) and stop its workers gracefully."""
        namespace, name = job_key.split("/", 1)
        kw.annotate_custom(
            self.api, TRAININGJOBS, namespace, name, {PREEMPTED_BY_ANNOTATION: f"{by} ({why})"}
        )
        workers = [
            p
            for p in self.pods(namespace, f"{JOB_LABEL}={name}")
            if not p["metadata"].get("deletionTimestamp")
        ]
        names = [p["metadata"]["name"] for p in workers]
        kw.delete_pods(self.api, namespace, names, grace_seconds=grace_seconds)
