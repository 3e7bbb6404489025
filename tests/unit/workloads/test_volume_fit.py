"""Where the PersistentVolumeClaims a job's workers mount may be used (VolumeBinding, VolumeZone).

A claim bound to a volume with a required node affinity, or with zone labels, keeps
the workers on the nodes that meet them; a claim that is missing or being deleted
fits no node (`node_fit.volume_rules`, `NodeRules.volumes`). Before, the plan did
not read volumes: a gang was planned on a node kube-scheduler's VolumeBinding
filter refuses, and the stuck rule moved it after 45 s.
"""

from __future__ import annotations

from typing import Any

from chronotope.sharing.labels import ZONE_LABEL
from chronotope.workloads.capacity import admitting, cluster_capacity
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.node_fit import claims_of, job_rules, volume_rules
from chronotope.workloads.training import decide
from tests.unit.workloads.test_domain_affinity import NODES
from tests.unit.workloads.test_node_fit import A100, NOW, V100
from tests.unit.workloads.test_pod_anti_affinity import _job


def _claim(name: str, volume: str = "", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "scale", **meta},
        "spec": {"volumeName": volume},
    }


def _volume(name: str, zone: str | None = None, labels: dict[str, str] | None = None) -> Any:
    spec: dict[str, Any] = {}
    if zone is not None:
        term = {"matchExpressions": [{"key": ZONE_LABEL, "operator": "In", "values": [zone]}]}
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [term]}}
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def _mounting(*claims: str) -> dict[str, Any]:
    job = _job("j")
    job["spec"]["template"]["spec"]["volumes"] = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)
    ] + [{"name": "scratch", "emptyDir": {}}]
    return job


def test_the_claims_a_pod_spec_mounts_are_read_once_each() -> None:
    spec = _mounting("data", "ckpt", "data")["spec"]["template"]["spec"]
    assert claims_of(spec) == ("data", "ckpt")
    assert claims_of({"volumes": "junk"}) == ()


def test_a_claim_bound_to_a_zonal_volume_keeps_the_workers_in_its_zone() -> None:
    rules = volume_rules(
        [_claim("data", "pv-x"), _claim("ckpt", "pv-labelled"), _claim("new")],
        [_volume("pv-x", "x"), _volume("pv-labelled", labels={ZONE_LABEL: "y__x"})],
    )
    data, ckpt, new = rules["scale/data"], rules["scale/ckpt"], rules["scale/new"]
    assert data.refuses("v100-x", {ZONE_LABEL: "x"}) is None
    assert data.refuses("a100-y", {ZONE_LABEL: "y"}) == (
        "volume node affinity conflict (PersistentVolume pv-x)"
    )
    assert ckpt.refuses("n", {ZONE_LABEL: "y"}) is None  # a multi-zone label: y or x
    assert (
        ckpt.refuses("n", {})
        == f"volume zone conflict (PersistentVolume pv-labelled: {ZONE_LABEL})"
    )
    assert new.refuses("n", {}) is None  # unbound: its binding is not modelled
    capacity = cluster_capacity(NODES, [], volumes=rules)
    seen = admitting(capacity, A100, job_rules(job_spec(_mounting("data"))))
    assert [n.name for n in seen.nodes] == []
    assert seen.refused == {"volume node affinity conflict (PersistentVolume pv-x)": 2}
    # the job prefers the A100s; it starts on the V100s of the volume's zone
    decision = decide(job_spec(_mounting("data", "new")), capacity, NOW)
    assert decision.gpu_type == V100, decision.reason
    # without the claims' rules (not known) nothing is checked
    unknown = cluster_capacity(NODES, [])
    assert decide(job_spec(_mounting("data")), unknown, NOW).gpu_type == A100


def test_a_missing_or_deleted_claim_fits_no_node_and_the_job_says_why() -> None:
    gone = _claim("old", "pv-x", deletionTimestamp="2026-12-07T00:00:00Z")
    capacity = cluster_capacity(NODES, [], volumes=volume_rules([gone], [_volume("pv-x", "x")]))
    for claim, why in (("nope", "not found"), ("old", "is being deleted")):
        decision = decide(job_spec(_mounting(claim)), capacity, NOW)
        assert decision.gpu_type is None
        assert f"PersistentVolumeClaim scale/{claim} {why}" in decision.reason, decision.reason
