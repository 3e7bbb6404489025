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
from chronotope.workloads.capacity import ClusterFacts, admitting, cluster_capacity, take
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.node_fit import (
    NO_PROVISIONER,
    claims_of,
    job_rules,
    volume_limits,
    volume_rules,
)
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
    capacity = cluster_capacity(NODES, [], facts=ClusterFacts(volumes=rules))
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
    capacity = cluster_capacity(
        NODES, [], facts=ClusterFacts(volumes=volume_rules([gone], [_volume("pv-x", "x")]))
    )
    for claim, why in (("nope", "not found"), ("old", "is being deleted")):
        decision = decide(job_spec(_mounting(claim)), capacity, NOW)
        assert decision.gpu_type is None
        said = f"waiting for its volumes: PersistentVolumeClaim scale/{claim} {why}"
        assert decision.reason == said, decision.reason
        reason = decision.why
        assert reason is not None
        assert reason.code == "VolumeNotReady"


def _class(name: str, mode: str | None = None, zones: list[str] | None = None) -> Any:
    out: dict[str, Any] = {"metadata": {"name": name}, "provisioner": "example.com/p"}
    if mode is not None:
        out["volumeBindingMode"] = mode
    if zones is not None:
        out["allowedTopologies"] = [
            {"matchLabelExpressions": [{"key": ZONE_LABEL, "values": zones}]}
        ]
    return out


def test_an_unbound_claim_waits_for_its_binding_or_goes_where_its_class_provisions() -> None:
    def unbound(name: str, kind: str | None) -> dict[str, Any]:
        out = _claim(name)
        out["spec"] = {"storageClassName": kind} if kind is not None else {}
        return out

    claims = [
        unbound("fast", "immediate"),
        unbound("plain", None),
        unbound("lost", "gone"),
        unbound("later", "wffc"),
        unbound("zonal", "zonal"),
        _claim("binding", "pv-not-seen-yet"),
        # the deprecated annotation names the class over the field, as kube-scheduler reads it
        {
            **unbound("old", "immediate"),
            "metadata": {
                "name": "old",
                "namespace": "scale",
                "annotations": {"volume.beta.kubernetes.io/storage-class": "wffc"},
            },
        },
    ]
    kinds = [
        _class("immediate"),
        _class("wffc", "WaitForFirstConsumer"),
        _class("zonal", "WaitForFirstConsumer", ["x"]),
    ]
    rules = volume_rules(claims, [], kinds)
    y, x = {ZONE_LABEL: "y"}, {ZONE_LABEL: "x"}
    assert rules["scale/fast"].refuses("n", x) == (
        "PersistentVolumeClaim scale/fast is not bound yet (StorageClass immediate)"
    )
    assert (
        rules["scale/plain"].refuses("n", x) == "PersistentVolumeClaim scale/plain is not bound yet"
    )
    assert rules["scale/lost"].refuses("n", x) == (
        "StorageClass gone of PersistentVolumeClaim scale/lost not found"
    )
    assert rules["scale/later"].refuses("n", y) is None  # provisioned where its pod goes
    assert rules["scale/zonal"].refuses("n", x) is None
    assert rules["scale/zonal"].refuses("n", y) == (
        "volume node affinity conflict (StorageClass zonal)"
    )
    assert rules["scale/binding"].refuses("n", y) is None  # its volume is on the way
    assert rules["scale/old"].refuses("n", y) is None
    # without the classes (not known), an unbound claim states nothing
    assert volume_rules(claims, [])["scale/fast"].refuses("n", x) is None
    # a job whose claim is not bound waits and says so; one on a zonal class goes to x
    capacity = cluster_capacity(NODES, [], facts=ClusterFacts(volumes=rules))
    decision = decide(job_spec(_mounting("fast")), capacity, NOW)
    assert decision.gpu_type is None
    assert "PersistentVolumeClaim scale/fast is not bound yet" in decision.reason
    assert decide(job_spec(_mounting("zonal")), capacity, NOW).gpu_type == V100


def _local(name: str, node: str, size: str = "10Gi", **spec: Any) -> dict[str, Any]:
    """A local PersistentVolume of class `local` on node `node` (by its hostname label)."""
    term = {
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]
    }
    return {
        "metadata": {"name": name, "labels": {"disk": "nvme"}},
        "spec": {
            "storageClassName": "local",
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}},
            **spec,
        },
    }


def _wants(name: str, size: str = "5Gi", **spec: Any) -> dict[str, Any]:
    """An unbound claim of class `local` asking `size`, ReadWriteOnce."""
    return {
        "metadata": {"name": name, "namespace": "scale"},
        "spec": {
            "storageClassName": "local",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}},
            **spec,
        },
    }


def test_a_claim_of_a_class_with_no_provisioner_goes_where_a_volume_it_fits_is() -> None:
    # kube-scheduler's VolumeBinding for WaitForFirstConsumer: a static volume the claim
    # could bind to (its size, access modes, volume mode, selector; not reserved for
    # another claim) may be used there; a class with no provisioner makes none elsewhere
    local = {**_class("local", "WaitForFirstConsumer"), "provisioner": NO_PROVISIONER}
    volumes = [
        _local("pv-a", "a"),
        _local("pv-small", "b", "1Gi"),
        _local("pv-taken", "c", claimRef={"namespace": "scale", "name": "other"}),
        _local("pv-block", "d", volumeMode="Block"),
        _local("pv-mine", "e", claimRef={"namespace": "scale", "name": "reserved"}),
    ]
    claims = [
        _wants("data"),
        _wants("huge", "100Gi"),
        _wants("reserved", "100Gi"),
        _wants("picky", selector={"matchLabels": {"disk": "ssd"}}),
        _wants("many", accessModes=["ReadWriteMany"]),
    ]
    rules = volume_rules(claims, volumes, [local])
    host = "kubernetes.io/hostname"
    data = rules["scale/data"]
    assert data.refuses("a", {host: "a"}) is None
    for n in "bcde":  # too small, reserved for another claim, a block volume, reserved
        assert data.refuses(n, {host: n}) == "volume node affinity conflict (StorageClass local)"
    assert rules["scale/reserved"].refuses("e", {host: "e"}) is None  # its own, whatever its size
    nowhere = "no PersistentVolume of StorageClass local is available for PersistentVolumeClaim"
    for name in ("huge", "picky", "many"):
        assert rules[f"scale/{name}"].refusal == f"{nowhere} scale/{name}"
    # a class that provisions: where a volume is, or where it may provision (anywhere)
    provisioning = [_class("local", "WaitForFirstConsumer")]
    assert volume_rules(claims, volumes, provisioning)["scale/huge"].refuses("z", {}) is None
    # a job whose claim no volume fits waits and says so
    capacity = cluster_capacity(NODES, [], facts=ClusterFacts(volumes=rules))
    decision = decide(job_spec(_mounting("huge")), capacity, NOW)
    assert decision.gpu_type is None
    assert f"{nowhere} scale/huge" in decision.reason


def _ephemeral(kind: str | None) -> dict[str, Any]:
    """A job whose workers each get a generic ephemeral volume of StorageClass `kind`."""
    claim: dict[str, Any] = {"accessModes": ["ReadWriteOnce"]}
    if kind is not None:
        claim["storageClassName"] = kind
    job = _job("j")
    job["spec"]["template"]["spec"]["volumes"] = [
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": claim}}}
    ]
    return job


def test_a_generic_ephemeral_volume_goes_where_its_class_may_give_it_a_volume() -> None:
    # each worker's claim is made with the pod: under WaitForFirstConsumer it binds
    # where a free volume of the class is, or where the class may provision one (not a
    # class with no provisioner); a template naming no class takes the default class
    local = {**_class("local", "WaitForFirstConsumer"), "provisioner": NO_PROVISIONER}
    local["metadata"]["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
    kinds = [local, _class("zonal", "WaitForFirstConsumer", ["x"]), _class("immediate")]
    free, taken = _volume("pv-x", "x"), _volume("pv-taken", "y")  # in zones x and y
    free["spec"] |= {"storageClassName": "local", "accessModes": ["ReadWriteOnce"]}
    taken["spec"] |= {"storageClassName": "local", "claimRef": {"namespace": "a", "name": "o"}}
    volumes = [free, taken]
    rules = volume_rules([], volumes, kinds)
    capacity = cluster_capacity(NODES, [], facts=ClusterFacts(volumes=rules))
    for kind in ("local", None, "zonal"):  # on v100-x's volume, or in zone x
        assert decide(job_spec(_ephemeral(kind)), capacity, NOW).gpu_type == V100, kind
    assert decide(job_spec(_ephemeral("immediate")), capacity, NOW).gpu_type == A100
    assert decide(job_spec(_ephemeral("")), capacity, NOW).gpu_type == A100  # no class
    missing = decide(job_spec(_ephemeral("gone")), capacity, NOW)
    assert missing.cause == "VolumeNotReady"
    assert "StorageClass gone of a generic ephemeral volume not found" in missing.reason
    # no free volume of a class with no provisioner: it waits and says so
    full = volume_rules([], volumes[1:], kinds)
    decision = decide(
        job_spec(_ephemeral("local")),
        cluster_capacity(NODES, [], facts=ClusterFacts(volumes=full)),
        NOW,
    )
    assert decision.cause == "VolumeNotReady"
    assert (
        "no PersistentVolume of StorageClass local is available for a generic ephemeral "
        "volume of StorageClass local"
    ) in decision.reason
    # the classes not known: nothing is checked
    unknown = cluster_capacity(NODES, [], facts=ClusterFacts(volumes=volume_rules([], volumes)))
    assert decide(job_spec(_ephemeral("local")), unknown, NOW).gpu_type == A100


def test_a_generic_ephemeral_volume_s_template_is_read_as_the_claim_it_makes() -> None:
    # its size, access and volume modes are compared with the class's volumes as for any
    # unbound claim (before stop 61 only its class was read: a template asking more than
    # the free volume holds was planned beside it, and its pod stayed Pending)
    local = {**_class("local", "WaitForFirstConsumer"), "provisioner": NO_PROVISIONER}
    small = _volume("pv-y", "y")  # beside a100-y
    small["spec"] |= {"storageClassName": "local", "capacity": {"storage": "1Gi"}}
    small["spec"]["accessModes"] = ["ReadWriteOnce"]
    large = _volume("pv-x", "x")  # beside v100-x
    large["spec"] |= {"storageClassName": "local", "capacity": {"storage": "10Gi"}}
    large["spec"]["accessModes"] = ["ReadWriteOnce"]
    rules = volume_rules([], [small, large], [local])
    capacity = cluster_capacity(NODES, [], facts=ClusterFacts(volumes=rules))

    def asking(size: str, modes: list[str]) -> dict[str, Any]:
        job = _ephemeral("local")
        claim = job["spec"]["template"]["spec"]["volumes"][0]["ephemeral"]["volumeClaimTemplate"]
        claim["spec"] |= {"accessModes": modes, "resources": {"requests": {"storage": size}}}
        return job

    assert decide(job_spec(asking("1Gi", ["ReadWriteOnce"])), capacity, NOW).gpu_type == A100
    # 5Gi: only the 10Gi volume, beside the slower V100 (a100-y's is too small)
    big = decide(job_spec(asking("5Gi", ["ReadWriteOnce"])), capacity, NOW)
    assert big.gpu_type == V100
    nowhere = decide(job_spec(asking("50Gi", ["ReadWriteOnce"])), capacity, NOW)
    assert nowhere.cause == "VolumeNotReady"
    assert (
        "no PersistentVolume of StorageClass local is available for a generic ephemeral "
        "volume of StorageClass local"
    ) in nowhere.reason
    shared = decide(job_spec(asking("1Gi", ["ReadWriteMany"])), capacity, NOW)
    assert shared.cause == "VolumeNotReady"


def test_a_gang_sharing_a_read_write_once_pod_claim_can_never_run() -> None:
    # kube-scheduler's VolumeRestrictions: one pod at a time may use such a claim, so a
    # gang of two whose workers both mount it would have its second worker Pending for
    # ever (before: planned, stuck, re-planned every 45 s); one worker may use it
    claim = _claim("solo", "pv-x")
    claim["spec"]["accessModes"] = ["ReadWriteOncePod"]
    rules = volume_rules([claim], [_volume("pv-x", "x")])
    assert rules["scale/solo"].one_pod
    capacity = cluster_capacity(NODES, [], facts=ClusterFacts(volumes=rules))
    pair = _mounting("solo")
    pair["spec"]["replicas"] = 2
    decision = decide(job_spec(pair), capacity, NOW)
    assert decision.cause == "VolumeConflict"
    assert decision.reason == (
        "cannot ever run here: PersistentVolumeClaim scale/solo is ReadWriteOncePod (one pod "
        "may use it) and every one of its 2 workers mounts it"
    )
    assert decide(job_spec(_mounting("solo")), capacity, NOW).gpu_type == V100
    # not bound yet: it never will be for both, which is what the job says
    claim["spec"] = {"accessModes": ["ReadWriteOncePod"]}
    waiting = cluster_capacity(NODES, [], facts=ClusterFacts(volumes=volume_rules([claim], [], [])))
    assert decide(job_spec(pair), waiting, NOW).cause == "VolumeConflict"


CSI = "csi.example.com"


def _pool(kind: str, limit: dict[str, str], topology: dict[str, Any] | None) -> dict[str, Any]:
    """A CSIStorageCapacity of StorageClass `kind` (`limit`: capacity, maximumVolumeSize)."""
    out: dict[str, Any] = {"metadata": {"name": f"p-{len(limit)}"}, "storageClassName": kind}
    if topology is not None:
        out["nodeTopology"] = topology
    return out | limit


def test_a_claim_a_csi_driver_provisions_goes_where_the_driver_reports_room() -> None:
    # kube-scheduler's VolumeBinding for a class whose CSI driver reports its capacity
    # (storageCapacity: true): it provisions only on a node in the nodeTopology of one of
    # the class's CSIStorageCapacities whose maximumVolumeSize (else capacity) covers
    # the claim's request. Before, the plan let it provision anywhere, and a gang
    # planned where the driver has no room waited 45 s for the stuck rule
    kind = {**_class("csi", "WaitForFirstConsumer"), "provisioner": CSI}
    driver = {"metadata": {"name": CSI}, "spec": {"storageCapacity": True}}
    pools = [
        _pool("csi", {"capacity": "100Gi"}, {"matchLabels": {ZONE_LABEL: "x"}}),
        # much free, but no volume above 1Gi
        _pool(
            "csi",
            {"capacity": "500Gi", "maximumVolumeSize": "1Gi"},
            {"matchLabels": {ZONE_LABEL: "y"}},
        ),
        _pool("csi", {"capacity": "900Gi"}, None),  # no nodeTopology: unavailable
        _pool("other", {"capacity": "900Gi"}, {}),  # another class's
    ]

    def wanting(name: str, size: str | None) -> dict[str, Any]:
        out = _wants(name) | {"spec": {"storageClassName": "csi"}}
        if size is not None:
            out["spec"]["resources"] = {"requests": {"storage": size}}
        return out

    claims = [wanting("data", "5Gi"), wanting("huge", "200Gi"), wanting("any", None)]
    rules = volume_rules(claims, [], [kind], [driver], pools)
    x, y = {ZONE_LABEL: "x"}, {ZONE_LABEL: "y"}
    assert rules["scale/data"].refuses("n", x) is None
    assert rules["scale/data"].refuses("n", y) == (
        "volume node affinity conflict (StorageClass csi and its CSI driver's capacity)"
    )
    assert rules["scale/huge"].refusal == (
        "no PersistentVolume of StorageClass csi is available for PersistentVolumeClaim "
        "scale/huge, nor a CSIStorageCapacity of the class with room for 200Gi"
    )
    assert rules["scale/any"].refuses("n", y) is None  # it requests no storage: not checked
    # a driver that does not report capacity, or none known: the class provisions anywhere
    for drivers in ([], [{"metadata": {"name": CSI}, "spec": {"storageCapacity": False}}]):
        assert (
            volume_rules(claims, [], [kind], drivers, pools)["scale/data"].refuses("n", y) is None
        )
    # the class's allowedTopologies and the pools' node selectors both hold
    zoned = {
        **kind,
        "allowedTopologies": [{"matchLabelExpressions": [{"key": ZONE_LABEL, "values": ["y"]}]}],
    }
    both = volume_rules(claims, [], [zoned], [driver], pools)["scale/data"]
    assert both.refuses("n", x) is not None
    assert both.refuses("n", y) is not None
    everywhere = [*pools, _pool("csi", {"capacity": "10Gi"}, {})]  # an empty selector: all
    assert (
        volume_rules(claims, [], [zoned], [driver], everywhere)["scale/data"].refuses("n", y)
        is None
    )
    # a job mounting the claim goes to the zone with room (the V100 node, A100 is faster)
    capacity = cluster_capacity(NODES, [], facts=ClusterFacts(volumes=rules))
    assert decide(job_spec(_mounting("data")), capacity, NOW).gpu_type == V100
    decision = decide(job_spec(_mounting("huge")), capacity, NOW)
    assert decision.gpu_type is None
    assert "nor a CSIStorageCapacity of the class with room for 200Gi" in decision.reason


def test_a_read_write_once_pod_claim_another_pod_uses_makes_the_job_wait() -> None:
    # kube-scheduler's VolumeRestrictions: while a bound pod uses a ReadWriteOncePod
    # claim, no other pod mounting it is scheduled. Before, the job was planned, its
    # worker stayed Pending, and the stuck rule re-planned it every 45 s
    claim = _claim("solo", "pv-x")
    claim["spec"]["accessModes"] = ["ReadWriteOncePod"]
    rules = volume_rules([claim, _claim("shared", "pv-x")], [_volume("pv-x", "x")])
    job = _mounting("solo", "shared")

    def user(name: str, labels: dict[str, str], phase: str = "Running") -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "scale", "labels": labels},
            "spec": {
                "nodeName": "v100-x",
                "containers": [{"name": "c"}],
                **_mounting("solo", "shared")["spec"]["template"]["spec"],
            },
            "status": {"phase": phase},
        }

    facts = ClusterFacts(volumes=rules)
    other = cluster_capacity(NODES, [user("reader", {"app": "reader"})], facts=facts)
    decision = decide(job_spec(job), other, NOW)
    assert decision.cause == "VolumeNotReady"
    assert decision.reason == (
        "waiting for its volumes: PersistentVolumeClaim scale/solo is ReadWriteOncePod and "
        "pod scale/reader uses it"
    )
    # one of the job's own workers (its labels and job label), or a pod that is done,
    # does not hold it from the job
    own = {"chronotope.dev/job": "j", "chronotope.dev/gang": "g0"}
    for pod in (user("j-0", own), user("reader", {"app": "reader"}, "Succeeded")):
        assert (
            decide(job_spec(job), cluster_capacity(NODES, [pod], facts=facts), NOW).gpu_type == V100
        )


def _csi_volume(name: str, handle: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"csi": {"driver": CSI, "volumeHandle": handle}}}


def _csi_node(node: str, count: int) -> dict[str, Any]:
    driver = {"name": CSI, "nodeID": node, "allocatable": {"count": count}}
    return {"metadata": {"name": node}, "spec": {"drivers": [driver, {"name": "other.example"}]}}


def _mounter(name: str, node: str, *claims: str) -> dict[str, Any]:
    spec = _mounting(*claims)["spec"]["template"]["spec"]
    return {
        "metadata": {"name": name, "namespace": "scale", "labels": {"app": name}},
        "spec": {"nodeName": node, **spec},
        "status": {"phase": "Running"},
    }


def test_a_node_whose_csi_driver_attaches_no_more_volumes_takes_no_worker() -> None:
    # kube-scheduler's NodeVolumeLimits: a node's CSINode states how many volumes of a
    # driver it may attach; its pods' volumes and its VolumeAttachments count, a volume
    # once however many pods mount it. Before stop 62 the plan did not read it, and the
    # gang was planned where kube-scheduler refused it ("node(s) exceed max volume count")
    volumes = [_csi_volume("pv-data", "h-data"), _csi_volume("pv-other", "h-other")]
    claims = [_claim("data", "pv-data"), _claim("other", "pv-other")]
    limits = volume_limits([_csi_node("a100-y", 1)], [], volumes)
    assert limits.per_node == {"a100-y": ((CSI, 1),)}
    assert limits.drivers == frozenset({CSI})
    facts = ClusterFacts(volumes=volume_rules(claims, volumes), limits=limits)
    job = job_spec(_mounting("data"))
    # a100-y attaches the other volume for a pod there: full, the job goes to a100-none
    busy = cluster_capacity(NODES, [_mounter("p", "a100-y", "other")], facts=facts)
    assert next(n for n in busy if n.name == "a100-y").attached == {(CSI, "h-other")}
    assert decide(job, busy, NOW).gpu_type == A100

    def usable(capacity: Any) -> list[str]:
        return [n.name for n in admitting(capacity, A100, job_rules(job)).nodes if n.free]

    assert usable(busy) == ["a100-none"]
    # its pod mounts the job's own volume: counted once, the node takes the job
    shared = cluster_capacity(NODES, [_mounter("p", "a100-y", "data")], facts=facts)
    assert usable(shared) == ["a100-y", "a100-none"]
    # a VolumeAttachment counts as a pod's volume would
    attachment = {
        "metadata": {"name": "va"},
        "spec": {
            "attacher": CSI,
            "nodeName": "a100-none",
            "source": {"persistentVolumeName": "pv-other"},
        },
    }
    both = volume_limits([_csi_node("a100-y", 1), _csi_node("a100-none", 1)], [attachment], volumes)
    facts = ClusterFacts(volumes=facts.volumes, limits=both)
    full = cluster_capacity(NODES, [_mounter("p", "a100-y", "other")], facts=facts)
    assert decide(job, full, NOW).gpu_type == V100
    pinned = _mounting("data")
    pinned["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    wait = decide(job_spec(pinned), full, NOW)
    assert (
        "too little room for volumes of CSI driver csi.example.com (a100-y attaches 1 of 1: "
        "node(s) exceed max volume count)" in wait.reason
    ), wait.reason


def test_each_worker_s_own_csi_volumes_count_on_its_node() -> None:
    # a generic ephemeral volume's claim is each pod's own: a node that may attach one
    # more volume of the driver holds one worker, and a start attaches it
    kind = {**_class("csi", "WaitForFirstConsumer"), "provisioner": CSI}
    facts = ClusterFacts(
        volumes=volume_rules([], [], [kind]),
        limits=volume_limits([_csi_node(n, 1) for n in ("a100-y", "a100-none")], [], []),
    )
    capacity = cluster_capacity(NODES, [], facts=facts)
    pair = _ephemeral("csi")
    pair["spec"]["replicas"] = 2
    rules = job_rules(job_spec(pair))
    seen = admitting(capacity, A100, rules)
    assert [(n.name, n.free) for n in seen.nodes] == [("a100-y", 1), ("a100-none", 1)]
    one = job_spec(_ephemeral("csi"))
    after, placed = take(capacity, A100, 1, 1, rules=job_rules(one))
    assert placed == (("a100-y", (0,)),)
    assert [n.name for n in admitting(after, A100, job_rules(one)).nodes if n.free] == ["a100-none"]
    # two volumes of one template are two of the worker's own: no node holds it
    twice = _ephemeral("csi")
    volumes = twice["spec"]["template"]["spec"]["volumes"]
    volumes.append({**volumes[0], "name": "more"})
    assert not any(n.free for n in admitting(capacity, A100, job_rules(job_spec(twice))).nodes)
