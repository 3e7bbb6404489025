"""Admission decisions (workloads.admission): deny, warn, default; and the wire format and
registration (workloads.admission_wire)."""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from chronotope.kube.admission import pod_template_types
from chronotope.workloads import admission
from chronotope.workloads import admission_wire as wire
from chronotope.workloads.admission import AdmissionLookupError, Review

TYPES = pod_template_types()
SHARE = "chronotope.dev/gpu-share"


@dataclass
class FakeLookups:
    gpus: dict[str, int] = field(default_factory=lambda: {"L4": 23034, "A100-SXM4-80GB": 81920})
    config_maps: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    variants: set[tuple[str, str]] = field(default_factory=set)
    broken: bool = False
    calls: list[str] = field(default_factory=list)

    nodes: list[dict[str, Any]] = field(default_factory=list)
    """More nodes than one per type of `gpus`."""

    def gpu_nodes(self) -> list[dict[str, Any]]:
        self.calls.append("gpu_nodes")
        if self.broken:
            raise AdmissionLookupError("API server answered 503 Service Unavailable")
        labelled = [
            {
                "metadata": {
                    "name": f"node-{t}",
                    "labels": {"nvidia.com/gpu.product": t, "nvidia.com/gpu.memory": str(m)},
                },
                "status": {"capacity": {"nvidia.com/gpu": "8"}},
            }
            for t, m in self.gpus.items()
        ]
        return labelled + self.nodes

    def config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        self.calls.append(f"configmap {namespace}/{name}")
        if self.broken:
            raise AdmissionLookupError("ReadTimeoutError: timed out")
        return self.config_maps.get((namespace, name))

    def model_variant_exists(self, namespace: str, name: str) -> bool:
        self.calls.append(f"variant {namespace}/{name}")
        if self.broken:
            raise AdmissionLookupError("timed out")
        return (namespace, name) in self.variants


def job(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "replicas": 2,
        "gpu": {"count": 1},
        "gpuTypes": [{"name": "L4", "relativeSpeed": 1.0}],
        "estimate": {"referenceGpuType": "L4", "durationSeconds": 600},
        "template": {"spec": {"containers": [{"name": "w", "image": "x"}]}},
    }
    return {"metadata": {"name": "j", "namespace": "ns"}, "spec": base | spec}


def pipeline(**spec: Any) -> dict[str, Any]:
    stage = {
        "name": "detect",
        "model": {"image": "detector:1"},
        "profiles": [
            {
                "gpuType": "L4",
                "batches": [{"batchSize": 1, "latencyMs": 10, "throughputQPS": 100}],
            }
        ],
    }
    base = {"stages": [stage], "slo": {"p99LatencyMs": 100}, "traffic": {"fixedQPS": 10}}
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": base | spec}


def variant(**spec: Any) -> dict[str, Any]:
    base = {
        "base": {"name": "llama", "sizeMiB": 13000},
        "delta": {"uri": "s3://d/chat", "compressedSizeMiB": 800},
        "traffic": {"expectedQPS": 1},
        "slo": {"p99LatencyMs": 500},
    }
    return {"metadata": {"name": "v", "namespace": "ns"}, "spec": base | spec}


def validate(kind: str, obj: dict[str, Any], old: Any = None, lookups: Any = None) -> Review:
    return admission.validate(kind, obj, old, lookups or FakeLookups(), TYPES)


def running(obj: dict[str, Any], phase: str = "Running") -> dict[str, Any]:
    return copy.deepcopy(obj) | {"status": {"phase": phase}}


# ---------------------------------------------------------------------- the pod template
def one(**container: Any) -> dict[str, Any]:
    """A template with one container: name w, image x, and `container`'s fields."""
    return {"spec": {"containers": [{"name": "w", "image": "x"} | container]}}


C0 = "spec.template.spec.containers[0]"


@pytest.mark.parametrize(
    ("template", "field", "problem"),
    [
        ({"spec": {"containers": "not-a-list"}}, "spec.template.spec.containers", "must be a list"),
        ({"spec": {"containers": [{"image": "x"}]}}, f"{C0}.name", "required"),
        ({"spec": {}}, "spec.template.spec.containers", "required"),
        (
            one(ports=[{"containerPort": "80"}]),
            f"{C0}.ports[0].containerPort",
            "must be an integer",
        ),
        (
            one(resources={"limits": {"memory": "1 GB"}}),
            f"{C0}.resources.limits[memory]",
            "is not a",
        ),
        (one(resources="big"), f"{C0}.resources", "must be an object"),
        (
            one() | {"metadata": {"labels": {"team": 7}}},
            "spec.template.metadata.labels[team]",
            "must be a string",
        ),
        (
            {"spec": one()["spec"] | {"hostNetwork": "yes"}},
            "spec.template.spec.hostNetwork",
            "must be true or false",
        ),
        (
            one(resources={"limits": {"nvidia.com/gpu": 1}}),
            f"{C0}.resources.limits[nvidia.com/gpu]",
            "request GPUs through spec.gpu",
        ),
        (
            {
                "spec": {
                    "containers": [
                        {"name": "w", "image": "x"},
                        {"name": "s", "image": "y", "resources": {"requests": {SHARE: "1"}}},
                    ]
                }
            },
            f"spec.template.spec.containers[1].resources.requests[{SHARE}]",
            "request GPUs through spec.gpu",
        ),
    ],
)
def test_a_bad_pod_template_is_denied_naming_the_field(
    template: dict[str, Any], field: str, problem: str
) -> None:
    answer = validate("TrainingJob", job(template=template))
    assert not answer.allowed
    assert f"{field}: " in answer.message
    assert problem in answer.message.split(f"{field}: ", 1)[1]


def test_a_good_template_with_numbers_as_quantities_and_named_ports_is_allowed() -> None:
    cpu_limit = {"resource": "limits.cpu", "divisor": 1}
    container = {
        "name": "w",
        "image": "x",
        "resources": {"limits": {"cpu": 2, "memory": "8Gi"}, "requests": {"cpu": "500m"}},
        "livenessProbe": {"httpGet": {"port": "http", "path": "/"}},
        "ports": [{"name": "http", "containerPort": 8080}],
        "env": [{"name": "A", "valueFrom": {"resourceFieldRef": cpu_limit}}],
    }
    template = {"metadata": {"labels": {"team": "a"}}, "spec": {"containers": [container]}}
    answer = validate("TrainingJob", job(template=template))
    assert answer == Review(True)


def test_unknown_template_fields_and_fields_the_operator_replaces_are_warnings() -> None:
    container = {
        "name": "w",
        "image": "x",
        "imagePullPolcy": "Always",
        "env": [{"name": "RANK", "value": "7"}],
    }
    spec = {
        "containers": [container],
        "schedulerName": "default-scheduler",
        "restartPolicy": "Always",
        "nodeSelector": {"nvidia.com/gpu.product": "T4"},
    }
    answer = validate("TrainingJob", job(template={"spec": spec}))
    assert answer.allowed
    assert answer.warnings == (
        "spec.template.spec.containers[0].imagePullPolcy: unknown field, dropped from the "
        "worker pods",
        "spec.template.spec.schedulerName: replaced by 'chronotope' in every worker",
        "spec.template.spec.restartPolicy: replaced by 'Never' in every worker",
        "spec.template.spec.nodeSelector[nvidia.com/gpu.product]: replaced by the GPU type "
        "the planner picks from spec.gpuTypes",
        "spec.template.spec.containers[0].env RANK: set by the operator",
    )


def test_a_spec_the_models_reject_is_denied_with_its_path() -> None:
    answer = validate("TrainingJob", job(gpuTypes=[{"name": "L4", "relativeSpeed": "fast"}]))
    assert not answer.allowed
    assert answer.message.startswith("spec.gpuTypes[0].relativeSpeed: ")


def test_a_strict_pack_gang_whose_workers_may_not_share_a_node_is_denied() -> None:
    port = {"containerPort": 7777, "hostPort": 7777}
    ported = {"spec": {"containers": [{"name": "w", "image": "x", "ports": [port]}]}}
    answer = validate("TrainingJob", job(placement={"strategy": "StrictPack"}, template=ported))
    assert not answer.allowed
    assert answer.message == (
        "spec.placement.strategy: StrictPack puts all 2 workers on one node, but its workers "
        "ask host port(s) 7777/TCP, so no two of them may share a node: it could never be "
        "scheduled (use StrictSpread)"
    )
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"chronotope.dev/job": "j"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    apart = {"spec": {"containers": [{"name": "w", "image": "x"}], "affinity": anti}}
    answer = validate("TrainingJob", job(placement={"strategy": "StrictPack"}, template=apart))
    assert "a required pod anti-affinity on kubernetes.io/hostname" in answer.message
    # a required Node topology is one node too
    node = {"strategy": "Pack", "topology": "Node", "required": True}
    answer = validate("TrainingJob", job(placement=node, template=ported))
    assert answer.message.startswith(
        "spec.placement.topology: Node (required) puts all 2 workers on one node, but its "
        "workers ask host port(s) 7777/TCP"
    )
    assert validate(
        "TrainingJob", job(placement=node | {"required": False}, template=ported)
    ).allowed
    spread = validate("TrainingJob", job(placement=node | {"strategy": "StrictSpread"}))
    assert spread.message == (
        "spec.placement: StrictSpread puts each of its 2 workers on a node of its own, but "
        "topology Node (required) puts them all on one: it could never be scheduled"
    )
    # one worker, Pack (placed StrictSpread), or an elastic job that may run on one: admitted
    assert validate(
        "TrainingJob", job(replicas=1, placement={"strategy": "StrictPack"}, template=ported)
    ).allowed
    assert validate("TrainingJob", job(template=ported)).allowed
    elastic = job(
        minReplicas=1,
        placement={"strategy": "StrictPack"},
        template=ported,
        checkpoint={"path": "/ckpt"},
    )
    assert validate("TrainingJob", elastic).allowed


def test_a_strict_spread_gang_whose_workers_must_share_a_node_is_denied() -> None:
    near = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"chronotope.dev/job": "j"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    together = {"spec": {"containers": [{"name": "w", "image": "x"}], "affinity": near}}
    answer = validate("TrainingJob", job(placement={"strategy": "StrictSpread"}, template=together))
    assert not answer.allowed
    assert answer.message == (
        "spec.placement.strategy: StrictSpread puts each of its 2 workers on a node of its "
        "own, but a required pod affinity on kubernetes.io/hostname is met by its workers' own "
        "labels, so once one runs the others may go only beside it: it could never be "
        "scheduled (use StrictPack)"
    )
    # Spread (placed StrictPack), StrictPack, or one worker: admitted
    assert validate("TrainingJob", job(placement={"strategy": "Spread"}, template=together)).allowed
    assert validate(
        "TrainingJob", job(placement={"strategy": "StrictPack"}, template=together)
    ).allowed
    assert validate(
        "TrainingJob", job(replicas=1, placement={"strategy": "StrictSpread"}, template=together)
    ).allowed


def test_the_models_template_message_is_not_repeated_after_the_precise_one() -> None:
    answer = validate("TrainingJob", job(template={"spec": {"containers": "x"}}))
    assert answer.message == "spec.template.spec.containers: must be a list, not the string 'x'"


# ---------------------------------------------------------------------- immutability
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"template": {"spec": {"containers": [{"name": "w", "image": "y"}]}}}, "spec.template"),
        ({"gpu": {"count": 2}}, "spec.gpu"),
        ({"gpu": {"shared": {"memoryMiB": 4096}}}, "spec.gpu"),
        ({"checkpoint": {"path": "/b"}}, "spec.checkpoint.path"),
    ],
)
def test_a_running_job_keeps_its_template_gpus_and_checkpoint(
    change: dict[str, Any], field: str
) -> None:
    old = job(checkpoint={"path": "/a"}, minReplicas=1, maxReplicas=4)
    new = job(checkpoint={"path": "/a"}, minReplicas=1, maxReplicas=4) | {}
    new["spec"] = new["spec"] | change
    for phase in admission.RUNNING_PHASES:
        answer = validate("TrainingJob", new, running(old, phase))
        assert not answer.allowed
        assert answer.message.startswith(f"{field}: cannot change while the job is {phase}: ")
        assert "delete and re-create the job" in answer.message
    for phase in ("Pending", "Waiting", "Resizing", "Succeeded", "Failed"):
        assert validate("TrainingJob", new, running(old, phase)).allowed, phase


def test_a_running_elastic_job_may_change_replicas_and_scheduling_inputs() -> None:
    old = job(checkpoint={"path": "/a", "intervalSeconds": 600}, minReplicas=1, maxReplicas=4)
    new = copy.deepcopy(old)
    new["spec"] |= {
        "replicas": 4,
        "maxReplicas": 8,
        "priority": 9,
        "queue": "urgent",
        "checkpoint": {"path": "/a", "intervalSeconds": 900},
        "gpuTypes": [
            {"name": "L4", "relativeSpeed": 1.0},
            {"name": "A100-SXM4-80GB", "relativeSpeed": 3.0},
        ],
    }
    assert validate("TrainingJob", new, running(old)) == Review(True)


def test_a_metadata_only_update_is_allowed_without_a_lookup() -> None:
    lookups = FakeLookups()
    old = running(job(template={"spec": {"containers": "broken before the webhook"}}))
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = []
    assert validate("TrainingJob", new, old, lookups) == Review(True)
    assert lookups.calls == []


# ---------------------------------------------------------------------- references and GPUs
def test_a_missing_model_profile_is_a_warning_and_a_broken_one_says_why() -> None:
    lookups = FakeLookups()
    spec = {"parallelism": {"modelProfile": "opt"}}
    answer = validate("TrainingJob", job(**spec), lookups=lookups)
    assert answer.allowed
    assert answer.warnings == (
        "spec.parallelism.modelProfile: model profile ConfigMap ns/opt not found; the job "
        "waits for it (create it with `chronotope profile configmap`)",
    )
    assert lookups.calls == ["gpu_nodes", "configmap ns/opt"]
    lookups.config_maps[("ns", "opt")] = {"profile-L4.json": "{}"}
    (warning,) = validate("TrainingJob", job(**spec), lookups=lookups).warnings
    assert "has no config.json key" in warning


def test_gpu_types_no_node_has_are_warnings() -> None:
    some = job(
        gpuTypes=[{"name": "L4", "relativeSpeed": 1.0}, {"name": "Z9", "relativeSpeed": 2.0}]
    )
    assert validate("TrainingJob", some).warnings == (
        "spec.gpuTypes: no node has GPU type Z9 (nvidia.com/gpu.product); the others are used",
    )
    none = job(
        gpuTypes=[{"name": "Z9", "relativeSpeed": 1.0}],
        estimate={"referenceGpuType": "Z9", "durationSeconds": 60},
    )
    answer = validate("TrainingJob", none)
    assert answer.allowed
    assert answer.warnings == (
        "spec.gpuTypes: no node has GPU type Z9 (nvidia.com/gpu.product); it waits until one joins",
    )


def test_a_share_larger_than_every_gpu_of_its_types_is_a_warning() -> None:
    answer = validate("TrainingJob", job(gpu={"shared": {"memoryMiB": 40000}}))
    assert answer.warnings == (
        "spec.gpu.shared.memoryMiB: 40000 MiB is more than any GPU of its types has "
        "(23034 MiB): it cannot be placed",
    )
    assert validate("TrainingJob", job(gpu={"shared": {"memoryMiB": 20000}})).warnings == ()


def test_a_pipeline_warns_about_a_missing_variant_trace_and_trace_key() -> None:
    lookups = FakeLookups(variants={("ns", "chat")})
    stages = pipeline()["spec"]["stages"]
    two = [
        stages[0] | {"model": {"variant": "chat"}},
        stages[0] | {"name": "rank", "model": {"variant": "gone"}},
    ]
    obj = pipeline(
        stages=two,
        edges=[{"from": "detect", "to": "rank"}],
        traffic={"trace": {"configMap": "arrivals"}},
    )
    answer = validate("InferencePipeline", obj, lookups=lookups)
    assert answer.allowed
    assert answer.warnings == (
        "spec.stages[1].model.variant: ModelVariant ns/gone not found; the pipeline waits for it",
        "spec.traffic.trace.configMap: trace ConfigMap ns/arrivals not found; the pipeline "
        "waits for it",
    )
    lookups.config_maps[("ns", "arrivals")] = {"other.txt": "0.1"}
    assert validate("InferencePipeline", obj, lookups=lookups).warnings[-1] == (
        "spec.traffic.trace.key: trace ConfigMap ns/arrivals has no key 'arrivals.txt'; "
        "the pipeline waits for it"
    )
    lookups.config_maps[("ns", "arrivals")] = {"arrivals.txt": "0.1"}
    lookups.variants.add(("ns", "gone"))
    assert validate("InferencePipeline", obj, lookups=lookups) == Review(True)


def test_gpu_types_no_node_admits_the_template_on_are_warnings() -> None:
    # the only L4 node is a team's dedicated one: the job waits for a node it may use
    dedicated = {
        "metadata": {"name": "l4-b", "labels": {"nvidia.com/gpu.product": "L4"}},
        "spec": {"taints": [{"key": "dedicated", "value": "b", "effect": "NoSchedule"}]},
        "status": {"capacity": {"nvidia.com/gpu": "8"}},
    }
    lookups = FakeLookups(gpus={"A100-SXM4-80GB": 81920}, nodes=[dedicated])
    assert validate("TrainingJob", job(), lookups=lookups).warnings == (
        "spec.template: no node of GPU type L4 (1 of 1 node(s) by taint "
        "dedicated=b:NoSchedule not tolerated) admits its workers now; it waits until one does",
    )
    both = job(
        gpuTypes=[
            {"name": "L4", "relativeSpeed": 1.0},
            {"name": "A100-SXM4-80GB", "relativeSpeed": 2.0},
        ]
    )
    (warning,) = validate("TrainingJob", both, lookups=lookups).warnings
    assert warning.endswith("the others are used")
    tolerant = job()
    tolerant["spec"]["template"]["spec"]["tolerations"] = [
        {"key": "dedicated", "operator": "Exists"}
    ]
    assert validate("TrainingJob", tolerant, lookups=lookups).warnings == ()
    selects = job()
    selects["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "x"}
    (warning,) = validate("TrainingJob", selects, lookups=FakeLookups()).warnings
    assert "L4 (1 of 1 node(s) by nodeSelector pool=x)" in warning
    # a worker asking more CPU than the node allocates
    small = {
        "metadata": {"name": "l4-small", "labels": {"nvidia.com/gpu.product": "L4"}},
        "status": {
            "capacity": {"nvidia.com/gpu": "1"},
            "allocatable": {"cpu": "4", "nvidia.com/gpu": "1"},
        },
    }
    hungry = job()
    hungry["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "8"}}
    (warning,) = validate(
        "TrainingJob", hungry, lookups=FakeLookups(gpus={}, nodes=[small])
    ).warnings
    assert "by allocatable CPU or memory below one worker's request (8000m CPU, 0 MiB)" in warning


def test_a_pipeline_stage_whose_gpu_types_no_node_has_is_a_warning() -> None:
    obj = pipeline()
    obj["spec"]["stages"][0]["profiles"][0]["gpuType"] = "T4"
    assert validate("InferencePipeline", obj).warnings == (
        "spec.stages[0].profiles: no node has GPU type T4 (nvidia.com/gpu.product); it waits "
        "until one joins",
    )


def test_a_variant_that_fits_no_gpu_is_a_warning() -> None:
    assert validate("ModelVariant", variant()) == Review(True)
    big = variant(base={"name": "llama-70b", "sizeMiB": 140000})
    assert validate("ModelVariant", big).warnings == (
        "spec.base.sizeMiB: the base and the delta (140800 MiB) fit on no GPU in the "
        "cluster (largest 81920 MiB); the variant cannot be served",
    )


def test_lookups_that_fail_are_warnings_never_denials() -> None:
    lookups = FakeLookups(broken=True)
    answer = validate("TrainingJob", job(parallelism={"modelProfile": "opt"}), lookups=lookups)
    assert answer.allowed
    assert answer.warnings == (
        "could not check the nodes' GPU types: API server answered 503 Service Unavailable",
        "could not check model profile ConfigMap ns/opt: ReadTimeoutError: timed out",
    )


def test_warnings_are_capped_in_number_and_length() -> None:
    containers = [{"name": f"c{i}", "image": "x", f"typo{i}" * 40: 1} for i in range(15)]
    answer = validate("TrainingJob", job(template={"spec": {"containers": containers}}))
    assert len(answer.warnings) == admission.MAX_WARNINGS
    assert answer.warnings[-1] == "... and 6 more warnings"
    assert all(len(w) <= 240 for w in answer.warnings)


# ---------------------------------------------------------------------- defaulting
def test_defaulting_adds_the_object_defaults_the_crd_cannot() -> None:
    obj = job(queue="default", priority=0, preemptible=True)
    answer = admission.default("TrainingJob", obj)
    assert answer.patch == (
        {
            "op": "add",
            "path": "/spec/placement",
            "value": {"strategy": "Pack", "topology": "Any", "required": False},
        },
        {"op": "add", "path": "/spec/restart", "value": {"policy": "OnFailure", "maxRestarts": 3}},
    )


def test_defaulting_never_changes_a_value_and_fills_inside_lists() -> None:
    obj = job(placement={"strategy": "Spread"}, restart={"policy": "Never", "maxRestarts": 0})
    ops = admission.default("TrainingJob", obj).patch
    assert {"op": "add", "path": "/spec/placement/topology", "value": "Any"} in ops
    assert not [op for op in ops if op["path"].startswith("/spec/restart")]
    assert not [op for op in ops if op["path"] == "/spec/placement/strategy"]
    stages = pipeline()["spec"]["stages"]
    stages[0]["gpu"] = {"shared": {"memoryMiB": 1000}}
    ops = admission.default("InferencePipeline", pipeline(stages=stages)).patch
    assert {"op": "add", "path": "/spec/stages/0/minReplicas", "value": 1} in ops
    assert {"op": "add", "path": "/spec/stages/0/gpu/shared/priority", "value": "BestEffort"} in ops


def test_defaulting_skips_invalid_and_unchanged_specs() -> None:
    assert admission.default("TrainingJob", job(replicas="two")) == Review()
    obj = job()
    assert admission.default("TrainingJob", obj, copy.deepcopy(obj)) == Review()


# ---------------------------------------------------------------------- wire format
def _request(obj: dict[str, Any], operation: str = "CREATE", **extra: Any) -> dict[str, Any]:
    return {
        "uid": "u-1",
        "kind": {"group": "chronotope.dev", "version": "v1alpha1", "kind": "TrainingJob"},
        "namespace": "ns",
        "operation": operation,
        "object": obj,
    } | extra


def test_review_and_response_speak_admission_review_v1() -> None:
    bad = job(template={"spec": {"containers": "x"}})
    del bad["metadata"]["namespace"]  # the request's namespace counts
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
    answer = wire.review(_request(bad), FakeLookups(), TYPES, mutate=False)
    out = wire.response(body | {"request": _request(bad)}, answer)
    assert out == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": "u-1",
            "allowed": False,
            "status": {
                "code": 422,
                "reason": "Invalid",
                "message": "spec.template.spec.containers: must be a list, not the string 'x'",
            },
        },
    }
    good = job(parallelism={"modelProfile": "opt"})
    lookups = FakeLookups()
    mutated = wire.review(_request(good), lookups, TYPES, mutate=True)
    out = wire.response(body | {"request": _request(good)}, mutated)["response"]
    assert out["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(out["patch"]))
    assert {op["path"] for op in patch} >= {"/spec/placement", "/spec/restart"}
    assert lookups.calls == []  # defaulting reads nothing
    warned = wire.review(_request(good), lookups, TYPES, mutate=False)
    assert wire.response({"request": _request(good)}, warned)["response"]["warnings"] == [
        "spec.parallelism.modelProfile: model profile ConfigMap ns/opt not found; the job "
        "waits for it (create it with `chronotope profile configmap`)"
    ]
    assert lookups.calls[-1] == "configmap ns/opt"


@pytest.mark.parametrize(
    "extra",
    [
        {"operation": "DELETE"},
        {"operation": "CONNECT"},
        {"subResource": "scale"},
        {"kind": {"group": "", "version": "v1", "kind": "Pod"}},
    ],
)
def test_requests_the_webhook_is_not_for_are_allowed_unchanged(extra: dict[str, Any]) -> None:
    bad = job(template={"spec": {"containers": "x"}})
    for mutate in (False, True):
        assert wire.review(_request(bad, **extra), FakeLookups(), TYPES, mutate=mutate) == (
            Review()
        )


def test_webhook_configurations_point_both_hooks_at_their_paths() -> None:
    validating, mutating = wire.webhook_configurations(
        "x", {"url": "https://127.0.0.1:9443/", "caBundle": "Q0E="}, failure_policy="Fail"
    )
    (v,) = validating["webhooks"]
    (m,) = mutating["webhooks"]
    assert v["clientConfig"] == {"url": "https://127.0.0.1:9443/validate", "caBundle": "Q0E="}
    assert m["clientConfig"]["url"] == "https://127.0.0.1:9443/mutate"
    assert (v["failurePolicy"], m["failurePolicy"]) == ("Fail", "Ignore")
    assert v["rules"][0]["resources"] == ["trainingjobs", "inferencepipelines", "modelvariants"]
    assert v["matchConditions"] == wire.MATCH_CONDITIONS
    svc = {"service": {"namespace": "n", "name": "s", "port": 443}, "caBundle": "Q0E="}
    validating, _ = wire.webhook_configurations("x", svc, failure_policy="Ignore")
    config = validating["webhooks"][0]["clientConfig"]
    assert config["service"] == {"namespace": "n", "name": "s", "port": 443, "path": "/validate"}
    with pytest.raises(ValueError, match="Fail or Ignore"):
        wire.webhook_configurations("x", svc, failure_policy="Maybe")
    with pytest.raises(ValueError, match=r"within 1\.\.30"):
        wire.webhook_configurations("x", svc, timeout_seconds=60)
