"""Extender decisions on the pure ledger: fit, reasons, assume/forget, rebuild from annotations."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from chronotope.extender.ledger import NoFit
from chronotope.extender.podreq import (
    SHARE_COMPUTE_ANNOTATION,
    SHARE_MEMORY_ANNOTATION,
    PodRequestError,
    pod_gpu_request,
)
from chronotope.extender.service import ExtenderService
from chronotope.sharing.assignment import BindRequest, GpuAssignment


def node(name: str, model: str, gpus: int, mem: int = 16000) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.product": model, "nvidia.com/gpu.memory": str(mem)},
        },
        "status": {"capacity": {"nvidia.com/gpu": str(gpus)}},
    }


def pod(
    name: str, gpus: int = 0, share: tuple[int, int] | None = None, model: str | None = None
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
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if model:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": model}
    return {"metadata": {"name": name, "namespace": "ns", "annotations": annotations}, "spec": spec}


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


def service(recorder: Recorder, pods: dict[str, dict[str, Any]] | None = None) -> ExtenderService:
    svc = ExtenderService(bind_fn=recorder, fetch_pod=lambda ns, n: (pods or {})[f"{ns}/{n}"])
    svc.sync_nodes([node("a", "A100", 8, 80000), node("t", "T4", 1), node("v", "V100", 4)])
    return svc


def test_filter_reports_reasons_per_node() -> None:
    svc = service(Recorder())
    out = svc.filter(pod("p", gpus=4), ["a", "t", "v", "ghost"])
    assert out.passed == ["a", "v"]
    assert "1 GPU(s) in total" in out.unresolvable["t"]
    assert "not known" in out.unresolvable["ghost"]


def test_model_selector_is_unresolvable_elsewhere() -> None:
    out = service(Recorder()).filter(pod("p", gpus=1, model="T4"), ["a", "t"])
    assert out.passed == ["t"]
    assert "not one of T4" in out.unresolvable["a"]


def test_bind_writes_assignment_and_holds_gpus() -> None:
    rec = Recorder()
    svc = service(rec)
    p = pod("p", gpus=3)
    svc.filter(p, ["v"])
    assert svc.bind("ns", "p", "uid", "v") == ""
    node_name, assignment = rec.bound["ns/p"]
    assert node_name == "v"
    assert assignment is not None
    assert assignment.gpu_indices == (0, 1, 2)
    assert assignment.gpu_uuids == ("GPU-v-0", "GPU-v-1", "GPU-v-2")
    out = svc.filter(pod("q", gpus=2), ["v"])
    assert out.passed == []
    assert "1 of 4 GPUs free" in out.failed["v"]


def test_shares_pack_onto_one_gpu_until_full() -> None:
    rec = Recorder()
    svc = service(rec)
    for i in range(3):
        p = pod(f"s{i}", share=(30, 4000))
        svc.filter(p, ["t"])
        assert svc.bind("ns", f"s{i}", "u", "t") == ""
    a = rec.bound["ns/s0"][1]
    assert a is not None
    assert (a.compute_percent, a.memory_mib) == (30, 4000)
    out = svc.filter(pod("s3", share=(30, 4000)), ["t"])
    assert "no GPU has 30 percent of one GPU, 4000 MiB free" in out.failed["t"]


def test_failed_bind_forgets_the_assumption() -> None:
    svc = service(Recorder(fail=True))
    svc.filter(pod("p", gpus=8), ["a"])
    assert "apiserver said no" in svc.bind("ns", "p", "uid", "a")
    assert svc.filter(pod("q", gpus=8), ["a"]).passed == ["a"]


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


def test_ledger_is_rebuilt_from_bound_pods_annotations() -> None:
    rec = Recorder()
    svc = service(rec)
    svc.filter(pod("p", gpus=2), ["v"])
    svc.bind("ns", "p", "u", "v")
    _, assignment = rec.bound["ns/p"]
    assert assignment is not None
    bound = pod("p", gpus=2)
    bound["metadata"]["annotations"] = assignment.to_annotations()
    bound["spec"]["nodeName"] = "v"
    fresh = service(Recorder())  # a restarted extender
    fresh.sync_pods([bound])
    assert "2 of 4 GPUs free" in fresh.filter(pod("q", gpus=3), ["v"]).failed["v"]
    fresh.on_pod("DELETED", bound)
    assert fresh.filter(pod("q", gpus=3), ["v"]).passed == ["v"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (pod("x", gpus=1, share=(10, 10)), "not both"),
        (
            {
                "metadata": {"name": "x", "annotations": {}},
                "spec": {
                    "containers": [
                        {"name": "c", "resources": {"limits": {"chronotope.dev/gpu-share": "1"}}}
                    ]
                },
            },
            "gpu-memory-mib",
        ),
        (pod("x", share=(150, 10)), "less than or equal to 100"),
    ],
)
def test_bad_pod_requests_name_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(PodRequestError, match=message):
        pod_gpu_request(spec)
    out = service(Recorder()).filter(spec, ["a"])
    assert message in out.unresolvable["a"]


def test_planned_pod_goes_only_to_its_planned_node_and_gpus() -> None:
    rec = Recorder()
    svc = service(rec)
    p = pod("planned", gpus=2)
    p["metadata"]["annotations"] = {
        "chronotope.dev/planned-node": "a",
        "chronotope.dev/planned-gpus": "5,6",
    }
    out = svc.filter(p, ["a", "v"])
    assert out.passed == ["a"]
    assert "batch plan puts this pod on a" in out.failed["v"]
    assert svc.bind("ns", "planned", "u", "a") == ""
    assert rec.bound["ns/planned"][1] is not None
    assert rec.bound["ns/planned"][1].gpu_indices == (5, 6)
    clash = pod("clash", gpus=1)
    clash["metadata"]["annotations"] = {
        "chronotope.dev/planned-node": "a",
        "chronotope.dev/planned-gpus": "6",
    }
    out = svc.filter(clash, ["a"])
    assert out.passed == []
    assert "planned GPU 6 is in use" in out.failed["a"]


def test_a_retried_bind_waits_for_the_earlier_try_of_the_same_pod() -> None:
    svc = service(Recorder())
    req = pod_gpu_request(pod("p", gpus=2))
    assert req is not None
    first = svc.ledger.assume("ns/p", "a", req)
    assert first == (0, 1)
    # kube-scheduler gave up waiting and retried elsewhere: the first try may still
    # succeed, so its GPUs must stay held and the retry must wait
    retry = svc.ledger.assume("ns/p", "v", req)
    assert isinstance(retry, NoFit) and "still in flight" in retry.message
    svc.ledger.forget("ns/p", only=("v", (0, 1)))  # a failing retry releases nothing else
    assert svc.ledger.holdings["ns/p"].node == "a"
    svc.ledger.confirm("ns/p")
    again = svc.ledger.assume("ns/p", "v", req)
    assert isinstance(again, NoFit) and again.unresolvable


def test_prioritize_uses_the_scores_of_its_filter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    svc = service(Recorder())
    p = pod("p", gpus=2)
    assert svc.filter(p, ["a", "t", "v"]).passed == ["a", "v"]
    calls: list[str] = []
    real_fit = svc.ledger.fit
    monkeypatch.setattr(svc.ledger, "fit", lambda n, r: calls.append(n) or real_fit(n, r))
    scores = svc.prioritize(p, ["a", "v"])
    assert calls == []  # scored while filtering
    assert scores["v"] > scores["a"]  # 2 of 4 V100s left beats 6 of 8 A100s
    svc.prioritize(p, ["a", "v"])  # a second call (no filter before it) refits
    assert sorted(calls) == ["a", "v"]


def test_filter_waits_for_the_bind_of_the_pod_filtered_before_it() -> None:
    # kube-scheduler binds asynchronously and starts the next pod's cycle at once.
    # If the second share were scored before the first one's GPUs are assumed, it
    # would open a second GPU instead of packing onto the first one's.
    svc = service(Recorder())
    first, second = pod("s1", share=(40, 6000)), pod("s2", share=(40, 6000))
    nodes = ["a", "t", "v"]
    assert svc.filter(first, nodes).passed == nodes
    done: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: done.update(out=svc.filter(second, nodes)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # held until s1's bind arrives
    assert svc.bind("ns", "s1", "uid-1", "v") == ""
    waiter.join(2.0)
    assert not waiter.is_alive()
    scores = svc.prioritize(second, done["out"].passed)
    assert max(scores, key=lambda n: scores[n]) == "v"  # packs onto s1's GPU


def test_filter_gives_up_on_a_pod_whose_bind_never_comes() -> None:
    svc = service(Recorder())
    svc.inflight_wait_s = 0.1
    nodes = ["a", "t", "v"]
    assert svc.filter(pod("lost", gpus=1), nodes).passed == nodes
    assert svc.filter(pod("next", gpus=1), nodes).passed == nodes  # after 0.1 s, not forever
    svc.on_pod("DELETED", pod("next", gpus=1))  # a deleted pod stops holding filters up
    assert svc.filter(pod("third", gpus=1), nodes).passed == nodes
