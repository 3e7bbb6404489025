"""The operator's Prometheus metrics: jobs by phase, waiting demand, stale jobs drop out."""

from __future__ import annotations

from prometheus_client import generate_latest

from chronotope.controllers.metrics import OperatorMetrics


def _job(name: str, replicas: int, gpus: int, gpu_type: str) -> dict[str, object]:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"replicas": replicas, "gpu": {"count": gpus}, "gpuTypes": [{"name": gpu_type}]},
    }


def test_phases_and_waiting_demand() -> None:
    m = OperatorMetrics()
    m.observe_job(_job("a", 2, 4, "H100"), {"phase": "Waiting"})
    m.observe_job(_job("b", 1, 8, "H100"), {"phase": "Pending"})
    running = _job("c", 1, 1, "T4") | {"status": {"phase": "Running"}}
    m.observe_job(running, {})  # nothing new in the outcome: the job's own phase counts
    m.observe_job(_job("d", 1, 1, "T4"), {})  # never reconciled to a phase yet
    m.events.labels("Started").inc()
    m.preemptions.labels("Reclaim", "team-b").inc()
    m.admission_wait.labels("team-a").observe(42.0)
    text = generate_latest(m.registry).decode()
    assert 'chronotope_trainingjobs{phase="Waiting"} 1.0' in text
    assert 'chronotope_trainingjobs{phase="Pending"} 1.0' in text
    assert 'chronotope_trainingjobs{phase="Running"} 1.0' in text
    assert 'chronotope_trainingjobs{phase="New"} 1.0' in text
    assert 'chronotope_trainingjob_waiting_gpus{gpu_type="H100"} 16.0' in text
    assert 'chronotope_trainingjob_events_total{reason="Started"} 1.0' in text
    assert 'chronotope_trainingjob_preemptions_total{cause="Reclaim",queue="team-b"} 1.0' in text
    wait = "chronotope_trainingjob_admission_wait_seconds"
    assert f'{wait}_count{{queue="team-a"}} 1.0' in text
    assert f'{wait}_bucket{{le="60.0",queue="team-a"}} 1.0' in text
    assert f'{wait}_bucket{{le="30.0",queue="team-a"}} 0.0' in text


def test_jobs_not_reconciled_lately_drop_out() -> None:
    now = [100.0]
    m = OperatorMetrics(stale_after_s=30.0, clock=lambda: now[0])
    m.observe_job(_job("gone", 1, 1, "T4"), {"phase": "Running"})
    now[0] += 29.0
    assert 'chronotope_trainingjobs{phase="Running"} 1.0' in generate_latest(m.registry).decode()
    now[0] += 2.0
    assert "chronotope_trainingjobs{" not in generate_latest(m.registry).decode()


def test_serving_groups_report_replicas_residency_and_passes() -> None:
    now = [100.0]
    m = OperatorMetrics(clock=lambda: now[0], group_stale_after_s=120.0)
    m.observe_group("ns", "llama", 2, {"chat": "GPU", "sql": "Host"})
    m.observe_group("ns", "tiny", None, {})  # could not be planned
    text = generate_latest(m.registry).decode()
    assert 'chronotope_serving_group_replicas{group="llama",namespace="ns"} 2.0' in text
    assert (
        'chronotope_variant_residency{group="llama",namespace="ns",residency="Host",variant="sql"}'
        " 1.0"
    ) in text
    assert (
        'chronotope_serving_group_passes_total{group="tiny",namespace="ns",result="unplannable"}'
        " 1.0"
    ) in text
    now[0] += 121.0  # not planned lately: its variants are gone
    assert "chronotope_serving_group_replicas{" not in generate_latest(m.registry).decode()


def test_queue_quota_and_usage_and_a_deleted_queue_drops_out() -> None:
    now = [0.0]
    m = OperatorMetrics(stale_after_s=30, clock=lambda: now[0])
    spec = {
        "quotas": [
            {"gpuType": "L4", "gpus": 4, "shareMilli": 500, "lendingLimit": 1},
            {"gpuType": "T4", "gpus": 2, "borrowingLimit": 0},
        ]
    }
    status = {
        "gpus": [{"gpuType": "L4", "used": 6, "borrowed": 2, "lent": 0, "usedShareMilli": 250}],
        "admittedWorkloads": 2,
        "pendingWorkloads": 3,
    }
    m.observe_queue("team-a", spec, status)
    text = generate_latest(m.registry).decode()
    assert 'chronotope_queue_gpus{gpu_type="L4",kind="nominal",queue="team-a"} 4.0' in text
    assert 'chronotope_queue_gpus{gpu_type="L4",kind="used",queue="team-a"} 6.0' in text
    assert 'chronotope_queue_gpus{gpu_type="L4",kind="borrowed",queue="team-a"} 2.0' in text
    assert (
        'chronotope_queue_gpus{gpu_type="L4",kind="used_share_milli",queue="team-a"} 250.0' in text
    )
    assert 'chronotope_queue_workloads{queue="team-a",state="pending"} 3.0' in text
    assert 'chronotope_queue_gpus{gpu_type="L4",kind="lending_limit",queue="team-a"} 1.0' in text
    assert 'chronotope_queue_gpus{gpu_type="T4",kind="borrowing_limit",queue="team-a"} 0.0' in text
    assert 'gpu_type="L4",kind="borrowing_limit"' not in text  # not set: no series
    now[0] = 31.0
    assert "team-a" not in generate_latest(m.registry).decode()


def test_pipelines_report_replicas_cost_p99_and_events_and_drop_out() -> None:
    now = [100.0]
    m = OperatorMetrics(clock=lambda: now[0], group_stale_after_s=120.0)
    status = {
        "stages": [
            {"name": "detect", "replicas": 4, "plannedReplicas": 2},
            {"name": "ocr", "replicas": 1, "servedBy": "ocr-group"},  # a group's: no plan of ours
        ],
        "costPerHour": 7.5,
        "predictedP99Ms": 120.0,
    }
    m.observe_pipeline("ns", "video", status, ["Planned", "ScaledUp"])
    m.observe_pipeline("ns", "video", status, ["ScaledUp"])
    text = generate_latest(m.registry).decode()
    row = 'namespace="ns",pipeline="video",stage="detect"'
    assert f'chronotope_pipeline_replicas{{kind="current",{row}}} 4.0' in text
    assert f'chronotope_pipeline_replicas{{kind="planned",{row}}} 2.0' in text
    assert 'kind="planned",namespace="ns",pipeline="video",stage="ocr"' not in text
    assert 'chronotope_pipeline_cost_per_hour{namespace="ns",pipeline="video"} 7.5' in text
    assert 'chronotope_pipeline_predicted_p99_seconds{namespace="ns",pipeline="video"} 0.12' in text
    assert 'chronotope_pipeline_events_total{reason="ScaledUp"} 2.0' in text
    assert 'chronotope_pipeline_events_total{reason="Planned"} 1.0' in text
    now[0] += 121.0  # deleted (not reconciled lately): its gauges go, its events stay counted
    text = generate_latest(m.registry).decode()
    assert "chronotope_pipeline_replicas{" not in text
    assert 'chronotope_pipeline_events_total{reason="ScaledUp"} 2.0' in text
