"""TrainingJobs on the real control plane: gangs, waiting with reasons, scale, node loss."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from chronotope.kube.nodes import apply_nodes, wait_nodes_ready, wait_nodes_untainted
from chronotope.planners.profile import profile_to_data
from chronotope.sharing.assignment import GpuAssignment
from chronotope.sharing.labels import ZONE_LABEL
from chronotope.sim.clusterspec import ClusterSpec, node_manifests
from e2e.kubetest import KubeCluster, operator_metrics, scratch_namespace, wait_for

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "chronotope.dev", "v1alpha1", "trainingjobs"
SAILOR = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sailor" / "OPT-350"


def job(
    name: str, replicas: int, gpus: int, types: list[tuple[str, float]], **extra: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas,
        "gpu": {"count": gpus},
        "gpuTypes": [{"name": t, "relativeSpeed": s} for t, s in types],
        "estimate": {"referenceGpuType": types[0][0], "durationSeconds": 3600},
        "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
    }
    spec |= extra
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def _get(api: Any, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )
    return obj


def _why(api: Any, ns: str, name: str) -> str:
    """The job's `status.whyWaiting` ('' when it states none)."""
    return str((_get(api, ns, name).get("status") or {}).get("whyWaiting") or "")


def _bound_counts(core: client.CoreV1Api, ns: str) -> dict[str, tuple[int, int]]:
    """job -> (bound workers, workers) for the current gang of each job."""
    out: dict[str, list[int]] = {}
    for pod in core.list_namespaced_pod(ns).items:
        if pod.metadata.deletion_timestamp:
            continue
        key = pod.metadata.labels["chronotope.dev/pod-group"]
        size = int(pod.metadata.annotations["chronotope.dev/pod-group-size"])
        entry = out.setdefault(key, [0, size])
        entry[0] += 1 if pod.spec.node_name else 0
    return {k: (v[0], v[1]) for k, v in out.items()}


def _events(core: client.CoreV1Api, ns: str, name: str) -> dict[str, str]:
    """The job's events: reason -> a message of that reason."""
    items = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return {e.reason: e.message for e in items}


def _phase(api: Any, ns: str, name: str) -> str:
    return str((_get(api, ns, name).get("status") or {}).get("phase", ""))


def _wait_job(api: Any, ns: str, name: str, check: Any, *, timeout: float, what: str) -> None:
    """`wait_for(check)`; on a timeout the job's status, events and pods are in the failure."""
    try:
        wait_for(check, timeout, what)
    except AssertionError as exc:
        core = client.CoreV1Api(api)
        status = _get(api, ns, name).get("status") or {}
        shown = {k: status.get(k) for k in ("phase", "whyWaiting", "plan", "conditions")}
        events = [
            f"{e.reason}: {e.message}"
            for e in core.list_namespaced_event(
                ns, field_selector=f"involvedObject.name={name}"
            ).items
        ]
        pods = [
            (p.metadata.name, p.spec.node_name, p.status.phase, bool(p.metadata.deletion_timestamp))
            for p in core.list_namespaced_pod(ns).items
        ]
        raise AssertionError(f"{exc}; status {shown}; events {events}; pods {pods}") from None


def _wait_running(api: Any, ns: str, name: str, *, timeout: float = 60, what: str = "") -> None:
    """`_wait_job` until the job is Running."""
    _wait_job(
        api,
        ns,
        name,
        lambda: _phase(api, ns, name) == "Running",
        timeout=timeout,
        what=what or f"{name} running",
    )


def _run_elastic(
    api: Any,
    custom: client.CustomObjectsApi,
    ns: str,
    name: str,
    *,
    gpu_type: str,
    replicas: int,
    max_replicas: int,
) -> None:
    """Create an elastic one-GPU-per-worker job and wait until it runs."""
    elastic = job(
        name,
        replicas,
        1,
        [(gpu_type, 1.0)],
        minReplicas=1,
        maxReplicas=max_replicas,
        checkpoint={"path": f"/ckpt/{name}"},
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, elastic)
    wait_for(lambda: _phase(api, ns, name) == "Running", 60, f"{name} running")


@pytest.fixture
def jobs_api(
    kube_cluster: KubeCluster, chronotope_operator: None
) -> Iterator[tuple[Any, client.CustomObjectsApi, client.CoreV1Api]]:
    with kube_cluster.api_client() as api:
        yield api, client.CustomObjectsApi(api), client.CoreV1Api(api)


def test_competing_jobs_never_bind_a_partial_gang(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    api, custom, core = jobs_api
    fast, slow = f"FAST-{namespace[-6:].upper()}", f"SLOW-{namespace[-6:].upper()}"
    # GPU types only this test uses, so other tests' leftovers cannot take its GPUs
    with (
        _gpu_nodes(api, core, f"cf-{namespace[-6:]}", fast, 2, per_node=8),
        _gpu_nodes(api, core, f"cs-{namespace[-6:]}", slow, 2, per_node=8),
    ):
        _compete(api, custom, core, namespace, fast=fast, slow=slow)


PARTIAL_GRACE_S = 20.0
"""How long a gang may be seen part-bound while kube-scheduler binds its pods in turn."""


def _compete(
    api: Any,
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    ns: str,
    *,
    fast: str,
    slow: str,
) -> None:
    types = [(fast, 2.0), (slow, 1.0)]
    for name in ("alpha", "beta", "gamma"):  # each 2 x 8 GPUs; 32 such GPUs exist: two fit
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job(name, 2, 8, types))
    deadline = time.monotonic() + 60
    phases: dict[str, str] = {}
    # kube-scheduler binds a gang's pods one scheduling cycle at a time, so a gang is seen
    # part-bound for a moment (longer on a busy machine); a gang that stays part-bound
    # (some workers bound, the rest never) is the split this test forbids
    partial_since: dict[str, float] = {}
    while time.monotonic() < deadline:
        now = time.monotonic()
        for gang, (bound, size) in _bound_counts(core, ns).items():
            if bound in (0, size):
                partial_since.pop(gang, None)
                continue
            since = partial_since.setdefault(gang, now)
            assert now - since < PARTIAL_GRACE_S, f"gang {gang} stays part-bound: {bound}/{size}"
        phases = {
            n: (_get(api, ns, n).get("status") or {}).get("phase", "")
            for n in ("alpha", "beta", "gamma")
        }
        if sorted(phases.values()) == ["Running", "Running", "Waiting"]:
            break
        time.sleep(1)
    assert sorted(phases.values()) == ["Running", "Running", "Waiting"], phases
    waiting = next(n for n, p in phases.items() if p == "Waiting")
    status = _get(api, ns, waiting)["status"]
    assert f"waiting for {fast}: it frees up" in status["whyWaiting"]
    assert "nothing fits now" in status["whyWaiting"]
    running = next(n for n, p in phases.items() if p == "Running")
    plan = _get(api, ns, running)["status"]["plan"]
    assert plan["workers"] == 2
    assert plan["totalGpus"] == 16
    assert plan["gpuType"] in (fast, slow)
    # the faster type goes first
    assert fast in {
        _get(api, ns, n)["status"]["plan"]["gpuType"] for n, p in phases.items() if p == "Running"
    }


def test_impossible_job_says_why_and_does_not_block_the_next(
    kube_cluster: KubeCluster,
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api],
    namespace: str,
) -> None:
    api, custom, _ = jobs_api
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, job("needs-b200", 1, 8, [("B200", 1.0)])
    )
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, job("small", 1, 1, [("T4", 1.0)])
    )
    status = wait_for(
        lambda: (s := _get(api, namespace, "needs-b200").get("status")) and s.get("phase") and s,
        60,
        "status on the impossible job",
    )
    assert status["phase"] == "Pending"
    assert "no node has B200 GPUs" in status["whyWaiting"]
    schedulable = next(c for c in status["conditions"] if c["type"] == "Schedulable")
    assert (schedulable["status"], schedulable["reason"]) == ("False", "Unschedulable")
    wait_for(
        lambda: _phase(api, namespace, "small") == "Running",
        60,
        "the job behind it to run",
    )
    metrics = operator_metrics(kube_cluster)
    assert 'chronotope_trainingjob_events_total{reason="Unschedulable"}' in metrics
    assert 'chronotope_trainingjobs{phase="Pending"}' in metrics
    assert 'chronotope_trainingjob_waiting_gpus{gpu_type="B200"} 8.0' in metrics
    assert 'chronotope_trainingjob_reconcile_seconds_count{result="ok"}' in metrics


def test_kubectl_scale_resizes_an_elastic_job(
    kube_cluster: KubeCluster,
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api],
    namespace: str,
) -> None:
    api, custom, core = jobs_api
    # a GPU type only this test's nodes have (two nodes of 4, as the demo's L4s), so no
    # other test's leftovers hold GPUs the resized gang needs
    model = f"SCALE-{namespace[-6:].upper()}"
    with _gpu_nodes(api, core, f"sc-{namespace[-6:]}", model, 2, per_node=4):
        _run_elastic(api, custom, namespace, "elastic", gpu_type=model, replicas=2, max_replicas=4)
        kube_cluster.run_kubectl("scale", "-n", namespace, "trainingjob/elastic", "--replicas=4")

        def resized() -> bool:
            return _running_with(api, namespace, "elastic", 4)

        _wait_job(
            api,
            namespace,
            "elastic",
            resized,
            timeout=90,
            what="elastic job running with 4 workers",
        )
        pods = [
            p
            for p in core.list_namespaced_pod(namespace).items
            if not p.metadata.deletion_timestamp
        ]
        assert len(pods) == 4
        env = {e.name: e.value for e in pods[0].spec.containers[0].env}
        assert env["WORLD_SIZE"] == "4"
        assert env["MASTER_ADDR"] == f"elastic-0.elastic.{namespace}.svc"
        events = core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=elastic"
        ).items
        assert any(e.reason == "Resizing" for e in events)


@contextlib.contextmanager
def _gpu_nodes(
    api: Any,
    core: client.CoreV1Api,
    pool: str,
    model: str | None,
    count: int,
    *,
    per_node: int = 1,
    cpu: str = "32",
    zone: str = "zone-a",
    max_pods: int = 110,
) -> Iterator[list[str]]:
    """kwok GPU nodes of a type only this test uses; deleted afterwards (`model` None: no GPUs)."""
    gpu = {"model": model, "perNode": per_node, "memoryMiB": 40960} if model else None
    spec = ClusterSpec.model_validate(
        {
            "name": "extra",
            "pools": [
                {
                    "name": pool,
                    "count": count,
                    "gpu": gpu,
                    "cpu": cpu,
                    "zone": zone,
                    "maxPods": max_pods,
                }
            ],
        }
    )
    nodes = node_manifests(spec)
    apply_nodes(api, nodes)
    names = sorted(n["metadata"]["name"] for n in nodes)
    wait_nodes_ready(api, set(names), 60)
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(client.exceptions.ApiException):
                core.delete_node(name)


def _running_with(api: Any, ns: str, name: str, workers: int) -> bool:
    status = _get(api, ns, name).get("status") or {}
    return status.get("phase") == "Running" and (status.get("plan") or {}).get("workers") == workers


def test_deleting_a_node_shrinks_an_elastic_job(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    api, custom, core = jobs_api
    model = f"ELASTIC-{namespace[-6:].upper()}"  # a GPU type only this test's nodes have
    with _gpu_nodes(api, core, f"el-{namespace[-6:]}", model, 3) as names:
        elastic = job(
            "shrinky",
            3,
            1,
            [(model, 1.0)],
            minReplicas=1,
            maxReplicas=3,
            checkpoint={"path": "/ckpt/shrinky"},
        )
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, copy.deepcopy(elastic)
        )
        wait_for(
            lambda: _phase(api, namespace, "shrinky") == "Running",
            60,
            "job running on 3 nodes",
        )
        victim = names[0]
        core.delete_node(victim)
        wait_for(
            lambda: _running_with(api, namespace, "shrinky", 2),
            120,
            "job running again with 2 workers",
        )
        status = _get(api, namespace, "shrinky")["status"]
        assert status["restarts"] >= 1
        assert all(p["node"] != victim for p in status["placement"])


def test_added_node_grows_and_cordon_moves_an_elastic_job(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    api, custom, core = jobs_api
    model = f"GROW-{namespace[-6:].upper()}"
    with _gpu_nodes(api, core, f"gr-{namespace[-6:]}", model, 2):
        elastic = job(
            "growy",
            3,
            1,
            [(model, 1.0)],
            minReplicas=1,
            maxReplicas=3,
            checkpoint={"path": "/ckpt/growy"},
        )
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, elastic)
        wait_for(
            lambda: _running_with(api, namespace, "growy", 2),
            60,
            "job running with the 2 workers that fit",
        )
        with _gpu_nodes(api, core, f"gr2-{namespace[-6:]}", model, 1):
            wait_for(
                lambda: _running_with(api, namespace, "growy", 3),
                90,
                "job grown to 3 workers on the added node",
            )
            events = core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=growy"
            ).items
            assert any(e.reason == "Replanning" and "free now" in e.message for e in events)
            grown = _get(api, namespace, "growy")["status"]
            assert grown["completedFraction"] > 0  # the first plan's progress is kept
            placement = grown["placement"]
            cordoned = placement[0]["node"]
            core.patch_node(cordoned, {"spec": {"unschedulable": True}})

            def moved() -> bool:
                status = _get(api, namespace, "growy").get("status") or {}
                return (
                    status.get("phase") == "Running"
                    and (status.get("plan") or {}).get("workers") == 2
                    and all(p["node"] != cordoned for p in status.get("placement") or [])
                )

            wait_for(moved, 90, "job moved off the cordoned node (2 workers)")
            events = core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=growy"
            ).items
            assert any("cordoned" in e.message for e in events)


def test_an_elastic_job_grows_when_another_workload_frees_its_gpus(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    # no node changes and none of the job's own pods do: another pod going away is
    # what frees the GPUs the gang below its size grows onto
    api, custom, core = jobs_api
    model = f"FREED-{namespace[-6:].upper()}"
    with _gpu_nodes(api, core, f"fr-{namespace[-6:]}", model, 1, per_node=4):
        blocker = {
            "metadata": {"name": "blocker"},
            "spec": {
                "schedulerName": "chronotope",
                "nodeSelector": {"nvidia.com/gpu.product": model},
                "containers": [
                    {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
                ],
            },
        }
        core.create_namespaced_pod(namespace, blocker)
        wait_for(
            lambda: core.read_namespaced_pod("blocker", namespace).spec.node_name,
            60,
            "the blocker pod bound",
        )
        elastic = job(
            "freed",
            4,
            1,
            [(model, 1.0)],
            minReplicas=1,
            maxReplicas=4,
            checkpoint={"path": "/ckpt/freed"},
        )
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, elastic)
        wait_for(
            lambda: _running_with(api, namespace, "freed", 2),
            60,
            "job running with the 2 workers that fit",
        )
        core.delete_namespaced_pod("blocker", namespace, grace_period_seconds=0)
        _wait_job(
            api,
            namespace,
            "freed",
            lambda: _running_with(api, namespace, "freed", 4),
            timeout=90,
            what="job grown to 4 workers on the GPUs the blocker left",
        )
        events = core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=freed"
        ).items
        assert any(e.reason == "Replanning" and "free now" in e.message for e in events)


def test_model_profile_missing_then_created_plans_from_the_profile(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    api, custom, core = jobs_api
    model = f"PROF-{namespace[-6:].upper()}"
    with _gpu_nodes(api, core, f"pr-{namespace[-6:]}", model, 3, per_node=2):
        profiled = job(
            "profiled",
            4,
            1,
            [(model, 1.0)],
            minReplicas=1,
            maxReplicas=4,
            priority=10,
            queue="shared",
            checkpoint={"path": "/ckpt/profiled"},
            parallelism={"modelProfile": "opt-test", "pipelineDegrees": [1, 2]},
        )
        del profiled["spec"]["gpuTypes"][0]["relativeSpeed"]  # the profile gives the speed
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, profiled)
        plain = job("plain", 2, 1, [(model, 1.0)], queue="shared")  # behind it in the queue
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, plain)
        status = wait_for(
            lambda: (s := _get(api, namespace, "profiled").get("status")) and s.get("phase") and s,
            60,
            "status on the job whose profile is missing",
        )
        assert status["phase"] == "Pending"
        assert f"no ConfigMap {namespace}/opt-test" in status["whyWaiting"]
        schedulable = next(c for c in status["conditions"] if c["type"] == "Schedulable")
        assert (schedulable["status"], schedulable["reason"]) == ("False", "ProfileMissing")
        wait_for(lambda: _phase(api, namespace, "plain") == "Running", 60, "the job behind it")

        data = profile_to_data(SAILOR, SAILOR / "training_config.json", {"A100-40": model})
        core.create_namespaced_config_map(
            namespace, {"metadata": {"name": "opt-test"}, "data": data}
        )
        wait_for(
            lambda: _phase(api, namespace, "profiled") == "Running",
            90,
            "the job running once its profile exists",
        )
        plan = _get(api, namespace, "profiled")["status"]["plan"]
        assert plan["planner"].startswith("profile opt-test:")
        assert plan["predictedSamplesPerSecond"] > 0
        assert 1 <= plan["workers"] <= 4  # 6 GPUs, 2 held by the job behind it
        par = plan["parallelism"]
        assert par["data"] * par["tensor"] * par["pipeline"] == plan["workers"]
        pods = core.list_namespaced_pod(
            namespace, label_selector="chronotope.dev/job=profiled"
        ).items
        env = {e.name: e.value for e in pods[0].spec.containers[0].env}
        assert env["CHRONOTOPE_MICRO_BATCH"] == str(par["microBatchSize"])
        assert env["CHRONOTOPE_PIPELINE_PARALLEL"] == str(par["pipeline"])


def test_deadline_job_preempts_a_best_effort_one(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    api, custom, core = jobs_api
    v100 = [("V100-SXM2-32GB", 1.0)]
    best_effort = job("besteffort", 4, 4, v100, preemptible=True, priority=0)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, best_effort)
    wait_for(
        lambda: _phase(api, namespace, "besteffort") == "Running",
        60,
        "best-effort job holding every V100",
    )
    deadline = (datetime.now(UTC) + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    urgent = job(
        "urgent", 2, 4, v100, priority=100, utility={"function": "Step", "deadline": deadline}
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, urgent)
    wait_for(
        lambda: _phase(api, namespace, "urgent") == "Running",
        120,
        "the deadline job running",
    )

    assert "Preempting" in _events(core, namespace, "urgent")
    wait_for(
        lambda: "Preempted" in _events(core, namespace, "besteffort"),
        60,
        "Preempted event on the victim",
    )
    victim = _get(api, namespace, "besteffort")["status"]
    assert victim["phase"] in ("Waiting", "Resizing", "Running")  # re-queued (maybe smaller)
    assert victim["restarts"] >= 1


def test_a_long_job_gives_its_lease_to_much_shorter_work(
    kube_cluster: KubeCluster,
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api],
    namespace: str,
) -> None:
    # the cluster policy's lease, as `chronotope simulate training` runs it: a 10 h job
    # holding every V100 is checkpointed and stopped when a 10 min job arrives
    api, custom, core = jobs_api
    v100 = [("V100-SXM2-32GB", 1.0)]
    long = job("long", 4, 4, v100, checkpoint={"path": "/ckpt/long"})
    long["spec"]["estimate"]["durationSeconds"] = 36000
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, long)
    wait_for(lambda: _phase(api, namespace, "long") == "Running", 60, "the long job running")
    short = job("short", 4, 4, v100)
    short["spec"]["estimate"]["durationSeconds"] = 600
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, short)
    _wait_running(
        api, namespace, "short", timeout=120, what="the short job running on the long job's V100s"
    )

    given = _events(core, namespace, "long")
    assert "LeaseGivenUp" in given
    assert f"gives its V100-SXM2-32GB GPUs to {namespace}/short" in given["LeaseGivenUp"]
    status = _get(api, namespace, "long")["status"]
    assert status["phase"] in ("Waiting", "Resizing")
    assert status["restarts"] >= 1
    assert 'chronotope_trainingjob_preemptions_total{cause="Lease",queue=""}' in (
        operator_metrics(kube_cluster)
    )


def _half_held(api: Any, custom: client.CustomObjectsApi, namespace: str, gpu: str) -> None:
    """A higher-priority job holds 2 GPUs on each of the two nodes of type `gpu`."""
    other = job("other", 2, 2, [(gpu, 1.0)], placement={"strategy": "Spread"}, priority=5)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, other)
    _wait_running(api, namespace, "other", timeout=60)


def _kept_lease(api: Any, core: client.CoreV1Api, namespace: str, name: str, gpu: str) -> None:
    """The job runs on `gpu` as it started: it never gave its lease up."""
    assert "LeaseGivenUp" not in _events(core, namespace, name)
    status = _get(api, namespace, name)["status"]
    assert (status["phase"], status["plan"]["gpuType"]) == ("Running", gpu), status
    assert status.get("restarts", 0) == 0, status


@pytest.mark.parametrize("slower", [False, True], ids=["fast-only", "or-a-slower-type"])
def test_a_lease_is_kept_when_the_shorter_job_would_not_fit_the_gpus_it_frees(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str, slower: bool
) -> None:
    # two nodes of 4 GPUs of a fast type, each running one 2-GPU worker of a long,
    # checkpointing job and one of a higher-priority job; a short job of one 4-GPU worker
    # that accepts the fast type and a slow one (4 GPUs free). The policy counts the long
    # job's 4 GPUs as one pool and would give its lease to the short job, but once it
    # stopped each node would have 2 free: the short job would not fit. It runs on the
    # slow type and the long job keeps its lease (before: the long job was stopped for
    # nothing, `LeaseGivenUp`, while the short job waited for the fast type). With
    # `slower`, the long job also accepts a slower type with 4 GPUs idle, and the policy
    # would move it there to free the fast GPUs: with nobody to take them, it stays
    # (before stop 65: moved, `LeaseGivenUp`, restarted on the slower type)
    api, custom, core = jobs_api
    tag = namespace[-6:]
    fast, slow, slowest = (f"{what}-{tag.upper()}" for what in ("LFAST", "LSLOW", "LSLOWEST"))
    with (
        _gpu_nodes(api, core, f"lf-{tag}", fast, 2, per_node=4) as fast_nodes,
        _gpu_nodes(api, core, f"ls-{tag}", slow, 1, per_node=4) as slow_nodes,
        _gpu_nodes(api, core, f"lx-{tag}", slowest, 1, per_node=4) as more,
    ):
        wait_nodes_untainted(api, set(fast_nodes + slow_nodes + more), 60)
        _half_held(api, custom, namespace, fast)
        spread = {"strategy": "Spread"}
        types = [(fast, 1.0), (slowest, 0.5)] if slower else [(fast, 1.0)]
        long = job("long", 2, 2, types, placement=spread, checkpoint={"path": "/c/l"})
        long["spec"]["estimate"]["durationSeconds"] = 36000
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, long)
        _wait_running(api, namespace, "long", timeout=60)
        short = job("short", 1, 4, [(fast, 1.0), (slow, 0.5)])
        short["spec"]["estimate"]["durationSeconds"] = 600
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, short)
        _wait_running(api, namespace, "short", timeout=60, what=f"short running on {slow}")
        assert _get(api, namespace, "short")["status"]["plan"]["gpuType"] == slow
        _kept_lease(api, core, namespace, "long", fast)


def test_a_running_job_is_not_moved_to_a_type_its_workers_would_not_fit(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    # a checkpointing job of one 4-GPU worker runs on the slow type; the fast one (4x)
    # has 4 free GPUs, 2 on each of two nodes. The policy would move it there, but its
    # worker would not fit: it keeps running (before: `LeaseGivenUp`, a restart on the
    # slow type, and the same move at the next pass)
    api, custom, core = jobs_api
    tag = namespace[-6:]
    fast, slow, third = (f"{what}-{tag.upper()}" for what in ("MFAST", "MSLOW", "MTHIRD"))
    with (
        _gpu_nodes(api, core, f"mf-{tag}", fast, 2, per_node=4) as fast_nodes,
        _gpu_nodes(api, core, f"ms-{tag}", slow, 1, per_node=4) as slow_nodes,
        _gpu_nodes(api, core, f"mt-{tag}", third, 1, per_node=1) as third_nodes,
    ):
        wait_nodes_untainted(api, set(fast_nodes + slow_nodes + third_nodes), 60)
        _half_held(api, custom, namespace, fast)
        mover = job("mover", 1, 4, [(fast, 1.0), (slow, 0.25)], checkpoint={"path": "/c/m"})
        mover["spec"]["estimate"]["durationSeconds"] = 36000
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, mover)
        _wait_running(api, namespace, "mover", timeout=60, what=f"mover running on {slow}")
        # a later job's start makes more passes, each deciding the mover's lease again
        later = job("later", 1, 1, [(third, 1.0)])
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, later)
        _wait_running(api, namespace, "later", timeout=60)
        _kept_lease(api, core, namespace, "mover", slow)


def test_operator_restarted_mid_resize_converges(
    kube_cluster: KubeCluster,
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api],
    namespace: str,
) -> None:
    api, custom, core = jobs_api
    model = f"RESTART-{namespace[-6:].upper()}"  # nodes of its own type, as the scale test
    with _gpu_nodes(api, core, f"rs-{namespace[-6:]}", model, 2, per_node=4):
        _run_elastic(api, custom, namespace, "restarty", gpu_type=model, replicas=2, max_replicas=4)
        kube_cluster.run_kubectl("scale", "-n", namespace, "trainingjob/restarty", "--replicas=3")
        assert kube_cluster.local is not None
        kube_cluster.local.stop_component("chronotope-operator")  # killed mid-resize
        kube_cluster.local.restart_operator()  # same identity, flags and webhook

        def converged() -> bool:
            status = _get(api, namespace, "restarty").get("status") or {}
            pods = [
                p
                for p in core.list_namespaced_pod(namespace).items
                if not p.metadata.deletion_timestamp
            ]
            generations = {p.metadata.labels["chronotope.dev/gang-generation"] for p in pods}
            return (
                status.get("phase") == "Running"
                and (status.get("plan") or {}).get("workers") == 3
                and len(pods) == 3
                and len(generations) == 1
            )

        _wait_job(
            api,
            namespace,
            "restarty",
            converged,
            timeout=120,
            what="one consistent 3-worker gang after the restart",
        )


def test_jobs_that_could_both_start_are_planned_jointly(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    api, custom, core = jobs_api
    tag = namespace[-6:]
    fast, slow = f"FAST-{tag.upper()}", f"SLOW-{tag.upper()}"

    def in_phase(name: str, phase: str) -> Callable[[], bool]:
        return lambda: _phase(api, namespace, name) == phase

    with (
        _gpu_nodes(api, core, f"fa-{tag}", fast, 1, per_node=2) as fast_nodes,
        _gpu_nodes(api, core, f"sl-{tag}", slow, 1, per_node=2) as slow_nodes,
    ):
        for node in fast_nodes + slow_nodes:  # both jobs wait until the GPUs appear at once
            core.patch_node(node, {"spec": {"unschedulable": True}})
        deadline = (datetime.now(UTC) + timedelta(minutes=45)).strftime("%Y-%m-%dT%H:%M:%SZ")
        jobs = {
            # alone, it would take the fast GPUs (twice the speed)
            "flexible": job("flexible", 1, 2, [(fast, 2.0), (slow, 1.0)], queue="a"),
            # 30 min on the fast GPUs meets its 45 min deadline; the slow ones do not exist for it
            "urgent": job(
                "urgent",
                1,
                2,
                [(fast, 2.0)],
                queue="b",
                utility={"function": "Step", "deadline": deadline},
            ),
        }
        for body in jobs.values():
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        for name in jobs:
            wait_for(in_phase(name, "Waiting"), 60, f"{name} waiting")
        for node in fast_nodes + slow_nodes:
            core.patch_node(node, {"spec": {"unschedulable": False}})
        for name in jobs:
            wait_for(in_phase(name, "Running"), 90, f"{name} running")
        assert _get(api, namespace, "urgent")["status"]["plan"]["gpuType"] == fast
        assert _get(api, namespace, "flexible")["status"]["plan"]["gpuType"] == slow
        started = [
            e.message for e in core.list_namespaced_event(namespace).items if e.reason == "Started"
        ]
        assert any("joint plan over 2 job(s)" in m for m in started), started
        # the plan's nodes and GPUs reach the workers of a job it started, and the
        # extender honours them
        planned_jobs = {
            e.involved_object.name
            for e in core.list_namespaced_event(namespace).items
            if e.reason == "Started" and "joint plan over 2 job(s)" in (e.message or "")
        }
        workers = [
            p
            for p in core.list_namespaced_pod(namespace).items
            if (p.metadata.labels or {}).get("chronotope.dev/job") in planned_jobs
        ]
        assert workers
        for pod in workers:
            annotations = pod.metadata.annotations or {}
            assert pod.spec.node_name == annotations["chronotope.dev/planned-node"]
            assigned = GpuAssignment.from_annotations(annotations).gpu_indices
            planned = tuple(int(g) for g in annotations["chronotope.dev/planned-gpus"].split(","))
            assert assigned == planned


def test_jobs_are_planned_only_on_nodes_their_pods_may_use(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    # a team's dedicated node (tainted) of the fast type, and an open node of the slow one:
    # before, a job that accepts both was planned on the fast node, whose taint its pods
    # do not tolerate; they stayed Pending and the stuck rule re-planned it there again
    api, custom, core = jobs_api
    tag = namespace[-6:]
    fast, slow = f"FAST-{tag.upper()}", f"SLOW-{tag.upper()}"
    taint = {"key": "dedicated", "value": f"team-{tag}", "effect": "NoSchedule"}
    toleration = {**taint, "operator": "Equal"}
    with (
        _gpu_nodes(api, core, f"fa-{tag}", fast, 1, per_node=2) as fast_nodes,
        _gpu_nodes(api, core, f"sl-{tag}", slow, 1, per_node=2),
    ):
        wait_nodes_untainted(api, set(fast_nodes), 60)
        core.patch_node(fast_nodes[0], {"spec": {"taints": [taint]}})
        tolerant = job("tolerant", 1, 1, [(fast, 2.0)])
        tolerant["spec"]["template"]["spec"]["tolerations"] = [toleration]
        jobs = {
            "open": job("open", 1, 1, [(fast, 2.0), (slow, 1.0)]),
            "pinned": job("pinned", 1, 1, [(fast, 2.0)]),
            "tolerant": tolerant,
        }
        for body in jobs.values():
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        for name in ("open", "tolerant"):
            _wait_running(api, namespace, name)
        assert _get(api, namespace, "open")["status"]["plan"]["gpuType"] == slow
        assert _get(api, namespace, "tolerant")["status"]["plan"]["gpuType"] == fast
        status = _get(api, namespace, "pinned")["status"]
        assert status["phase"] == "Pending", status
        assert f"taint dedicated=team-{tag}:NoSchedule not tolerated" in status["whyWaiting"]
        assert not [
            p
            for p in core.list_namespaced_pod(namespace).items
            if (p.metadata.labels or {}).get("chronotope.dev/job") == "pinned"
        ]
        # the taint goes: the node change makes a new pass, and the pinned job starts there
        core.patch_node(fast_nodes[0], {"spec": {"taints": None}})
        _wait_running(api, namespace, "pinned", what="pinned running once the taint is gone")


def test_a_worker_is_planned_where_its_cpu_fits(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    # the fast node has 2 free GPUs but CPU for one 3-core worker: before, the second
    # job was planned there by its GPUs, and its worker stayed Pending for CPU
    api, custom, core = jobs_api
    tag = namespace[-6:]
    fast, slow = f"FAST-{tag.upper()}", f"SLOW-{tag.upper()}"
    template = {
        "spec": {
            "containers": [
                {
                    "name": "w",
                    "image": "registry.example/t:1",
                    "resources": {"requests": {"cpu": "3"}},
                }
            ]
        }
    }
    with (
        _gpu_nodes(api, core, f"fa-{tag}", fast, 1, per_node=2, cpu="4"),
        _gpu_nodes(api, core, f"sl-{tag}", slow, 1, per_node=2),
    ):
        first = job("first", 1, 1, [(fast, 2.0)], template=template)
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, first)
        _wait_running(api, namespace, "first")
        second = job("second", 1, 1, [(fast, 2.0), (slow, 1.0)], template=template)
        pinned = job("pinned", 1, 1, [(fast, 2.0)], template=template)
        for body in (second, pinned):
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        _wait_running(api, namespace, "second")
        assert _get(api, namespace, "second")["status"]["plan"]["gpuType"] == slow
        status = _get(api, namespace, "pinned")["status"]
        assert status["phase"] == "Waiting", status
        assert "too little free CPU or memory for a worker: 3000m CPU" in status["whyWaiting"]


@contextlib.contextmanager
def _fast_and_slow(
    api: Any,
    core: client.CoreV1Api,
    namespace: str,
    *,
    zones: bool = False,
    per_node: int = 1,
    fast_max_pods: int = 110,
) -> Iterator[tuple[str, str, list[str], list[str]]]:
    """One node of a fast and of a slow GPU type of the test's own, untainted.

    `zones`: each in a zone of its own (else both in zone-a); `per_node`: GPUs each
    has; `fast_max_pods`: the pods the fast node takes.
    """
    tag = namespace[-6:]
    fast, slow = f"FAST-{tag.upper()}", f"SLOW-{tag.upper()}"
    fast_zone, slow_zone = (f"fz-{tag}", f"sz-{tag}") if zones else ("zone-a", "zone-a")
    with (
        _gpu_nodes(
            api,
            core,
            f"fa-{tag}",
            fast,
            1,
            per_node=per_node,
            zone=fast_zone,
            max_pods=fast_max_pods,
        ) as fast_nodes,
        _gpu_nodes(
            api, core, f"sl-{tag}", slow, 1, per_node=per_node, zone=slow_zone
        ) as slow_nodes,
    ):
        wait_nodes_untainted(api, set(fast_nodes + slow_nodes), 60)
        yield fast, slow, fast_nodes, slow_nodes


def test_a_gang_kube_scheduler_will_not_bind_is_re_planned_off_that_node(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    # the worker mounts an in-tree AWS EBS disk inline, and a pod on the fast node mounts
    # it already: kube-scheduler's VolumeRestrictions filter refuses the fast node ("node(s)
    # had no available disk"). The plan does not read in-tree disk volumes, so it plans
    # the fast node; the stuck rule moves the job off it (before `status.avoidNodes`, it
    # re-planned the job there again, for ever)
    api, custom, core = jobs_api
    disk = [{"name": "disk", "awsElasticBlockStore": {"volumeID": f"vol-{namespace[-6:]}"}}]
    with _fast_and_slow(api, core, namespace) as (fast, slow, fast_nodes, slow_nodes):
        _run(core, namespace, _bare_pod("holder", fast_nodes[0], "holder", disk))
        wired = job("wired", 1, 1, [(fast, 2.0), (slow, 1.0)])
        wired["spec"]["template"]["spec"]["volumes"] = disk
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, wired)
        _wait_running(api, namespace, "wired", timeout=150, what="wired running off the node")
        status = _get(api, namespace, "wired")["status"]
        assert status["plan"]["gpuType"] == slow
        assert [p["node"] for p in status["placement"]] == slow_nodes
        assert not status.get("avoidNodes")  # placed: cleared
        replanned = _events(core, namespace, "wired")["Replanning"]
        assert "no available disk" in replanned, replanned
        assert replanned.endswith(f"re-planning off node(s) {fast_nodes[0]}"), replanned


def test_a_gang_whose_csi_driver_attaches_no_more_volumes_on_the_fast_node_starts_on_the_slow(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    # the worker mounts a claim bound to a CSI volume of a driver the fast node's CSINode
    # allows no volume (`allocatable.count: 0`): kube-scheduler's NodeVolumeLimits
    # filter refuses it ("node(s) exceed max volume count"). The plan reads the CSINodes:
    # the job starts at once on the slow node. Before stop 62 it was planned on the fast
    # node and the stuck rule moved it after 45 s
    api, custom, core = jobs_api
    tag = namespace[-6:]
    storage = client.StorageV1Api(api)
    driver, volume = f"limits-{tag}.example.com", f"attach-{tag}"

    def bound() -> bool:
        got = core.read_namespaced_persistent_volume_claim("attached", namespace)
        return bool(got.status and got.status.phase == "Bound")

    with _fast_and_slow(api, core, namespace) as (fast, slow, fast_nodes, slow_nodes):
        try:
            limit = {"name": driver, "nodeID": fast_nodes[0], "allocatable": {"count": 0}}
            storage.create_csi_node(
                {"metadata": {"name": fast_nodes[0]}, "spec": {"drivers": [limit]}}
            )
            core.create_persistent_volume(
                {
                    "metadata": {"name": volume},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteMany"],
                        "storageClassName": "",
                        "csi": {"driver": driver, "volumeHandle": volume},
                        "claimRef": {"namespace": namespace, "name": "attached"},
                    },
                }
            )
            core.create_namespaced_persistent_volume_claim(
                namespace,
                {
                    "metadata": {"name": "attached"},
                    "spec": {
                        "accessModes": ["ReadWriteMany"],
                        "storageClassName": "",
                        "volumeName": volume,
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                },
            )
            wait_for(bound, 60, "the claim bound")
            wired = job("wired", 1, 1, [(fast, 2.0), (slow, 1.0)])
            pod = wired["spec"]["template"]["spec"]
            pod["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "attached"}}]
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, wired)
            _started_at_once_on(api, core, namespace, "wired", gpu=slow, nodes=slow_nodes)
        finally:
            with contextlib.suppress(client.exceptions.ApiException):
                storage.delete_csi_node(fast_nodes[0])
            with contextlib.suppress(client.exceptions.ApiException):
                core.delete_persistent_volume(volume)


@pytest.mark.parametrize(
    "case",
    [("example.com/nic", None, "1", "1"), ("ephemeral-storage", "5Gi", "100Gi", "10Gi")],
    ids=["extended resource", "ephemeral-storage"],
)
def test_a_gang_asking_a_resource_the_fast_node_lacks_starts_where_it_fits(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api],
    namespace: str,
    case: tuple[str, str | None, str, str],
) -> None:
    # the worker asks a resource (set on the kwok nodes' status) the fast node has none
    # or too little of: kube-scheduler's NodeResourcesFit refuses it ("Insufficient
    # example.com/nic"). The plan reads every resource the workers request: the job
    # starts at once on the slow node. Before stop 62 it was planned on the fast node
    # and the stuck rule moved it after 45 s
    api, custom, core = jobs_api
    resource, fast_has, slow_has, asked = case  # what each node has, what a worker asks
    with _fast_and_slow(api, core, namespace) as (fast, slow, fast_nodes, slow_nodes):
        for name, has in ((fast_nodes[0], fast_has), (slow_nodes[0], slow_has)):
            if has is not None:
                amount = {resource: has}
                core.patch_node_status(
                    name, {"status": {"capacity": amount, "allocatable": amount}}
                )
        wired = job("wired", 1, 1, [(fast, 2.0), (slow, 1.0)])
        container = wired["spec"]["template"]["spec"]["containers"][0]
        container.setdefault("resources", {}).setdefault("limits", {})[resource] = asked
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, wired)
        _started_at_once_on(api, core, namespace, "wired", gpu=slow, nodes=slow_nodes)


@pytest.mark.parametrize("workers", [1, 2], ids=["full", "one slot for two workers"])
def test_a_gang_keeps_off_a_node_whose_pod_capacity_is_used_up(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str, workers: int
) -> None:
    # the fast node takes `workers` pods (`maxPods`) and runs one already:
    # kube-scheduler's NodeResourcesFit filter admits fewer workers than its free GPUs
    # hold ("Too many pods"). The plan counts the pods there: the job starts at once on
    # the slow node. Before (a full node: stop 61; one slot for two: stop 62) it was
    # planned on the fast node and the stuck rule moved it after 45 s
    api, custom, core = jobs_api
    with _fast_and_slow(api, core, namespace, per_node=workers, fast_max_pods=workers) as (
        fast,
        slow,
        fast_nodes,
        slow_nodes,
    ):
        _run(core, namespace, _bare_pod("filler", fast_nodes[0], "filler"))
        crowded = job("crowded", workers, 1, [(fast, 2.0), (slow, 1.0)])
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, crowded)
        _started_at_once_on(api, core, namespace, "crowded", gpu=slow, nodes=slow_nodes * workers)
        if workers == 1:  # a job only the full node's type suits says why it waits
            pinned = job("pinned", 1, 1, [(fast, 1.0)])
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, pinned)
            wait_for(
                lambda: "have idle GPUs but no pod slot left" in _why(api, namespace, "pinned"),
                60,
                "pinned saying its node is full",
            )


@pytest.mark.parametrize("rule", ["spread", "anti-affinity"])
def test_a_gang_that_takes_one_worker_per_zone_starts_where_the_zones_hold_it(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str, rule: str
) -> None:
    # the job's two workers spread one per zone (maxSkew 1, counting themselves), or
    # keep out of each other's zone (a required pod anti-affinity on the zone matching
    # their own labels); the fast type has two nodes in one zone (and a cordoned one in
    # another), the slow type one node in each of two zones. The plan lets a zone take
    # one of the gang's workers, so the fast type holds one: the job starts at once on
    # the slow nodes. Before stop 61, both were planned on the fast zone's two nodes,
    # kube-scheduler refused the second, and the stuck rule moved the job after 45 s
    api, custom, core = jobs_api
    tag = namespace[-6:]
    fast, slow = f"FAST-{tag.upper()}", f"SLOW-{tag.upper()}"
    with (
        _gpu_nodes(api, core, f"fa-{tag}", fast, 2, zone=f"fz-{tag}") as fast_nodes,
        _gpu_nodes(api, core, f"fb-{tag}", fast, 1, zone=f"fy-{tag}") as cordoned,
        _gpu_nodes(api, core, f"sa-{tag}", slow, 1, zone=f"sz-{tag}") as slow_a,
        _gpu_nodes(api, core, f"sb-{tag}", slow, 1, zone=f"sy-{tag}") as slow_b,
    ):
        wait_nodes_untainted(api, {*fast_nodes, *cordoned, *slow_a, *slow_b}, 60)
        core.patch_node(cordoned[0], {"spec": {"unschedulable": True}})
        pair = job("pair", 2, 1, [(fast, 2.0), (slow, 1.0)])
        pair["spec"]["template"]["metadata"] = {"labels": {"app": "trainer"}}
        pod = pair["spec"]["template"]["spec"]
        if rule == "spread":
            pod["topologySpreadConstraints"] = [_spread_constraint(ZONE_LABEL)]
        else:
            pod["affinity"] = _beside("podAntiAffinity", "trainer", ZONE_LABEL)
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, pair)
        _wait_running(api, namespace, "pair", timeout=60, what="pair running on the slow nodes")
        status = _get(api, namespace, "pair")["status"]
        assert status["plan"]["gpuType"] == slow
        assert sorted(p["node"] for p in status["placement"]) == sorted(slow_a + slow_b)
        assert "Replanning" not in _events(core, namespace, "pair")


def _zone_volume(tag: str, name: str, zone: str, size: str) -> dict[str, Any]:
    """A hostPath PersistentVolume NAME-TAG of class manual-TAG and `size`, usable in `zone`."""
    where = {"key": ZONE_LABEL, "operator": "In", "values": [zone]}
    return {
        "metadata": {"name": f"{name}-{tag}"},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": f"manual-{tag}",
            "hostPath": {"path": f"/tmp/{name}-{tag}"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [where]}]}},
        },
    }


@pytest.mark.parametrize("runtime", ["in place", "missing at first"])
def test_a_gang_whose_runtime_class_names_a_zone_starts_there(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str, runtime: str
) -> None:
    # the job's workers run under a RuntimeClass whose scheduling.nodeSelector names the
    # slow type's zone: the API server's RuntimeClass admission adds it to each worker's
    # nodeSelector. The plan knows this: the job starts at once on the slow node. Before,
    # it was planned on the fast node and the stuck rule moved it after 45 s. A class
    # that does not exist yet: the job waits saying its workers would be rejected, and
    # starts once the class is made (before, its workers were created and rejected)
    api, custom, core = jobs_api
    node_api = client.NodeV1Api(api)
    tag = namespace[-6:]
    kind = {
        "metadata": {"name": f"slow-{tag}"},
        "handler": "runc",
        "scheduling": {"nodeSelector": {ZONE_LABEL: f"sz-{tag}"}},
    }
    with _fast_and_slow(api, core, namespace, zones=True) as (fast, slow, _, slow_nodes):
        try:
            if runtime == "in place":
                node_api.create_runtime_class(kind)
            bound = job("bound", 1, 1, [(fast, 2.0), (slow, 1.0)])
            bound["spec"]["template"]["spec"]["runtimeClassName"] = f"slow-{tag}"
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, bound)
            if runtime == "missing at first":
                said = f"would reject its workers: RuntimeClass slow-{tag} not found"
                wait_for(lambda: said in _why(api, namespace, "bound"), 60, "bound says why")
                assert not _events(core, namespace, "bound").get("Started")
                node_api.create_runtime_class(kind)
            _started_at_once_on(api, core, namespace, "bound", gpu=slow, nodes=slow_nodes)
        finally:
            with contextlib.suppress(client.exceptions.ApiException):
                node_api.delete_runtime_class(f"slow-{tag}")


def _run(core: client.CoreV1Api, namespace: str, pod: dict[str, Any]) -> None:
    """Create `pod` (bound by name, `_bare_pod`) in `namespace` and wait until it runs."""
    name = pod["metadata"]["name"]
    core.create_namespaced_pod(namespace, pod)
    wait_for(
        lambda: core.read_namespaced_pod(name, namespace).status.phase == "Running",
        60,
        f"pod {name} running",
    )


def _bare_pod(
    name: str, node: str, app: str, volumes: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A pod (no GPU) labelled `app`, bound to `node` by name, mounting `volumes`."""
    container = {"name": "c", "image": "registry.example/p:1"}
    spec: dict[str, Any] = {"nodeName": node, "containers": [container]}
    if volumes is not None:
        spec["volumes"] = volumes
    return {"metadata": {"name": name, "labels": {"app": app}}, "spec": spec}


def _beside(kind: str, app: str, key: str = "kubernetes.io/hostname") -> dict[str, Any]:
    """A required `kind` (podAffinity, podAntiAffinity) to pods labelled `app`, on `key`."""
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


@pytest.mark.parametrize(
    "rule",
    [
        "its anti-affinity",
        "the pod's anti-affinity",
        "its affinity",
        "its affinity across namespaces",
        "its zone affinity",
        "the pod's zone anti-affinity",
    ],
)
def test_a_gang_a_pod_affinity_keeps_off_a_node_starts_where_it_binds(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str, rule: str
) -> None:
    # a required pod (anti-)affinity keeps the job's workers off the fast type's only
    # node: their anti-affinity selects a serving pod there, or the serving pod's
    # selects them, or their affinity asks for a cache pod that runs only on the slow
    # node (kube-scheduler's InterPodAffinity filter). Or, each type in a zone of its
    # own, their affinity asks for a cache pod in the slow type's zone, or a pod in the
    # fast type's zone keeps them out of it; those pods run on a node without GPUs.
    # Or their affinity asks for a cache pod in the namespaces labelled with a team
    # (namespaceSelector): that pod runs on the slow node in another namespace, one in
    # the job's own namespace on the fast node; the job waits until the namespace gets
    # its label. The plan knows this: the job starts at once on the slow node. Before,
    # it was planned on the fast node, kube-scheduler would not bind it there, and the
    # stuck rule moved it after 45 s
    api, custom, core = jobs_api
    zoned = "zone" in rule
    zone = ZONE_LABEL
    with contextlib.ExitStack() as stack:
        fast, slow, fast_nodes, slow_nodes = stack.enter_context(
            _fast_and_slow(api, core, namespace, zones=zoned)
        )
        tag = namespace[-6:]
        where = namespace  # of the other pod
        other = _bare_pod("other", fast_nodes[0], "serve")
        shy = job("shy", 1, 1, [(fast, 2.0), (slow, 1.0)])
        if rule == "its anti-affinity":
            shy["spec"]["template"]["spec"]["affinity"] = _beside("podAntiAffinity", "serve")
        elif rule == "the pod's anti-affinity":
            other["spec"]["affinity"] = _beside("podAntiAffinity", "trainer")
            shy["spec"]["template"]["metadata"] = {"labels": {"app": "trainer"}}
        elif rule == "its affinity":
            other = _bare_pod("other", slow_nodes[0], "cache")
            shy["spec"]["template"]["spec"]["affinity"] = _beside("podAffinity", "cache")
        elif rule == "its affinity across namespaces":
            where = stack.enter_context(scratch_namespace(core, f"data-{tag}"))
            other = _bare_pod("other", slow_nodes[0], "cache")
            core.create_namespaced_pod(namespace, _bare_pod("decoy", fast_nodes[0], "cache"))
            affinity = _beside("podAffinity", "cache")
            (term,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            term["namespaceSelector"] = {"matchLabels": {"team": f"data-{tag}"}}
            shy["spec"]["template"]["spec"]["affinity"] = affinity
        elif rule == "its zone affinity":
            (cpu,) = stack.enter_context(
                _gpu_nodes(api, core, f"c-{tag}", None, 1, zone=f"sz-{tag}")
            )
            other = _bare_pod("other", cpu, "cache")
            shy["spec"]["template"]["spec"]["affinity"] = _beside("podAffinity", "cache", zone)
        else:
            (cpu,) = stack.enter_context(
                _gpu_nodes(api, core, f"c-{tag}", None, 1, zone=f"fz-{tag}")
            )
            other = _bare_pod("other", cpu, "db")
            other["spec"]["affinity"] = _beside("podAntiAffinity", "trainer", zone)
            shy["spec"]["template"]["metadata"] = {"labels": {"app": "trainer"}}
        _run(core, where, other)
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, shy)
        if where != namespace:  # no namespace has the team label yet: no pod meets it
            wait_for(
                lambda: "required pod affinity" in _why(api, namespace, "shy"),
                60,
                "shy waiting for its pod affinity",
            )
            core.patch_namespace(where, {"metadata": {"labels": {"team": f"data-{tag}"}}})
        _started_at_once_on(api, core, namespace, "shy", gpu=slow, nodes=slow_nodes)


@contextlib.contextmanager
def _spread_against(
    api: Any, core: client.CoreV1Api, namespace: str, key: str
) -> Iterator[tuple[str, str, list[str], list[str], dict[str, Any]]]:
    """Two fast nodes, in zones of their own, and a slow one; a job spread on `key`.

    The job's workers (labelled app=trainer) have a topology spread constraint of
    `maxSkew` 1 on `key` (DoNotSchedule) counting pods labelled app=trainer: one runs
    on the first fast node, none on the second, which is cordoned (it still counts for
    the skew), so kube-scheduler's PodTopologySpread filter refuses the first. Yields
    the fast and slow types, the first fast node and the slow node (lists of one
    name each) and the job, not yet created.
    """
    tag = namespace[-6:]
    fast, slow = f"FAST-{tag.upper()}", f"SLOW-{tag.upper()}"
    with (
        _gpu_nodes(api, core, f"fa-{tag}", fast, 1, zone=f"fz-{tag}") as fast_nodes,
        _gpu_nodes(api, core, f"fb-{tag}", fast, 1, zone=f"fy-{tag}") as cordoned,
        _gpu_nodes(api, core, f"sl-{tag}", slow, 1, zone=f"sz-{tag}") as slow_nodes,
    ):
        wait_nodes_untainted(api, set(fast_nodes + cordoned + slow_nodes), 60)
        core.patch_node(cordoned[0], {"spec": {"unschedulable": True}})
        _run(core, namespace, _bare_pod("other", fast_nodes[0], "trainer"))
        spready = job("spready", 1, 1, [(fast, 2.0), (slow, 1.0)])
        spready["spec"]["template"]["metadata"] = {"labels": {"app": "trainer"}}
        spready["spec"]["template"]["spec"]["topologySpreadConstraints"] = [_spread_constraint(key)]
        yield fast, slow, fast_nodes, slow_nodes, spready


def _spread_constraint(key: str) -> dict[str, Any]:
    """A topology spread constraint of maxSkew 1 on `key` counting pods labelled app=trainer."""
    return {
        "maxSkew": 1,
        "topologyKey": key,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "trainer"}},
    }


@pytest.mark.parametrize("key", ["kubernetes.io/hostname", ZONE_LABEL])
def test_a_gang_spread_keeps_off_a_node_whose_domain_runs_a_pod_it_counts(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str, key: str
) -> None:
    # a topology spread of one per node, or per zone (`_spread_against`): the plan
    # counts the pods it selects per domain, and the job starts at once on the slow
    # node. Before, it was planned on the first fast node, kube-scheduler would not
    # bind it there, and the stuck rule moved it after 45 s (per node until stop 60,
    # per zone until stop 61)
    api, custom, core = jobs_api
    with _spread_against(api, core, namespace, key) as setup:
        _, slow, _, slow_nodes, spready = setup
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, spready)
        _started_at_once_on(api, core, namespace, "spready", gpu=slow, nodes=slow_nodes)


def _own_spread(key: str) -> dict[str, Any]:
    """A topology spread constraint of maxSkew 1 on `key` over the job's own pods."""
    return {
        "maxSkew": 1,
        "topologyKey": key,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {},
        "matchLabelKeys": ["chronotope.dev/job"],
    }


@pytest.mark.parametrize("key", ["kubernetes.io/hostname", ZONE_LABEL])
def test_a_gang_with_more_workers_than_domains_spreads_over_them_in_levels(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str, key: str
) -> None:
    # four one-GPU workers with a topology spread of maxSkew 1 per node (or per zone)
    # over their own job's pods, on a type of two nodes of 2 GPUs (in two zones):
    # kube-scheduler binds them one after another, each counted for the next, two a
    # node. Before stop 63 the plan said such a gang per node could never run ("the
    # cluster holds at most 2 worker(s) ... the job needs 4"; it was placed
    # StrictSpread), and one per zone waited for ever ("room for 2 of 4 worker(s) now")
    api, custom, core = jobs_api
    tag = namespace[-6:]
    model = f"LEVEL-{tag.upper()}"
    zones = (f"lz-{tag}", f"lz-{tag}") if key != ZONE_LABEL else (f"lx-{tag}", f"ly-{tag}")
    with (
        _gpu_nodes(api, core, f"la-{tag}", model, 1, per_node=2, zone=zones[0]) as first,
        _gpu_nodes(api, core, f"lb-{tag}", model, 1, per_node=2, zone=zones[1]) as second,
    ):
        nodes = first + second
        wait_nodes_untainted(api, set(nodes), 60)
        levels = job("levels", 4, 1, [(model, 1.0)])
        levels["spec"]["template"]["spec"]["topologySpreadConstraints"] = [_own_spread(key)]
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, levels)
        _wait_running(api, namespace, "levels", timeout=90, what="levels running, two a node")
        status = _get(api, namespace, "levels")["status"]
        assert status["plan"]["gpuType"] == model
        assert sorted(p["node"] for p in status["placement"]) == sorted(nodes * 2)
        pods = core.list_namespaced_pod(namespace, label_selector="chronotope.dev/job=levels")
        assert sorted(p.spec.node_name for p in pods.items) == sorted(nodes * 2)
        events = _events(core, namespace, "levels")
        assert "Replanning" not in events, events


def test_a_gang_spread_per_zone_and_per_node_goes_one_a_node_across_zones(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    # the Kubernetes documentation's example, maxSkew 1 per zone and 1 per node, over
    # the job's own pods: four one-GPU workers on four nodes in two zones run one a
    # node. Before stop 63 each zone took one worker in the plan: the job waited for
    # ever ("room for 2 of 4 worker(s) now")
    api, custom, core = jobs_api
    tag = namespace[-6:]
    model = f"BOTH-{tag.upper()}"
    with (
        _gpu_nodes(api, core, f"bx-{tag}", model, 2, zone=f"bx-{tag}") as first,
        _gpu_nodes(api, core, f"by-{tag}", model, 2, zone=f"by-{tag}") as second,
    ):
        nodes = first + second
        wait_nodes_untainted(api, set(nodes), 60)
        both = job("both", 4, 1, [(model, 1.0)])
        both["spec"]["template"]["spec"]["topologySpreadConstraints"] = [
            _own_spread(ZONE_LABEL),
            _own_spread("kubernetes.io/hostname"),
        ]
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, both)
        _wait_running(api, namespace, "both", timeout=90, what="both running, one a node")
        pods = core.list_namespaced_pod(namespace, label_selector="chronotope.dev/job=both")
        assert sorted(p.spec.node_name for p in pods.items) == sorted(nodes)
        events = _events(core, namespace, "both")
        assert "Replanning" not in events, events


def _started_at_once_on(
    api: Any, core: client.CoreV1Api, namespace: str, name: str, *, gpu: str, nodes: list[str]
) -> None:
    """The job runs within 60 s on `nodes` of type `gpu`, with no re-plan."""
    _wait_running(api, namespace, name, timeout=60, what=f"{name} running on {nodes}")
    status = _get(api, namespace, name)["status"]
    assert status["plan"]["gpuType"] == gpu
    assert [p["node"] for p in status["placement"]] == nodes
    events = _events(core, namespace, name)
    assert "Replanning" not in events, events  # planned right the first time


def _slow_zone_volume(tag: str) -> dict[str, Any]:
    """A 1 GiB hostPath PersistentVolume data-TAG of class manual-TAG usable only in zone sz-TAG."""
    return _zone_volume(tag, "data", f"sz-{tag}", "1Gi")


def _manual_class(tag: str, *, local: bool) -> dict[str, Any]:
    """StorageClass manual-TAG, whose provisioner never runs: it binds a claim at once to a
    volume made by hand, or (`local`) only to a static volume, when its pod is placed."""
    if local:
        return {
            "metadata": {"name": f"manual-{tag}"},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
        }
    return {"metadata": {"name": f"manual-{tag}"}, "provisioner": "example.com/none"}


@contextlib.contextmanager
def _manual_storage(api: Any, tag: str) -> Iterator[client.StorageV1Api]:
    """The storage API; PersistentVolume data-TAG and StorageClass manual-TAG deleted after."""
    storage, core = client.StorageV1Api(api), client.CoreV1Api(api)
    try:
        yield storage
    finally:
        with contextlib.suppress(client.exceptions.ApiException):
            core.delete_persistent_volume(f"data-{tag}")
        with contextlib.suppress(client.exceptions.ApiException):
            storage.delete_storage_class(f"manual-{tag}")


def test_a_gang_whose_csi_driver_has_room_in_one_zone_starts_there(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    # the workers mount a claim of a WaitForFirstConsumer class whose CSI driver reports
    # its capacity (storageCapacity: true), and its only CSIStorageCapacity with room is
    # the slow type's zone: kube-scheduler's VolumeBinding filter refuses the fast node
    # ("did not have enough free storage"). The plan knows this: the job starts at once
    # on the slow node, where the test's stand-in for the driver's provisioner makes the
    # volume for the node kube-scheduler picked. Before, it was planned on the fast
    # node and the stuck rule moved it after 45 s
    api, custom, core = jobs_api
    tag = namespace[-6:]
    driver = f"csi-{tag}.example.com"
    storage = client.StorageV1Api(api)
    claim = {
        "metadata": {"name": "data"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": f"csi-{tag}",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    with _fast_and_slow(api, core, namespace, zones=True) as (fast, slow, _, slow_nodes):
        try:
            storage.create_csi_driver(
                {"metadata": {"name": driver}, "spec": {"storageCapacity": True}}
            )
            storage.create_storage_class(
                {
                    "metadata": {"name": f"csi-{tag}"},
                    "provisioner": driver,
                    "volumeBindingMode": "WaitForFirstConsumer",
                }
            )
            storage.create_namespaced_csi_storage_capacity(
                namespace,
                {
                    "metadata": {"name": "slow-zone"},
                    "storageClassName": f"csi-{tag}",
                    "nodeTopology": {"matchLabels": {ZONE_LABEL: f"sz-{tag}"}},
                    "capacity": "10Gi",
                },
            )
            core.create_namespaced_persistent_volume_claim(namespace, claim)
            with _provisioning(core, namespace, "data", f"csi-{tag}", f"pv-{tag}"):
                reader = job("reader", 1, 1, [(fast, 2.0), (slow, 1.0)])
                reader["spec"]["template"]["spec"]["volumes"] = [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}
                ]
                custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, reader)
                _started_at_once_on(api, core, namespace, "reader", gpu=slow, nodes=slow_nodes)
        finally:
            with contextlib.suppress(client.exceptions.ApiException):
                core.delete_persistent_volume(f"pv-{tag}")
            with contextlib.suppress(client.exceptions.ApiException):
                storage.delete_storage_class(f"csi-{tag}")
            with contextlib.suppress(client.exceptions.ApiException):
                storage.delete_csi_driver(driver)


def test_a_job_whose_read_write_once_pod_claim_another_pod_uses_waits_for_it(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    # the worker mounts a ReadWriteOncePod claim a running pod already uses:
    # kube-scheduler's VolumeRestrictions schedules no other pod that mounts it. The
    # job waits saying which pod holds it, and starts once that pod is gone (woken by
    # its deletion). Before, it was planned, its worker stayed Pending, and the stuck
    # rule re-planned it every 45 s
    api, custom, core = jobs_api
    tag = namespace[-6:]
    volume = _slow_zone_volume(tag)
    volume["spec"]["accessModes"] = ["ReadWriteOncePod"]
    claim = {
        "metadata": {"name": "solo"},
        "spec": {
            "accessModes": ["ReadWriteOncePod"],
            "storageClassName": f"manual-{tag}",
            "volumeName": f"data-{tag}",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    mount = [{"name": "data", "persistentVolumeClaim": {"claimName": "solo"}}]
    with (
        _fast_and_slow(api, core, namespace, zones=True) as (fast, slow, _, slow_nodes),
        _manual_storage(api, tag),
    ):
        core.create_persistent_volume(volume)
        core.create_namespaced_persistent_volume_claim(namespace, claim)
        _run(core, namespace, _bare_pod("holder", slow_nodes[0], "holder", mount))
        reader = job("reader", 1, 1, [(fast, 2.0), (slow, 1.0)])
        reader["spec"]["template"]["spec"]["volumes"] = mount
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, reader)
        said = (
            f"PersistentVolumeClaim {namespace}/solo is ReadWriteOncePod and pod "
            f"{namespace}/holder uses it"
        )
        wait_for(lambda: said in _why(api, namespace, "reader"), 60, "reader saying why")
        assert not core.list_namespaced_pod(
            namespace, label_selector="chronotope.dev/job=reader"
        ).items
        core.delete_namespaced_pod("holder", namespace, grace_period_seconds=0)
        _wait_running(api, namespace, "reader", timeout=90, what="reader running")
        status = _get(api, namespace, "reader")["status"]
        assert [p["node"] for p in status["placement"]] == slow_nodes  # the volume's zone
        assert "Replanning" not in _events(core, namespace, "reader")


@contextlib.contextmanager
def _provisioning(
    core: client.CoreV1Api, namespace: str, name: str, kind: str, volume: str
) -> Iterator[None]:
    """A stand-in for a CSI driver's provisioner, for claim `name` of StorageClass `kind`.

    Once kube-scheduler names the node for the claim (the `selected-node` annotation,
    as it does for a WaitForFirstConsumer claim it must provision), it makes volume
    `volume` reserved for the claim; kube-controller-manager binds them, and
    kube-scheduler then binds the pod.
    """
    done = threading.Event()

    def provision() -> None:
        while not done.wait(0.5):
            with contextlib.suppress(client.exceptions.ApiException):
                got = core.read_namespaced_persistent_volume_claim(name, namespace)
                notes = got.metadata.annotations or {}
                if "volume.kubernetes.io/selected-node" not in notes:
                    continue
                core.create_persistent_volume(
                    {
                        "metadata": {"name": volume},
                        "spec": {
                            "storageClassName": kind,
                            "capacity": {"storage": "1Gi"},
                            "accessModes": ["ReadWriteOnce"],
                            "hostPath": {"path": "/tmp"},
                            "claimRef": {
                                "namespace": namespace,
                                "name": name,
                                "uid": got.metadata.uid,
                            },
                        },
                    }
                )
                return

    worker = threading.Thread(target=provision, daemon=True)
    worker.start()
    try:
        yield
    finally:
        done.set()
        worker.join(5)


def test_a_gang_sharing_a_read_write_once_pod_claim_says_it_can_never_run(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str
) -> None:
    # both workers of a gang mount one ReadWriteOncePod claim: kube-scheduler's
    # VolumeRestrictions lets one pod use it, so the gang could never all run. The job
    # says so and starts nothing. Before, one worker was bound, the other stayed
    # Pending, and the stuck rule re-planned the gang every 45 s
    api, custom, core = jobs_api
    claim = {
        "metadata": {"name": "solo"},
        "spec": {
            "accessModes": ["ReadWriteOncePod"],
            "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    core.create_namespaced_persistent_volume_claim(namespace, claim)
    with _fast_and_slow(api, core, namespace) as (fast, slow, _, _):
        pair = job("pair", 2, 1, [(fast, 2.0), (slow, 1.0)])
        pod = pair["spec"]["template"]["spec"]
        pod["volumes"] = [{"name": "solo", "persistentVolumeClaim": {"claimName": "solo"}}]
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, pair)
        said = f"PersistentVolumeClaim {namespace}/solo is ReadWriteOncePod"
        wait_for(lambda: said in _why(api, namespace, "pair"), 60, "pair says why")
        assert not _events(core, namespace, "pair").get("Started")
        assert not core.list_namespaced_pod(
            namespace, label_selector="chronotope.dev/job=pair"
        ).items


@pytest.mark.parametrize("volumes", ["one", "too small in the fast zone"])
def test_a_gang_whose_ephemeral_volume_can_only_be_local_starts_beside_it(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str, volumes: str
) -> None:
    # each worker gets a generic ephemeral volume of a WaitForFirstConsumer class with
    # no provisioner: its claim, made with the pod, can bind only to a volume of that
    # class it fits: `one`: the class's only volume, in the slow type's zone (1 GiB
    # asked); `too small in the fast zone`: 5 GiB asked, the class's volume in the fast
    # type's zone holds 1 GiB, the one in the slow type's 10 GiB. The plan knows this
    # (it reads the template's claim, its size too): the job starts at once on the slow
    # node, and kube-scheduler binds the worker's claim to that volume. Before, it was
    # planned on the fast node and the stuck rule moved it after 45 s (`one` until stop
    # 60; the sizes until stop 61, when only the class was read)
    api, custom, core = jobs_api
    tag = namespace[-6:]
    small = volumes != "one"
    claim = {
        "storageClassName": f"manual-{tag}",
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "5Gi" if small else "1Gi"}},
    }
    made = [_zone_volume(tag, "data", f"sz-{tag}", "10Gi" if small else "1Gi")]
    if small:
        made.append(_zone_volume(tag, "small", f"fz-{tag}", "1Gi"))
    with (
        _fast_and_slow(api, core, namespace, zones=True) as (fast, slow, _, slow_nodes),
        _manual_storage(api, tag) as storage,
    ):
        try:
            storage.create_storage_class(_manual_class(tag, local=True))
            for volume in made:
                core.create_persistent_volume(volume)
            scratch = job("scratch", 1, 1, [(fast, 2.0), (slow, 1.0)])
            ephemeral = {"volumeClaimTemplate": {"spec": claim}}
            scratch["spec"]["template"]["spec"]["volumes"] = [
                {"name": "scratch", "ephemeral": ephemeral}
            ]
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, scratch)
            _started_at_once_on(api, core, namespace, "scratch", gpu=slow, nodes=slow_nodes)
            volume = core.read_persistent_volume(f"data-{tag}")
            assert volume.spec.claim_ref is not None, volume.spec  # the worker's claim took it
        finally:
            with contextlib.suppress(client.exceptions.ApiException):
                core.delete_persistent_volume(f"small-{tag}")


@pytest.mark.parametrize("claim", ["bound", "missing at first", "not bound yet", "local"])
def test_a_gang_whose_volume_lives_in_one_zone_starts_there(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str, claim: str
) -> None:
    # the workers mount a PersistentVolumeClaim bound to a volume whose node affinity
    # is the slow type's zone (kube-scheduler's VolumeBinding filter refuses the fast
    # node). The plan knows this: the job starts at once on the slow node. Before, it
    # was planned on the fast node and the stuck rule moved it after 45 s. A claim that
    # does not exist yet, or that waits for a volume (its StorageClass binds at once,
    # and there is no volume for it until the test makes one): the job waits and says
    # so; once the claim is bound, the job starts, woken by the claim's watch event. A
    # local volume: the claim's class has no provisioner and binds when the first pod
    # is placed (WaitForFirstConsumer), so the pod goes only where a volume it could
    # bind to may be used; kube-scheduler binds the claim to it when it binds the pod
    api, custom, core = jobs_api
    tag = namespace[-6:]
    volume = _slow_zone_volume(tag)
    data: dict[str, Any] = {
        "metadata": {"name": "data"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": f"manual-{tag}",
            "volumeName": f"data-{tag}",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }

    def bound() -> bool:
        got = core.read_namespaced_persistent_volume_claim("data", namespace)
        return bool(got.status and got.status.phase == "Bound")

    def says(text: str) -> None:
        wait_for(lambda: text in _why(api, namespace, "reader"), 60, f"reader saying {text!r}")

    with (
        _fast_and_slow(api, core, namespace, zones=True) as (fast, slow, _, slow_nodes),
        _manual_storage(api, tag) as storage,
    ):
        if claim in ("not bound yet", "local"):  # an unbound claim of the test's class
            if claim == "local":  # static volumes only, bound when a pod is placed
                core.create_persistent_volume(volume)
            storage.create_storage_class(_manual_class(tag, local=claim == "local"))
            del data["spec"]["volumeName"]
            core.create_namespaced_persistent_volume_claim(namespace, data)
        else:
            core.create_persistent_volume(volume)
        if claim == "bound":
            core.create_namespaced_persistent_volume_claim(namespace, data)
            wait_for(bound, 60, "the claim bound")
        reader = job("reader", 1, 1, [(fast, 2.0), (slow, 1.0)])
        pod = reader["spec"]["template"]["spec"]
        pod["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
        pod["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, reader)
        if claim == "missing at first":
            says(f"PersistentVolumeClaim {namespace}/data not found")
            core.create_namespaced_persistent_volume_claim(namespace, data)
            wait_for(bound, 60, "the claim bound")
        elif claim == "not bound yet":
            says(f"PersistentVolumeClaim {namespace}/data is not bound yet")
            assert f"(StorageClass manual-{tag})" in _why(api, namespace, "reader")
            assert not _events(core, namespace, "reader").get("Started")
            core.create_persistent_volume(volume)
            wait_for(bound, 90, "the claim bound to the new volume")
        _started_at_once_on(api, core, namespace, "reader", gpu=slow, nodes=slow_nodes)
        if claim == "local":  # kube-scheduler bound it to the volume it was placed by
            wait_for(bound, 60, "the claim bound to the local volume")


@pytest.mark.parametrize("apart", ["hostPort", "podAntiAffinity"])
def test_a_gang_whose_workers_may_not_share_a_node_is_planned_where_it_binds(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str, apart: str
) -> None:
    # two workers that may not share a node: they ask host port 7777 (kube-scheduler's
    # NodePorts filter), or keep off each other's nodes by a required pod anti-affinity
    # on their own label (InterPodAffinity). The fast type's one node has GPUs for both
    # but holds one; a pod holds port 7777 on one of the slow type's three nodes. The
    # plan knows this: the gang starts at once, one worker a node, on slow nodes that
    # take it. Before, it was planned on the fast node, stuck there 45 s, then re-planned
    api, custom, core = jobs_api
    tag = namespace[-6:]
    fast, slow = f"FAST-{tag.upper()}", f"SLOW-{tag.upper()}"
    port = {"containerPort": 7777, "hostPort": 7777}
    with (
        _gpu_nodes(api, core, f"fa-{tag}", fast, 1, per_node=2) as fast_nodes,
        _gpu_nodes(api, core, f"sl-{tag}", slow, 3) as slow_nodes,
    ):
        wait_nodes_untainted(api, set(fast_nodes + slow_nodes), 60)
        holder = {
            "metadata": {"name": "port-holder"},
            "spec": {
                "nodeName": slow_nodes[0],
                "containers": [{"name": "c", "image": "registry.example/p:1", "ports": [port]}],
            },
        }
        core.create_namespaced_pod(namespace, holder)
        pair = job("pair", 2, 1, [(fast, 2.0), (slow, 1.0)])
        template = pair["spec"]["template"]
        if apart == "hostPort":
            template["spec"]["containers"][0]["ports"] = [port]
        else:
            template["metadata"] = {"labels": {"app": f"pair-{tag}"}}
            template["spec"]["affinity"] = {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"app": f"pair-{tag}"}},
                            "topologyKey": "kubernetes.io/hostname",
                        }
                    ]
                }
            }
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, pair)
        _wait_running(api, namespace, "pair", timeout=90, what="pair running")
        status = _get(api, namespace, "pair")["status"]
        assert status["plan"]["gpuType"] == slow
        placed = sorted(p["node"] for p in status["placement"])
        assert len(set(placed)) == len(placed), placed  # one worker a node
        assert set(placed) <= set(slow_nodes), placed
        if apart == "hostPort":
            assert placed == slow_nodes[1:]  # not where the port is held
        events = _events(core, namespace, "pair")
        assert "Replanning" not in events, events  # planned right the first time
        assert slow in events["Started"], events


@pytest.mark.parametrize("how", ["placement", "pod affinity"])
def test_a_gang_that_requires_one_zone_starts_inside_one(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str, how: str
) -> None:
    # one GPU type in two zones: two 2-GPU nodes in one, one in the other. Two workers of
    # 2 GPUs under Spread go to two nodes with the most free GPUs: before, one in each
    # zone, though the job said `topology: Zone, required: true` (read by nothing), or
    # its workers' required pod affinity on the zone selects their own label (then the
    # second worker never bound, and the stuck rule re-planned after 45 s). Now both go
    # inside the zone that holds them, at once; a gang no zone can hold says so
    api, custom, core = jobs_api
    tag = namespace[-6:]
    gpu = f"ZONED-{tag.upper()}"
    with (
        _gpu_nodes(api, core, f"za-{tag}", gpu, 2, per_node=2, zone=f"za-{tag}") as zone_a,
        _gpu_nodes(api, core, f"zb-{tag}", gpu, 1, per_node=2, zone=f"zb-{tag}") as zone_b,
    ):
        wait_nodes_untainted(api, set(zone_a + zone_b), 60)
        placement: dict[str, Any] = {"strategy": "Spread", "topology": "Zone", "required": True}
        if how == "pod affinity":
            placement = {"strategy": "Spread"}

        def body(name: str, workers: int) -> dict[str, Any]:
            out = job(name, workers, 2, [(gpu, 1.0)], placement=placement)
            if how == "pod affinity":
                template = out["spec"]["template"]
                template["metadata"] = {"labels": {"app": f"{name}-{tag}"}}
                template["spec"]["affinity"] = _beside("podAffinity", f"{name}-{tag}", ZONE_LABEL)
            return out

        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body("zoned", 2))
        _wait_running(api, namespace, "zoned", timeout=90, what="zoned running")
        placed = sorted(p["node"] for p in _get(api, namespace, "zoned")["status"]["placement"])
        assert placed == zone_a, placed
        pods = core.list_namespaced_pod(namespace, label_selector="chronotope.dev/job=zoned")
        assert sorted(p.spec.node_name for p in pods.items) == zone_a
        assert "Replanning" not in _events(core, namespace, "zoned")
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body("three", 3))

        def why() -> str:
            return _why(api, namespace, "three")

        wait_for(lambda: "within one Zone" in why(), 60, "three says why")
        assert "at most 2 worker(s) of 2 GPU(s) (Spread within one Zone)" in why(), why()


@pytest.mark.parametrize("case", ["zone", "fragmented"])
def test_a_job_starts_on_a_type_where_its_workers_fit_not_where_free_gpus_add_up(
    jobs_api: tuple[Any, client.CustomObjectsApi, client.CoreV1Api], namespace: str, case: str
) -> None:
    # the faster type has 4 free GPUs, 2 on each of two nodes (in two zones); the slower
    # one 4 on one node. A gang that does not fit the faster type's nodes (2 workers of 2
    # that require one zone; one worker of 4) starts on the slower type. Before, with
    # another job of its priority running, the fleet policy counted the faster type's 4
    # GPUs as one pool and picked it, and the job waited ("... but ZFAST has no room
    # yet") with every GPU of the slower type idle
    api, custom, core = jobs_api
    tag = namespace[-6:]
    fast, slow, third = (f"{what}-{tag.upper()}" for what in ("ZFAST", "ZSLOW", "ZTHIRD"))
    with (
        _gpu_nodes(api, core, f"zfa-{tag}", fast, 1, per_node=2, zone=f"za-{tag}") as fa,
        _gpu_nodes(api, core, f"zfb-{tag}", fast, 1, per_node=2, zone=f"zb-{tag}") as fb,
        _gpu_nodes(api, core, f"zs-{tag}", slow, 1, per_node=4, zone=f"za-{tag}") as sl,
        _gpu_nodes(api, core, f"zt-{tag}", third, 1, per_node=1, zone=f"za-{tag}") as th,
    ):
        wait_nodes_untainted(api, set(fa + fb + sl + th), 60)
        other = job("other", 1, 1, [(third, 1.0)])
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, other)
        _wait_running(api, namespace, "other", timeout=60)
        types = [(fast, 1.0), (slow, 0.6)]
        if case == "zone":
            placement = {"strategy": "Pack", "topology": "Zone", "required": True}
            body = job("gang", 2, 2, types, placement=placement)
        else:
            body = job("gang", 1, 4, types)
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        _wait_running(api, namespace, "gang", timeout=60, what=f"gang running on {slow}")
        status = _get(api, namespace, "gang")["status"]
        assert status["plan"]["gpuType"] == slow, status
        assert sorted({p["node"] for p in status["placement"]}) == sl
