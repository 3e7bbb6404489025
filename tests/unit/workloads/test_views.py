"""`kubectl chronotope` views from plain objects: GPU map, why, Gantt, use."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from chronotope.sharing.assignment import GpuAssignment, gpu_uuid, new_handshake
from chronotope.workloads.views import explain, gantt, gpu_map, gpu_totals, usage

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def node(name: str, product: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product, "zone": "a"}},
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpus), "cpu": "32", "memory": "128Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(
    name: str, node_name: str, *, gpus: int = 0, assigned: str = "", pct: str = ""
) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if assigned:
        indices = tuple(int(g) for g in assigned.split(","))
        annotations = GpuAssignment(
            node=node_name,
            gpu_indices=indices,
            gpu_uuids=tuple(gpu_uuid(node_name, g) for g in indices),
            memory_mib=1024 if pct else None,
            compute_percent=int(pct) if pct else None,
            handshake=new_handshake(),
        ).to_annotations()
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {"chronotope.dev/gpu-share": "1"}
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
        "spec": {
            # only the chronotope scheduler's pods have their assignment read
            "schedulerName": "chronotope" if assigned else "default-scheduler",
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Running"},
    }


def test_the_gpu_map_names_holders_and_shares() -> None:
    nodes = [node("a", "A100", 2), node("t", "T4", 1), node("cpu", "", 0)]
    pods = [
        pod("whole", "a", gpus=1, assigned="1"),
        pod("half", "t", assigned="0", pct="50"),
        pod("quarter", "t", assigned="0", pct="25"),
        pod("other-scheduler", "a", gpus=1),  # no assignment: a whole GPU by count
    ]
    rows = {r.node: r for r in gpu_map(nodes, pods)}
    assert set(rows) == {"a", "t"}  # CPU-only nodes are not on the map
    assert [c.text() for c in rows["a"].gpus] == ["ns/other-scheduler", "ns/whole"]
    assert rows["t"].gpus[0].text() == "ns/half(50%)+ns/quarter(25%)"
    assert gpu_totals(list(rows.values())) == {
        "A100": {"free": 0, "shared": 0, "whole": 2},
        "T4": {"free": 0, "shared": 1, "whole": 0},
    }
    assert [r.node for r in gpu_map(nodes, pods, gpu_type="T4")] == ["t"]
    assert gpu_map(nodes, pods, labels={"zone": "b"}) == []


def test_why_joins_status_conditions_events_and_a_hint() -> None:
    job = {
        "metadata": {"name": "<b>big</b>", "namespace": "ns"},
        "spec": {"replicas": 2, "gpu": {"count": 8}, "gpuTypes": [{"name": "A100"}]},
        "status": {
            "phase": "Waiting",
            "whyWaiting": "queued behind ns/first",
            "conditions": [
                {
                    "type": "Schedulable",
                    "status": "True",
                    "reason": "WaitingForGPUs",
                    "message": "m",
                }
            ],
        },
    }
    events = [
        {
            "type": "Normal",
            "reason": "Waiting",
            "message": "queued behind ns/first",
            "lastTimestamp": "t",
        }
    ]
    lines = explain("TrainingJob", job, events, free_by_type={"A100": 3})
    assert lines[0] == "TrainingJob ns/<b>big</b>"  # plain text: markup stays text
    assert "why: queued behind ns/first" in lines
    assert any(line.startswith("event Normal Waiting") for line in lines)
    assert lines[-1].startswith("unblock: it needs 16 GPU(s) of one of its types (A100: 3 free)")
    assert not any(line.startswith("avoiding") for line in lines)
    avoiding = {**job, "status": {"avoidNodes": ["a100-0", "a100-1"]}}
    assert "avoiding node(s) a100-0, a100-1: its gang waited there unbound" in "\n".join(
        explain("TrainingJob", avoiding, events)
    )


def test_why_a_model_variant_and_a_stage_served_by_its_group() -> None:
    variant = {
        "metadata": {"namespace": "ns", "name": "chat"},
        "status": {
            "phase": "Swapped",
            "residency": "Host",
            "expectedSwapLatencyMs": 31.5,
            "servingReplica": "llama-0",
            "node": "l4-0",
            "gpuType": "L4",
            "whyWaiting": "in host memory",
        },
    }
    lines = explain("ModelVariant", variant, [])
    assert "delta in Host (swap-in 31.5 ms), served by llama-0 on l4-0 (L4)" in lines
    pipeline = {
        "metadata": {"namespace": "ns", "name": "p"},
        "status": {
            "phase": "Serving",
            "stages": [
                {
                    "name": "ocr",
                    "gpuType": "A100",
                    "batchSize": 8,
                    "replicas": 3,
                    "readyReplicas": 3,
                    "servedBy": "llama",
                },
            ],
        },
    }
    assert "stage ocr: 3/3 ready on A100 (batch 8), served by serving group llama" in explain(
        "InferencePipeline", pipeline, []
    )


def test_the_gantt_marks_now_and_deadlines_by_gpu_type() -> None:
    def job(
        name: str, gpu: str | None, start_h: float, end_h: float, deadline_h: float | None = None
    ) -> dict[str, Any]:
        plan = {}
        if gpu:
            plan = {
                "gpuType": gpu,
                "startTime": (NOW + timedelta(hours=start_h)).isoformat(),
                "predictedCompletionTime": (NOW + timedelta(hours=end_h)).isoformat(),
            }
        spec: dict[str, Any] = {}
        if deadline_h is not None:
            spec["utility"] = {
                "function": "Step",
                "deadline": (NOW + timedelta(hours=deadline_h)).isoformat(),
            }
        return {
            "metadata": {"name": name, "namespace": "ns"},
            "spec": spec,
            "status": {"phase": "Running" if gpu else "Waiting", "plan": plan},
        }

    lines = gantt(
        [job("a", "A100", -1, 2, 3), job("b", "T4", 0, 1), job("c", None, 0, 0)], NOW, width=40
    )
    text = "\n".join(lines)
    assert "A100:" in text
    assert "T4:" in text
    a = next(line for line in lines if "ns/a" in line)
    assert "|" in a
    assert "!" in a
    assert "=" in a
    assert a.endswith("Running")


def test_use_by_type_namespace_and_queue() -> None:
    nodes = [node("a", "A100", 2)]
    pods = [pod("w", "a", gpus=1, assigned="0")]
    jobs = [
        {"spec": {"queue": "research"}, "status": {"phase": "Running", "plan": {"totalGpus": 8}}}
    ]
    data = usage(nodes, pods, jobs)
    assert data["byType"] == {"A100": {"used": 1.0, "total": 2.0}}
    assert data["byNamespace"] == {"ns": {"gpus": 1.0}}
    assert data["byQueue"] == {"research": {"gpus": 8.0, "jobs": 1.0}}


def test_use_by_queue_counts_each_job_under_the_queue_its_local_queue_admits_into() -> None:
    def running(ns: str, local: str, gpus: int) -> dict[str, Any]:
        return {
            "metadata": {"name": f"{ns}-{local}", "namespace": ns},
            "spec": {"queue": local},
            "status": {"phase": "Running", "plan": {"totalGpus": gpus}},
        }

    local_queues = [
        {"metadata": {"name": "default", "namespace": "a"}, "spec": {"queue": "team-a"}},
        {"metadata": {"name": "default", "namespace": "b"}, "spec": {"queue": "team-b"}},
    ]
    jobs = [running("a", "default", 2), running("b", "default", 3), running("c", "default", 1)]
    by_queue = usage([], [], jobs, local_queues)["byQueue"]
    # two namespaces' LocalQueues named "default" feed two Queues; c has no LocalQueue
    assert by_queue == {
        "team-a": {"gpus": 2.0, "jobs": 1.0},
        "team-b": {"gpus": 3.0, "jobs": 1.0},
        "default": {"gpus": 1.0, "jobs": 1.0},
    }


def test_dashboard_state_keeps_user_strings_raw_for_the_page_to_set_as_text() -> None:
    from chronotope.workloads.views import dashboard_state

    job = {
        "metadata": {
            "name": "j",
            "namespace": "ns",
            "annotations": {"kubernetes.io/description": "<b>x</b>"},
        },
        "spec": {"queue": "q", "utility": {"function": "Step", "deadline": "2030-01-02T00:00:00Z"}},
        "status": {"phase": "Waiting", "whyWaiting": "queued"},
    }
    state = dashboard_state([node("a", "A100", 1)], [], [job], pipelines=[], variants=[], now=NOW)
    (row,) = state["jobs"]
    assert row["description"] == "<b>x</b>"  # escaped by the page, not here
    assert row["deadline"] == "2030-01-02T00:00:00Z"
    assert row["why"] == "queued"
    assert state["totals"] == {"A100": {"free": 1, "shared": 0, "whole": 0}}


def _latency_pipeline() -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "p"},
        "spec": {"slo": {"p99LatencyMs": 200, "observedP99Query": "q"}},
        "status": {
            "phase": "Serving",
            "predictedP99Ms": 150.0,
            "observedP99Ms": 497.5,
            "p99History": [
                {"time": "2030-01-01T00:00:00Z", "predictedMs": 150.0, "observedMs": 99.5}
            ],
            "conditions": [
                {
                    "type": "SloMet",
                    "status": "False",
                    "reason": "ObservedOverSlo",
                    "message": "observed P99 497.5 ms is over the SLO of 200 ms",
                }
            ],
        },
    }


def test_why_a_pipeline_shows_observed_against_predicted_p99() -> None:
    lines = explain("InferencePipeline", _latency_pipeline(), [])
    assert "P99: observed 497.5 ms, predicted 150 ms, SLO 200 ms, SloMet=False" in lines, lines
    assert (
        "condition SloMet=False (ObservedOverSlo): observed P99 497.5 ms is over the SLO of 200 ms"
        in lines
    )
    # nothing observed yet: a dash, and no verdict
    bare = {"metadata": {"namespace": "ns", "name": "q"}, "status": {"predictedP99Ms": 90.0}}
    assert "P99: observed -, predicted 90 ms, SLO -" in explain("InferencePipeline", bare, [])
    # no P99 line for a pipeline with nothing to say, nor for other kinds
    assert not any(line.startswith("P99") for line in explain("InferencePipeline", {}, []))
    assert not any(
        line.startswith("P99") for line in explain("TrainingJob", _latency_pipeline(), [])
    )


def test_pipeline_latency_rows_for_top_and_the_dashboard() -> None:
    from chronotope.workloads.views import dashboard_state, pipeline_latency

    assert pipeline_latency([_latency_pipeline()]) == [
        {
            "pipeline": "ns/p",
            "predictedP99Ms": 150.0,
            "observedP99Ms": 497.5,
            "sloMs": 200,
            "sloMet": "False",
            "reason": "ObservedOverSlo",
        }
    ]
    state = dashboard_state([], [], [], pipelines=[_latency_pipeline()], variants=[], now=NOW)
    (row,) = state["pipelines"]
    assert row["observedP99Ms"] == 497.5
    assert row["p99History"] == _latency_pipeline()["status"]["p99History"]
    assert row["sloMet"] == {
        "status": "False",
        "reason": "ObservedOverSlo",
        "message": "observed P99 497.5 ms is over the SLO of 200 ms",
    }
    empty = dashboard_state(
        [], [], [], pipelines=[{"metadata": {"name": "x"}}], variants=[], now=NOW
    )
    assert (empty["pipelines"][0]["p99History"], empty["pipelines"][0]["sloMet"]) == ([], None)


def test_the_dashboard_shows_each_queues_quota_use_and_head_of_line() -> None:
    from chronotope.workloads.views import dashboard_state

    queue: dict[str, Any] = {
        "metadata": {"name": "team-a"},
        "spec": {
            "cohort": "ml",
            "quotas": [
                {"gpuType": "L4", "gpus": 4},
                {"gpuType": "T4", "gpus": 1, "shareMilli": 1000},
            ],
        },
        "status": {
            "gpus": [{"gpuType": "L4", "used": 5, "borrowed": 1}, {"gpuType": "T4", "lent": 1}],
            "admittedWorkloads": 2,
            "pendingWorkloads": 4,
            "pendingHead": [{"workload": f"ns/w{i}", "position": i + 1} for i in range(4)],
        },
    }
    queue["status"]["pendingHead"][1]["predictedStartTime"] = "2030-01-01T14:30:00Z"
    local = {"metadata": {"name": "research", "namespace": "ns"}, "spec": {"queue": "team-a"}}
    jobs = [
        {"metadata": {"name": "j", "namespace": "ns"}, "spec": {"queue": "research"}},
        {"metadata": {"name": "k", "namespace": "other"}, "spec": {"queue": "research"}},
    ]
    state = dashboard_state(
        [], [], jobs, pipelines=[], variants=[], now=NOW, queues=[queue], local_queues=[local]
    )
    (row,) = state["queues"]
    assert (row["name"], row["cohort"]) == ("team-a", "ml")
    assert [
        (g["gpuType"], g["nominal"], g["used"], g["borrowed"], g["lent"]) for g in row["gpus"]
    ] == [
        ("L4", 4, 5, 1, 0),
        ("T4", 1, 0, 0, 1),
    ]
    assert (row["admitted"], row["pending"], row["inUse"]) == (2, 4, 5)
    # the first three in admission order, with a predicted start where there is one
    assert row["next"] == ["ns/w0", "ns/w1 (starts 01-01 14:30)", "ns/w2"]
    # a job's queue is its LocalQueue, and the Queue that LocalQueue admits into
    assert [j["queue"] for j in state["jobs"]] == ["research → team-a", "research"]


def test_without_queues_the_dashboard_shows_gpus_by_the_queue_names_jobs_give() -> None:
    from chronotope.workloads.views import dashboard_state

    running = {
        "metadata": {"name": "j", "namespace": "ns"},
        "spec": {"queue": "batch"},
        "status": {"phase": "Running", "plan": {"totalGpus": 3}},
    }
    state = dashboard_state([], [], [running], pipelines=[], variants=[], now=NOW)
    assert state["queues"] == [
        {
            "name": "batch",
            "cohort": None,
            "gpus": [],
            "inUse": 3.0,
            "admitted": 1,
            "pending": None,
            "next": [],
        }
    ]
