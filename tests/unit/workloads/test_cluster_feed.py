"""Which pods' assignment annotations the ledger reads: only the chronotope scheduler's."""

from __future__ import annotations

from typing import Any

import pytest

from chronotope.sharing.assignment import GpuAssignment, gpu_uuid
from chronotope.sharing.labels import SCHEDULER_NAME
from chronotope.solver.cache import ClusterCache, NodeInfo
from chronotope.solver.model import MILLI
from chronotope.workloads.cluster_feed import pod_holding, scheduler_assignment

NODE = "l4-000"


def assignment(
    gpus: tuple[int, ...], percent: int | None = None, node: str = NODE
) -> GpuAssignment:
    return GpuAssignment(
        node=node,
        gpu_indices=gpus,
        gpu_uuids=tuple(gpu_uuid(node, g) for g in gpus),
        memory_mib=1 if percent else None,
        compute_percent=percent,
        handshake="hs",
    )


def pod(
    scheduler: str | None, annotations: dict[str, str], gpus: int = 0, name: str = "p"
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    spec: dict[str, Any] = {
        "nodeName": NODE,
        "containers": [{"name": "c", "resources": {"limits": limits}}],
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"metadata": {"name": name, "namespace": "ns", "annotations": annotations}, "spec": spec}


def cache() -> ClusterCache:
    c = ClusterCache()
    c.upsert_node(NodeInfo(name=NODE, gpu_model="L4", gpu_count=4, gpu_memory_mib=23034))
    return c


@pytest.mark.parametrize(
    ("scheduler", "annotations", "expected"),
    [
        pytest.param(SCHEDULER_NAME, assignment((1,), 50).to_annotations(), (1,), id="ours"),
        pytest.param(None, assignment((1,)).to_annotations(), None, id="default-scheduler"),
        pytest.param("other", assignment((1,)).to_annotations(), None, id="another-scheduler"),
        pytest.param(
            SCHEDULER_NAME, assignment((1,), node="elsewhere").to_annotations(), None, id="node"
        ),
        pytest.param(SCHEDULER_NAME, {"chronotope.dev/assigned-gpus": "0"}, None, id="partial"),
        pytest.param(SCHEDULER_NAME, {}, None, id="none"),
    ],
)
def test_only_the_schedulers_own_pods_have_their_assignment_read(
    scheduler: str | None, annotations: dict[str, str], expected: tuple[int, ...] | None
) -> None:
    found = scheduler_assignment(pod(scheduler, annotations), NODE)
    assert (found.gpu_indices if found else None) == expected


def test_a_squatter_of_another_scheduler_holds_nothing_it_did_not_request() -> None:
    """Issue 20: pre-bound, no GPU request, `assigned-gpus: 0,1,2,3`: the node stays free."""
    forged = {"chronotope.dev/assigned-gpus": "0,1,2,3"} | assignment((0, 1, 2, 3)).to_annotations()
    c = cache()
    held = pod_holding(c, "ns/squat", pod(None, forged), NODE)
    assert held.gpu_indices == ()


def test_a_whole_gpu_pod_of_another_scheduler_holds_whole_gpus_whatever_it_claims() -> None:
    """Issue 20: a whole-GPU pod forging a 1 % share still holds its GPUs outright."""
    forged = assignment((2,), percent=1).to_annotations()
    c = cache()
    held = pod_holding(c, "ns/whole", pod(None, forged, gpus=2), NODE)
    assert len(held.gpu_indices) == 2
    assert held.gpu_milli == MILLI  # a whole GPU each, not the claimed 1 %


def test_the_schedulers_share_is_counted_as_assigned() -> None:
    c = cache()
    held = pod_holding(
        c, "ns/share", pod(SCHEDULER_NAME, assignment((3,), 50).to_annotations()), NODE
    )
    assert (held.gpu_indices, held.gpu_milli) == ((3,), MILLI // 2)
