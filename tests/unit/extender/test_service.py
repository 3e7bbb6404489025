"""Extender decisions on the cluster cache: the policy's choice, reasons, assume, bind, rebuild."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from chronotope.extender.service import ExtenderService
from chronotope.sharing.assignment import BindRequest, GpuAssignment
from chronotope.solver.cache import ClusterCache
from chronotope.solver.frag import FragModel, FragTracker, typical_pods
from chronotope.solver.fragpack import Chronotope
from chronotope.solver.model import ClusterSnapshot, Gpu, Node, PodRequest
from chronotope.solver.policies import Context
from chronotope.solver.state import ClusterState
from chronotope.workloads.podreq import (
    SHARE_COMPUTE_ANNOTATION,
    SHARE_MEMORY_ANNOTATION,
    PodRequestError,
    pod_gpu_request,
)


def node(
    name: str, model: str, gpus: int, mem: int = 16000, cpu: str | None = None
) -> dict[str, Any]:
    status: dict[str, Any] = {"capacity": {"nvidia.com/gpu": str(gpus)}}
    if cpu is not None:
        status["allocatable"] = {"nvidia.com/gpu": str(gpus), "cpu": cpu, "memory": "64Gi"}
    return {
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.product": model, "nvidia.com/gpu.memory": str(mem)},
        },
        "status": status,
    }


def pod(
    name: str,
    gpus: int = 0,
    share: tuple[int, int] | None = None,
    model: str | None = None,
    cpu: str | None = None,
) -> dict[str, Any]:
    limits: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if share:
        limits["chronotope.dev/gpu-share"] = "1"
        annotations = {
            SHARE_COMPUTE_ANNOTATION: str(share[0]),
            SHARE_MEMORY_ANNOTATION: str(share[1]),
        }
    if cpu:
        limits["cpu"] = cpu
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if model:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": model}
    return {"metadata": {"name": name, "namespace": "ns", "annotations": annotations}, "spec": spec}


def bound(p: dict[str, Any], node_name: str, assignment: GpuAssignment | None) -> dict[str, Any]:
    p["spec"]["nodeName"] = node_name
    if assignment is not None:
        p["metadata"]["annotations"] = assignment.to_annotations()
    return p


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.bound: dict[str, tuple[str, GpuAssignment | None]] = {}
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self, req: BindRequest) -> None:
        if self.fail:
            raise RuntimeError("apiserver said no")
        with self.lock:
            self.bound[f"{req.namespace}/{req.name}"] = (req.node, req.assignment)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def service(
    recorder: Recorder,
    pods: dict[str, dict[str, Any]] | None = None,
    clock: Clock | None = None,
) -> ExtenderService:
    svc = ExtenderService(
        bind_fn=recorder,
        fetch_pod=lambda ns, n: (pods or {})[f"{ns}/{n}"],
        clock=clock or Clock(),
    )
    svc.sync_nodes([node("a", "A100", 8, 80000), node("t", "T4", 1), node("v", "V100", 4)])
    return svc


def place(svc: ExtenderService, p: dict[str, Any], nodes: list[str]) -> str:
    """Filter then bind, as kube-scheduler does; returns the node."""
    out = svc.filter(p, nodes)
    assert len(out.passed) == 1, out
    name = p["metadata"]["name"]
    assert svc.bind("ns", name, f"uid-{name}", out.passed[0]) == ""
    return out.passed[0]


def test_filter_passes_only_the_policys_node() -> None:
    svc = service(Recorder())
    out = svc.filter(pod("p", gpus=4), ["a", "t", "v", "ghost"])
    assert len(out.passed) == 1
    assert out.passed[0] in {"a", "v"}
    assert svc.prioritize(pod("p", gpus=4), ["a", "v"]) == {
        n: 10 if n == out.passed[0] else 0 for n in ("a", "v")
    }


def test_a_pod_that_fits_nowhere_gets_a_reason_per_node() -> None:
    svc = service(Recorder())
    out = svc.filter(pod("p", gpus=6), ["a", "t", "v", "ghost"])
    assert out.passed == ["a"]
    out = svc.filter(pod("q", gpus=4), ["a", "t", "v", "ghost"])  # a keeps 2 after p
    assert out.passed == ["v"]
    out = svc.filter(pod("r", gpus=4), ["a", "t", "v", "ghost"])
    assert out.passed == []
    assert "2 of 8 GPUs free, pod needs 4" in out.failed["a"]
    assert "0 of 4 GPUs free" in out.failed["v"]
    assert "1 GPU(s) in total" in out.unresolvable["t"]
    assert "not known" in out.unresolvable["ghost"]


def test_model_selector_is_unresolvable_elsewhere() -> None:
    svc = service(Recorder())
    assert svc.filter(pod("p", gpus=1, model="T4"), ["a", "t"]).passed == ["t"]
    out = svc.filter(pod("q", gpus=1, model="T4"), ["a", "t"])
    assert "not one of T4" in out.unresolvable["a"]
    assert "0 of 1 GPUs free" in out.failed["t"]


def test_bind_writes_the_gpus_assumed_at_filter() -> None:
    rec = Recorder()
    svc = service(rec)
    assert place(svc, pod("p", gpus=3), ["v"]) == "v"
    node_name, assignment = rec.bound["ns/p"]
    assert node_name == "v"
    assert assignment is not None
    assert assignment.gpu_indices == (0, 1, 2)
    assert assignment.gpu_uuids == ("GPU-v-0", "GPU-v-1", "GPU-v-2")
    out = svc.filter(pod("q", gpus=2), ["v"])
    assert out.passed == []
    assert "1 of 4 GPUs free" in out.failed["v"]


def test_the_next_filter_sees_the_previous_pod_before_its_bind() -> None:
    # kube-scheduler binds asynchronously and filters the next pod at once; the
    # first share is assumed at filter, so the second cannot take the same room
    rec = Recorder()
    svc = service(rec)
    assert svc.filter(pod("s1", share=(60, 6000)), ["t"]).passed == ["t"]
    out = svc.filter(pod("s2", share=(60, 6000)), ["t"])
    assert "no GPU has 60 percent of one GPU, 6000 MiB free" in out.failed["t"]
    assert svc.bind("ns", "s1", "u1", "t") == ""
    assert svc.filter(pod("s3", share=(40, 6000)), ["t"]).passed == ["t"]


def test_shares_pack_onto_one_gpu_until_full() -> None:
    rec = Recorder()
    svc = service(rec)
    for i in range(3):
        assert place(svc, pod(f"s{i}", share=(30, 4000)), ["t"]) == "t"
    a = rec.bound["ns/s0"][1]
    assert a is not None
    assert (a.compute_percent, a.memory_mib) == (30, 4000)
    out = svc.filter(pod("s3", share=(30, 4000)), ["t"])
    assert "no GPU has 30 percent of one GPU, 4000 MiB free" in out.failed["t"]


def test_a_share_needs_device_memory_on_its_gpu() -> None:
    svc = service(Recorder())
    assert place(svc, pod("big", share=(20, 12000)), ["t"]) == "t"
    out = svc.filter(pod("more", share=(20, 6000)), ["t"])  # share left, memory not
    assert "no GPU has 20 percent of one GPU, 6000 MiB free" in out.failed["t"]
    out = svc.filter(pod("huge", share=(10, 20000)), ["t"])
    assert "GPU memory 16000 MiB < requested 20000 MiB" in out.unresolvable["t"]


def test_failed_bind_forgets_the_assumption() -> None:
    svc = service(Recorder(fail=True))
    out = svc.filter(pod("p", gpus=8), ["a"])
    assert out.passed == ["a"]
    assert "apiserver said no" in svc.bind("ns", "p", "uid", "a")
    assert svc.filter(pod("q", gpus=8), ["a"]).passed == ["a"]


def test_an_assumption_whose_bind_never_comes_expires() -> None:
    clock = Clock()
    svc = service(Recorder(), clock=clock)
    assert svc.filter(pod("lost", gpus=8), ["a"]).passed == ["a"]
    assert svc.filter(pod("next", gpus=8), ["a"]).passed == []
    clock.now += svc.cache.assume_ttl_s + 1
    assert svc.filter(pod("next", gpus=8), ["a"]).passed == ["a"]


def test_concurrent_binds_never_share_a_gpu() -> None:
    rec = Recorder()
    pods = {f"ns/p{i}": pod(f"p{i}", share=(50, 1000)) for i in range(40)}
    svc = service(rec, pods)
    with ThreadPoolExecutor(8) as pool:
        errors = list(pool.map(lambda i: svc.bind("ns", f"p{i}", "u", "a"), range(40)))
    assert errors.count("") == 16  # 8 GPUs x 2 halves
    per_gpu: dict[int, int] = {}
    for _, a in rec.bound.values():
        assert a is not None
        per_gpu[a.gpu_indices[0]] = per_gpu.get(a.gpu_indices[0], 0) + (a.compute_percent or 0)
    assert all(total <= 100 for total in per_gpu.values())


def test_cache_is_rebuilt_from_bound_pods_annotations() -> None:
    rec = Recorder()
    svc = service(rec)
    place(svc, pod("p", gpus=2), ["v"])
    _, assignment = rec.bound["ns/p"]
    running = bound(pod("p", gpus=2), "v", assignment)
    fresh = service(Recorder())  # a restarted extender
    fresh.sync_pods([running])
    assert "2 of 4 GPUs free" in fresh.filter(pod("q", gpus=3), ["v"]).failed["v"]
    fresh.on_pod("DELETED", running)
    assert fresh.filter(pod("q", gpus=3), ["v"]).passed == ["v"]


def test_pods_of_other_schedulers_hold_gpus_and_cpu() -> None:
    svc = ExtenderService(bind_fn=Recorder(), fetch_pod=lambda ns, n: {}, clock=Clock())
    svc.sync_nodes([node("g", "L4", 4, cpu="8")])
    # bound by another scheduler: whole GPUs by count (no indices), CPU by request
    svc.on_pod("ADDED", bound(pod("theirs", gpus=3, cpu="1"), "g", None))
    out = svc.filter(pod("two", gpus=2), ["g"])
    assert "1 of 4 GPUs free, pod needs 2" in out.failed["g"]
    svc.on_pod("ADDED", bound(pod("cpu-hog", cpu="6"), "g", None))
    out = svc.filter(pod("one", gpus=1, cpu="2"), ["g"])
    assert "less than the pod's 2000m CPU is free" in out.failed["g"]
    svc.on_pod("DELETED", bound(pod("cpu-hog", cpu="6"), "g", None))
    assert svc.filter(pod("one", gpus=1, cpu="2"), ["g"]).passed == ["g"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(pod("x", gpus=1, share=(10, 10)), "not both", id="whole-and-share"),
        pytest.param(
            {
                "metadata": {"name": "x", "annotations": {}},
                "spec": {
                    "containers": [
                        {"name": "c", "resources": {"limits": {"chronotope.dev/gpu-share": "1"}}}
                    ]
                },
            },
            "gpu-memory-mib",
            id="share-without-memory",
        ),
        pytest.param(pod("x", share=(150, 10)), "less than or equal to 100", id="share-over-100"),
        pytest.param(pod("x", gpus=1, cpu="lots"), "not a Kubernetes quantity", id="bad-cpu"),
    ],
)
def test_bad_pod_requests_name_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(PodRequestError, match=message):
        pod_gpu_request(spec)
    out = service(Recorder()).filter(spec, ["a"])
    assert message in out.unresolvable["a"]


def test_planned_pod_goes_to_its_planned_node_and_gpus() -> None:
    rec = Recorder()
    svc = service(rec)
    p = pod("planned", gpus=2)
    p["metadata"]["annotations"] = {
        "chronotope.dev/planned-node": "a",
        "chronotope.dev/planned-gpus": "5,6",
    }
    assert place(svc, p, ["a", "v"]) == "a"
    assignment = rec.bound["ns/planned"][1]
    assert assignment is not None
    assert assignment.gpu_indices == (5, 6)


def test_a_plan_that_no_longer_fits_falls_back_to_the_policy_and_says_so() -> None:
    events: list[tuple[str, str, str]] = []
    svc = service(Recorder())
    svc.event_fn = lambda key, reason, message: events.append((key, reason, message))
    first = pod("first", gpus=1)
    first["metadata"]["annotations"] = {
        "chronotope.dev/planned-node": "a",
        "chronotope.dev/planned-gpus": "6",
    }
    place(svc, first, ["a"])
    clash = pod("clash", gpus=1)
    clash["metadata"]["annotations"] = {
        "chronotope.dev/planned-node": "a",
        "chronotope.dev/planned-gpus": "6",
    }
    out = svc.filter(clash, ["a", "v"])
    assert len(out.passed) == 1
    assert events == [
        (
            "ns/clash",
            "PlanFallback",
            "planned node a no longer fits: planned GPU 6 is in use; "
            "placed by the chronotope policy instead",
        )
    ]
    assert svc.bind("ns", "clash", "u", out.passed[0]) == ""


def test_a_refilter_during_an_earlier_bind_of_the_same_pod_waits_for_it() -> None:
    release = threading.Event()
    started = threading.Event()

    def slow_bind(req: BindRequest) -> None:
        started.set()
        release.wait(5)

    svc = service(Recorder())
    svc.bind_fn = slow_bind
    assert svc.filter(pod("p", gpus=2), ["v"]).passed == ["v"]
    binder = threading.Thread(target=svc.bind, args=("ns", "p", "u", "v"))
    binder.start()
    assert started.wait(5)
    # kube-scheduler gave up waiting and retried: the first try may still succeed,
    # so its GPUs stay held and the retry waits
    out = svc.filter(pod("p", gpus=2), ["a", "v"])
    assert out.passed == []
    assert "still in flight" in out.failed["a"]
    release.set()
    binder.join(5)
    assert svc.cache.holdings["ns/p"].bound


def test_the_extender_chooses_what_the_simulator_chooses() -> None:
    """Same policy, same arrays: a stream of pods lands where the simulator puts it."""
    rng = np.random.default_rng(3)
    # (whole GPUs, share (percent, MiB), CPU cores): shares, 1-4 GPUs, CPU-only pods
    shapes = [
        (0, (30, 1000), 2),
        (0, (60, 1000), 4),
        (1, None, 4),
        (2, None, 8),
        (0, (25, 1000), 1),
        (4, None, 2),
        (0, None, 6),
        (0, None, 3),
    ]
    stream = [shapes[int(i)] for i in rng.integers(len(shapes), size=80)]
    requests = [
        PodRequest(
            name=f"ns/p{i}",
            cpu_milli=cpu * 1000,
            num_gpus=max(g, 1) if g or share else 0,
            gpu_milli=0 if not (g or share) else 1000 if share is None else share[0] * 10,
        )
        for i, (g, share, cpu) in enumerate(stream)
    ]
    mix = typical_pods(requests)
    cluster = [("a", "A100", 8, 80000, 32), ("t", "T4", 1, 16000, 8), ("v", "V100", 4, 16000, 16)]
    # the simulator's side: its arrays, fragmentation tables and default tie order
    snapshot = ClusterSnapshot(
        nodes=tuple(
            Node(
                name=name,
                cpu_milli=cores * 1000,
                memory_mib=65536,
                gpus=tuple(Gpu(index=j, model=model, memory_mib=mem) for j in range(count)),
            )
            for name, model, count, mem, cores in cluster
        )
    )
    state = ClusterState.from_snapshot(snapshot)
    frag = FragTracker(FragModel(mix, state.models), state)
    ctx = Context(state=state, frag=frag, rng=np.random.default_rng(0))
    policy = Chronotope()
    rec = Recorder()
    svc = ExtenderService(
        bind_fn=rec, fetch_pod=lambda ns, n: {}, cache=ClusterCache(typical=mix), clock=Clock()
    )
    svc.sync_nodes([node(n, m, c, mem, cpu=str(cores)) for n, m, c, mem, cores in cluster])
    placed = 0
    for i, ((g, share, cpu), req) in enumerate(zip(stream, requests, strict=True)):
        spec = state.spec(req)
        cand = state.feasible(spec)
        out = svc.filter(pod(f"p{i}", gpus=g, share=share, cpu=str(cpu)), ["a", "t", "v"])
        if len(cand) == 0:
            assert out.passed == [], f"pod {i}"
            continue
        where, gpus = policy.choose(ctx, spec, cand)
        state.assign(where, spec, gpus)
        frag.refresh(where)
        assert out.passed == [state.names[where]], f"pod {i}"
        assert svc.bind("ns", f"p{i}", "u", out.passed[0]) == ""
        assignment = rec.bound[f"ns/p{i}"][1]
        assert (assignment.gpu_indices if assignment else ()) == gpus, f"pod {i}"
        placed += 1
    assert 10 < placed < len(stream)  # the stream fills the cluster: both outcomes occur


def test_a_pod_that_fits_nowhere_is_logged_once_per_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    svc = service(Recorder())
    big = pod("huge", gpus=16)
    with caplog.at_level(logging.INFO, logger="chronotope.extender.service"):
        for _ in range(5):  # kube-scheduler retries an unschedulable pod again and again
            assert svc.filter(big, ["a", "t", "v"]).passed == []
    lines = [r.getMessage() for r in caplog.records if "fits no node" in r.getMessage()]
    assert len(lines) == 1
    assert "ns/huge" in lines[0]
