"""ModelVariant `reconcile` against a fake `VariantOps`: the group memo, events, isolation."""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from chronotope.controllers.modelvariant import GroupMemo, VariantOps, reconcile
from chronotope.controllers.trainingjob import Outcome
from chronotope.workloads.training_quota import waiting_serving
from tests.quota_inputs import QuotaInputs, serving_pod, training_borrows
from tests.variant_fixtures import node, pod, variant

NOW = datetime(2030, 1, 1, tzinfo=UTC)


class FakeOps(QuotaInputs):
    """Objects in memory; counts applies and Prometheus queries."""

    def __init__(self, variants: list[dict[str, Any]]) -> None:
        super().__init__()
        self.objs = {v["metadata"]["name"]: v for v in variants}
        self._nodes = [node("h100-0"), node("h100-1")]
        self._pods: dict[str, list[dict[str, Any]]] = {}
        self.applied: dict[tuple[str, str], dict[str, Any]] = {}
        self.applies = 0
        self.queries = 0
        self.rate: float | str = 0.2
        self.elsewhere: list[dict[str, Any]] = []
        """Pods of other namespaces' workloads."""

    def variants(self, namespace: str) -> list[dict[str, Any]]:
        return list(self.objs.values())

    def nodes(self) -> list[dict[str, Any]]:
        return self._nodes

    def pods(self, namespace: str, group: str) -> list[dict[str, Any]]:
        return self._pods.get(group, [])

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.applied.get(("ConfigMap", name))

    def query_rate(self, address: str | None, query: str) -> float | str:
        self.queries += 1
        return self.rate

    def apply(self, objects: Sequence[dict[str, Any]]) -> None:
        self.applies += 1
        for obj in objects:
            self.applied[obj["kind"], obj["metadata"]["name"]] = copy.deepcopy(obj)

    def pods_matching(
        self, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        every = [p for pods in self._pods.values() for p in pods] + self.elsewhere
        return [p for p in every if namespace in (None, p["metadata"].get("namespace", "ns"))]

    def run_pods(self, group: str, *, ready: bool = True) -> None:
        """The Deployment controller and scheduler: one bound pod per replica, as templated."""
        spec = self.applied["Deployment", group]["spec"]
        self._pods[group] = []
        for i in range(spec["replicas"]):
            p = pod(f"{group}-{i}", f"h100-{i % 2}", ready=ready, group=group)
            p["spec"] = copy.deepcopy(spec["template"]["spec"]) | p["spec"]  # its GPUs, its node
            self._pods[group].append(p)


def _protocol(ops: FakeOps) -> VariantOps:
    return ops  # mypy checks the fake against the Protocol


def _pass(ops: FakeOps, memo: GroupMemo, now: datetime = NOW) -> dict[str, Outcome]:
    """One timer round: every variant reconciled once, its status written back."""
    out = {}
    for name, obj in list(ops.objs.items()):
        outcome = reconcile(obj, ops, now, memo)
        obj["status"] = outcome.status
        out[name] = outcome
    return out


def _three() -> FakeOps:
    return FakeOps([variant("a"), variant("b"), variant("c")])


def test_one_group_pass_serves_every_variant_of_the_group() -> None:
    ops, memo = _three(), GroupMemo()
    first = _pass(ops, memo)
    assert memo.passes == 1
    assert ops.applies == 1
    assert set(ops.applied) == {
        ("ConfigMap", "llama-placement"),
        ("Service", "llama"),
        ("Deployment", "llama"),
    }
    for outcome in first.values():
        assert outcome.status["phase"] == "Pending"
        assert [e[1] for e in outcome.events] == ["Pending", "Placed"]
    quiet = _pass(ops, memo)  # nothing changed: the memo answers, nothing is said twice
    assert memo.passes == 1
    assert all(o.events == [] for o in quiet.values())
    ops.run_pods("llama")
    serving = _pass(ops, memo)
    assert memo.passes == 2  # the pods changed
    for outcome in serving.values():
        assert outcome.status["phase"] == "Serving"
        assert [e[1] for e in outcome.events] == ["Serving"]
        assert "llama-0 (h100-0, H100-SXM5-80GB)" in outcome.events[0][2]
    assert _pass(ops, memo)["a"].events == []


def test_a_spec_change_replans_and_the_memo_refreshes_after_its_interval() -> None:
    ops, memo = _three(), GroupMemo(refresh_s=30)
    _pass(ops, memo)
    ops.run_pods("llama")
    _pass(ops, memo)
    passes = memo.passes
    hot = variant("a", qps=8, generation=2)
    ops.objs["a"] = hot | {"status": ops.objs["a"]["status"]}
    _pass(ops, memo)
    assert memo.passes == passes + 1
    assert ops.applied["Deployment", "llama"]["spec"]["replicas"] == 2
    _pass(ops, memo, NOW + timedelta(seconds=10))
    assert memo.passes == passes + 1
    _pass(ops, memo, NOW + timedelta(seconds=31))  # re-applied even though nothing changed
    assert memo.passes == passes + 2


def test_a_node_change_replans() -> None:
    ops, memo = _three(), GroupMemo()
    _pass(ops, memo)
    ops._nodes = [node("a100-0", "A100-SXM4-80GB", 8)]
    _pass(ops, memo)
    assert memo.passes == 2
    selector = ops.applied["Deployment", "llama"]["spec"]["template"]["spec"]["nodeSelector"]
    assert selector == {"nvidia.com/gpu.product": "A100-SXM4-80GB"}


def _holder(name: str, node_name: str, gpus: int) -> dict[str, Any]:
    """A bound pod of another namespace's workload holding `gpus` of the node's GPUs."""
    limits = {"nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"name": name, "namespace": "other"},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Running"},
    }


def test_a_group_is_planned_on_free_gpus_and_moves_back_once_its_best_type_frees_up() -> None:
    # other work holds every H100: before, the group was planned there anyway and its
    # pod waited while the A100s idled; now it goes to the A100s, and once the H100s
    # free up (a change of the free GPUs, not the refresh) it is planned back on them
    ops, memo = _three(), GroupMemo(refresh_s=300)
    ops._nodes = [*ops._nodes, node("a100-0", "A100-SXM4-80GB", 8)]
    ops.elsewhere = [_holder("train-0", "h100-0", 8), _holder("train-1", "h100-1", 8)]

    def selector() -> str:
        spec = ops.applied["Deployment", "llama"]["spec"]["template"]["spec"]
        return str(spec["nodeSelector"]["nvidia.com/gpu.product"])

    first = _pass(ops, memo)
    assert selector() == "A100-SXM4-80GB"
    placed = dict(e[1:] for e in first["a"].events)["Placed"]
    assert "on the GPUs free now (1 x H100-SXM5-80GB would serve it" in placed
    _pass(ops, memo, NOW + timedelta(seconds=10))
    assert memo.passes == 1  # nothing it reads changed
    ops.elsewhere = [_holder("train-1", "h100-1", 8)]  # one H100 node's GPUs free up
    _pass(ops, memo, NOW + timedelta(seconds=20))
    assert memo.passes == 2
    assert selector() == "H100-SXM5-80GB"
    # its own pods' GPUs count as free: running there, it stays when other work fills the rest
    ops.run_pods("llama")
    ops.elsewhere = [_holder("train-0", "h100-0", 7), _holder("train-1", "h100-1", 8)]
    _pass(ops, memo, NOW + timedelta(seconds=30))
    assert selector() == "H100-SXM5-80GB"


def test_a_bad_variant_fails_alone_and_says_so_once() -> None:
    ops = FakeOps(
        [
            variant("a"),
            variant("huge", delta_mib=20000),
            variant("other-base", base="mistralai/Mistral-7B-v0.1", base_mib=14000, created=5),
        ]
    )
    memo = GroupMemo()
    first = _pass(ops, memo)
    assert first["huge"].status["phase"] == "Failed"
    assert first["huge"].events == [
        ("Warning", "DeltaTooLarge", first["huge"].status["whyWaiting"])
    ]
    assert first["other-base"].status["conditions"][0]["reason"] == "BaseMismatch"
    assert first["a"].status["phase"] == "Pending"
    assert first["a"].status["gpuType"] == "H100-SXM5-80GB"
    owners = ops.applied["Deployment", "llama"]["metadata"]["ownerReferences"]
    assert {o["name"] for o in owners} == {"a", "other-base"}
    again = _pass(ops, memo)
    assert again["huge"].events == []
    assert again["other-base"].events == []


def test_a_live_rate_is_read_once_per_ttl_and_replans_when_it_moves() -> None:
    source: dict[str, Any] = {
        "traffic": {"expectedQPS": 0.1, "prometheus": {"query": "rate(req[1m])"}}
    }
    ops = FakeOps([variant("a", **source), variant("b")])
    memo = GroupMemo(rate_ttl_s=5)
    _pass(ops, memo)
    assert ops.queries == 1  # two variants' passes, one query
    assert ops.applied["Deployment", "llama"]["spec"]["replicas"] == 1
    ops.rate = 20.0
    _pass(ops, memo, NOW + timedelta(seconds=2))  # within the TTL: the old rate
    assert ops.applied["Deployment", "llama"]["spec"]["replicas"] == 1
    _pass(ops, memo, NOW + timedelta(seconds=6))
    assert ops.queries == 2
    assert ops.applied["Deployment", "llama"]["spec"]["replicas"] > 1


def test_concurrent_passes_of_one_group_plan_it_once() -> None:
    ops, memo = _three(), GroupMemo()
    start = threading.Barrier(6)
    errors: list[BaseException] = []

    def one(name: str) -> None:
        start.wait()
        try:
            reconcile(ops.objs[name], ops, NOW, memo)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in ("a", "b", "c") * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []
    assert memo.passes == 1
    assert ops.applies == 1


def test_a_variant_being_deleted_is_left_alone_and_its_group_replans_without_it() -> None:
    ops, memo = _three(), GroupMemo()
    _pass(ops, memo)
    ops.objs["c"]["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    assert reconcile(ops.objs["c"], ops, NOW, memo) == Outcome()
    _pass(ops, memo)
    doc = ops.applied["ConfigMap", "llama-placement"]["data"]["placement.json"]
    assert '"c"' not in doc


GPU = "H100-SXM5-80GB"


def _serving_queue(ops: FakeOps, gpus: int) -> None:
    """Queue `serving` with `gpus` GPUs, namespace ns's LocalQueue `default` onto it."""
    ops.queue_objs = [
        {"metadata": {"name": "serving"}, "spec": {"quotas": [{"gpuType": GPU, "gpus": gpus}]}}
    ]
    ops.local_queue_objs = [
        {"metadata": {"name": "default", "namespace": "ns"}, "spec": {"queue": "serving"}}
    ]


def test_a_new_serving_group_over_its_queue_quota_waits_and_builds_nothing() -> None:
    ops, memo = _three(), GroupMemo()
    _serving_queue(ops, 0)
    out = _pass(ops, memo)
    assert ops.applies == 0
    for outcome in out.values():
        assert outcome.status["phase"] == "Pending"
        assert outcome.status["whyWaiting"].startswith("waiting for quota: queue serving:")
        assert outcome.status["conditions"][0]["reason"] == "QuotaExceeded"
    # its Queue counts the group (not each variant) as one pending workload
    waits = waiting_serving([], ops.objs.values())
    assert [w.workload.key for w in waits] == ["ns/serving-group:llama"]
    (demand,) = waits[0].workload.alternatives  # its Deployment's GPUs: one type, in the cycle
    assert (demand.gpu_type, demand.gpus > 0) == (GPU, True)
    # the quota is raised: the next group pass builds it
    ops.queue_objs[0]["spec"]["quotas"][0]["gpus"] = 16
    _pass(ops, memo, NOW + timedelta(seconds=60))
    assert ops.applies == 1
    assert waiting_serving([], ops.objs.values()) == []
    assert ("Deployment", next(iter(memo._entries))[1]) in ops.applied


def test_a_new_serving_group_is_planned_on_the_gpu_type_its_queue_admits() -> None:
    # the queue lists A100 quota only: before, the group was planned on the H100s (the
    # fewest GPUs) and waited for quota that never comes; now it is built on the A100s
    ops, memo = _three(), GroupMemo()
    ops._nodes = [*ops._nodes, node("a100-0", "A100-SXM4-80GB", 8)]
    _serving_queue(ops, 0)
    ops.queue_objs[0]["spec"]["quotas"].append({"gpuType": "A100-SXM4-80GB", "gpus": 8})
    out = _pass(ops, memo)
    assert ops.applies == 1
    spec = ops.applied["Deployment", "llama"]["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "A100-SXM4-80GB"}
    assert all(o.status["phase"] == "Pending" for o in out.values())
    assert not any("quota" in o.status["whyWaiting"] for o in out.values())
    # its H100 quota lent to a borrowing TrainingJob, its A100 quota free: it is built on
    # the A100s without stopping the borrower (Kueue tries the next flavour first)
    ops, memo = _three(), GroupMemo()
    ops._nodes = [*ops._nodes, node("a100-0", "A100-SXM4-80GB", 8)]
    _serving_queue(ops, 16)
    ops.queue_objs[0]["spec"]["quotas"].append({"gpuType": "A100-SXM4-80GB", "gpus": 8})
    training_borrows(ops, "PreemptBorrowed", GPU, workers=16)
    events = _pass(ops, memo)["a"].events
    assert ops.applies == 1
    reasons = dict(e[1:] for e in events)
    assert "ReclaimingQuota" not in reasons
    assert reasons["Placed"].startswith(
        "A100-SXM4-80GB (on the GPUs free now (1 x H100-SXM5-80GB would serve it, "
        "but queue serving's quota does not admit them now))"
    )


def test_a_running_serving_group_grows_only_as_far_as_its_queue_quota_admits() -> None:
    ops, memo = _three(), GroupMemo(refresh_s=30)
    _serving_queue(ops, 16)
    _pass(ops, memo)
    ops.run_pods("llama")
    _pass(ops, memo)
    deployment = ops.applied["Deployment", "llama"]
    assert deployment["spec"]["replicas"] == 1
    per_replica = int(
        deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
            "nvidia.com/gpu"
        ]
    )
    # the platform team caps the queue at what runs; then a variant's traffic needs a replica more
    ops.queue_objs[0]["spec"]["quotas"][0]["gpus"] = per_replica
    hot = variant("a", qps=8, generation=2)
    ops.objs["a"] = hot | {"status": ops.objs["a"]["status"]}
    held = _pass(ops, memo, NOW + timedelta(seconds=1))
    assert ops.applied["Deployment", "llama"]["spec"]["replicas"] == 1  # kept its plan
    for outcome in held.values():
        assert outcome.status["phase"] == "Serving"  # what runs keeps serving
        assert [e[1] for e in outcome.events] == ["QuotaExceeded"]
        assert outcome.events[0][2].startswith("not scaling up: queue serving:")
    doc = ops.applied["ConfigMap", "llama-placement"]["data"]["placement.json"]
    assert "not scaling up" in doc
    # the next refresh, still held: nothing is said twice
    again = _pass(ops, memo, NOW + timedelta(seconds=40))
    assert all(o.events == [] for o in again.values())
    # the quota is raised: the group takes its new plan
    ops.queue_objs[0]["spec"]["quotas"][0]["gpus"] = 16
    _pass(ops, memo, NOW + timedelta(seconds=80))
    assert ops.applied["Deployment", "llama"]["spec"]["replicas"] == 2


def test_a_running_serving_groups_new_plan_reclaims_its_queues_lent_quota() -> None:
    def grown(policy: str) -> tuple[FakeOps, dict[str, Outcome]]:
        ops, memo = _three(), GroupMemo()
        _serving_queue(ops, 16)
        _pass(ops, memo)
        ops.run_pods("llama")
        _pass(ops, memo)
        replica = ops.applied["Deployment", "llama"]["spec"]["template"]["spec"]
        gpus = int(replica["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        # a training queue of the cohort borrows all its queue does not use; then a
        # variant's traffic needs a replica more
        _lent_to_training(ops, 16 - gpus, policy)
        hot = variant("a", qps=8, generation=2)
        ops.objs["a"] = hot | {"status": ops.objs["a"]["status"]}
        return ops, _pass(ops, memo, NOW + timedelta(seconds=1))

    ops, up = grown("PreemptBorrowed")
    assert ops.applied["Deployment", "llama"]["spec"]["replicas"] == 2
    for outcome in up.values():
        reclaiming = [e[2] for e in outcome.events if e[1] == "ReclaimingQuota"]
        assert len(reclaiming) == 1
        assert "stopping borrowed TrainingJob(s) t/big" in reclaiming[0]
    ops, held = grown("Never")
    assert ops.applied["Deployment", "llama"]["spec"]["replicas"] == 1
    assert all([e[1] for e in o.events] == ["QuotaExceeded"] for o in held.values())


def test_a_serving_group_above_a_lowered_quota_shrinks_but_does_not_grow_back() -> None:
    ops, memo = FakeOps([variant("a", qps=20), variant("b"), variant("c")]), GroupMemo()
    _serving_queue(ops, 16)
    _pass(ops, memo)
    ops.run_pods("llama")
    _pass(ops, memo)
    assert ops.applied["Deployment", "llama"]["spec"]["replicas"] == 4  # 4 x 1 GPU
    # the platform team lowers the quota to 2 GPUs; then a's traffic drops to 3 replicas' worth
    ops.queue_objs[0]["spec"]["quotas"][0]["gpus"] = 2
    ops.objs["a"] = variant("a", qps=12, generation=2) | {"status": ops.objs["a"]["status"]}
    shrunk = _pass(ops, memo, NOW + timedelta(seconds=1))
    assert ops.applied["Deployment", "llama"]["spec"]["replicas"] == 3  # it gives one back
    assert all("QuotaExceeded" not in [e[1] for e in o.events] for o in shrunk.values())
    ops.run_pods("llama")
    # traffic is back: 4 replicas would be above the quota again, so it keeps its 3
    ops.objs["a"] = variant("a", qps=20, generation=3) | {"status": ops.objs["a"]["status"]}
    held = _pass(ops, memo, NOW + timedelta(seconds=2))
    assert ops.applied["Deployment", "llama"]["spec"]["replicas"] == 3
    assert [e[1] for e in held["a"].events] == ["QuotaExceeded"]


def test_another_namespaces_serving_pods_count_against_the_shared_queue() -> None:
    """A pipeline of namespace `other`, in the same Queue, holds all 16 GPUs: the group waits."""
    ops, memo = _three(), GroupMemo()
    _serving_queue(ops, 16)
    ops.local_queue_objs.append(
        {"metadata": {"name": "default", "namespace": "other"}, "spec": {"queue": "serving"}}
    )
    ops.elsewhere = [serving_pod("theirs-0", GPU, namespace="other", pipeline="theirs", gpus=16)]
    out = _pass(ops, memo)
    assert ops.applies == 0
    for outcome in out.values():
        assert outcome.status["phase"] == "Pending"
        assert outcome.status["whyWaiting"].startswith("waiting for quota: queue serving:")


def _lent_to_training(ops: FakeOps, gpus: int, policy: str = "PreemptBorrowed") -> None:
    """Queue serving (16 GPUs, `policy`) lent `gpus` to TrainingJob t/big of queue train."""
    _serving_queue(ops, 16)
    training_borrows(ops, policy, GPU, workers=gpus)


def test_a_new_serving_group_reclaims_its_queues_quota_lent_to_training() -> None:
    """Queue serving (16 GPUs, PreemptBorrowed) lent them all to a TrainingJob of queue train."""
    ops, memo = _three(), GroupMemo()
    _lent_to_training(ops, 16)
    out = _pass(ops, memo)
    assert ops.applies == 1  # built: its pods reserve the quota while t/big is stopped
    for outcome in out.values():
        assert [e[1] for e in outcome.events if e[1] == "ReclaimingQuota"] == ["ReclaimingQuota"]
        assert "stopping borrowed TrainingJob(s) t/big" in outcome.events[-1][2]
    # under reclaim policy Never it waits, as before
    ops2, memo2 = _three(), GroupMemo()
    _serving_queue(ops2, 16)
    ops2.queue_objs, ops2.local_queue_objs, ops2.jobs = (
        copy.deepcopy(ops.queue_objs),
        ops.local_queue_objs,
        ops.jobs,
    )
    ops2.queue_objs[0]["spec"]["reclaim"]["policy"] = "Never"
    held = _pass(ops2, memo2)
    assert ops2.applies == 0
    assert all(o.status["phase"] == "Pending" for o in held.values())
