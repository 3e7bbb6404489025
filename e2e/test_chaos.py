"""Chaos (issue 20): crashes at seeded points of a mixed workload break no invariant.

The cluster test runs one short round (`e2e/chaos.py`, docs/chaos.md) on a
cluster of its own, since it kills the apiserver and etcd: about 40 objects
(TrainingJobs, share pods, whole-GPU pods, pod gangs) and 7 kills, every one of
the extender, the operator, the `chronotope` kube-scheduler, the apiserver and
etcd at least once. The seed is `CHRONOTOPE_CHAOS_SEED` (default 1); the report
is printed (`pytest -s`) and written to test-artifacts/chaos-seed<SEED>.json.
`make soak` runs the same driver for longer.

The table tests below check the checkers: each invariant fails on a snapshot
built to break it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from chronotope.devcluster.cluster import ClusterError, LocalCluster
from chronotope.devcluster.settings import ClusterSettings
from e2e.chaos import COMPONENTS, Chaos, Plan, chaos_cluster, write_report
from e2e.chaos_invariants import (
    Snapshot,
    gang_problems,
    job_problems,
    lost_objects,
    over_allocation,
    settle_problems,
)

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def _seed() -> int:
    raw = os.environ.get("CHRONOTOPE_CHAOS_SEED", "1")
    if not raw.isdigit():
        raise pytest.UsageError(f"CHRONOTOPE_CHAOS_SEED must be a whole number, not {raw!r}")
    return int(raw)


@pytest.mark.cluster
@pytest.mark.timeout(900)
def test_crashes_during_a_mixed_workload_break_no_invariant(
    cluster_settings: Any, tmp_path: Path
) -> None:
    seed = _seed()
    settings = dataclasses.replace(cluster_settings, state_root=tmp_path)
    admin = os.environ.get("CHRONOTOPE_TEST_ADMIN") == "1"
    with chaos_cluster(settings, identities=not admin) as cluster:
        chaos = Chaos(cluster, Plan(seed=seed))
        try:
            report = chaos.run()
        finally:
            chaos.close()
    print(report.text())
    write_report(report, ARTIFACTS / f"chaos-seed{seed}.json")
    assert set(report.kills) == set(COMPONENTS)
    assert sum(report.kills.values()) == Plan(seed=seed).kills
    assert report.objects >= Plan(seed=seed).objects
    assert report.final_checks["bound pods"] > 0
    assert report.violations == {}, report.text()


def test_crashing_a_component_the_cluster_cannot_restart_is_a_clear_error(tmp_path: Path) -> None:
    cluster = LocalCluster(ClusterSettings(cache_dir=tmp_path, state_root=tmp_path), "c")
    with pytest.raises(ClusterError, match="'c' is not running"), cluster.killed("etcd"):
        pass
    cluster.directory.mkdir()
    old = {"name": "etcd", "pid": 2**22 + 1, "binary": "/no/etcd", "log": str(tmp_path / "l")}
    state = {"name": "c", "directory": str(cluster.directory), "ports": {}, "processes": [old]}
    cluster.state_file.write_text(json.dumps(state))
    with (
        pytest.raises(ClusterError, match=r"runs no 'kwok' \(it runs etcd\)"),
        cluster.killed("kwok"),
    ):
        pass
    with pytest.raises(ClusterError, match="etcd was recorded without its command line"):
        cluster.restart_component("etcd")


# ---------------------------------------------------------------------- the checkers
def _node(name: str, gpus: int = 4, memory: int = 16000) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.memory": str(memory)}},
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpus), "cpu": "32", "memory": "128Gi"},
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "32", "memory": "128Gi"},
        },
    }


def _pod(
    name: str,
    node: str | None = None,
    gpus: tuple[int, ...] = (),
    *,
    share: tuple[int, int] | None = None,
    whole: int = 1,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits = {"chronotope.dev/gpu-share": "1"} if share else {"nvidia.com/gpu": str(whole)}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
    }
    if share:
        meta["annotations"] |= {
            "chronotope.dev/gpu-compute-percent": str(share[0]),
            "chronotope.dev/gpu-memory-mib": str(share[1]),
        }
    if node is not None:
        meta["annotations"] |= {
            "chronotope.dev/assigned-node": node,
            "chronotope.dev/assigned-gpus": ",".join(map(str, gpus)),
            "chronotope.dev/assigned-gpu-uuids": ",".join(f"GPU-{node}-{g}" for g in gpus),
            "chronotope.dev/handshake": f"h{name}",
        }
        if share:
            meta["annotations"] |= {
                "chronotope.dev/assigned-compute-percent": str(share[0]),
                "chronotope.dev/assigned-memory-mib": str(share[1]),
            }
    spec: dict[str, Any] = {
        "schedulerName": "chronotope",
        "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def _gang(name: str, size: int) -> dict[str, Any]:
    return {
        "labels": {"chronotope.dev/pod-group": name},
        "annotations": {"chronotope.dev/pod-group-size": str(size)},
    }


def _snap(*pods: dict[str, Any], jobs: tuple[dict[str, Any], ...] = ()) -> Snapshot:
    return Snapshot([_node("n1"), _node("n2")], list(pods), list(jobs))


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param(
            [_pod("a", "n1", (0,)), _pod("b", "n1", (1,)), _pod("c", "n1", (0,), share=(50, 100))],
            ["GPU n1/0 is held whole and by others"],
            id="whole-and-share",
        ),
        pytest.param(
            [_pod("a", "n1", (0,), share=(60, 100)), _pod("b", "n1", (0,), share=(50, 100))],
            ["GPU n1/0 has more than 100% of its compute given out"],
            id="compute",
        ),
        pytest.param(
            [_pod("a", "n1", (2,), share=(20, 9000)), _pod("b", "n1", (2,), share=(20, 9000))],
            ["GPU n1/2 has more than its 16000 MiB given out"],
            id="memory",
        ),
        pytest.param([_pod("a", "n1", (4,))], ["GPU n1/4 does not exist"], id="no-such-gpu"),
        pytest.param(
            [_pod("a", "n1", (0,), whole=2)], ["pod ns/a asked for 2 whole GPUs"], id="size"
        ),
        pytest.param(
            [{**_pod("a", "n1", (0,)), "metadata": {"name": "a", "namespace": "ns"}}],
            ["pod ns/a is bound to n1 without a readable assignment"],
            id="no-assignment",
        ),
        pytest.param(
            [_pod("a", "n1", (0, 1), whole=2), _pod("b", "n1", (2,), share=(50, 8000))],
            [],
            id="fine",
        ),
    ],
)
def test_over_allocation_is_found(pods: list[dict[str, Any]], expected: list[str]) -> None:
    found = over_allocation(_snap(*pods))
    assert len(found.problems) == len(expected), found.problems
    for problem, start in zip(found.problems, expected, strict=True):
        assert problem.startswith(start), problem


def test_a_finished_pod_holds_nothing() -> None:
    done = _pod("a", "n1", (0,))
    done["status"]["phase"] = "Succeeded"
    assert over_allocation(_snap(done, _pod("b", "n1", (0,)))).problems == []


def test_partial_and_incomplete_gangs_are_found() -> None:
    partial = [_pod("g-0", "n1", (0,), **_gang("g", 2)), _pod("g-1", **_gang("g", 2))]
    missing = [_pod("h-0", "n2", (0,), **_gang("h", 3)), _pod("h-1", "n2", (1,), **_gang("h", 3))]
    whole = [_pod("k-0", **_gang("k", 2)), _pod("k-1", **_gang("k", 2))]
    found = gang_problems(_snap(*partial, *missing, *whole))
    assert found.checked["gangs"] == 3
    assert found.problems == [
        "gang ns/g is partially bound: 1 of 2 members",
        "gang ns/h has 2 live member(s), declares 3",
    ]


def _job(name: str, phase: str, workers: int, uid: str = "u1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "status": {"phase": phase, "plan": {"workers": workers}, "whyWaiting": "x"},
    }


def _worker(job: str, gen: int, rank: int, node: str | None, uid: str = "u1") -> dict[str, Any]:
    pod = _pod(
        f"{job}-g{gen}-{rank}",
        node,
        (rank,) if node else (),
        labels={
            "chronotope.dev/job": job,
            "chronotope.dev/gang-generation": str(gen),
            "chronotope.dev/pod-group": f"{job}-g{gen}",
        },
        annotations={"chronotope.dev/pod-group-size": "2"},
    )
    pod["metadata"]["ownerReferences"] = [{"uid": uid}]
    return pod


def test_duplicated_and_orphaned_workers_are_found() -> None:
    fine = [_worker("a", 1, 0, "n1"), _worker("a", 1, 1, "n1")]
    two_generations = [_worker("b", 1, 0, None), _worker("b", 2, 0, None)]
    not_owned = [_worker("c", 1, 0, None, uid="old"), _worker("c", 1, 1, None)]
    orphan = [_worker("gone", 1, 0, None)]
    jobs = (_job("a", "Running", 2), _job("b", "Starting", 2), _job("c", "Running", 2))
    found = job_problems(_snap(*fine, *two_generations, *not_owned, *orphan, jobs=jobs))
    assert found.checked["TrainingJobs"] == 3
    assert found.problems == [
        "1 worker(s) of TrainingJob ns/gone, which is gone",
        "TrainingJob ns/b has live workers of generations ['1', '2']",
        "TrainingJob ns/c: worker c-g1-0 is not owned by it",
        "TrainingJob ns/c is Running with 0 of 2 workers bound, plan 2",
    ]


def test_lost_objects_are_found() -> None:
    snap = _snap(_pod("a", "n1", (0,)), jobs=(_job("j", "Waiting", 1),))
    found = lost_objects(snap, pods=["ns/b"], jobs=["ns/j", "ns/k"], deleted=["ns/a", "ns/c"])
    assert found.problems == [
        "pod ns/b was accepted and is gone",
        "TrainingJob ns/k was accepted and is gone",
        "ns/a was deleted and is still there",
    ]


def test_what_still_moves_is_found() -> None:
    full = [_pod(f"w{g}", "n1", (g,)) for g in range(4)]
    pending_fits = _pod("fits", whole=2)  # n2 is empty
    pending_too_big = _pod("too-big", whole=8)
    big_gang = [_pod(f"b-{i}", whole=4, **_gang("b", 2)) for i in range(2)]
    small_gang = [_pod(f"s-{i}", whole=2, **_gang("s", 2)) for i in range(2)]
    terminating = _pod("t", "n1", (0,))
    terminating["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    jobs = (_job("s", "Starting", 1), _job("w", "Waiting", 1))
    problems = settle_problems(_snap(*full, pending_fits, pending_too_big, terminating, jobs=jobs))
    assert problems == [
        "pod ns/t is terminating",
        "TrainingJob ns/s is Starting",
        "pod ns/fits is pending but fits now",
    ]
    # two members of 4 GPUs: with n1 full only n2 has room, for one of them
    assert settle_problems(_snap(*full, *big_gang)) == []
    # two members of 2 GPUs: one on n1's two free GPUs, one on n2
    assert settle_problems(_snap(*full[:2], *small_gang)) == ["gang ns/s is pending but fits now"]
