"""ModelVariant serving groups (pure): grouping, bad input, GPU pool, placement contract, status."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from chronotope.api.v1alpha1.common import GpuRequest, GpuShare
from chronotope.api.v1alpha1.inferencepipeline import InferencePipelineSpec
from chronotope.controllers.inferencepipeline import gpu_types
from chronotope.planners.inferline import StageConfig
from chronotope.planners.llmcost import Tier
from chronotope.planners.variants import GroupPlan, Placement, ReplicaPlan
from chronotope.sharing.assignment import GpuAssignment
from chronotope.solver.colocation import Colocation
from chronotope.solver.online import PlacementRules
from chronotope.workloads.capacity import FreeGpus
from chronotope.workloads.pipeline import _over_free
from chronotope.workloads.placement import (
    DRAINING,
    SERVING,
    PodView,
    assign_slots,
    parse_doc,
    plan_from_doc,
    routes,
)
from chronotope.workloads.quota import Unit
from chronotope.workloads.serving_group import GroupResult, object_name, serve_group
from chronotope.workloads.training_quota import ServingRoom
from chronotope.workloads.variants import (
    free_serving_gpus,
    gpu_pool,
    group_variants,
    replica_request,
    usable_gpu_nodes,
)
from tests.variant_fixtures import LLAMA, node, pod, variant

ROOT = Path(__file__).resolve().parents[3]

NOW = datetime(2030, 1, 1, tzinfo=UTC)
H100 = "H100-SXM5-80GB"


def serve(
    variants: Sequence[dict[str, Any]],
    *,
    nodes: Sequence[dict[str, Any]] | None = None,
    pods: Sequence[dict[str, Any]] = (),
    previous: dict[str, Any] | None = None,
    rates: dict[str, float | str] | None = None,
    group: str = "llama",
) -> GroupResult:
    grouping = group_variants(variants)
    return serve_group(
        grouping.groups[group],
        "ns",
        nodes=nodes if nodes is not None else [node("h100-0")],
        pods=list(pods),
        previous_doc=previous,
        rates=rates or {},
        now=NOW,
    )


# -- grouping and bad input ---------------------------------------------------------------


def test_variants_group_by_serving_group_else_by_base() -> None:
    grouping = group_variants(
        [
            variant("a"),
            variant("b"),
            variant("c", group=None),
            variant("d", group=None, base="mistralai/Mistral-7B-v0.1", base_mib=14000),
        ]
    )
    assert {g: [m.name for m in grp.members] for g, grp in grouping.groups.items()} == {
        "llama": ["a", "b"],
        "meta-llama-llama-2-7b-hf": ["c"],
        "mistralai-mistral-7b-v0-1": ["d"],
    }
    assert grouping.failed == {}
    assert grouping.group_of["c"] == "meta-llama-llama-2-7b-hf"


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("meta-llama/Llama-2-7b-hf", "meta-llama-llama-2-7b-hf"),
        ("01-ai/Yi-34B", "m-01-ai-yi-34b"),  # a Service name must start with a letter
        ("org/" + "x" * 80, None),  # hashed to 63 characters
    ],
)
def test_derived_group_names_are_dns_labels(base: str, expected: str | None) -> None:
    grouping = group_variants([variant("a", group=None, base=base)])
    (name,) = grouping.groups
    assert len(name) <= 63
    assert name[0].isalpha()
    assert name[-1].isalnum()
    if expected is not None:
        assert name == expected
    assert object_name("7b") == "g-7b"


def test_a_delta_not_smaller_than_its_base_fails_that_variant_only() -> None:
    grouping = group_variants([variant("ok"), variant("huge", delta_mib=13000)])
    assert grouping.failed["huge"].code == "DeltaTooLarge"
    assert "not smaller than its base (13000 MiB)" in grouping.failed["huge"].message
    assert [m.name for m in grouping.groups["llama"].members] == ["ok"]


def test_an_invalid_spec_fails_that_variant_only() -> None:
    bad = variant("bad")
    bad["spec"]["delta"]["bits"] = 5
    grouping = group_variants([bad, variant("ok")])
    assert grouping.failed["bad"].code == "InvalidSpec"
    assert "delta.bits" in grouping.failed["bad"].message
    assert "ok" in grouping.group_of


def test_the_majority_base_is_served_and_the_others_fail_with_base_mismatch() -> None:
    other: dict[str, Any] = {"base": "mistralai/Mistral-7B-v0.1", "base_mib": 14000}
    grouping = group_variants(
        [variant("a", created=3), variant("b", created=4), variant("c", created=1, **other)]
    )
    group = grouping.groups["llama"]
    assert group.base.name == LLAMA
    assert [m.name for m in group.members] == ["a", "b"]
    assert [m.name for m in group.owners] == ["a", "b", "c"]
    assert grouping.failed["c"].code == "BaseMismatch"
    assert "serves base meta-llama/Llama-2-7b-hf (13000 MiB), as 2 of its 3" in (
        grouping.failed["c"].message
    )
    # a size disagreement is a mismatch too; on a tie the oldest variant's base wins
    tie = group_variants([variant("new", created=9), variant("old", created=2, base_mib=13500)])
    assert tie.groups["llama"].base.size_mib == 13500
    assert set(tie.failed) == {"new"}


def test_a_base_no_gpu_can_hold_fails_the_whole_group_and_builds_nothing() -> None:
    result = serve([variant("a", base_mib=100_000), variant("b", base_mib=100_000)])
    assert result.objects == ()
    for status in result.statuses.values():
        assert status["phase"] == "Failed"
        assert status["conditions"][0]["reason"] == "NoGpuFits"
        assert "cannot hold the base (100000 MiB)" in status["whyWaiting"]


def test_an_unmeetable_slo_fails_that_variant_and_serves_the_rest() -> None:
    result = serve([variant("a"), variant("fast", slo_ms=5)])
    assert result.statuses["fast"]["phase"] == "Failed"
    assert result.statuses["fast"]["conditions"][0]["reason"] == "SloUnmeetable"
    assert result.statuses["a"]["phase"] == "Pending"  # no pod yet
    assert result.doc is not None
    assert set(result.doc["routes"]) == {"a"}
    assert result.doc["rejected"]["fast"]["code"] == "SloUnmeetable"


# -- GPU pool and the replica's request ---------------------------------------------------


def test_the_gpu_pool_counts_ready_schedulable_nodes_of_known_types() -> None:
    nodes = [
        node("h0", gpus=8),
        node("h1", gpus=8, ready=False),
        node("h2", gpus=8, unschedulable=True),
        node("a0", "A100-SXM4-80GB", 4, memory_mib=40960),
        node("x0", "MYSTERY-GPU", 8),
        node("c0", "T4", 0),
    ]
    pool = gpu_pool(nodes, GpuRequest(count=1))
    assert {t: n for t, (_, n) in pool.items()} == {H100: 8, "A100-SXM4-80GB": 4}
    assert pool["A100-SXM4-80GB"][0].memory_mib == 40960  # the node's label wins
    two = gpu_pool(nodes, GpuRequest(count=2))
    assert two[H100][1] == 4
    assert two[H100][0].memory_mib == 2 * 81559
    share = gpu_pool(
        nodes, GpuRequest.model_validate({"shared": {"memoryMiB": 20000, "computePercent": 30}})
    )
    perf, count = share[H100]
    assert count == 8 * 3  # three 30 % shares per GPU (memory allows four)
    assert perf.memory_mib == 20000


def test_the_gpu_pool_counts_as_many_shares_a_gpu_as_the_extender_puts_there() -> None:
    # High compute-bound 20 % shares: compute and memory allow five a GPU, but beside two
    # others a third is predicted at the 1.10x budget and a fourth over it; the
    # extender places three, and so does the pool count (before: five, and the group
    # planned replicas whose pods the extender refused)
    high = {"memoryMiB": 4096, "computePercent": 20, "priority": "High"}
    request = GpuRequest.model_validate({"shared": high | {"profile": "ComputeBound"}})
    nodes = [node("h0", gpus=2)]
    assert gpu_pool(nodes, request)[H100][1] == 2 * 3
    # the extender's budget is the operator's too
    loose = PlacementRules(colocation=Colocation(budget=1.5))
    assert gpu_pool(nodes, request, loose)[H100][1] == 2 * 5
    # best-effort shares are bounded beside High ones, never refused by each other
    best_effort = GpuRequest.model_validate({"shared": high | {"priority": "BestEffort"}})
    assert gpu_pool(nodes, best_effort)[H100][1] == 2 * 5


def test_the_gpu_pool_leaves_out_nodes_whose_taints_serving_pods_do_not_tolerate() -> None:
    # serving pods carry no tolerations: a team's dedicated node is not theirs (before,
    # the group was planned there and its pods stayed Pending); the device plugin's
    # nvidia.com/gpu taint is tolerated by the API server's ExtendedResourceToleration
    dedicated, gpu = node("h0", gpus=8), node("h1", gpus=8)
    dedicated["spec"] = {"taints": [{"key": "dedicated", "value": "b", "effect": "NoSchedule"}]}
    gpu["spec"] = {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}
    soft = node("h2", gpus=8)
    soft["spec"] = {"taints": [{"key": "spot", "effect": "PreferNoSchedule"}]}
    pool = gpu_pool([dedicated, gpu, soft], GpuRequest(count=1))
    assert pool[H100][1] == 16
    assert usable_gpu_nodes([dedicated]) == []
    assert gpu_types([dedicated, gpu]) == {H100}
    assert gpu_types([dedicated]) == set()
    # a share asks for chronotope.dev/gpu-share, not nvidia.com/gpu: the plugin adds no
    # toleration of the nvidia.com/gpu taint to its pods, and that node is not theirs
    share = GpuRequest(shared=GpuShare(memory_mib=8192, compute_percent=50))
    assert gpu_pool([dedicated, gpu], share) == {}
    assert gpu_pool([soft], share)[H100][1] == 16


def test_a_replica_takes_the_largest_request_of_its_variants() -> None:
    shared: dict[str, Any] = {"gpu": {"shared": {"memoryMiB": 16000, "computePercent": 40}}}
    bigger: dict[str, Any] = {
        "gpu": {"shared": {"memoryMiB": 20000, "computePercent": 30, "priority": "High"}}
    }
    grouping = group_variants([variant("a", **shared), variant("b", **bigger)])
    request = replica_request(grouping.groups["llama"].members)
    assert request.shared is not None
    assert (request.shared.memory_mib, request.shared.compute_percent) == (20000, 40)
    assert request.shared.priority == "High"
    # a variant that names no GPU needs a whole one: whole GPUs win
    mixed = group_variants([variant("a", **shared), variant("c")])
    assert replica_request(mixed.groups["llama"].members) == GpuRequest(count=1)
    result = serve([variant("a", **shared), variant("b", **bigger)])
    template = result.objects[2]["spec"]["template"]
    limits = template["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"chronotope.dev/gpu-share": "1"}
    assert template["metadata"]["annotations"]["chronotope.dev/gpu-memory-mib"] == "20000"


# -- objects and the placement contract ---------------------------------------------------


def test_the_group_gets_a_deployment_a_service_and_its_placement_config_map() -> None:
    result = serve([variant("a"), variant("b"), variant("c")])
    config_map, service, deployment = result.objects
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "llama"
    assert config_map["metadata"]["name"] == "llama-placement"
    owners = {o["name"] for o in deployment["metadata"]["ownerReferences"]}
    assert owners == {"a", "b", "c"}  # the garbage collector waits for the last variant
    assert deployment["spec"]["replicas"] == 1
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["schedulerName"] == "chronotope"
    assert pod_spec["nodeSelector"] == {"nvidia.com/gpu.product": H100}
    assert pod_spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert pod_spec["volumes"][0]["configMap"]["name"] == "llama-placement"
    doc = parse_doc(config_map["data"])
    assert doc is not None
    assert doc == result.doc
    assert doc["version"] == 1
    assert doc["gpuType"] == H100
    (replica,) = doc["replicas"]
    assert [d["variant"] for d in replica["resident"]] == ["a", "b", "c"]
    assert replica["resident"][0] == {"variant": "a", "uri": "s3://deltas/a", "sizeMiB": 500}
    assert "SLOT" in config_map["data"]["placement.txt"]


def test_the_document_reads_back_as_the_plan_and_its_version_moves_only_on_change() -> None:
    variants = [variant("a"), variant("b")]
    first = serve(variants)
    assert first.doc is not None
    plan = plan_from_doc(json.loads(json.dumps(first.doc)))
    assert plan == first.plan
    again = serve(variants, previous=first.doc)
    assert again.doc is not None
    assert again.doc["version"] == 1
    assert again.events == {}  # nothing moved: no Placed events
    ready = serve(variants, pods=[pod("llama-x", "h100-0", ready=True)], previous=first.doc)
    assert ready.doc is not None
    assert ready.doc["version"] == 2
    assert plan_from_doc({"group": "x"}) is None


@pytest.mark.parametrize(
    ("n", "previous", "pods", "expected"),
    [
        (2, [], ["p2", "p1"], ["p1", "p2"]),  # new pods fill slots in name order
        (2, ["p2", "p1"], ["p1", "p2"], ["p2", "p1"]),  # a slot keeps its pod
        (2, ["p2", "p1"], ["p1", "p3"], ["p3", "p1"]),  # a new pod takes the empty slot
        (3, ["p2", "p1"], ["p1", "p2"], ["p2", "p1", None]),  # grown: a slot without a pod
        (1, ["p2", "p1"], ["p1", "p2"], ["p2"]),  # shrunk: the rest are released
        (2, [None, "p1"], ["p0", "p1", "p9"], ["p0", "p1"]),
    ],
)
def test_slots_keep_their_pods(
    n: int, previous: list[str | None], pods: list[str], expected: list[str | None]
) -> None:
    assert assign_slots(n, previous, pods) == expected


def test_a_hot_variant_is_replicated_and_the_deployment_grows() -> None:
    quiet = [variant("a"), variant("b"), variant("c")]
    first = serve(quiet, pods=[pod("llama-0", "h100-0", ready=True)])
    assert first.statuses["a"]["phase"] == "Serving"
    hot = [variant("a", qps=8), variant("b"), variant("c")]
    second = serve(hot, pods=[pod("llama-0", "h100-0", ready=True)], previous=first.doc)
    assert second.objects[2]["spec"]["replicas"] == 2
    assert second.doc is not None
    route = second.doc["routes"]["a"]
    assert [(e["slot"], e["pod"], e["state"]) for e in route] == [
        (0, "llama-0", SERVING),  # the slot keeps its pod
        (1, None, SERVING),  # the new replica's pod is not there yet
    ]
    assert second.statuses["a"]["phase"] == "Serving"
    assert second.events["a"][0][1] == "Placed"


def _plan_with(c_replicas: tuple[int, ...]) -> GroupPlan:
    return GroupPlan(
        "llama",
        H100,
        (ReplicaPlan(0, ("c",), (), 0.1), ReplicaPlan(1, (), (), 0.0)),
        {"c": Placement("c", c_replicas, (1.0,), Tier.GPU, 0.0, "resident")},
        3,
        5.9,
    )


def test_a_moved_delta_drains_on_its_old_replica_until_the_new_one_is_ready() -> None:
    slots = ["p0", "p1"]
    loading = {"p0": PodView("p0", "n", True, None), "p1": PodView("p1", "n", False, None)}
    before = routes(_plan_with((0,)), slots, loading, {})
    assert before["c"] == [{"slot": 0, "pod": "p0", "weight": 1.0, "state": SERVING, "ready": True}]
    moved = routes(_plan_with((1,)), slots, loading, before)
    assert [(e["pod"], e["state"], e["weight"]) for e in moved["c"]] == [
        ("p1", SERVING, 1.0),
        ("p0", DRAINING, 0.0),
    ]
    still = routes(_plan_with((1,)), slots, loading, moved)  # p1 still loading: keep p0
    assert [(e["pod"], e["state"]) for e in still["c"]] == [("p1", SERVING), ("p0", DRAINING)]
    loaded = {**loading, "p1": PodView("p1", "n", True, None)}
    done = routes(_plan_with((1,)), slots, loaded, still)
    assert [(e["pod"], e["state"]) for e in done["c"]] == [("p1", SERVING)]
    # a serving replica drains for one pass even when the new one is Ready at once
    once = routes(_plan_with((1,)), slots, loaded, before)
    assert [(e["pod"], e["state"]) for e in once["c"]] == [("p1", SERVING), ("p0", DRAINING)]
    # a pod that is gone drains nothing
    gone = routes(_plan_with((1,)), ["p0", "p1"], {"p1": loaded["p1"]}, before)
    assert [(e["pod"], e["state"]) for e in gone["c"]] == [("p1", SERVING)]


# -- status ---------------------------------------------------------------------------------


def test_status_follows_the_pods_pending_loading_serving() -> None:
    variants = [variant("a")]
    none = serve(variants).statuses["a"]
    assert none["phase"] == "Pending"
    assert none["whyWaiting"].startswith("no pod yet for replica 1; resident on replica 1 of 1")
    unbound = serve(variants, pods=[pod("llama-0", waiting="0/3 nodes are available")])
    assert unbound.statuses["a"]["phase"] == "Pending"
    assert "0/3 nodes are available" in unbound.statuses["a"]["whyWaiting"]
    loading = serve(variants, pods=[pod("llama-0", "h100-0")]).statuses["a"]
    assert (loading["phase"], loading["node"]) == ("Loading", "h100-0")
    serving = serve(variants, pods=[pod("llama-0", "h100-0", ready=True)]).statuses["a"]
    assert serving["phase"] == "Serving"
    assert serving["whyWaiting"] is None
    assert (serving["servingReplica"], serving["node"], serving["gpuType"]) == (
        "llama-0",
        "h100-0",
        H100,
    )
    assert (serving["residency"], serving["expectedSwapLatencyMs"]) == ("GPU", 0.0)
    assert serving["observedGeneration"] == 1
    conditions = {c["type"]: c for c in serving["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Resident"]["reason"] == "ResidentOnGpu"
    # a pod being deleted serves nothing
    leaving = serve(variants, pods=[pod("llama-0", "h100-0", ready=True, deleting=True)])
    assert leaving.statuses["a"]["phase"] == "Pending"


def test_variants_that_do_not_fit_the_slots_are_swapped_with_their_swap_cost() -> None:
    # an L4 holds the 13 GiB base and one delta beside a useful KV cache: one slot
    variants = [variant("a", qps=0.05), variant("b", qps=0.01), variant("c", qps=0.01)]
    nodes = [node("l4-0", "L4", 4)]
    pods = [pod(f"llama-{i}", "l4-0", ready=True) for i in range(4)]
    result = serve(variants, nodes=nodes, pods=pods)
    assert isinstance(result.plan, GroupPlan)
    swapped = [s for s in result.statuses.values() if s["phase"] == "Swapped"]
    assert swapped, result.statuses
    for status in swapped:
        assert status["residency"] == "Host"
        assert status["expectedSwapLatencyMs"] > 0
        assert "host memory" in status["whyWaiting"]
        resident = next(c for c in status["conditions"] if c["type"] == "Resident")
        assert (resident["status"], resident["reason"]) == ("False", "InHostMemory")
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"  # still routable


def test_a_group_that_cannot_be_planned_now_keeps_its_last_plan() -> None:
    variants = [variant("a"), variant("b")]
    pods = [pod("llama-0", "h100-0", ready=True)]
    first = serve(variants, pods=pods)
    later = serve(variants, nodes=[node("h100-0", ready=False)], pods=pods, previous=first.doc)
    assert later.objects
    assert later.objects[2]["spec"]["replicas"] == 1
    assert later.statuses["a"]["phase"] == "Serving"
    assert first.doc is not None
    assert later.doc is not None
    assert "; kept, no new plan: serving group llama: no GPU type" in later.doc["why"]
    assert later.doc["why"].startswith(first.doc["why"])
    still = serve(variants, nodes=[], pods=pods, previous=later.doc)  # said once, not nested
    assert still.doc is not None
    assert still.doc["why"] == later.doc["why"]
    assert still.doc["version"] == later.doc["version"]
    newcomer = serve([*variants, variant("c")], nodes=[], pods=pods, previous=first.doc)
    assert newcomer.statuses["c"]["phase"] == "Failed"
    assert newcomer.statuses["c"]["conditions"][0]["reason"] == "NoGpuFits"


def test_a_live_rate_replaces_the_expected_rate_and_says_so() -> None:
    source: dict[str, Any] = {
        "traffic": {"expectedQPS": 0.2, "prometheus": {"query": "rate(x[1m])"}}
    }
    variants = [variant("a", **source), variant("b")]
    live = serve(variants, rates={"a": 20.0})
    assert live.objects[2]["spec"]["replicas"] > 1
    cond = next(c for c in live.statuses["a"]["conditions"] if c["type"] == "LiveTraffic")
    assert (cond["status"], cond["reason"]) == ("True", "LiveRate")
    down = serve(variants, rates={"a": "Prometheus at http://p did not answer"})
    assert down.objects[2]["spec"]["replicas"] == 1
    cond = next(c for c in down.statuses["a"]["conditions"] if c["type"] == "LiveTraffic")
    assert (cond["status"], cond["reason"]) == ("False", "PrometheusUnreachable")
    assert "planned on expectedQPS (0.2)" in cond["message"]


def _holding(name: str, node_name: str, gpus: int, namespace: str = "other") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def test_the_free_serving_gpus_are_the_cluster_models_on_the_nodes_serving_pods_may_use() -> None:
    dedicated = node("h-ded", gpus=8)
    dedicated["spec"] = {"taints": [{"key": "dedicated", "value": "b", "effect": "NoSchedule"}]}
    nodes = [node("h-0", gpus=8), node("h-1", gpus=4), dedicated, node("h-off", unschedulable=True)]
    nodes.append(node("l4-0", "L4", 2))
    pods = [_holding("train-0", "h-0", 6), _holding("mine-0", "h-1", 4, namespace="ns")]

    def whole(free: dict[str, FreeGpus]) -> dict[str, tuple[int, ...]]:
        return {t: f.whole for t, f in free.items()}

    assert whole(free_serving_gpus(nodes, pods)) == {"H100-SXM5-80GB": (2, 0), "L4": (2,)}
    assert whole(free_serving_gpus(nodes, pods, frozenset({"ns/mine-0"}))) == {
        "H100-SXM5-80GB": (4, 2),
        "L4": (2,),
    }


def test_a_replica_of_k_gpus_counts_only_the_nodes_room_for_whole_replicas() -> None:
    doc = yaml.safe_load((ROOT / "manifests/samples/inferencepipeline-video.yaml").read_text())
    spec = InferencePipelineSpec.model_validate(doc["spec"])
    detect = spec.stages[0].model_copy(update={"gpu": GpuRequest(count=2)})
    over = _over_free([detect], {"T4": FreeGpus((3, 1, 2))})
    two = (StageConfig("T4", 1, 2),)
    assert over(two) == 0  # 3 -> 2 and 2: two replicas of 2
    assert over((StageConfig("T4", 1, 3),)) == 2
    assert over((StageConfig("A100-SXM4-80GB", 1, 1),)) == 2  # no free GPU of the type


def _share_holder(
    name: str,
    node_name: str,
    gpu: int,
    percent: int,
    mib: int,
    *,
    priority: str | None = None,
    profile: str | None = None,
) -> dict[str, Any]:
    """A bound GPU-share pod of another workload holding `percent` of one GPU."""
    assignment = GpuAssignment(
        node_name, (gpu,), (f"GPU-{node_name}-{gpu}",), mib, percent, "h-" + name, priority, profile
    )
    return {
        "metadata": {
            "name": name,
            "namespace": "other",
            "annotations": assignment.to_annotations(),
        },
        "spec": {
            "nodeName": node_name,
            "schedulerName": "chronotope",
            "containers": [
                {"name": "c", "resources": {"limits": {"chronotope.dev/gpu-share": "1"}}}
            ],
        },
        "status": {"phase": "Running"},
    }


def test_the_free_serving_gpus_say_each_gpus_room_for_shares() -> None:
    # a share of 60 % and 10 GiB on GPU 0 of the T4 node; the tainted node's GPUs are
    # for whole-GPU pods only (the API server tolerates nvidia.com/gpu for those)
    tainted = node("t4-gpu-only", "T4", 1, memory_mib=15360)
    tainted["spec"] = {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}
    nodes = [node("t4-0", "T4", 2, memory_mib=15360), tainted]
    free = free_serving_gpus(nodes, [_share_holder("s", "t4-0", 0, 60, 10240)])
    assert free["T4"].whole == (1, 1)
    assert free["T4"].shares == ((400, 5120), (1000, 15360))


def _share_stage(types: Sequence[str]) -> Any:
    doc = yaml.safe_load((ROOT / "manifests/samples/inferencepipeline-video.yaml").read_text())
    pose = InferencePipelineSpec.model_validate(doc["spec"]).stages[1]  # a 50 % share, 4 GiB
    profile = pose.profiles[0]
    return pose.model_copy(
        update={"profiles": [profile.model_copy(update={"gpu_type": t}) for t in types]}
    )


def _t4(
    gpus: int, *holders: tuple[int, int, int], rules: PlacementRules | None = None, **cls: str
) -> dict[str, FreeGpus]:
    """One T4 node of `gpus` GPUs of 15 GiB; each holder (GPU, percent, MiB) a share on it."""
    pods = [
        _share_holder(f"s{i}", "t4-0", g, pct, mib, **cls)
        for i, (g, pct, mib) in enumerate(holders)
    ]
    return free_serving_gpus([node("t4-0", "T4", gpus, memory_mib=15360)], pods, rules=rules)


def test_share_replicas_count_against_each_gpus_room() -> None:
    pose = _share_stage(["T4", "L4"])  # a 50 % share of 4 GiB
    over = _over_free([pose], _t4(2, (0, 60, 8000), (1, 40, 12000)))
    assert over((StageConfig("T4", 1, 1),)) == 1  # 40 % too little; 60 % but 3 GiB
    over = _over_free([pose], _t4(2, (0, 40, 4000)))
    assert over((StageConfig("T4", 1, 1),)) == 0
    assert over((StageConfig("T4", 1, 3),)) == 0  # 60 % left on GPU 0, 100 % on GPU 1
    assert over((StageConfig("T4", 1, 4),)) == 1
    # a share on the untouched GPU leaves it no longer free for a whole replica
    detect = pose.model_copy(update={"gpu": GpuRequest(count=1)})
    both = _over_free([detect, pose], _t4(1))
    assert both((StageConfig("T4", 1, 1), StageConfig("T4", 1, 1))) == 1
    assert both((StageConfig("T4", 1, 1), StageConfig("T4", 1, 0))) == 0
    # a stage profiled on one type only has nowhere else to go: its wait is not counted
    only = _over_free([_share_stage(["T4"])], _t4(1, (0, 100, 15360)))
    assert only((StageConfig("T4", 1, 2),)) == 0


def test_share_replicas_go_where_the_extenders_policy_puts_them() -> None:
    # the extender's policy puts a 50 % share on the GPU a 50 % share already uses
    # (it fills a GPU rather than cut into an untouched one), so a whole replica still
    # finds the untouched GPU; a second share then has to take that GPU
    pose = _share_stage(["T4", "L4"])
    detect = pose.model_copy(update={"gpu": GpuRequest(count=1)})
    both = _over_free([detect, pose], _t4(2, (0, 50, 4000)))
    assert both((StageConfig("T4", 1, 1), StageConfig("T4", 1, 1))) == 0
    assert both((StageConfig("T4", 1, 1), StageConfig("T4", 1, 2))) == 1


def test_share_replicas_fit_only_where_the_co_location_rules_let_them() -> None:
    # three best-effort compute-bound shares hold 30 % of the only GPU: room for the
    # High compute-bound 50 % share, but its predicted slowdown beside them is over the
    # extender's 1.10x budget, so the extender would not place it there
    pose = _share_stage(["T4", "L4"])
    held = [(0, 10, 1024)] * 3
    crowded = _t4(1, *held, priority="best-effort", profile="compute-bound")
    assert crowded["T4"].shares == ((700, 12288),)
    assert _over_free([pose], crowded)((StageConfig("T4", 1, 1),)) == 1
    # the extender's budget is the operator's too (`--interference-budget`)
    loose = PlacementRules(colocation=Colocation(budget=1.5))
    relaxed = _t4(1, *held, rules=loose, priority="best-effort", profile="compute-bound")
    assert _over_free([pose], relaxed)((StageConfig("T4", 1, 1),)) == 0
    # shares that state no priority are not subject to the rules
    assert _over_free([pose], _t4(1, *held))((StageConfig("T4", 1, 1),)) == 0


def test_a_share_group_is_planned_where_the_free_gpus_hold_its_shares() -> None:
    # two 50 % shares of another workload fill the H100's only GPU; the A100s are free.
    # Planned on the free GPUs (as the extender would place the shares), the group goes
    # to the A100s (four 40 % replicas, two a GPU) and says why; planned on capacity
    # alone it would wait on the H100 (one replica)
    shared: dict[str, Any] = {"gpu": {"shared": {"memoryMiB": 20000, "computePercent": 40}}}
    members = [variant("a", **shared), variant("b", **shared)]
    nodes = [
        node("h100-0", gpus=1, memory_mib=81559),
        node("a100-0", "A100-SXM4-80GB", 2, memory_mib=81920),
    ]
    holders = [_share_holder(f"s{g}", "h100-0", 0, 50, 20000) for g in range(2)]
    group = group_variants(members).groups["llama"]

    def planned(free: dict[str, FreeGpus] | None) -> GroupResult:
        return serve_group(
            group, "ns", nodes=nodes, pods=[], previous_doc=None, rates={}, now=NOW, free=free
        )

    assert isinstance(planned(None).plan, GroupPlan)
    assert planned(None).statuses["a"]["gpuType"] == H100
    moved = planned(free_serving_gpus(nodes, holders))
    assert moved.statuses["a"]["gpuType"] == "A100-SXM4-80GB"
    template = moved.objects[2]["spec"]["template"]["spec"]
    assert template["nodeSelector"] == {"nvidia.com/gpu.product": "A100-SXM4-80GB"}
    why = moved.statuses["a"]["whyWaiting"]
    assert "on the GPUs free now (1 x H100-SXM5-80GB would serve it" in why
    (event,) = moved.events["a"]
    assert event[2].startswith("A100-SXM4-80GB (on the GPUs free now")
    # the A100 held too: no type's free GPUs hold it; it waits on the H100, and says so
    full = [*holders, _holding("train", "a100-0", 1)]  # half its GPUs: room for two, not four
    waits = planned(free_serving_gpus(nodes, full))
    assert waits.statuses["a"]["gpuType"] == H100
    said = waits.statuses["a"]["whyWaiting"]
    assert "nothing holds it now (H100-SXM5-80GB: other work holds the GPUs): its pods wait" in said


def test_a_group_is_planned_on_the_types_its_queue_admits() -> None:
    # the namespace's queue lists no H100 quota (never admitted), or none left now:
    # before, the group was planned on the H100s anyway and waited for quota that would
    # not come (or until borrowers stopped) while its A100 quota and GPUs were free
    nodes = [node("h100-0", gpus=8), node("a100-0", "A100-SXM4-80GB", 8)]
    group = group_variants([variant("a"), variant("b")]).groups["llama"]
    a100, h100 = ("A100-SXM4-80GB", Unit.GPUS), (H100, Unit.GPUS)

    def planned(room: ServingRoom | None) -> GroupPlan:
        result = serve_group(
            group,
            "ns",
            nodes=nodes,
            pods=[],
            previous_doc=None,
            rates={},
            now=NOW,
            free=free_serving_gpus(nodes, []),
            room=room,
        )
        assert isinstance(result.plan, GroupPlan)
        return result.plan

    assert planned(None).gpu_type == H100
    never = planned(ServingRoom("team", {a100: 8, h100: 0}))
    assert never.gpu_type == "A100-SXM4-80GB"
    assert never.on_free == ""  # the H100s are no option at all
    not_now = planned(ServingRoom("team", {a100: 8, h100: 8}, {a100: 8, h100: 0}))
    assert not_now.gpu_type == "A100-SXM4-80GB"
    assert not_now.on_free == (
        "on the GPUs free now (1 x H100-SXM5-80GB would serve it, "
        "but queue team's quota does not admit them now)"
    )
    # it admits neither now: the type whose GPUs are free, and it waits for quota
    neither = planned(ServingRoom("team", {a100: 8, h100: 8}, {a100: 0, h100: 0}))
    assert neither.gpu_type == H100
    assert neither.on_free.startswith("nothing holds it now (H100-SXM5-80GB: queue team's")
    # a queue that could hold none of the types leaves them all in (admission says why)
    assert planned(ServingRoom("team", {a100: 0, h100: 0})).gpu_type == H100
