"""Queues on the real control plane: two teams in one cohort borrow, reclaim and wait for quota.

The Queues exist only during the test (quotas are on cluster-wide while any
Queue exists, so every other test's jobs would need a LocalQueue); the GPU type
is one only this test uses.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from functools import partial
from typing import Any

import pytest
from kubernetes import client

from chronotope.workloads.gang import JOB_LABEL
from chronotope.workloads.replan import parse_time
from e2e.kubetest import (
    KubeCluster,
    metric_value,
    operator_metrics,
    scratch_namespace,
    wait_for,
)
from e2e.test_kubectl_plugin import _kubectl
from e2e.test_trainingjob import _gpu_nodes, job

pytestmark = pytest.mark.cluster

GROUP, VERSION = "chronotope.dev", "v1alpha1"
JOBS = "trainingjobs"


def _cohort_queue(
    name: str, cohort: str, gpu_type: str, gpus: int, reclaim: dict[str, str], **quota: int
) -> dict[str, Any]:
    """A Queue of `cohort`: `gpus` of `gpu_type` (with `quota`'s limits), a 5 s grace."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {
            "cohort": cohort,
            "quotas": [{"gpuType": gpu_type, "gpus": gpus, **quota}],
            "reclaim": {"gracePeriodSeconds": 5, **reclaim},
        },
    }


def _queue(name: str, gpu_type: str, *, reclaim: str, limit: int | None = None) -> dict[str, Any]:
    """2 GPUs of `gpu_type` in the cohort its name starts with (`COHORT-x`)."""
    limits = {} if limit is None else {"borrowingLimit": limit}
    return _cohort_queue(name, name.rsplit("-", 1)[0], gpu_type, 2, {"policy": reclaim}, **limits)


def _solo_queue(name: str, gpu_type: str, gpus: int, **reclaim: str) -> dict[str, Any]:
    """A Queue with no cohort: `gpus` of `gpu_type`, a 5 s grace, and `reclaim` fields."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {
            "quotas": [{"gpuType": gpu_type, "gpus": gpus}],
            "reclaim": {"gracePeriodSeconds": 5, **reclaim},
        },
    }


def _local_queue(namespace: str, target: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LocalQueue",
        "metadata": {"name": "default", "namespace": namespace},
        "spec": {"queue": target},
    }


def _team_local_queues(
    custom: client.CustomObjectsApi, ns: str, team_a: dict[str, Any], team_b: dict[str, Any]
) -> None:
    """LocalQueues in `ns`: `default` for Queue team_a, `b` for Queue team_b."""
    local_b = _local_queue(ns, team_b["metadata"]["name"])
    local_b["metadata"]["name"] = "b"
    for local in (_local_queue(ns, team_a["metadata"]["name"]), local_b):
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, "localqueues", local)


@contextlib.contextmanager
def _queues(custom: client.CustomObjectsApi, *objs: dict[str, Any]) -> Iterator[None]:
    try:
        for obj in objs:
            custom.create_cluster_custom_object(GROUP, VERSION, "queues", obj)
        yield
    finally:
        for obj in objs:
            with contextlib.suppress(client.exceptions.ApiException):
                custom.delete_cluster_custom_object(
                    GROUP, VERSION, "queues", obj["metadata"]["name"]
                )


def _status(custom: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, ns, JOBS, name)
    return dict(obj.get("status") or {})


def _condition(status: dict[str, Any], kind: str) -> tuple[str, str]:
    """The job's condition `kind`: (status, reason), empty strings when it has none."""
    for cond in status.get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status")), str(cond.get("reason"))
    return "", ""


def _reason(status: dict[str, Any]) -> str:
    return _condition(status, "Schedulable")[1]


def _quota_reserved(status: dict[str, Any]) -> tuple[str, str]:
    """The job's QuotaReserved condition (Kueue's name): (status, reason)."""
    return _condition(status, "QuotaReserved")


def _usage(custom: client.CustomObjectsApi, queue: str) -> tuple[int, int, int, int, int]:
    """(used, borrowed, lent, admitted, pending) from the Queue's status."""
    status = custom.get_cluster_custom_object(GROUP, VERSION, "queues", queue).get("status") or {}
    rows = status.get("gpus") or [{}]
    row = rows[0]
    return (
        int(row.get("used", 0)),
        int(row.get("borrowed", 0)),
        int(row.get("lent", 0)),
        int(status.get("admittedWorkloads", 0)),
        int(status.get("pendingWorkloads", 0)),
    )


def _submit(
    custom: client.CustomObjectsApi,
    ns: str,
    name: str,
    gpu_type: str,
    queue: str,
    *,
    hours: float = 1.0,
) -> None:
    """A 2-GPU job of `hours` that checkpoints, in LocalQueue `queue`."""
    obj = job(name, 1, 2, [(gpu_type, 1.0)], checkpoint={"path": f"/ckpt/{name}"})
    obj["spec"]["queue"] = queue
    obj["spec"]["estimate"]["durationSeconds"] = hours * 3600
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, JOBS, obj)


def _running(
    custom: client.CustomObjectsApi, ns: str, name: str, timeout: float, what: str
) -> None:
    def running() -> bool:
        return _status(custom, ns, name).get("phase") == "Running"

    try:
        wait_for(running, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {name}: {_status(custom, ns, name)}") from None


def _plan_ahead_as_data(
    custom: client.CustomObjectsApi, ns: str, queue: str, gpu_type: str
) -> None:
    """The quota plan-ahead as data: a3's predicted start, the queue's forecast of releases."""
    a3 = _status(custom, ns, "a3")
    assert a3["predictedStartTime"].startswith("20")
    forecast = custom.get_cluster_custom_object(GROUP, VERSION, "queues", queue)["status"][
        "forecast"
    ]
    assert {r["workload"] for r in forecast} == {f"{ns}/a1", f"{ns}/a2"}
    assert all(r["gpuType"] == gpu_type and r["gpus"] == 2 for r in forecast)
    assert [r["at"] for r in forecast] == sorted(r["at"] for r in forecast)
    assert a3["predictedStartTime"] in {r["at"] for r in forecast}


def test_two_teams_borrow_reclaim_and_wait_for_quota(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    tag = uuid.uuid4().hex[:6]
    gpu_type = f"QUOTA-{tag.upper()}"
    team_a, team_b = f"q{tag}-a", f"q{tag}-b"
    ns_a = namespace
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

        def submit(ns: str, name: str, queue: str = "default") -> None:
            _submit(custom, ns, name, gpu_type, queue)

        def phase(ns: str, name: str) -> str:
            return str(_status(custom, ns, name).get("phase", ""))

        def running(ns: str, name: str, timeout: float, what: str) -> None:
            _running(custom, ns, name, timeout, what)

        with (
            scratch_namespace(core, f"{namespace}-b") as ns_b,
            _gpu_nodes(api, core, f"qn-{tag}", gpu_type, 1, per_node=6),
            _queues(
                custom,
                _queue(team_a, gpu_type, reclaim="Never", limit=2),
                _queue(team_b, gpu_type, reclaim="PreemptBorrowed"),
            ),
        ):
            for ns, target in ((ns_a, team_a), (ns_b, team_b)):
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, ns, "localqueues", _local_queue(ns, target)
                )
            # team A: one job within its quota, one on team B's idle quota
            submit(ns_a, "a1")
            running(ns_a, "a1", 60, "a1 running")
            submit(ns_a, "a2")
            running(ns_a, "a2", 60, "a2 running on borrowed")
            wait_for(
                lambda: _usage(custom, team_a)[:2] == (4, 2) and _usage(custom, team_b)[2] == 2,
                30,
                "Queue status: team A borrows 2, team B lends 2",
            )
            # a third would exceed team A's borrowing limit: it waits, saying so
            submit(ns_a, "a3")
            wait_for(lambda: _reason(_status(custom, ns_a, "a3")) == "QuotaExceeded", 30, "a3")
            why = _status(custom, ns_a, "a3")["whyWaiting"]
            assert why.startswith(f"queue {team_a}: {gpu_type} 4/2 in use, borrowing limit 2")
            # as a Kueue user reads it: a3's quota is not reserved, a1's (running) is
            assert [_quota_reserved(_status(custom, ns_a, n)) for n in ("a3", "a1")] == [
                ("False", "QuotaExceeded"),
                ("True", "QuotaReserved"),
            ]
            # the plan-ahead on quota: a1 and a2 are predicted to end; a1 (older) first
            assert "; its quota frees up 20" in why
            assert why.endswith(f"({ns_a}/a1 ends)") or why.endswith(f"({ns_a}/a2 ends)")
            _plan_ahead_as_data(custom, ns_a, team_a, gpu_type)
            # team B wants its quota back: a2 (borrowed) is checkpointed and stopped
            submit(ns_b, "b1")
            running(ns_b, "b1", 90, "b1 running after reclaim")
            why = f"{ns_b}/b1 (reclaiming quota of queue {team_b})"
            _was_preempted(kube_cluster, core, ns_a, "a2", why=why, counted=("Reclaim", team_b))
            assert phase(ns_a, "a1") == "Running"  # within nominal: never touched
            wait_for(lambda: phase(ns_a, "a2") == "Waiting", 30, "a2 re-queued")
            # 2 of the 6 GPUs are idle, but the cohort's quota (4) is all in use
            wait_for(lambda: _reason(_status(custom, ns_a, "a2")) == "QuotaExceeded", 30, "a2")
            assert "cohort" in _status(custom, ns_a, "a2")["whyWaiting"]
            wait_for(lambda: _usage(custom, team_b)[:3] == (2, 0, 0), 30, "team B's usage")
            # a job naming a LocalQueue that does not exist waits with the reason
            submit(ns_b, "lost", queue="nope")
            wait_for(
                lambda: _reason(_status(custom, ns_b, "lost")) == "LocalQueueMissing",
                30,
                "lost waits",
            )
            assert (
                _status(custom, ns_b, "lost")["whyWaiting"]
                == f"no LocalQueue nope in namespace {ns_b}"
            )
            # the platform team raises team A's quota live: a2 (ahead of a3) starts
            custom.patch_cluster_custom_object(
                GROUP,
                VERSION,
                "queues",
                team_a,
                {"spec": {"quotas": [{"gpuType": gpu_type, "gpus": 4, "borrowingLimit": 2}]}},
            )
            running(ns_a, "a2", 60, "a2 running on new quota")
            assert phase(ns_a, "a3") == "Waiting"
            wait_for(lambda: _usage(custom, team_a)[3:] == (2, 1), 30, "team A counts")
            # admission waits by Queue: a1, a2, and a2 again after its reclaim; b1
            _admission_waits(kube_cluster, {team_a: 3, team_b: 1})


def _was_preempted(
    cluster: KubeCluster,
    core: client.CoreV1Api,
    ns: str,
    name: str,
    *,
    why: str,
    counted: tuple[str, str],
) -> None:
    """`name`'s Preempted event says `why`; /metrics counts it once, as (cause, queue).

    The operator posts events in the background, so the event may come a moment after
    the job that preempted it runs.
    """

    def preempted() -> list[str]:
        events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
        return [e.message for e in events.items if e.reason == "Preempted"]

    wait_for(lambda: bool(preempted()), 30, f"{name}'s Preempted event")
    assert why in preempted()[0]
    cause, queue = counted
    line = f'chronotope_trainingjob_preemptions_total{{cause="{cause}",queue="{queue}"}} 1.0'
    wait_for(lambda: line in operator_metrics(cluster), 30, f"metrics: {line}")


def _admission_waits(cluster: KubeCluster, starts: dict[str, int]) -> None:
    """/metrics has observed at least `starts[queue]` admission waits of each queue."""
    count = "chronotope_trainingjob_admission_wait_seconds_count"

    def observed() -> bool:
        text = operator_metrics(cluster)
        return all(metric_value(text, count, f'queue="{q}"') >= n for q, n in starts.items())

    wait_for(observed, 30, f"admission waits {starts} in /metrics")


def test_a_higher_priority_job_preempts_lower_priority_work_of_its_queue(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    tag = uuid.uuid4().hex[:6]
    gpu_type, team = f"PRIO-{tag.upper()}", f"p{tag}"
    ns = namespace
    queue = _solo_queue(team, gpu_type, 4, withinQueue="LowerPriority")
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

        def submit(name: str, priority: int, preemptible: bool) -> None:
            obj = job(name, 1, 2, [(gpu_type, 1.0)], checkpoint={"path": f"/ckpt/{name}"})
            obj["spec"] |= {"priority": priority, "preemptible": preemptible}
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, JOBS, obj)

        # 8 GPUs on the node, 4 in the quota: only quota holds the third job back
        with _gpu_nodes(api, core, f"pn-{tag}", gpu_type, 1, per_node=8), _queues(custom, queue):
            custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "localqueues", _local_queue(ns, team)
            )
            submit("low1", 0, True)
            _running(custom, ns, "low1", 60, "low1 running")
            time.sleep(1.1)  # plan.startTime is to the second: low2 starts strictly later
            submit("low2", 0, True)
            _running(custom, ns, "low2", 60, "low2 running")
            submit("high", 10, False)
            _running(custom, ns, "high", 90, "high running after preempting within its queue")
            # low2, the newest lower-priority job, is the one preempted
            why = f"{ns}/high (higher priority in queue {team})"
            _was_preempted(kube_cluster, core, ns, "low2", why=why, counted=("WithinQueue", team))
            assert _status(custom, ns, "low1")["phase"] == "Running"  # only as many as needed
            wait_for(
                lambda: _reason(_status(custom, ns, "low2")) == "QuotaExceeded",
                30,
                "low2 waits for quota",
            )
            # an equal priority never preempts: another priority-0 job waits
            submit("low3", 0, True)
            wait_for(lambda: _reason(_status(custom, ns, "low3")) == "QuotaExceeded", 30, "low3")
            assert _status(custom, ns, "low1")["phase"] == "Running"


def test_a_held_queue_admits_nothing_and_a_drained_one_stops_what_runs(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    tag = uuid.uuid4().hex[:6]
    gpu_type, team, ns = f"STOP-{tag.upper()}", f"s{tag}", namespace
    queue = _solo_queue(team, gpu_type, 8)
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

        def submit(name: str) -> None:
            _submit(custom, ns, name, gpu_type, "default")

        def stop(policy: str) -> None:  # `kubectl edit queue`, as the platform team would
            patch = {"spec": {"stopPolicy": policy}}
            custom.patch_cluster_custom_object(GROUP, VERSION, "queues", team, patch)

        def active() -> tuple[str, str]:
            got = custom.get_cluster_custom_object(GROUP, VERSION, "queues", team)
            (cond,) = (got.get("status") or {}).get("conditions") or [{}]
            return str(cond.get("status")), str(cond.get("reason"))

        with _gpu_nodes(api, core, f"sn-{tag}", gpu_type, 1, per_node=8), _queues(custom, queue):
            custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "localqueues", _local_queue(ns, team)
            )
            submit("s1")
            _running(custom, ns, "s1", 60, "s1 running")
            # Hold: what runs keeps running, a new job waits though quota and GPUs are free
            stop("Hold")
            wait_for(lambda: active() == ("False", "Stopped"), 30, "the Queue inactive, Stopped")
            submit("s2")
            wait_for(lambda: _reason(_status(custom, ns, "s2")) == "QueueStopped", 30, "s2 held")
            assert _status(custom, ns, "s2")["whyWaiting"].startswith(f"queue {team} is stopped")
            assert _status(custom, ns, "s1")["phase"] == "Running"
            # HoldAndDrain: s1 is checkpointed and stopped, and waits too
            stop("HoldAndDrain")
            why = f"Queue {team} (draining queue {team})"
            wait_for(lambda: _reason(_status(custom, ns, "s1")) == "QueueStopped", 60, "s1 drained")
            _was_preempted(kube_cluster, core, ns, "s1", why=why, counted=("Drain", team))
            wait_for(
                lambda: not core.list_namespaced_pod(ns, label_selector=f"{JOB_LABEL}=s1").items,
                60,
                "s1's workers gone",
            )
            # the stop is lifted: both start
            stop("None")
            _running(custom, ns, "s1", 60, "s1 running again")
            _running(custom, ns, "s2", 60, "s2 running")
            wait_for(lambda: active() == ("True", "Ready"), 30, "the Queue active again")


def test_a_lending_limit_keeps_part_of_a_teams_quota_its_own(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    # the lender has 4 GPUs and lends at most 2: the borrower gets 2 and no more though
    # the lender idles, and the lender's own job then starts at once, nobody preempted
    tag = uuid.uuid4().hex[:6]
    gpu_type, cohort = f"LEND-{tag.upper()}", f"l{tag}"
    lender, borrower, ns = f"{cohort}-a", f"{cohort}-b", namespace

    def queue(name: str, gpus: int, **quota: int) -> dict[str, Any]:
        return _cohort_queue(name, cohort, gpu_type, gpus, {"policy": "PreemptBorrowed"}, **quota)

    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        with (
            _gpu_nodes(api, core, f"ln-{tag}", gpu_type, 1, per_node=6),
            _queues(custom, queue(lender, 4, lendingLimit=2), queue(borrower, 0)),
        ):
            for name, target in (("default", lender), ("borrow", borrower)):
                local = _local_queue(ns, target)
                local["metadata"]["name"] = name
                custom.create_namespaced_custom_object(GROUP, VERSION, ns, "localqueues", local)
            _submit(custom, ns, "b1", gpu_type, "borrow")
            _running(custom, ns, "b1", 60, "b1 running on the 2 GPUs the lender lends")
            _submit(custom, ns, "b2", gpu_type, "borrow")
            wait_for(lambda: _reason(_status(custom, ns, "b2")) == "QuotaExceeded", 30, "b2")
            why = _status(custom, ns, "b2")["whyWaiting"]
            assert why.startswith(f"queue {borrower}: {gpu_type} 2/0 in use, cohort {cohort}")
            assert "has 0 to lend" in why
            _submit(custom, ns, "a1", gpu_type, "default")
            _running(custom, ns, "a1", 60, "a1 running on its guaranteed GPUs")
            assert _status(custom, ns, "b1")["phase"] == "Running"  # nothing to reclaim
            wait_for(
                lambda: (
                    _usage(custom, lender)[:3] == (2, 0, 2)
                    and _usage(custom, borrower)[:2] == (2, 2)
                ),
                30,
                "Queue status: the lender uses 2 of its own and lends 2, the borrower borrows 2",
            )
            # a lending limit above the nominal quota is refused by the API server
            patch = {"spec": {"quotas": [{"gpuType": gpu_type, "gpus": 4, "lendingLimit": 5}]}}
            with pytest.raises(client.exceptions.ApiException) as refused:
                custom.patch_cluster_custom_object(GROUP, VERSION, "queues", lender, patch)
            assert refused.value.status == 422
            assert "lendingLimit must not exceed gpus" in str(refused.value.body)


def _pending_in_order(
    cluster: KubeCluster, custom: client.CustomObjectsApi, team: str, ns: str, names: list[str]
) -> None:
    """The Queue's status and `kubectl chronotope queue` list `names` pending, in that order."""
    wanted = [(f"{ns}/{n}", i + 1) for i, n in enumerate(names)]

    def head() -> list[tuple[str, int]]:
        status = custom.get_cluster_custom_object(GROUP, VERSION, "queues", team).get("status")
        return [(q["workload"], q["position"]) for q in (status or {}).get("pendingHead") or []]

    wait_for(lambda: head() == wanted, 30, f"Queue {team} status.pendingHead {wanted}")
    out = _kubectl(cluster, "queue", team, "-o", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["workload"], r["position"], r["localQueuePosition"]) for r in rows] == [
        (w, p, p) for w, p in wanted
    ]
    assert all(r["queue"] == team and r["reason"] == "QuotaExceeded" for r in rows)
    table = _kubectl(cluster, "queue", "--local-queue", "default", "-n", ns)
    assert table.returncode == 0, table.stderr
    assert [line.split()[3] for line in table.stdout.splitlines()[1:]] == [w for w, _ in wanted]
    why = _kubectl(cluster, "why", f"trainingjob/{names[-1]}", "-n", ns)
    assert why.returncode == 0, why.stderr
    assert f"queue: {len(names)} of {len(names)} pending in Queue {team}," in why.stdout


def _turns_in_order(custom: client.CustomObjectsApi, team: str, ns: str) -> None:
    """The plan-ahead on quota takes turns: big when first ends, small only after big."""

    def at(name: str, field: str) -> datetime:
        status = _status(custom, ns, name)
        text = (status.get("plan") or {}).get(field) if name == "first" else status.get(field)
        when = parse_time(text)
        assert when is not None, f"{name} has no {field}"
        return when

    def forecast() -> bool:
        return all(_status(custom, ns, n).get("predictedStartTime") for n in ("big", "small"))

    wait_for(forecast, 30, "big and small have a predicted start")
    ends = at("first", "predictedCompletionTime")
    assert abs((at("big", "predictedStartTime") - ends).total_seconds()) < 1
    assert at("small", "predictedStartTime") > at("big", "predictedStartTime")
    assert _status(custom, ns, "small")["whyWaiting"].endswith(f"({ns}/big ends)")

    def listed() -> bool:  # the Queue's pendingHead carries the same predicted starts
        status = custom.get_cluster_custom_object(GROUP, VERSION, "queues", team)["status"]
        head = {q["workload"]: q.get("predictedStartTime") for q in status["pendingHead"]}
        return all(
            parse_time(head.get(f"{ns}/{n}")) == at(n, "predictedStartTime")
            for n in ("big", "small")
        )

    wait_for(listed, 30, f"Queue {team} pendingHead with the predicted starts")


def test_a_strict_fifo_queue_holds_later_jobs_behind_its_head(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    # 4 GPUs of quota, 2 in use: a 4-GPU job waits, and under StrictFIFO the 2-GPU job
    # behind it waits too though 2 are free; switched to BestEffortFIFO, it starts
    tag = uuid.uuid4().hex[:6]
    gpu_type, team, ns = f"FIFO-{tag.upper()}", f"f{tag}", namespace
    queue = _solo_queue(team, gpu_type, 4)
    queue["spec"]["queueingStrategy"] = "StrictFIFO"
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        with _gpu_nodes(api, core, f"fn-{tag}", gpu_type, 1, per_node=8), _queues(custom, queue):
            custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "localqueues", _local_queue(ns, team)
            )
            _submit(custom, ns, "first", gpu_type, "default")
            _running(custom, ns, "first", 60, "first running")
            big = job("big", 2, 2, [(gpu_type, 1.0)], checkpoint={"path": "/ckpt/big"})
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, JOBS, big)
            wait_for(lambda: _reason(_status(custom, ns, "big")) == "QuotaExceeded", 30, "big")
            _submit(custom, ns, "small", gpu_type, "default")
            wait_for(lambda: _reason(_status(custom, ns, "small")) == "QuotaExceeded", 30, "small")
            why = _status(custom, ns, "small")["whyWaiting"]
            assert why.startswith(
                f"queue {team} admits in order (queueingStrategy StrictFIFO): {ns}/big ahead"
            )
            _pending_in_order(kube_cluster, custom, team, ns, ["big", "small"])
            _turns_in_order(custom, team, ns)
            patch = {"spec": {"queueingStrategy": "BestEffortFIFO"}}
            custom.patch_cluster_custom_object(GROUP, VERSION, "queues", team, patch)
            _running(custom, ns, "small", 60, "small running once the queue is BestEffortFIFO")
            assert _reason(_status(custom, ns, "big")) == "QuotaExceeded"


def _held_by_quota(custom: client.CustomObjectsApi, ns: str, name: str) -> bool:
    return _reason(_status(custom, ns, name)) == "QuotaExceeded"


def test_freed_quota_goes_to_the_job_the_cluster_policy_runs_first(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    # 2 GPUs of quota, held by `first`; `long` (4 h) and then `short` (1 h) wait for it.
    # When `first` goes, the quota goes to `short`, the job the cluster policy runs first
    # (shortest remaining work), as the simulator's queues admit; before, quota admitted
    # the queue's oldest job, and the policy only ever saw that one
    tag = uuid.uuid4().hex[:6]
    gpu_type, team, ns = f"WISH-{tag.upper()}", f"w{tag}", namespace
    queue = _solo_queue(team, gpu_type, 2)
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        with _gpu_nodes(api, core, f"wn-{tag}", gpu_type, 1, per_node=8), _queues(custom, queue):
            custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "localqueues", _local_queue(ns, team)
            )
            _submit(custom, ns, "first", gpu_type, "default")
            _running(custom, ns, "first", 60, "first running")
            for name, hours in (("long", 4), ("short", 1)):
                _submit(custom, ns, name, gpu_type, "default", hours=hours)
                wait_for(partial(_held_by_quota, custom, ns, name), 30, name)
                time.sleep(1.1)  # creationTimestamp is to the second: `long` is the older
            custom.delete_namespaced_custom_object(GROUP, VERSION, ns, JOBS, "first")
            _running(custom, ns, "short", 60, "short running on the quota first freed")
            assert _reason(_status(custom, ns, "long")) == "QuotaExceeded"


def test_a_full_queue_gives_a_lease_to_the_shorter_job(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    # the team's 2 GPUs of quota and the node's 2 GPUs are held by `long` (4 h, it
    # checkpoints); `short` (1 h) comes. The cluster policy gives long's lease to short,
    # as it does without queues and as the simulator's queues do; before, quota held
    # short back (2/2 in use) and the policy never saw it
    tag = uuid.uuid4().hex[:6]
    gpu_type, team, ns = f"LEASE-{tag.upper()}", f"l{tag}", namespace
    queue = _solo_queue(team, gpu_type, 2)
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        with _gpu_nodes(api, core, f"ln-{tag}", gpu_type, 1, per_node=2), _queues(custom, queue):
            custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "localqueues", _local_queue(ns, team)
            )
            for name, hours in (("long", 4), ("short", 1)):
                _submit(custom, ns, name, gpu_type, "default", hours=hours)
                if name == "long":
                    _running(custom, ns, "long", 60, "long running")
            _running(custom, ns, "short", 90, "short running in long's place")
            why = f"{ns}/short (cluster policy's lease in queue {team})"
            _was_preempted(kube_cluster, core, ns, "long", why=why, counted=("Lease", team))
            assert _status(custom, ns, "long")["phase"] != "Running"


def test_no_lease_of_a_job_the_policy_would_move_to_a_type_its_queue_cannot_have(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    # `long` (3 h on SLOW, checkpoints) runs on team a's 2 SLOW GPUs; it would take 1 h
    # on the idle FAST GPUs, which only team b has quota for. `short` (2 h, SLOW only)
    # comes. Quota aside, the cluster policy runs long first, moved to FAST, and gives
    # short its SLOW lease; stopping long for short only started long again on SLOW
    # (quota admits it first), and the next pass gave the lease again: long was stopped
    # every other pass. Now long keeps running and short waits for quota, as in the
    # simulator's queues (tests/unit/workloads/test_training_pass.py runs both)
    tag = uuid.uuid4().hex[:6]
    fast, slow, ns = f"FAST-{tag.upper()}", f"SLOW-{tag.upper()}", namespace
    team_a, team_b = _solo_queue(f"a{tag}", slow, 2), _solo_queue(f"b{tag}", fast, 4)
    long = job("long", 1, 2, [(slow, 1.0), (fast, 3.0)], checkpoint={"path": "/ckpt/long"})
    long["spec"] |= {"queue": "default", "preemptible": True}
    long["spec"]["estimate"] = {"referenceGpuType": slow, "durationSeconds": 3 * 3600}
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        with (
            _gpu_nodes(api, core, f"sn-{tag}", slow, 1, per_node=2),
            _gpu_nodes(api, core, f"fn-{tag}", fast, 1, per_node=4),
            _queues(custom, team_a, team_b),
        ):
            custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "localqueues", _local_queue(ns, team_a["metadata"]["name"])
            )
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, JOBS, long)
            _running(custom, ns, "long", 60, "long running on SLOW")
            _submit(custom, ns, "short", slow, "default", hours=2)
            wait_for(partial(_held_by_quota, custom, ns, "short"), 30, "short held by quota")
            time.sleep(20)  # several passes (the queue's grace is 5 s)
            status = _status(custom, ns, "long")
            assert (status.get("phase"), status.get("restarts", 0)) == ("Running", 0), status
            assert _held_by_quota(custom, ns, "short"), _status(custom, ns, "short")


def test_a_job_the_policy_runs_on_a_slower_type_is_admitted_there(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    # a node of 4 FAST and one of 4 SLOW GPUs. Team b's `b-first` (20 min, FAST only)
    # comes first in the cluster policy's order and takes the FAST GPUs; team a's
    # `a-quick` (the older by name within the same second: 30 min on FAST, 39 on SLOW)
    # comes next, and the policy runs it on SLOW. Team a has quota for both types. Quota
    # asked for a-quick's own fastest type and admitted it on FAST, where b-first runs:
    # a-quick waited beside the idle SLOW GPUs until a later pass. Now quota asks for the
    # type the policy wishes first, as the simulator's queues do: both start in one pass
    tag = uuid.uuid4().hex[:6]
    fast, slow, ns = f"FAST-{tag.upper()}", f"SLOW-{tag.upper()}", namespace
    team_a = _solo_queue(f"a{tag}", fast, 4)
    team_a["spec"]["quotas"].append({"gpuType": slow, "gpus": 4})
    team_b = _solo_queue(f"b{tag}", fast, 4)
    first = job("b-first", 1, 4, [(fast, 1.0)])
    first["spec"] |= {"queue": "b", "estimate": {"referenceGpuType": fast, "durationSeconds": 1200}}
    quick = job("a-quick", 1, 4, [(fast, 1.3), (slow, 1.0)])
    quick["spec"]["queue"] = "default"
    quick["spec"]["estimate"] = {"referenceGpuType": fast, "durationSeconds": 1800}
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        with (
            _gpu_nodes(api, core, f"fn-{tag}", fast, 1, per_node=4),
            _gpu_nodes(api, core, f"sn-{tag}", slow, 1, per_node=4),
            _queues(custom, team_a, team_b),
        ):
            _team_local_queues(custom, ns, team_a, team_b)
            while time.time() % 1 > 0.5:  # both within one second: a-quick the older by name
                time.sleep(0.02)
            # one burst: the pass decides both at once
            for obj in (first, quick):
                custom.create_namespaced_custom_object(GROUP, VERSION, ns, JOBS, obj)
            _running(custom, ns, "b-first", 60, "b-first running on FAST")
            _running(custom, ns, "a-quick", 60, "a-quick running on SLOW beside it")
            plans = {name: _status(custom, ns, name)["plan"] for name in ("b-first", "a-quick")}
            assert (plans["b-first"]["gpuType"], plans["a-quick"]["gpuType"]) == (fast, slow)
            # in the same pass (before, a-quick waited for a later one)
            assert plans["a-quick"]["startTime"] == plans["b-first"]["startTime"]


def test_each_queue_gives_its_own_lease_to_its_short_job_when_the_policy_pairs_them_across(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    # one node of 4 GPUs; teams a and b have 2 each (no cohort: neither lends). a-long
    # (6 h) and b-long (5 h) run, then b-short (1 h) and a-short (2 h) come. Quota
    # aside, the cluster policy runs both short jobs in place of both long ones, and
    # pairs them across the queues (b-short in a-long's place), which quota cannot give:
    # both short jobs waited for good. Now each takes its own queue's lease, as the
    # simulator's queues admit (tests/unit/workloads/test_training_pass.py runs both)
    tag = uuid.uuid4().hex[:6]
    gpu_type, ns = f"PAIR-{tag.upper()}", namespace
    team_a, team_b = _solo_queue(f"a{tag}", gpu_type, 2), _solo_queue(f"b{tag}", gpu_type, 2)
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        with (
            _gpu_nodes(api, core, f"pn-{tag}", gpu_type, 1, per_node=4),
            _queues(custom, team_a, team_b),
        ):
            _team_local_queues(custom, ns, team_a, team_b)
            for name, queue, hours in (("a-long", "default", 6), ("b-long", "b", 5)):
                _submit(custom, ns, name, gpu_type, queue, hours=hours)
                _running(custom, ns, name, 60, f"{name} running")
            for name, queue, hours in (("b-short", "b", 1), ("a-short", "default", 2)):
                _submit(custom, ns, name, gpu_type, queue, hours=hours)
            _running(custom, ns, "a-short", 90, "a-short running in a-long's place")
            _running(custom, ns, "b-short", 90, "b-short running in b-long's place")
            for long, short, team in (("a-long", "a-short", team_a), ("b-long", "b-short", team_b)):
                name = team["metadata"]["name"]
                assert _status(custom, ns, long)["phase"] != "Running"
                why = f"{ns}/{short} (cluster policy's lease in queue {name})"
                _was_preempted(kube_cluster, core, ns, long, why=why, counted=("Lease", name))


def test_a_queue_admits_only_the_namespaces_its_selector_selects(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    # a LocalQueue in a namespace the Queue does not select gets nothing: the job waits
    # saying so; labelling the namespace (as a platform team would) admits it
    tag = uuid.uuid4().hex[:6]
    gpu_type, team, ns = f"NSSEL-{tag.upper()}", f"n{tag}", namespace
    queue = _solo_queue(team, gpu_type, 4)
    queue["spec"]["namespaceSelector"] = {"matchLabels": {"chronotope.dev/team": team}}
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        with _gpu_nodes(api, core, f"sn-{tag}", gpu_type, 1, per_node=4), _queues(custom, queue):
            custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "localqueues", _local_queue(ns, team)
            )
            _submit(custom, ns, "j1", gpu_type, "default")
            wait_for(lambda: _reason(_status(custom, ns, "j1")) == "NamespaceNotAllowed", 30, "j1")
            why = _status(custom, ns, "j1")["whyWaiting"]
            assert f"Queue {team}'s namespaceSelector does not select namespace {ns}" in why
            core.patch_namespace(ns, {"metadata": {"labels": {"chronotope.dev/team": team}}})
            _running(custom, ns, "j1", 60, "j1 running once its namespace is selected")


def test_a_team_below_its_fair_share_preempts_a_borrower_above_it(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    """Cohort: team a (2 GPUs), team b (2) and an idle team c (4), all `fairShare: Preempt`.

    a runs a1 on its quota and a2, a3 on c's (it borrows 4 of 8); b runs b1 on its own. b's
    next job would borrow 2 with nothing left to lend: with it b's share is 2/8, a's without
    a3 (its newest) 2/8, so a3 is checkpointed and stopped and b2 starts; a3 then waits, as
    with it back a's share (4/8) would be above b's."""
    tag = uuid.uuid4().hex[:6]
    gpu_type, cohort, ns = f"FAIR-{tag.upper()}", f"f{tag}", namespace
    team_a, team_b = f"{cohort}-a", f"{cohort}-b"

    def queue(name: str, gpus: int) -> dict[str, Any]:
        return _cohort_queue(name, cohort, gpu_type, gpus, {"fairShare": "Preempt"})

    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        with (
            _gpu_nodes(api, core, f"fn-{tag}", gpu_type, 1, per_node=8),
            _queues(custom, queue(team_a, 2), queue(team_b, 2), queue(f"{cohort}-c", 4)),
        ):
            for name, target in (("default", team_a), ("team-b", team_b)):
                local = _local_queue(ns, target)
                local["metadata"]["name"] = name
                custom.create_namespaced_custom_object(GROUP, VERSION, ns, "localqueues", local)
            for name in ("a1", "a2", "a3"):
                _submit(custom, ns, name, gpu_type, "default")
                _running(custom, ns, name, 60, f"{name} running")
                time.sleep(1.1)  # plan.startTime is to the second: a3 is the newest
            _submit(custom, ns, "b1", gpu_type, "team-b")
            _running(custom, ns, "b1", 60, "b1 running on team b's quota")
            wait_for(lambda: _usage(custom, team_a)[:2] == (6, 4), 30, "team a borrows 4")
            _submit(custom, ns, "b2", gpu_type, "team-b")
            _running(custom, ns, "b2", 90, "b2 running after a3 is stopped for b's fair share")
            why = f"{ns}/b2 (fair share of queue {team_b})"
            _was_preempted(kube_cluster, core, ns, "a3", why=why, counted=("FairShare", team_b))
            assert _status(custom, ns, "a1")["phase"] == "Running"  # only as many as needed
            assert _status(custom, ns, "a2")["phase"] == "Running"
            # a3 cannot take it back: it waits for quota, b2 keeps running
            wait_for(lambda: _reason(_status(custom, ns, "a3")) == "QuotaExceeded", 30, "a3 waits")
            assert _status(custom, ns, "b2")["phase"] == "Running"
            wait_for(lambda: _usage(custom, team_b)[:2] == (4, 2), 30, "team b borrows 2")
