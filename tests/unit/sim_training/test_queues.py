"""Queues in the training simulator: hand-checked quota cases, fairness figures, CLI."""

from __future__ import annotations

import argparse
import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from chronotope.api.v1alpha1.queue import QueueSpec
from chronotope.sim.training.engine import EngineSettings, SimResult, simulate
from chronotope.sim.training.policies import make_training_policy
from chronotope.sim.training.queue_report import QUEUE_COLUMNS, jain, queue_rows
from chronotope.sim.training.queues import (
    QueueSetup,
    QuotaPolicy,
    assign_queues,
    check_fit,
    check_quotas,
    load_queues,
)
from chronotope.sim.training_cli import DEFAULT_GAVEL, run_training
from chronotope.workloads.training_policy import Job, JobState

ROOT = Path(__file__).resolve().parents[3]
NO_OVERHEAD = EngineSettings(round_s=100.0, restart_overhead_s=0.0)
CAP = {"v100": 4}


def _setup(reclaim: str = "PreemptBorrowed", nominal: tuple[int, int] = (2, 2)) -> QueueSetup:
    specs = {
        name: QueueSpec.model_validate(
            {
                "cohort": "c",
                "quotas": [{"gpuType": "v100", "gpus": n}],
                "reclaim": {"policy": reclaim},
            }
        )
        for name, n in zip(("a", "b"), nominal, strict=True)
    }
    return QueueSetup(specs, {"a": 1.0, "b": 1.0})


def _job(i: int, arrival: float, work: float, gpus: int = 1) -> Job:
    return Job(i, arrival, gpus, work, "t", {"v100": 1.0})


def _run(
    jobs: list[Job], job_queue: dict[int, str], setup: QueueSetup, policy: str = "fifo"
) -> tuple[QuotaPolicy, dict[int, float]]:
    wrapped = QuotaPolicy(make_training_policy(policy, 100.0, 0.0), setup, job_queue)
    result = simulate(jobs, CAP, wrapped, NO_OVERHEAD)
    return wrapped, result.finish_s


def _held(wrapped: QuotaPolicy, at: float) -> dict[str, int]:
    snap = [s for s in wrapped.trace if s.at_s <= at][-1]
    out = {"a": 0, "b": 0}
    for (q, _), n in snap.used.items():
        out[q] += n
    return out


@pytest.mark.parametrize("policy", ["fifo", "las", "gavel", "chronotope"])
def test_reclaim_returns_quota_to_the_lender(policy: str) -> None:
    # a borrows b's idle quota at 0 (4 jobs on 4 GPUs); b's two jobs arrive at 100 and
    # take their quota back at once: a's two newest borrowers stop.
    jobs = [_job(i, 0, 1000) for i in range(4)] + [_job(4, 100, 1000), _job(5, 100, 1000)]
    job_queue = {0: "a", 1: "a", 2: "a", 3: "a", 4: "b", 5: "b"}
    wrapped, finish = _run(jobs, job_queue, _setup(), policy)
    assert _held(wrapped, 0) == {"a": 4, "b": 0}
    assert _held(wrapped, 100) == {"a": 2, "b": 2}
    assert finish[4] == finish[5] == 1100.0
    rows = queue_rows(
        jobs,
        job_queue,
        _result(wrapped, finish),
        trace=wrapped.trace,
        setup=wrapped.setup,
        capacity=CAP,
    )
    by_queue = {r["queue"]: r for r in rows}
    assert by_queue["a"]["borrowed_gpu_hours"] == round(2 * 100 / 3600, 2)
    assert by_queue["b"]["borrowed_gpu_hours"] == 0.0
    assert by_queue["b"]["share_attainment"] == 1.0  # held all it was owed while it had demand


def _result(wrapped: QuotaPolicy, finish: dict[int, float]) -> SimResult:
    return SimResult(wrapped.name, finish, 0.0, {}, len(wrapped.trace))


def test_never_reclaim_waits_for_the_borrowers() -> None:
    jobs = [_job(i, 0, 1000) for i in range(4)] + [_job(4, 100, 1000), _job(5, 100, 1000)]
    job_queue = {0: "a", 1: "a", 2: "a", 3: "a", 4: "b", 5: "b"}
    wrapped, finish = _run(jobs, job_queue, _setup("Never"))
    assert _held(wrapped, 100) == {"a": 4, "b": 0}
    assert finish[4] == finish[5] == 2000.0


@pytest.mark.parametrize("policy", ["fifo", "las", "edf", "gavel", "chronotope"])
def test_within_quota_never_starved_and_borrowing_only_when_lender_idles(policy: str) -> None:
    # a: 2 jobs, b: 6 jobs, all at 0, each queue 2 of 4 GPUs. While a has work, b holds
    # only its own 2 (every policy's wish is cut to the quota); once a is done, b borrows.
    jobs = [_job(0, 0, 100), _job(1, 0, 100)] + [_job(i, 0, 100) for i in range(2, 8)]
    job_queue = {i: ("a" if i < 2 else "b") for i in range(8)}
    wrapped, finish = _run(jobs, job_queue, _setup(), policy)
    assert _held(wrapped, 0) == {"a": 2, "b": 2}
    assert finish[0] == finish[1] == 100.0
    assert sorted(finish[i] for i in range(2, 8)) == [100.0, 100.0, 200.0, 200.0, 200.0, 200.0]
    assert _held(wrapped, 100) == {"a": 0, "b": 4}  # borrowing a's quota once a idles


def test_unequal_quota_gang_borrows_and_check_fit() -> None:
    setup = _setup(nominal=(3, 1))
    jobs = [_job(0, 0, 100, gpus=3), _job(1, 0, 100, gpus=1)]
    _, finish = _run(jobs, {0: "b", 1: "a"}, setup)
    assert finish == {0: 100.0, 1: 100.0}  # b borrows 2 of a's 3 idle GPUs
    lone = QueueSetup(
        {"a": QueueSpec.model_validate({"quotas": [{"gpuType": "v100", "gpus": 2}]})},
        {"a": 1.0},
    )
    with pytest.raises(ValueError, match="queue a may hold at most 2"):
        check_fit([_job(0, 0, 10, gpus=3)], {0: "a"}, lone)


def test_check_quotas_raises_on_a_breach() -> None:
    setup = _setup(nominal=(2, 2))
    jobs = {i: _job(i, 0, 10) for i in range(5)}
    check_quotas({i: "v100" for i in range(4)}, jobs, dict.fromkeys(range(5), "a"), setup)
    with pytest.raises(RuntimeError, match="queue a holds 5 v100 > nominal \\+ borrowable 4"):
        check_quotas({i: "v100" for i in range(5)}, jobs, dict.fromkeys(range(5), "a"), setup)
    split = {0: "a", 1: "a", 2: "a", 3: "b", 4: "b"}  # each within its ceiling, not the cohort
    with pytest.raises(RuntimeError, match="cohort c holds 5 v100 > its nominal 4"):
        check_quotas({i: "v100" for i in range(5)}, jobs, split, setup)
    limited = QueueSetup(
        {
            "a": QueueSpec.model_validate(
                {"cohort": "c", "quotas": [{"gpuType": "v100", "gpus": 2, "borrowingLimit": 1}]}
            ),
            "b": QueueSpec.model_validate(
                {"cohort": "c", "quotas": [{"gpuType": "v100", "gpus": 2}]}
            ),
        },
        {"a": 1.0, "b": 1.0},
    )
    with pytest.raises(RuntimeError, match="queue a holds 4 v100 > nominal \\+ borrowable 3"):
        check_quotas({i: "v100" for i in range(4)}, jobs, dict.fromkeys(range(5), "a"), limited)


def test_a_lending_limit_keeps_the_lenders_guaranteed_quota_in_the_simulator() -> None:
    # b lends at most 1 of its 2 GPUs: a's four jobs hold 3 at most, and b's job starts at
    # once on its guaranteed GPU at 100 though b reclaims nothing (Never)
    specs = {
        "a": QueueSpec.model_validate({"cohort": "c", "quotas": [{"gpuType": "v100", "gpus": 2}]}),
        "b": QueueSpec.model_validate(
            {"cohort": "c", "quotas": [{"gpuType": "v100", "gpus": 2, "lendingLimit": 1}]}
        ),
    }
    setup = QueueSetup(specs, {"a": 1.0, "b": 1.0})
    jobs = [_job(i, 0, 1000) for i in range(4)] + [_job(4, 100, 1000)]
    job_queue = {0: "a", 1: "a", 2: "a", 3: "a", 4: "b"}
    wrapped, finish = _run(jobs, job_queue, setup)
    assert _held(wrapped, 0) == {"a": 3, "b": 0}
    assert _held(wrapped, 100) == {"a": 3, "b": 1}
    assert finish[4] == 1100.0
    assert sorted(finish[i] for i in range(4)) == [1000.0, 1000.0, 1000.0, 2000.0]
    many = {i: _job(i, 0, 10) for i in range(4)}
    with pytest.raises(RuntimeError, match="queue a holds 4 v100 > nominal \\+ borrowable 3"):
        check_quotas({i: "v100" for i in range(4)}, many, dict.fromkeys(range(4), "a"), setup)


def test_jain_known_inputs() -> None:
    assert jain([1.0, 1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain([1.0, 2.0]) == pytest.approx(0.9)
    assert jain([0.0, 0.0]) == 1.0


def test_seeded_assignment_is_deterministic_and_follows_shares() -> None:
    setup = load_queues(ROOT / "manifests" / "queues" / "philly-4teams.yaml", _gavel_cap())
    jobs = [_job(i, 0, 10) for i in range(4000)]
    first = assign_queues(jobs, setup, seed=3)
    assert first == assign_queues(list(reversed(jobs)), setup, seed=3)
    assert first != assign_queues(jobs, setup, seed=4)
    counts = {q: sum(1 for v in first.values() if v == q) for q in setup.specs}
    assert all(900 < n < 1100 for n in counts.values())  # job-share 1:1:1:1
    by_nominal = QueueSetup(setup.specs, {n: float(setup.nominal_gpus(n)) for n in setup.specs})
    share = assign_queues(jobs, by_nominal, seed=3)
    assert 1600 < sum(1 for v in share.values() if v == "team-a") < 1900  # 42/96 of 4000


def _gavel_cap() -> dict[str, int]:
    return {"k80": 32, "p100": 32, "v100": 32}


def test_sample_maps_product_names_to_sim_types() -> None:
    setup = load_queues(ROOT / "manifests" / "queues" / "philly-4teams.yaml", _gavel_cap())
    assert sorted(setup.specs) == ["team-a", "team-b", "team-c", "team-d"]
    assert [q.gpu_type for q in setup.specs["team-a"].quotas] == ["k80", "p100", "v100"]
    assert sum(setup.nominal_gpus(n) for n in setup.specs) == 96


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("kind: ClusterSpec\n", "document 1 is not a Queue"),
        (
            "kind: Queue\napiVersion: chronotope.dev/v1alpha1\nmetadata: {name: a}\n"
            "spec: {quotas: [{gpuType: Tesla-V100, gpus: -1}]}\n",
            "spec.quotas.0.gpus",
        ),
        (
            "kind: Queue\napiVersion: chronotope.dev/v1alpha1\nmetadata: {name: a}\n"
            "spec: {quotas: [{gpuType: A100, gpus: 1}]}\n",
            "no Gavel throughputs",
        ),
        (
            "kind: Queue\napiVersion: chronotope.dev/v1alpha1\nmetadata: {name: a}\n"
            "spec: {quotas: [{gpuType: Tesla-V100, gpus: 40}]}\n",
            "nominal v100 quotas add up to 40 > 32",
        ),
        (
            "kind: Queue\napiVersion: chronotope.dev/v1alpha1\nmetadata: {name: a}\n"
            "spec: {quotas: [{gpuType: Tesla-V100, gpus: 4}], stopPolicy: Hold}\n",
            "Queue a: a stopPolicy is not simulated",
        ),
        (
            "kind: Queue\napiVersion: chronotope.dev/v1alpha1\nmetadata: {name: a}\n"
            "spec: {quotas: [{gpuType: Tesla-V100, gpus: 4}], namespaceSelector: {}}\n",
            "Queue a: a namespaceSelector is not simulated",
        ),
    ],
)
def test_bad_queue_files(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "q.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        load_queues(path, _gavel_cap())


def _args(tmp_path: Path, out: str, queues: Path | None) -> argparse.Namespace:
    trace = tmp_path / "philly.csv"
    trace.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        + "".join(
            f"2017-10-09 06:{m:02d}:00,{600 * (m % 5 + 1)}.0,{m % 3 + 1},0,c\n" for m in range(40)
        )
    )
    return argparse.Namespace(
        trace=trace,
        start="2017-10-09 06:00:00",
        end="2017-10-09 07:00:00",
        cluster=ROOT / "manifests" / "clusters" / "gavel-96.yaml",
        policies="fifo,chronotope",
        seed=1,
        out=tmp_path / out,
        throughputs=DEFAULT_GAVEL,
        deadline_share=0.3,
        round_s=360.0,
        restart_overhead_s=30.0,
        estimate_error="none",
        queues=queues,
    )


def test_cli_without_queues_is_unchanged_and_with_queues_writes_queues_csv(
    tmp_path: Path,
) -> None:
    plain = run_training(_args(tmp_path, "plain", None))
    assert not (tmp_path / "plain" / "queues.csv").exists()
    sample = ROOT / "manifests" / "queues" / "philly-4teams.yaml"
    both = run_training(_args(tmp_path, "queues", sample))
    assert [r["policy"] for r in both] == ["fifo", "fifo+queues", "chronotope", "chronotope+queues"]
    assert [both[0], both[2]] == plain  # the runs without quotas are the same
    with (tmp_path / "queues" / "queues.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == QUEUE_COLUMNS
    assert len(rows) == 8
    assert sum(int(r["jobs"]) for r in rows if r["policy"] == "fifo+queues") == 40
    assert {r["gpu_util_no_queues_pct"] for r in rows if r["policy"] == "fifo+queues"} == {
        str(plain[0]["gpu_util_pct"])
    }


class _WantsV100:
    """A wish that puts every active job on v100 (more than the quota allows)."""

    name = "wants-v100"
    preemptive = True

    def allocate(
        self, now: float, active: Sequence[JobState], capacity: Mapping[str, int]
    ) -> dict[int, str]:
        return {js.job.job_id: "v100" for js in active}


def test_a_job_denied_its_wished_type_moves_to_the_fastest_admissible_one() -> None:
    # b holds one GPU of each type. Job 1 keeps b's v100; job 0, wished onto v100 too,
    # is denied it and must fall back: to p100 (3x its k80 speed), not stay on the k80
    # it holds. Seen in the Philly run: an 8-GPU job sat 18 h on K80s at 0.2x speed.
    setup = QueueSetup(
        {
            "b": QueueSpec.model_validate(
                {"quotas": [{"gpuType": g, "gpus": 1} for g in ("k80", "p100", "v100")]}
            )
        },
        {"b": 1.0},
    )
    speeds = {"k80": 0.2, "p100": 0.6, "v100": 1.0}
    slow = JobState(Job(0, 0, 1, 1000, "t", speeds), 1000, gpu_type="k80")
    kept = JobState(Job(1, 0, 1, 1000, "t", speeds), 1000, gpu_type="v100")
    wrapped = QuotaPolicy(_WantsV100(), setup, {0: "b", 1: "b"})
    alloc = wrapped.allocate(0.0, [slow, kept], {"k80": 1, "p100": 1, "v100": 1})
    assert alloc == {0: "p100", 1: "v100"}
