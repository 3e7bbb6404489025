"""What a pod's RuntimeClass adds to it before kube-scheduler sees it.

The API server's RuntimeClass admission merges the class's `scheduling.nodeSelector`
into the pod's node selector, adds its `scheduling.tolerations`, and sets its
`overhead`, which NodeResourcesFit counts; a pod naming a class that does not exist,
or whose node selector gives one of the class's keys another value, is rejected
(`node_fit.runtime_rules`, `NodeRules.run_by`, `NodeRules.runtime_refusal`). Before,
the plan did not read RuntimeClasses: a gang whose class keeps its pods in one zone
was planned in another, kube-scheduler refused it, and the stuck rule moved it after
45 s; and a job naming a missing class was started, and its workers rejected.
"""

from __future__ import annotations

from typing import Any

from chronotope.sharing.labels import ZONE_LABEL
from chronotope.workloads.capacity import ClusterFacts, admitting, cluster_capacity
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.node_fit import job_rules, runtime_rules
from chronotope.workloads.training import Action, decide
from tests.unit.workloads.test_backfill import node
from tests.unit.workloads.test_domain_affinity import NODES
from tests.unit.workloads.test_node_fit import A100, NOW, RESERVED, V100
from tests.unit.workloads.test_pod_anti_affinity import _job

CLASSES = [
    {
        "metadata": {"name": "zone-x"},
        "handler": "kata",
        "scheduling": {
            "nodeSelector": {ZONE_LABEL: "x"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        },
        "overhead": {"podFixed": {"cpu": "500m", "memory": "1Gi"}},
    },
    {"metadata": {"name": "nvidia"}, "handler": "nvidia"},
]
RUNTIMES = runtime_rules(CLASSES)


def _running(runtime: str, **spec: Any) -> Any:
    job = _job("j")
    job["spec"]["template"]["spec"] |= {"runtimeClassName": runtime, **spec}
    return job_spec(job)


def test_a_runtime_class_is_read_as_its_admission_adds_it() -> None:
    zone_x = RUNTIMES["zone-x"]
    assert zone_x.selector == ((ZONE_LABEL, "x"),)
    assert (zone_x.cpu_milli, zone_x.memory_mib) == (500, 1024)
    assert RUNTIMES["nvidia"].selector == ()
    rules = job_rules(_running("zone-x", nodeSelector={"disk": "nvme"})).run_by(RUNTIMES)
    assert rules.selector == (("disk", "nvme"), (ZONE_LABEL, "x"))
    assert (rules.cpu_milli, rules.memory_mib, rules.runtime) == (500, 1024, "")
    assert rules.run_by(RUNTIMES) == rules  # added once
    # the classes not known: nothing is added, nothing refused
    plain = job_rules(_running("zone-x"))
    assert plain.run_by(None) is plain
    assert plain.runtime_refusal(None) is None


def test_the_class_keeps_the_workers_on_its_nodes_and_lets_them_onto_its_tainted_ones() -> None:
    tainted = node("v100-tainted", V100, 8)
    tainted["metadata"]["labels"][ZONE_LABEL] = "x"
    tainted["spec"] = {"taints": [RESERVED]}
    capacity = cluster_capacity([*NODES, tainted], [], facts=ClusterFacts(runtimes=RUNTIMES))
    rules = job_rules(_running("zone-x"))
    assert [n.name for n in admitting(capacity, A100, rules).nodes] == []
    assert [n.name for n in admitting(capacity, V100, rules).nodes] == ["v100-x", "v100-tainted"]
    assert decide(job_spec(_job("plain")), capacity, NOW).gpu_type == A100
    assert decide(_running("zone-x"), capacity, NOW).gpu_type == V100


def test_its_overhead_counts_against_the_nodes_free_cpu() -> None:
    small = node("small", A100, 8)
    small["status"]["allocatable"] |= {"cpu": "4", "memory": "64Gi"}
    job = _job("j")
    pod = job["spec"]["template"]["spec"]
    pod["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    pod["runtimeClassName"] = "heavy"
    fixed = {"metadata": {"name": "heavy"}, "overhead": {"podFixed": {"cpu": "500m"}}}
    # 1 CPU a worker: four fit in 4 CPUs; 1.5 with the class's overhead: two
    for runtimes, free in ((None, 4), (runtime_rules([fixed]), 2)):
        capacity = cluster_capacity([small], [], facts=ClusterFacts(runtimes=runtimes))
        assert admitting(capacity, A100, job_rules(job_spec(job))).nodes[0].free == free


def test_a_job_whose_workers_would_be_rejected_waits_and_says_why() -> None:
    capacity = cluster_capacity(NODES, [], facts=ClusterFacts(runtimes=RUNTIMES))
    missing = decide(_running("gvisor"), capacity, NOW)
    assert missing.action is Action.IMPOSSIBLE
    assert missing.cause == "RuntimeClassRejected"
    assert missing.reason == (
        "the API server would reject its workers: RuntimeClass gvisor not found"
    )
    clash = decide(_running("zone-x", nodeSelector={ZONE_LABEL: "y"}), capacity, NOW)
    assert clash.cause == "RuntimeClassRejected"
    assert f"its nodeSelector {ZONE_LABEL}=y conflicts with RuntimeClass zone-x's" in clash.reason


def test_a_worker_the_overhead_makes_too_big_for_every_node_says_so() -> None:
    small = node("small", A100, 8)
    small["status"]["allocatable"] |= {"cpu": "4", "memory": "64Gi"}
    fixed = {"metadata": {"name": "heavy"}, "overhead": {"podFixed": {"cpu": "500m"}}}
    capacity = cluster_capacity([small], [], facts=ClusterFacts(runtimes=runtime_rules([fixed])))
    job = _job("j")
    job["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    pod = job["spec"]["template"]["spec"]
    pod["containers"][0]["resources"] = {"requests": {"cpu": "4"}}
    pod["runtimeClassName"] = "heavy"
    decision = decide(job_spec(job), capacity, NOW)
    assert decision.gpu_type is None
    assert "4500m CPU" in decision.reason, decision.reason
