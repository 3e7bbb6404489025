"""The TrainingJob start gates, each on its own, and the order they run in."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.sharing.labels import GENERATION_ANNOTATION
from chronotope.workloads.capacity import Capacity, NodeCapacity, cluster_capacity
from chronotope.workloads.gang import GENERATION_LABEL, JOB_LABEL
from chronotope.workloads.gates import (
    Cycle,
    Decider,
    FleetGate,
    JointGate,
    frees_at,
    preempt,
    run_gates,
)
from chronotope.workloads.training import Action, Decision

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
H100 = [NodeCapacity("h100-0", "H100", 8, 8, True, memory_mib=81920)]


def job(
    name: str,
    *,
    queue: str = "default",
    workers: int = 1,
    seconds: int = 3600,
    created: str = "2030-01-01T00:00:00Z",
    phase: str = "Waiting",
    **spec_over: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": workers,
        "gpu": {"count": 8},
        "queue": queue,
        "gpuTypes": [{"name": "H100", "relativeSpeed": 1.0}],
        "estimate": {"referenceGpuType": "H100", "durationSeconds": seconds},
        "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
    }
    return {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
        "spec": spec | spec_over,
        "status": {"phase": phase},
    }


def no_profile(_ns: str, name: str) -> str:
    return f"model profile {name} not found"


def no_pods(_ns: str | None = None, _selector: str | None = None) -> list[dict[str, Any]]:
    return []


def cycle(
    me: dict[str, Any],
    others: list[dict[str, Any]],
    capacity: Capacity | None = None,
    **over: Any,
) -> Cycle:
    return Cycle(
        job=me,
        spec=TrainingJobSpec.model_validate(me["spec"]),
        now=NOW,
        capacity=H100 if capacity is None else capacity,
        jobs=[me, *others],
        decider=Decider(no_profile, no_pods),
        **over,
    )


def start_of(c: Cycle) -> Decision:
    d = c.decider.decide(c.namespace, c.spec, c.capacity, NOW)
    assert d.action is Action.START
    return d


# --------------------------------------------------------------------- Decider
def test_a_decider_decides_a_job_once_per_capacity() -> None:
    spec = TrainingJobSpec.model_validate(job("a")["spec"])
    decider = Decider(no_profile, no_pods)
    cap = list(H100)
    a = decider.decide("ns", spec, cap, NOW)
    assert decider.decide("ns", spec, cap, NOW) is a
    # another capacity (even with equal content), another amount of work left,
    # another namespace or spec: decided afresh
    assert decider.decide("ns", spec, list(H100), NOW) is not a
    assert decider.decide("ns", spec, cap, NOW, remaining=0.5) is not a
    assert decider.decide("other", spec, cap, NOW) is not a
    assert decider.decide("ns", spec.model_copy(update={"replicas": 2}), cap, NOW) is not a
    # a new decider (a new cycle) remembers nothing
    again = Decider(no_profile, no_pods).decide("ns", spec, cap, NOW)
    assert again == a
    assert again is not a


def test_a_missing_profile_makes_the_job_impossible_with_its_cause() -> None:
    spec = TrainingJobSpec.model_validate(job("a", parallelism={"modelProfile": "opt-350"})["spec"])
    d = Decider(no_profile, no_pods).decide("ns", spec, H100, NOW)
    assert d.action is Action.IMPOSSIBLE
    assert d.cause == "ProfileMissing"
    assert "opt-350" in d.reason


# --------------------------------------------------------------------- FleetGate
def test_fleet_gate_gives_the_gpus_to_the_shorter_job_of_equal_priority() -> None:
    short = job("short", queue="b", seconds=600, created="2030-01-01T01:00:00Z")
    c = cycle(job("long", seconds=36000), [short])
    d = FleetGate()(c, start_of(c))
    assert d.action is Action.WAIT
    assert "gives the GPUs now to ns/short" in d.reason
    # the other way round, the short job starts
    c = cycle(short, [job("long", seconds=36000)])
    d = start_of(c)
    assert FleetGate()(c, d).action is Action.START


def test_fleet_gate_passes_a_job_with_no_equal_priority_rival() -> None:
    rival = job("vip", queue="b", seconds=600, priority=10)
    c = cycle(job("me"), [rival])
    d = start_of(c)
    assert FleetGate()(c, d) is d


# --------------------------------------------------------------------- JointGate
def test_joint_gate_gives_the_only_gpus_to_the_more_valuable_head_of_another_queue() -> None:
    high = job("high", queue="b", utility={"function": "Constant", "value": 5})
    c = cycle(job("low"), [high])
    d = JointGate()(c, start_of(c))
    assert d.action is Action.WAIT
    assert "gives the GPUs to ns/high" in d.reason


def test_joint_gate_puts_the_plans_nodes_and_gpus_on_the_start() -> None:
    two = [*H100, NodeCapacity("h100-1", "H100", 8, 8, True, memory_mib=81920)]
    c = cycle(job("a"), [job("b", queue="b")], capacity=two)
    d = JointGate()(c, start_of(c))
    assert d.action is Action.START
    ((node, gpus),) = d.placements
    assert node in {"h100-0", "h100-1"}
    assert gpus == tuple(range(8))


# --------------------------------------------------------------------- run_gates
class _Hold:
    name: ClassVar[str] = "hold"
    advisory: ClassVar[bool] = False
    calls = 0

    def __call__(self, cycle: Cycle, decision: Decision) -> Decision:
        type(self).calls += 1
        return Decision(Action.WAIT, "held")


class _Broken:
    name: ClassVar[str] = "broken"
    advisory: ClassVar[bool] = True

    def __call__(self, cycle: Cycle, decision: Decision) -> Decision:
        raise RuntimeError("boom")


class _Required(_Broken):
    advisory: ClassVar[bool] = False


def test_gates_run_in_order_until_one_holds_the_start() -> None:
    c = cycle(job("me"), [])
    start = start_of(c)
    _Hold.calls = 0
    out = run_gates([_Broken(), _Hold(), _Hold()], c, start)
    assert out.reason == "held"
    assert _Hold.calls == 1


def test_a_failing_required_gate_raises() -> None:
    c = cycle(job("me"), [])
    with pytest.raises(RuntimeError, match="boom"):
        run_gates([_Required()], c, start_of(c))


# --------------------------------------------------------------------- preempt
def _node(name: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "H100"}},
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _worker(job_name: str, node: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{job_name}-g0-0",
            "namespace": "ns",
            "labels": {JOB_LABEL: job_name},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


@pytest.mark.parametrize(
    ("victim_over", "victims"),
    [
        pytest.param({"preemptible": True}, ("ns/low",), id="preemptible-lower-priority"),
        pytest.param({"preemptible": False}, None, id="not-preemptible"),
        pytest.param({"preemptible": True, "priority": 10}, None, id="same-priority"),
    ],
)
def test_preempt_stops_only_lower_priority_preemptible_jobs(
    victim_over: dict[str, Any], victims: tuple[str, ...] | None
) -> None:
    nodes, pods = [_node("h100-0", 8)], [_worker("low", "h100-0", 8)]
    low = job("low", phase="Running", **victim_over)
    low["status"]["plan"] = {"gpuType": "H100", "totalGpus": 8}
    me = job("me", priority=10)
    c = cycle(me, [low], capacity=cluster_capacity(nodes, pods), nodes=nodes, pods=pods)
    waiting = c.decider.decide("ns", c.spec, c.capacity, NOW)
    assert waiting.action is Action.WAIT
    out = preempt(c, waiting)
    if victims is None:
        assert out is None
    else:
        assert out is not None
        assert out.victims == victims
        assert out.decision.action is Action.START


def test_frees_at_is_the_earliest_predicted_finish_per_type() -> None:
    def running(name: str, finish: str) -> dict[str, Any]:
        j = job(name, phase="Running")
        j["status"]["plan"] = {"gpuType": "H100", "predictedCompletionTime": finish}
        return j

    jobs = [running("a", "2030-01-01T15:00:00Z"), running("b", "2030-01-01T13:00:00Z")]
    assert frees_at(jobs, "ns/me") == {"H100": datetime(2030, 1, 1, 13, 0, tzinfo=UTC)}
    assert frees_at(jobs, "ns/b") == {"H100": datetime(2030, 1, 1, 15, 0, tzinfo=UTC)}


def test_has_gang_reads_the_pods_once_a_cycle_and_counts_live_workers_of_the_current_gang() -> None:
    def worker(ns: str, job: str, gen: str, deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": f"{job}-g{gen}-0",
            "namespace": ns,
            "labels": {JOB_LABEL: job, GENERATION_LABEL: gen},
        }
        if deleting:
            meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
        return {"metadata": meta}

    pods = [worker("a", "old", "0"), worker("a", "now", "1"), worker("a", "gone", "0", True)]
    reads: list[tuple[str | None, str | None]] = []

    def read(ns: str | None = None, selector: str | None = None) -> list[dict[str, Any]]:
        reads.append((ns, selector))
        return pods

    def job(ns: str, name: str, gen: str) -> dict[str, Any]:
        return {
            "metadata": {"namespace": ns, "name": name, "annotations": {GENERATION_ANNOTATION: gen}}
        }

    d = Decider(no_profile, read)
    assert d.has_gang(job("a", "now", "1"))
    assert not d.has_gang(job("a", "old", "1"))  # its workers are of an older generation
    assert not d.has_gang(job("a", "gone", "0"))  # being deleted
    assert not d.has_gang(job("b", "now", "1"))  # another namespace's job of that name
    assert d.has_gang(job("a", "old", "0"))
    assert reads == [(None, None)]
