"""InferencePipeline `reconcile` against a fake `PipelineOps`."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from chronotope.controllers.inferencepipeline import PipelineOps, reconcile
from chronotope.workloads.training_quota import QuotaView, serving_workloads, waiting_serving
from tests.quota_inputs import QuotaInputs, serving_pod, training_borrows

ROOT = Path(__file__).resolve().parents[3]
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _node(name: str, product: str, gpus: int = 4) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


class FakeOps(QuotaInputs):
    """Objects in memory; records what `reconcile` applies."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        super().__init__()
        self.pods: list[dict[str, Any]] = []
        """Live pods (what holds quota)."""
        self._nodes = nodes
        self.config_maps: dict[tuple[str, str], dict[str, Any]] = {}
        self.variants: dict[tuple[str, str], dict[str, Any]] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        """Serving groups' Deployments (the ModelVariant controller's), by name."""
        self.applied: dict[str, dict[str, Any]] = {}
        self.rate: float | str = 50.0
        self.answers: dict[str, float | str] = {}
        """Answers by query (the observed P99 query's); any other query gets `rate`."""
        self.asked: list[tuple[str | None, str]] = []

    def nodes(self) -> list[dict[str, Any]]:
        return self._nodes

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.config_maps.get((namespace, name))

    def model_variant(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.variants.get((namespace, name))

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.groups.get(name)

    def query_rate(self, address: str | None, query: str) -> float | str:
        self.asked.append((address, query))
        return self.answers.get(query, self.rate)

    def deployments(self, namespace: str, pipeline: str) -> dict[str, dict[str, Any]]:
        return self.applied

    def apply(self, deployment: dict[str, Any], service: dict[str, Any]) -> None:
        d = copy.deepcopy(deployment)
        d["status"] = {"readyReplicas": d["spec"]["replicas"]}  # ready at once
        self.applied[d["metadata"]["name"]] = d

    def pods_matching(
        self, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        key, _, value = (selector or "").partition("=")
        return [
            p
            for p in self.pods
            if namespace in (None, p["metadata"]["namespace"])
            and (not key or p["metadata"].get("labels", {}).get(key) == value)
        ]


def _protocol(ops: FakeOps) -> PipelineOps:
    return ops  # mypy checks the fake against the Protocol


def _sample() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "manifests/samples/inferencepipeline-video.yaml").read_text())
    doc["metadata"] |= {"namespace": "ns", "uid": "u-1", "generation": 1}
    return dict(doc)


def _ops() -> FakeOps:
    ops = FakeOps([_node("t4-0", "T4", 1), _node("a-0", "A100-SXM4-80GB", 8)])
    arrivals = yaml.safe_load((ROOT / "manifests/demo/video-arrivals.yaml").read_text())
    ops.config_maps["ns", "video-arrivals"] = arrivals
    variants = yaml.safe_load_all((ROOT / "manifests/samples/modelvariants-llama.yaml").read_text())
    ops.variants["ns", "ocr-receipts"] = next(
        v for v in variants if v["metadata"]["name"] == "ocr-receipts"
    )
    ops.groups["llama-7b"] = {"spec": {"replicas": 3}, "status": {"readyReplicas": 2}}
    return ops


def test_a_pipeline_is_planned_built_and_serving() -> None:
    ops, obj = _ops(), _sample()
    out = reconcile(obj, ops, NOW)
    assert out.status["phase"] == "Serving"
    assert out.status["predictedP99Ms"] <= 250
    assert out.status["costPerHour"] > 0
    assert [s["name"] for s in out.status["stages"]] == ["detect", "pose", "ocr"]
    # the ocr stage names a ModelVariant: its serving group serves it, nothing of its own
    assert set(ops.applied) == {"video-analytics-detect", "video-analytics-pose"}
    ocr = out.status["stages"][2]
    assert (ocr["servedBy"], ocr["replicas"], ocr["readyReplicas"]) == ("llama-7b", 3, 2)
    pose = ops.applied["video-analytics-pose"]["spec"]["template"]
    assert pose["spec"]["containers"][0]["resources"]["limits"] == {"chronotope.dev/gpu-share": "1"}
    assert pose["metadata"]["annotations"]["chronotope.dev/gpu-compute-percent"] == "50"
    detect = ops.applied["video-analytics-detect"]["spec"]["template"]["spec"]
    assert detect["schedulerName"] == "chronotope"
    env = {e["name"]: e["value"] for e in detect["containers"][0]["env"]}
    assert env["CHRONOTOPE_DOWNSTREAM"].split(",") == [
        "http://video-analytics-pose.ns.svc:8080",
        "http://llama-7b.ns.svc:8080",  # the serving group's Service
    ]
    assert [e[1] for e in out.events] == ["Planned"]
    # the recorded plan is reused: no second planning event, same replicas
    again = reconcile(obj | {"status": out.status}, ops, NOW)
    assert again.events == []
    assert again.status["stages"] == out.status["stages"]


def test_a_variant_stage_waits_for_its_serving_group() -> None:
    ops, obj = _ops(), _sample()
    ops.groups.clear()  # the ModelVariant controller has not built the group yet
    out = reconcile(obj, ops, NOW)
    assert out.status["phase"] == "Planning"
    assert out.status["whyWaiting"] == (
        "waiting for replicas: ocr: serving group llama-7b has no ready replica"
    )
    ocr = out.status["stages"][2]
    assert (ocr["servedBy"], ocr["replicas"], ocr["readyReplicas"]) == ("llama-7b", 0, 0)
    # its GPUs are the group's, not the pipeline's
    own = out.status["stages"][:2]
    assert out.status["totalGpus"] == pytest.approx(own[0]["replicas"] + 0.5 * own[1]["replicas"])
    ops.groups["llama-7b"] = {"spec": {"replicas": 1}, "status": {"readyReplicas": 1}}
    assert reconcile(obj | {"status": out.status}, ops, NOW).status["phase"] == "Serving"


def test_a_stage_naming_a_variant_without_a_group_name_uses_the_base() -> None:
    ops, obj = _ops(), _sample()
    del ops.variants["ns", "ocr-receipts"]["spec"]["servingGroup"]
    ops.groups = {
        "meta-llama-llama-2-7b-hf": {"spec": {"replicas": 1}, "status": {"readyReplicas": 1}}
    }
    out = reconcile(obj, ops, NOW)
    assert out.status["stages"][2]["servedBy"] == "meta-llama-llama-2-7b-hf"
    assert out.status["phase"] == "Serving"


def _prometheus_unreachable(o: dict[str, Any], ops: FakeOps) -> None:
    o["spec"].update(traffic={"prometheus": {"query": "rate(x[1m])"}})
    ops.rate = "Prometheus at http://p did not answer"


@pytest.mark.parametrize(
    ("change", "code", "phase"),
    [
        pytest.param(
            lambda o, ops: ops.variants.clear(), "ModelVariantMissing", "Pending", id="variant"
        ),
        pytest.param(
            lambda o, ops: ops.variants["ns", "ocr-receipts"]["spec"].pop("base"),
            "ModelVariantInvalid",
            "Pending",
            id="variant-invalid",
        ),
        pytest.param(
            lambda o, ops: o["spec"]["slo"].update(p99LatencyMs=20),
            "SLOInfeasible",
            "Failed",
            id="slo",
        ),
        pytest.param(
            lambda o, ops: ops.config_maps.clear(), "TraceMissing", "Pending", id="no-trace"
        ),
        pytest.param(
            lambda o, ops: ops.config_maps["ns", "video-arrivals"]["data"].update(
                {"arrivals.txt": "x y"}
            ),
            "TraceUnparsable",
            "Pending",
            id="bad-trace",
        ),
        pytest.param(
            lambda o, ops: ops._nodes.pop(), "NoProfiledGpuType", "Failed", id="no-gpu-type"
        ),
        pytest.param(
            _prometheus_unreachable,
            "PrometheusUnreachable",
            "Pending",
            id="prometheus",
        ),
    ],
)
def test_bad_input_gets_a_condition_and_builds_nothing(change: Any, code: str, phase: str) -> None:
    ops, obj = _ops(), _sample()
    change(obj, ops)
    out = reconcile(obj, ops, NOW)
    assert out.status["phase"] == phase
    assert out.status["conditions"][0]["reason"] == code
    assert ops.applied == {}
    assert [e[1] for e in out.events] == [code]
    assert reconcile(obj | {"status": out.status}, ops, NOW).events == []  # said once


def test_a_fixed_rate_is_planned_on_a_poisson_sample() -> None:
    ops, obj = _ops(), _sample()
    obj["spec"]["traffic"] = {"fixedQPS": 300}
    busy = reconcile(obj, ops, NOW)
    obj["spec"]["traffic"] = {"fixedQPS": 20}
    quiet = reconcile(obj, _ops(), NOW)
    assert busy.status["costPerHour"] > quiet.status["costPerHour"]


def _prometheus_pipeline() -> dict[str, Any]:
    obj = _sample()
    obj["spec"]["traffic"] = {"prometheus": {"query": "rate(requests_total[5s])"}}
    return obj


def _live_traffic(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[FakeOps, dict[str, Any], dict[str, float]]:
    """Fake ops whose Prometheus answers `rates["now"]`, and `rates["max"]` for the recent max."""
    ops, obj = _ops(), _prometheus_pipeline()
    rates = {"now": 40.0, "max": 40.0}

    def query_rate(address: str | None, q: str) -> float | str:
        return rates["max"] if q.startswith("max_over_time") else rates["now"]

    monkeypatch.setattr(ops, "query_rate", query_rate)
    return ops, obj, rates


def test_the_tuner_scales_up_at_once_and_down_only_after_the_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from datetime import timedelta

    from chronotope.controllers.inferencepipeline import TunerSettings

    ops, obj, rates = _live_traffic(monkeypatch)
    settings = TunerSettings(down_delay_s=30)
    first = reconcile(obj, ops, NOW, settings)
    assert [e[1] for e in first.events] == ["Planned"]
    base = [s["replicas"] for s in first.status["stages"]]
    assert base == [
        s["plannedReplicas"] if "servedBy" not in s else s["replicas"]
        for s in first.status["stages"]
    ]
    assert first.status["tuner"]["plannedEnvelope"][-2]["windowSeconds"] == 60.0
    table = first.status["tuner"]["scalingTable"]
    assert len(table) >= 3
    assert all(len(r["replicas"]) == len(base) for r in table)
    assert [r["rateQPS"] for r in table] == sorted(r["rateQPS"] for r in table)

    def step(status: dict[str, Any], seconds: float) -> Any:
        return reconcile(obj | {"status": status}, ops, NOW + timedelta(seconds=seconds), settings)

    rates.update(now=200.0, max=200.0)  # a burst: up at once
    up = step(first.status, 2)
    assert up.status["tuner"]["mode"] == "ScalingUp"
    assert [e[1] for e in up.events] == ["ScaledUp"]
    bigger = [s["replicas"] for s in up.status["stages"]]
    assert sum(bigger) > sum(base)
    # the replicas are the table's need at 200 queries/s (past its end: its last row, scaled)
    from chronotope.planners.inferline import ScalingStep, table_need

    need = table_need([ScalingStep(r["rateQPS"], tuple(r["replicas"])) for r in table], 200.0)
    own = [i for i, s in enumerate(up.status["stages"]) if "servedBy" not in s]
    assert own  # (a stage served by a ModelVariant shows its group's replicas)
    assert [bigger[i] for i in own] == [max(need[i], base[i]) for i in own]
    assert up.status["tuner"]["scalingTable"] == table  # kept from pass to pass
    assert ops.applied["video-analytics-detect"]["spec"]["replicas"] == bigger[0]
    rates.update(now=40.0)  # the burst ends, but it is within the delay: hold
    held = step(up.status, 10)
    assert held.status["tuner"]["mode"] == "Steady"
    assert [s["replicas"] for s in held.status["stages"]] == bigger
    rates.update(max=40.0)  # the delay has passed and the recent max is low: down
    down = step(held.status, 40)
    assert down.status["tuner"]["mode"] == "ScalingDown"
    assert [s["replicas"] for s in down.status["stages"]] == base
    assert down.status["costPerHour"] < up.status["costPerHour"]


def _replan_due_at(
    obj: dict[str, Any], status: dict[str, Any], seconds: float, settings: Any
) -> bool:
    from datetime import timedelta

    from chronotope.api.v1alpha1.inferencepipeline import InferencePipelineSpec
    from chronotope.controllers.inferencepipeline import _replan_due

    spec = InferencePipelineSpec.model_validate(obj["spec"])
    generation = obj["metadata"].get("generation")
    return _replan_due(spec, status, generation, NOW + timedelta(seconds=seconds), settings)


def test_a_pipeline_on_live_traffic_is_planned_again_at_a_low_frequency(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from datetime import timedelta

    from chronotope.controllers.inferencepipeline import TunerSettings

    ops, obj, rates = _live_traffic(monkeypatch)
    settings = TunerSettings(down_delay_s=30, replan_period_s=600)
    first = reconcile(obj, ops, NOW, settings)
    assert first.status["tuner"]["plannedAt"] == NOW.strftime("%Y-%m-%dT%H:%M:%SZ")

    def step(status: dict[str, Any], seconds: float) -> Any:
        return reconcile(obj | {"status": status}, ops, NOW + timedelta(seconds=seconds), settings)

    def planned(status: dict[str, Any]) -> list[int]:
        return [int(s["plannedReplicas"]) for s in status["stages"]]

    rates.update(now=400.0, max=400.0)  # ten times the rate the plan was made for
    up = step(first.status, 300)  # before the period: the tuner scales, the plan stays
    assert [e[1] for e in up.events] == ["ScaledUp"]
    assert up.status["tuner"]["plannedAt"] == first.status["tuner"]["plannedAt"]
    assert planned(up.status) == planned(first.status)
    again = step(up.status, 700)  # the period has passed: planned again on 400 queries/s
    assert [e[1] for e in again.events] == ["Replanned"]
    assert "400.0 queries/s" in again.events[0][2]
    assert again.status["tuner"]["plannedAt"] == (NOW + timedelta(seconds=700)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    assert sum(planned(again.status)) > sum(planned(first.status))
    # a stage that keeps its GPU type and batch keeps the tuner's replicas (scaling down is
    # still the tuner's, after its delay); one whose batch changed runs the new plan's
    for a, b in zip(up.status["stages"], again.status["stages"], strict=True):
        if "servedBy" in a:
            continue
        if (a["gpuType"], a["batchSize"]) == (b["gpuType"], b["batchSize"]):
            assert b["replicas"] >= a["replicas"]
        else:
            assert b["replicas"] == b["plannedReplicas"]
    same = step(again.status, 1400)  # planned again on the same rate: the same plan, no event
    assert same.events == []
    assert planned(same.status) == planned(again.status)
    assert same.status["tuner"]["plannedAt"] > again.status["tuner"]["plannedAt"]
    # due again while Prometheus does not answer: the running plan stays, and the period
    # starts again (no re-plan tried on every pass)
    monkeypatch.setattr(ops, "query_rate", lambda address, q: "Prometheus did not answer")
    down = step(same.status, 2100)
    assert [e[1] for e in down.events if e[1] in ("Planned", "Replanned")] == []
    assert planned(down.status) == planned(same.status)
    assert down.status["tuner"]["plannedAt"] == (NOW + timedelta(seconds=2100)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    assert _replan_due_at(obj, down.status, 2101, settings) is False


def test_an_unreachable_prometheus_holds_the_replicas_and_says_so() -> None:
    ops, obj = _ops(), _prometheus_pipeline()
    first = reconcile(obj, ops, NOW)
    ops.rate = "Prometheus at http://127.0.0.1:9090 did not answer: refused"
    held = reconcile(obj | {"status": first.status}, ops, NOW)
    assert held.status["phase"] == "Serving"
    assert [s["replicas"] for s in held.status["stages"]] == [
        s["replicas"] for s in first.status["stages"]
    ]
    risk = next(c for c in held.status["conditions"] if c["type"] == "SLOAtRisk")
    assert risk["reason"] == "PrometheusUnreachable"
    assert "holding" in risk["message"]


def test_nodes_going_not_ready_keep_the_running_plan() -> None:
    ops, obj = _ops(), _sample()
    first = reconcile(obj, ops, NOW)
    for n in ops._nodes:  # a starved machine: every kwok node misses its heartbeat
        n["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    later = reconcile(obj | {"status": first.status}, ops, NOW)
    assert later.status["phase"] != "Failed"
    assert later.status["stages"] == first.status["stages"]
    assert later.events == []


P99_QUERY = "histogram_quantile(0.99, sum(rate(pipeline_request_seconds_bucket[1m])) by (le))"


def _observed(obj: dict[str, Any]) -> dict[str, Any]:
    obj["spec"]["slo"]["observedP99Query"] = P99_QUERY
    return obj


def _slo_met(status: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any]
    (found,) = [c for c in status["conditions"] if c["type"] == "SloMet"]
    return found


def test_the_observed_p99_is_read_recorded_and_compared_with_the_slo() -> None:
    ops, obj = _ops(), _observed(_sample())
    ops.answers[P99_QUERY] = 0.1234  # seconds
    out = reconcile(obj, ops, NOW)
    assert (None, P99_QUERY) in ops.asked  # no traffic.prometheus: the operator's default
    assert out.status["observedP99Ms"] == 123.4
    assert out.status["p99History"] == [
        {
            "time": "2030-01-01T00:00:00Z",
            "predictedMs": out.status["predictedP99Ms"],
            "observedMs": 123.4,
        }
    ]
    met = _slo_met(out.status)
    assert (met["status"], met["reason"]) == ("True", "ObservedWithinSlo")
    assert [e[1] for e in out.events] == ["Planned"]
    # the spec's Prometheus address is asked when the traffic names one
    obj["spec"]["traffic"] = {"prometheus": {"query": "rate(x[5s])", "address": "http://p:9090"}}
    reconcile(obj, ops, NOW)
    assert ("http://p:9090", P99_QUERY) in ops.asked


def test_slo_violation_and_recovery_are_each_one_event() -> None:
    from datetime import timedelta

    ops, obj = _ops(), _observed(_sample())
    status: dict[str, Any] = {}
    timeline = [0.1, 0.3, 0.31, 0.32, 0.3, 0.1, 0.1]  # seconds; the SLO is 250 ms
    reasons = []
    for i, seconds in enumerate(timeline):
        ops.answers[P99_QUERY] = seconds
        out = reconcile(obj | {"status": status}, ops, NOW + timedelta(seconds=2 * i))
        reasons += [e[1] for e in out.events if e[1] != "Planned"]
        # as the handler writes it: conditions merged by type
        status = status | out.status
        if i == 1:
            met = _slo_met(out.status)
            assert (met["status"], met["reason"]) == ("False", "ObservedOverSlo")
            assert out.status["phase"] == "Serving"  # the plan is not touched
    assert reasons == ["SloViolated", "SloRecovered"]
    ops.answers[P99_QUERY] = 0.3  # a fresh pipeline over the SLO at once
    violated = next(e for e in reconcile(obj, ops, NOW).events if e[1] == "SloViolated")
    assert violated[0] == "Warning"
    assert "observed P99 300 ms is over the SLO of 250 ms" in violated[2]
    # 7 passes 2 s apart: one slot of the history
    assert len(status["p99History"]) == 1


def test_a_failed_latency_query_says_why_in_the_condition_only() -> None:
    ops, obj = _ops(), _observed(_sample())
    ops.answers[P99_QUERY] = 0.1
    first = reconcile(obj, ops, NOW)
    ops.answers[P99_QUERY] = "Prometheus at http://127.0.0.1:9090 did not answer: refused"
    held = reconcile(obj | {"status": first.status}, ops, NOW)
    met = _slo_met(held.status)
    assert (met["status"], met["reason"]) == ("Unknown", "NoObservation")
    assert "did not answer: refused" in met["message"]
    assert held.status["observedP99Ms"] is None  # removed, not a stale number
    assert held.status["whyWaiting"] is None  # planning is fine
    assert held.status["phase"] == "Serving"
    assert held.status["stages"] == first.status["stages"]
    assert held.events == []
    # the slot's last good reading stays in the history
    assert held.status["p99History"][-1]["observedMs"] == 100.0


def test_without_a_latency_query_nothing_is_asked_and_slo_met_is_unknown() -> None:
    ops, obj = _ops(), _sample()
    out = reconcile(obj, ops, NOW)
    assert ops.asked == []  # trace traffic, no latency query: no Prometheus at all
    met = _slo_met(out.status)
    assert (met["status"], met["reason"]) == ("Unknown", "NoObservation")
    assert out.status["observedP99Ms"] is None
    assert out.status["p99History"] is None


def test_a_pipeline_that_cannot_be_planned_is_not_observed() -> None:
    ops, obj = _ops(), _observed(_sample())
    obj["spec"]["slo"]["p99LatencyMs"] = 20  # infeasible
    out = reconcile(obj, ops, NOW)
    assert out.status["phase"] == "Failed"
    assert ops.asked == []
    assert "observedP99Ms" not in out.status


def _quota(ops: FakeOps, whole: int, shares_milli: int) -> None:
    """One Queue for namespace ns (LocalQueue default): `whole` GPUs of each type, and
    `shares_milli` of T4 in shares."""
    ops.queue_objs = [
        {
            "metadata": {"name": "serving"},
            "spec": {
                "quotas": [
                    {"gpuType": "A100-SXM4-80GB", "gpus": whole},
                    {"gpuType": "T4", "gpus": whole, "shareMilli": shares_milli},
                ]
            },
        }
    ]
    ops.local_queue_objs = [
        {"metadata": {"name": "default", "namespace": "ns"}, "spec": {"queue": "serving"}}
    ]


def test_a_pipeline_over_its_queue_quota_waits_and_builds_nothing() -> None:
    ops, obj = _ops(), _sample()
    # one A100 and T4 shares: room for detect on the A100 and pose on a T4 share, but
    # another pipeline of the queue holds the A100
    _quota(ops, whole=1, shares_milli=500)
    ops.queue_objs[0]["spec"]["quotas"][1]["gpus"] = 0
    ops.pods = [_quota_pod("other", "A100-SXM4-80GB")]
    out = reconcile(obj, ops, NOW)
    assert ops.applied == {}
    assert out.status["phase"] == "Pending"
    assert out.status["whyWaiting"].startswith("waiting for quota: queue serving:")
    assert out.status["quotaHeld"].startswith("queue serving:")
    assert [e[1] for e in out.events] == ["Planned", "QuotaExceeded"]
    # what it asks (detect on the A100, pose on a T4 share), which its Queue's admission
    # cycle reads; and its Queue counts it as a pending workload
    assert out.status["quotaDemand"] == [
        {"gpuType": "A100-SXM4-80GB", "gpus": 1, "shareMilli": 0},
        {"gpuType": "T4", "gpus": 0, "shareMilli": 500},
    ]
    key = f"ns/pipeline:{obj['metadata']['name']}"
    assert [w.workload.key for w in waiting_serving([obj | {"status": out.status}], [])] == [key]
    # the plan is kept: the next reconcile neither re-plans nor repeats the event
    again = reconcile(obj | {"status": out.status}, ops, NOW)
    assert again.events == []
    assert ops.applied == {}
    # the other workload ends: it is built
    ops.pods = []
    built = reconcile(obj | {"status": again.status}, ops, NOW)
    assert built.status["phase"] == "Serving"
    assert set(ops.applied) == {"video-analytics-detect", "video-analytics-pose"}
    assert waiting_serving([obj | {"status": built.status}], []) == []
    assert built.status["quotaDemand"] is None


def _quota_pod(name: str, gpu_type: str) -> dict[str, Any]:
    """A running pod of another pipeline of the same queue holding one whole GPU."""
    return serving_pod(name, gpu_type, namespace="ns", pipeline="other")


def test_a_pipeline_is_planned_only_on_types_its_queue_could_ever_hold() -> None:
    # detect would go on a whole T4; its queue has T4 shares only (pose's), and A100s
    ops, obj = _ops(), _sample()
    _quota(ops, whole=8, shares_milli=8000)
    ops.queue_objs[0]["spec"]["quotas"][1]["gpus"] = 0
    out = reconcile(obj, ops, NOW)
    assert out.status["phase"] == "Serving"
    types = {s["name"]: s["gpuType"] for s in out.status["stages"]}
    assert types == {"detect": "A100-SXM4-80GB", "pose": "T4", "ocr": "A100-SXM4-80GB"}
    assert out.status.get("quotaHeld") is None
    # the recorded plan holds while the quota does; a quota that could never hold any
    # replica of a stage leaves it waiting for quota, with nothing built
    again = reconcile(obj | {"status": out.status}, ops, NOW)
    assert again.events == []
    ops2, obj2 = _ops(), _sample()
    _quota(ops2, whole=0, shares_milli=0)
    held = reconcile(obj2, ops2, NOW)
    assert held.status["phase"] == "Pending"
    assert held.status["quotaHeld"].startswith("queue serving: stage detect has profiles for")
    assert [e[1] for e in held.events] == ["QuotaExceeded"]
    assert ops2.applied == {}
    assert reconcile(obj2 | {"status": held.status}, ops2, NOW).events == []
    _quota(ops2, whole=8, shares_milli=8000)  # kubectl edit queue
    built = reconcile(obj2 | {"status": held.status}, ops2, NOW)
    assert built.status["phase"] == "Serving"
    assert built.status["quotaHeld"] is None


def test_a_pipeline_within_its_queue_quota_is_built_and_its_pods_hold_the_quota() -> None:
    ops, obj = _ops(), _sample()
    _quota(ops, whole=8, shares_milli=8000)
    out = reconcile(obj, ops, NOW)
    assert out.status["phase"] == "Serving"
    assert out.status.get("quotaHeld") is None
    assert set(ops.applied) == {"video-analytics-detect", "video-analytics-pose"}
    # the stages' pods carry their LocalQueue, and hold its queue's quota
    pods = []
    for d in ops.applied.values():
        template = d["spec"]["template"]
        assert template["metadata"]["labels"]["chronotope.dev/queue"] == "default"
        for i in range(d["spec"]["replicas"]):
            meta = {**template["metadata"], "name": f"{d['metadata']['name']}-{i}"}
            pods.append({"metadata": meta | {"namespace": "ns"}, "spec": template["spec"]})
    view = QuotaView.parse(ops.queue_objs, ops.local_queue_objs)
    (held,) = serving_workloads(view, pods)
    assert held.key == "ns/pipeline:video-analytics"
    assert held.queue == "serving"
    assert not held.reclaimable
    assert sum(held.usage.values()) > 0
    # its own pods never count against it: reconciled again with them, nothing changes
    ops.pods = pods
    again = reconcile(obj | {"status": out.status}, ops, NOW)
    assert again.status.get("quotaHeld") is None
    # the platform team shrinks the quota below what runs: it keeps serving; its plan
    # takes no more than it holds, so nothing is held back and nothing is said
    _quota(ops, whole=0, shares_milli=0)
    shrunk = reconcile(obj | {"status": out.status}, ops, NOW)
    assert shrunk.status["phase"] == "Serving"
    assert shrunk.status.get("quotaHeld") is None
    assert shrunk.events == []
    # above a lowered share quota (100 of the 500 milli it holds), the tuner's replica
    # more is held back: it keeps what runs
    _quota(ops, whole=1, shares_milli=100)
    before = {k: d["spec"]["replicas"] for k, d in ops.applied.items()}
    status = copy.deepcopy(out.status)
    for row in status["stages"]:
        if row["name"] == "pose":
            row["replicas"] += 1
    held_back = reconcile(obj | {"status": status}, ops, NOW)
    assert held_back.status["quotaHeld"].startswith("queue serving: T4 shares (milli)")
    assert [e[1] for e in held_back.events] == ["QuotaExceeded"]
    assert {k: d["spec"]["replicas"] for k, d in ops.applied.items()} == before


def test_a_serving_pipeline_grows_as_far_as_its_queue_quota_admits() -> None:
    ops, obj = _ops(), _sample()
    _quota(ops, whole=8, shares_milli=8000)
    out = reconcile(obj, ops, NOW)
    assert [
        ops.applied[f"video-analytics-{s}"]["spec"]["replicas"] for s in ("detect", "pose")
    ] == [
        1,
        1,
    ]
    # the tuner wants 4 detect (whole T4) and 3 pose (half-T4 shares); the queue has room
    # for 2 whole T4s and 1000 milli of shares
    _quota(ops, whole=2, shares_milli=1000)
    status = copy.deepcopy(out.status)
    for row in status["stages"]:
        row["replicas"] = {"detect": 4, "pose": 3}.get(row["name"], row["replicas"])
    grown = reconcile(obj | {"status": status}, ops, NOW)
    assert [
        ops.applied[f"video-analytics-{s}"]["spec"]["replicas"] for s in ("detect", "pose")
    ] == [
        2,
        2,
    ]
    assert grown.status["quotaHeld"].startswith("queue serving:")
    assert [e[1] for e in grown.events] == ["QuotaExceeded"]
    assert grown.events[0][2].startswith("scaling up only as far as its queue's quota admits")


def test_a_serving_pipelines_scale_up_reclaims_its_queues_lent_quota() -> None:
    def scaled(policy: str) -> tuple[FakeOps, Any]:
        ops, obj = _ops(), _sample()
        _quota(ops, whole=8, shares_milli=8000)
        out = reconcile(obj, ops, NOW)
        # the queue's 4 whole T4s and 1500 milli of shares fit the tuner's 4 detect and
        # 3 pose, but a training queue of the cohort borrows 2 of those T4s
        _quota(ops, whole=4, shares_milli=1500)
        training_borrows(ops, policy, "T4", gpus=2)
        status = copy.deepcopy(out.status)
        for row in status["stages"]:
            row["replicas"] = {"detect": 4, "pose": 3}.get(row["name"], row["replicas"])
        return ops, reconcile(obj | {"status": status}, ops, NOW)

    def replicas(ops: FakeOps) -> list[int]:
        return [ops.applied[f"video-analytics-{s}"]["spec"]["replicas"] for s in ("detect", "pose")]

    ops, up = scaled("PreemptBorrowed")
    assert replicas(ops) == [4, 3]  # the whole scale-up: its new pods take the lent quota
    assert up.status.get("quotaHeld") is None
    assert [e[1] for e in up.events] == ["ReclaimingQuota"]
    assert "stopping borrowed TrainingJob(s) t/big" in up.events[0][2]
    # under Never it grows only as far as the quota admits now, as before
    ops, cut = scaled("Never")
    assert replicas(ops) == [2, 3]
    assert [e[1] for e in cut.events] == ["QuotaExceeded"]


def test_the_tuner_reads_the_live_envelope_and_scales_up_on_sustained_traffic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from datetime import timedelta

    from chronotope.controllers.inferencepipeline import TunerSettings
    from chronotope.workloads.pipeline import rate_window_s

    ops, obj = _ops(), _prometheus_pipeline()
    by_window: dict[float, float] = {}  # queries/s Prometheus answers per window; else 150
    asked: list[str] = []

    def answer(address: str | None, q: str) -> float | str:
        asked.append(q)
        return by_window.get(rate_window_s(q), 150.0)

    monkeypatch.setattr(ops, "query_rate", answer)
    settings = TunerSettings(down_delay_s=30)
    first = reconcile(obj, ops, NOW, settings)
    rows = first.status["tuner"]["scalingTable"]
    # the rows keep the longer windows of their samples' envelopes (the 60 s sample: 10, 20 s)
    assert [p["windowSeconds"] for p in rows[3]["envelope"]] == [10.0, 20.0]
    # the query over 5 s (its own), 10, 20, 40 and 60 s, now and at most over the delay
    assert "rate(requests_total[20s])" in asked
    assert "max_over_time((rate(requests_total[60s]))[30s:])" in asked
    assert len(asked) == 1 + 10  # (the first: the rate the plan is made for)
    observed = first.status["tuner"]["observedEnvelope"]
    assert [p["windowSeconds"] for p in observed] == [5.0, 10.0, 20.0, 40.0, 60.0]
    assert [p["maxQueries"] for p in observed] == [750, 1500, 3000, 6000, 9000]
    base = [s["replicas"] for s in first.status["stages"]]

    def step(status: dict[str, Any], seconds: float) -> Any:
        return reconcile(obj | {"status": status}, ops, NOW + timedelta(seconds=seconds), settings)

    # the 5 s rate stays at the plan's, but 165 queries/s has held for 20 s: more than the
    # busiest 10 and 20 s of the sample the planned row was sized on
    planned_row = next(r for r in rows if r["rateQPS"] >= 150.0)
    assert all(p["rateQPS"] < 165.0 for p in planned_row["envelope"])
    by_window.update({10.0: 165.0, 20.0: 165.0})
    up = step(first.status, 2)
    assert up.status["tuner"]["mode"] == "ScalingUp"
    assert up.status["stages"][0]["replicas"] > base[0]
    # on the 5 s rate alone the planned row would have held
    by_window.clear()
    assert step(first.status, 2).status["stages"][0]["replicas"] == base[0]
    # one window Prometheus cannot answer: the tuner holds what runs and says so
    monkeypatch.setattr(
        ops,
        "query_rate",
        lambda address, q: "Prometheus did not answer" if "[40s]" in q else 40.0,
    )
    held = step(up.status, 4)
    assert [s["replicas"] for s in held.status["stages"]] == [
        s["replicas"] for s in up.status["stages"]
    ]
    risk = next(c for c in held.status["conditions"] if c["type"] == "SLOAtRisk")
    assert risk["reason"] == "PrometheusUnreachable"


def _other_namespace_pod(gpu_type: str) -> dict[str, Any]:
    """A pod of a pipeline in namespace `other`, whose LocalQueue admits into the same Queue."""
    pod = _quota_pod("theirs-0", gpu_type)
    pod["metadata"]["namespace"] = "other"
    return pod


def _share_queue_with_other(ops: FakeOps) -> None:
    ops.local_queue_objs.append(
        {"metadata": {"name": "default", "namespace": "other"}, "spec": {"queue": "serving"}}
    )


def test_a_plan_over_what_its_queue_admits_now_is_cut_to_fit_and_goes_back_once_it_may() -> None:
    # the queue has one whole T4 (detect's) and shares for pose; a pipeline of another
    # namespace in the same Queue holds that T4: detect is planned on an A100 instead
    ops, obj = _ops(), _sample()
    _quota(ops, whole=1, shares_milli=8000)
    ops.queue_objs[0]["spec"]["quotas"][0]["gpus"] = 8
    _share_queue_with_other(ops)
    free = reconcile(obj, _fresh_copy(ops), NOW)  # the plan without the other pipeline
    assert {s["name"]: s["gpuType"] for s in free.status["stages"]}["detect"] == "T4"
    ops.pods = [_other_namespace_pod("T4")]
    out = reconcile(obj, ops, NOW)
    types = {s["name"]: s["gpuType"] for s in out.status["stages"]}
    assert types["detect"] == "A100-SXM4-80GB"
    assert out.status["phase"] == "Serving"
    assert out.status.get("quotaHeld") is None
    planned = next(c for c in out.status["conditions"] if c["type"] == "Planned")
    assert planned["reason"] == "WithinQueueQuota"
    assert "cut to fit what its queue's quota admits now" in out.events[0][2]
    room = {r["gpuType"]: r for r in out.status["quotaRoom"]}
    assert room["T4"]["gpus"] == 0  # the other namespace's pod holds the queue's T4
    assert room["A100-SXM4-80GB"]["gpus"] == 8
    assert ops.applied["video-analytics-detect"]["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "A100-SXM4-80GB"
    }
    # nothing changes: the recorded cut plan stands, nothing is said
    again = reconcile(obj | {"status": out.status}, ops, NOW)
    assert again.events == []
    assert again.status["quotaRoom"] == out.status["quotaRoom"]
    # the other pipeline ends: the queue admits the T4 again, and detect goes back to it
    ops.pods = []
    back = reconcile(obj | {"status": again.status}, ops, NOW)
    assert {s["name"]: s["gpuType"] for s in back.status["stages"]}["detect"] == "T4"
    assert [e[1] for e in back.events] == ["Replanned"]
    assert back.events[0][2].startswith("its queue's quota admits more now:")
    assert back.status["quotaRoom"] is None
    planned = next(c for c in back.status["conditions"] if c["type"] == "Planned")
    assert planned["reason"] == "Planned"


def _fresh_copy(ops: FakeOps) -> FakeOps:
    twin = _ops()
    twin.queue_objs = copy.deepcopy(ops.queue_objs)
    twin.local_queue_objs = copy.deepcopy(ops.local_queue_objs)
    return twin


def test_another_namespaces_serving_pods_count_against_the_shared_queue() -> None:
    # the queue's only A100 and no T4: detect could go on the A100 alone, but a pipeline of
    # another namespace in the same Queue holds it
    ops, obj = _ops(), _sample()
    _quota(ops, whole=1, shares_milli=8000)
    ops.queue_objs[0]["spec"]["quotas"][1]["gpus"] = 0
    _share_queue_with_other(ops)
    ops.pods = [_other_namespace_pod("A100-SXM4-80GB")]
    out = reconcile(obj, ops, NOW)
    assert ops.applied == {}
    assert out.status["phase"] == "Pending"
    assert out.status["quotaHeld"].startswith("queue serving:")


def test_a_pipeline_waiting_for_quota_takes_a_cut_plan_once_its_queue_admits_one() -> None:
    ops, obj = _ops(), _sample()
    _quota(ops, whole=1, shares_milli=8000)
    ops.queue_objs[0]["spec"]["quotas"][0]["gpus"] = 1
    _share_queue_with_other(ops)
    theirs = _other_namespace_pod("A100-SXM4-80GB")
    ops.pods = [
        _other_namespace_pod("T4"),
        theirs | {"metadata": theirs["metadata"] | {"name": "a"}},
    ]
    out = reconcile(obj, ops, NOW)  # neither the T4 nor the A100 is free: it waits
    assert ops.applied == {}
    assert out.status["phase"] == "Pending"
    assert out.status["quotaRoom"] is not None
    again = reconcile(obj | {"status": out.status}, ops, NOW)
    assert again.events == []  # the same room: no new plan, nothing said
    # the A100 frees up, the T4 does not: detect is planned on the A100 and built
    ops.pods = ops.pods[:1]
    built = reconcile(obj | {"status": again.status}, ops, NOW)
    assert {s["name"]: s["gpuType"] for s in built.status["stages"]}["detect"] == ("A100-SXM4-80GB")
    assert [e[1] for e in built.events] == ["Replanned"]
    assert built.status["phase"] == "Serving"
    assert "video-analytics-detect" in ops.applied


def _lent_to_training(ops: FakeOps, policy: str) -> None:
    """The pipeline's queue has one A100 (detect's only type), lent to a training queue."""
    _quota(ops, whole=1, shares_milli=8000)
    ops.queue_objs[0]["spec"]["quotas"][1]["gpus"] = 0
    training_borrows(ops, policy, "A100-SXM4-80GB")


def test_a_waiting_pipeline_reclaims_its_queues_lent_quota_from_training() -> None:
    # under reclaim policy Never it waits for the borrower to finish, as before
    ops, obj = _ops(), _sample()
    _lent_to_training(ops, "Never")
    held = reconcile(obj, ops, NOW)
    assert ops.applied == {}
    assert held.status["phase"] == "Pending"
    assert "reclaim policy Never waits" in held.status["quotaHeld"]
    # under PreemptBorrowed its Deployments are applied (their pods reserve the quota; the
    # queue loop stops the borrower) and it says whom it reclaims from
    ops, obj = _ops(), _sample()
    _lent_to_training(ops, "PreemptBorrowed")
    out = reconcile(obj, ops, NOW)
    assert set(ops.applied) == {"video-analytics-detect", "video-analytics-pose"}
    assert out.status.get("quotaHeld") is None
    reclaiming = [e[2] for e in out.events if e[1] == "ReclaimingQuota"]
    assert reclaiming == [
        "queue serving reclaims the quota it lent: stopping borrowed TrainingJob(s) t/big "
        "(checkpointed within the queue's grace period); its pods start once they have stopped"
    ]
    # its Deployments ask for what it reclaimed; before their pods exist nothing is said again
    gap = reconcile(obj | {"status": out.status}, ops, NOW)
    assert gap.events == []
    assert gap.status.get("quotaHeld") is None
    # its pods (not yet on a node) hold the quota now: nothing more is reclaimed or said
    ops.pods = [
        {
            "metadata": d["spec"]["template"]["metadata"] | {"name": f"p{i}", "namespace": "ns"},
            "spec": d["spec"]["template"]["spec"],
            "status": {"phase": "Pending"},
        }
        for d in ops.applied.values()
        for i in range(d["spec"]["replicas"])
    ]
    again = reconcile(obj | {"status": out.status}, ops, NOW)
    assert [e for e in again.events if e[1] == "ReclaimingQuota"] == []
    assert again.status.get("quotaHeld") is None


def _bound(pod: dict[str, Any], node: str) -> dict[str, Any]:
    pod["spec"]["nodeName"] = node
    return pod


def test_a_pipeline_with_no_queue_is_planned_on_the_gpus_free_now() -> None:
    # another workload holds the only T4: before, detect was planned on it anyway (the
    # cheapest plan) and its pod stayed Pending while the A100s idled
    ops, obj = _ops(), _sample()
    ops.pods = [_bound(serving_pod("theirs-0", "T4", namespace="other", pipeline="x"), "t4-0")]
    out = reconcile(obj, ops, NOW)
    types = {s["name"]: s["gpuType"] for s in out.status["stages"]}
    assert types["detect"] == "A100-SXM4-80GB"
    assert out.status["predictedP99Ms"] <= 250
    planned = next(c for c in out.status["conditions"] if c["type"] == "Planned")
    assert planned["reason"] == "WithinFreeGpus"
    assert "moved to the GPUs free now" in out.events[0][2]
    assert out.status.get("quotaRoom") is None
    # the recorded plan stands (it says so again, and nothing is announced)
    again = reconcile(obj | {"status": out.status}, ops, NOW)
    assert again.events == []
    assert next(c for c in again.status["conditions"] if c["type"] == "Planned")["reason"] == (
        "WithinFreeGpus"
    )
    # the pipeline's own pod on the T4 leaves it free for the pipeline: the cheapest plan
    ops.pods = [
        _bound(serving_pod("mine-0", "T4", namespace="ns", pipeline="video-analytics"), "t4-0")
    ]
    own = reconcile(obj, ops, NOW)
    assert {s["name"]: s["gpuType"] for s in own.status["stages"]}["detect"] == "T4"
    planned = next(c for c in own.status["conditions"] if c["type"] == "Planned")
    assert planned["reason"] == "Planned"


def _unplaced(name: str, since: datetime, said: str) -> dict[str, Any]:
    pod = serving_pod(name, "T4", namespace="ns", pipeline="video-analytics")
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": said,
                "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        ],
    }
    return pod


def test_a_pipeline_whose_pods_wait_in_vain_is_planned_again_on_the_free_gpus() -> None:
    # planned on the free T4; another workload took it before detect's pod was bound:
    # before, the pod stayed Pending for good while the A100s idled
    ops, obj = _ops(), _sample()
    obj["metadata"]["uid"] = "u-stuck"
    planned = reconcile(obj, ops, NOW)
    assert {s["name"]: s["gpuType"] for s in planned.status["stages"]}["detect"] == "T4"
    obj = obj | {"status": planned.status}
    said = "0/2 nodes are available: 1 Insufficient nvidia.com/gpu."
    theirs = _bound(serving_pod("theirs-0", "T4", namespace="other", pipeline="x"), "t4-0")
    ops.pods = [theirs, _unplaced("detect-0", NOW - timedelta(seconds=30), said)]
    soon = reconcile(obj, ops, NOW)  # 30 s: not yet
    assert soon.events == []
    assert {s["name"]: s["gpuType"] for s in soon.status["stages"]}["detect"] == "T4"
    ops.pods = [theirs, _unplaced("detect-0", NOW - timedelta(seconds=60), said)]
    late = reconcile(obj, ops, NOW)
    assert {s["name"]: s["gpuType"] for s in late.status["stages"]}["detect"] == "A100-SXM4-80GB"
    assert [e[1] for e in late.events] == ["Replanned"]
    assert late.events[0][2].startswith(
        f"its pods could not be placed for 45s (kube-scheduler: {said}): detect: "
    )
    planned_cond = next(c for c in late.status["conditions"] if c["type"] == "Planned")
    assert planned_cond["reason"] == "WithinFreeGpus"
    # the same free GPUs again (say the status write was lost): not planned again
    again = reconcile(obj, ops, NOW)
    assert again.events == []
    # its GPU is free after all (the other workload ended): kube-scheduler waits for
    # something else, and the plan stands
    ops.pods = [_unplaced("detect-0", NOW - timedelta(seconds=60), said)]
    obj["metadata"]["uid"] = "u-stuck-2"
    assert reconcile(obj, ops, NOW).events == []


def test_a_plan_moved_to_the_free_gpus_goes_back_once_its_cheapest_plan_fits() -> None:
    ops, obj = _ops(), _sample()
    obj["metadata"]["uid"] = "u-back"
    theirs = _bound(serving_pod("theirs-0", "T4", namespace="other", pipeline="x"), "t4-0")
    ops.pods = [theirs]
    moved = reconcile(obj, ops, NOW)
    assert {s["name"]: s["gpuType"] for s in moved.status["stages"]}["detect"] == "A100-SXM4-80GB"
    obj = obj | {"status": moved.status}
    ops.pods = []  # the other workload ends: the T4 is free
    soon = reconcile(obj, ops, NOW + timedelta(seconds=30))  # looked at planning time: not yet
    assert soon.events == []
    back = reconcile(obj, ops, NOW + timedelta(seconds=61))
    assert {s["name"]: s["gpuType"] for s in back.status["stages"]}["detect"] == "T4"
    assert [e[1] for e in back.events] == ["Replanned"]
    assert back.events[0][2].startswith("the GPUs of its cheapest plan are free again: detect: ")
    planned = next(c for c in back.status["conditions"] if c["type"] == "Planned")
    assert planned["reason"] == "Planned"
    # still held: it stays where it is, and the same free GPUs are not planned on twice
    ops.pods = [theirs]
    obj["metadata"]["uid"] = "u-back-2"
    held = reconcile(obj, ops, NOW + timedelta(seconds=200))
    assert held.events == []
    assert {s["name"]: s["gpuType"] for s in held.status["stages"]}["detect"] == "A100-SXM4-80GB"


def test_a_stage_short_of_replicas_says_kube_schedulers_reason() -> None:
    ops, obj = _ops(), _sample()
    out = reconcile(obj, ops, NOW)
    assert out.status["whyWaiting"] is None  # the fake's Deployments are ready at once
    said = "0/2 nodes are available: 1 Insufficient nvidia.com/gpu."
    ops.pods = [_unplaced("detect-0", NOW, said)]
    applied = ops.apply

    def detect_not_ready(deployment: dict[str, Any], service: dict[str, Any]) -> None:
        applied(deployment, service)
        if deployment["metadata"]["name"] == "video-analytics-detect":
            ops.applied["video-analytics-detect"]["status"] = {"readyReplicas": 0}

    ops.apply = detect_not_ready  # type: ignore[method-assign]
    short = reconcile(obj | {"status": out.status}, ops, NOW)
    why = short.status["whyWaiting"]
    assert why.startswith("waiting for replicas: detect 0/1 on T4")
    assert why.endswith(f"(kube-scheduler: {said})")
    ready = next(c for c in short.status["conditions"] if c["type"] == "Ready")
    assert ready["message"] == why


def test_a_pipeline_in_a_queue_is_planned_on_the_gpus_free_now_within_its_quota() -> None:
    # its queue admits the T4 (no one in the queue holds it), but a workload outside
    # the queue runs on it: before stop 56 detect was planned on the T4 anyway and its
    # pod stayed Pending while the queue's A100 quota idled
    ops, obj = _ops(), _sample()
    obj["metadata"]["uid"] = "u-queued-free"
    _quota(ops, whole=8, shares_milli=8000)
    theirs = _bound(serving_pod("theirs-0", "T4", namespace="other", pipeline="x"), "t4-0")
    ops.pods = [theirs]
    out = reconcile(obj, ops, NOW)
    assert {s["name"]: s["gpuType"] for s in out.status["stages"]}["detect"] == "A100-SXM4-80GB"
    planned = next(c for c in out.status["conditions"] if c["type"] == "Planned")
    assert planned["reason"] == "WithinFreeGpus"
    assert out.status.get("quotaHeld") is None
    # the T4 frees up: it goes back to its cheapest plan within the quota
    ops.pods = []
    back = reconcile(obj | {"status": out.status}, ops, NOW + timedelta(seconds=61))
    assert {s["name"]: s["gpuType"] for s in back.status["stages"]}["detect"] == "T4"
    assert [e[1] for e in back.events] == ["Replanned"]
    # the queue admits no whole A100: nothing it admits is free, so the plan is the T4,
    # as before, and its pod waits for it
    ops2, obj2 = _ops(), _sample()
    _quota(ops2, whole=8, shares_milli=8000)
    ops2.queue_objs[0]["spec"]["quotas"][0]["gpus"] = 0
    ops2.pods = [theirs]
    waits = reconcile(obj2, ops2, NOW)
    assert {s["name"]: s["gpuType"] for s in waits.status["stages"]}["detect"] == "T4"
    assert next(c for c in waits.status["conditions"] if c["type"] == "Planned")["reason"] == (
        "Planned"
    )


def test_a_moved_plan_takes_a_cheaper_type_that_frees_up_before_the_cheapest() -> None:
    # three types, X cheapest, Z dearest; other work holds X's and Y's only GPUs: the
    # pipeline serves on Z. Y frees up, X stays held: before, the plan stayed on Z
    # until X freed (it went back only to the cheapest plan); now it takes Y
    ops = FakeOps([_node("x-0", "X", 1), _node("y-0", "Y", 1), _node("z-0", "Z", 1)])
    batches = [{"batchSize": 1, "latencyMs": 10, "throughputQPS": 100}]
    obj: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-cheaper", "generation": 1},
        "spec": {
            "stages": [
                {
                    "name": "s",
                    "model": {"image": "registry.example/m:1"},
                    "profiles": [{"gpuType": t, "batches": batches} for t in "XYZ"],
                }
            ],
            "slo": {"p99LatencyMs": 100},
            "traffic": {"fixedQPS": 50},
            "costs": [{"gpuType": t, "perHour": k + 1.0} for k, t in enumerate("XYZ")],
        },
    }
    on_x = _bound(serving_pod("x-holder", "X", namespace="other", pipeline="a"), "x-0")
    on_y = _bound(serving_pod("y-holder", "Y", namespace="other", pipeline="b"), "y-0")
    ops.pods = [on_x, on_y]
    moved = reconcile(obj, ops, NOW)
    assert moved.status["stages"][0]["gpuType"] == "Z"
    obj = obj | {"status": moved.status}
    ops.pods = [on_x]
    cheaper = reconcile(obj, ops, NOW + timedelta(seconds=61))
    assert cheaper.status["stages"][0]["gpuType"] == "Y"
    assert [e[1] for e in cheaper.events] == ["Replanned"]
    assert cheaper.events[0][2].startswith("a cheaper plan fits the GPUs free now: s: 1x Y")
    planned = next(c for c in cheaper.status["conditions"] if c["type"] == "Planned")
    assert planned["reason"] == "WithinFreeGpus"
    # then X frees up: back to the cheapest plan
    ops.pods = []
    back = reconcile(obj | {"status": cheaper.status}, ops, NOW + timedelta(seconds=122))
    assert back.status["stages"][0]["gpuType"] == "X"
    assert back.events[0][2].startswith("the GPUs of its cheapest plan are free again")


def test_a_share_stage_is_planned_on_a_type_with_room_for_its_share() -> None:
    # pose (a 50 % T4 share) may also run on an A100 share; another workload holds the
    # only T4: before, pose's share was not counted and stayed planned on the full T4
    ops, obj = _ops(), _sample()
    for n in ops.nodes():  # a share asks GPU memory: the nodes say theirs (GPU feature discovery)
        n["metadata"]["labels"]["nvidia.com/gpu.memory"] = "15360"
    pose = obj["spec"]["stages"][1]
    pose["profiles"].append({**pose["profiles"][0], "gpuType": "A100-SXM4-80GB"})
    ops.pods = [_bound(serving_pod("theirs-0", "T4", namespace="other", pipeline="x"), "t4-0")]
    out = reconcile(obj, ops, NOW)
    types = {s["name"]: s["gpuType"] for s in out.status["stages"]}
    assert types == {"detect": "A100-SXM4-80GB", "pose": "A100-SXM4-80GB", "ocr": "A100-SXM4-80GB"}
    planned = next(c for c in out.status["conditions"] if c["type"] == "Planned")
    assert planned["reason"] == "WithinFreeGpus"
    # with the T4 free, detect takes it whole: pose's share has no room left on the one
    # T4 and goes on an A100 (before, both were planned on the T4 and pose waited)
    ops.pods = []
    free = reconcile(obj, ops, NOW)
    types = {s["name"]: s["gpuType"] for s in free.status["stages"]}
    assert (types["detect"], types["pose"]) == ("T4", "A100-SXM4-80GB")
    # a T4 node with a second GPU: both on the T4s (the cheapest plan)
    ops.nodes().append(_node("t4-1", "T4", 1))
    ops.nodes()[-1]["metadata"]["labels"]["nvidia.com/gpu.memory"] = "15360"
    both = reconcile(obj, ops, NOW)
    types = {s["name"]: s["gpuType"] for s in both.status["stages"]}
    assert (types["detect"], types["pose"]) == ("T4", "T4")
