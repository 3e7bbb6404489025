"""workloads.podreq.gpu_resources: what the controllers write is what the extender reads."""

from __future__ import annotations

from chronotope.api.v1alpha1.common import GpuShare, SharePriority, WorkloadProfile
from chronotope.workloads.podreq import gpu_resources, pod_request


def _pod(limits: dict[str, str], annotations: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


def test_a_share_round_trips_with_its_priority_and_profile() -> None:
    share = GpuShare(
        memory_mib=8000,
        compute_percent=40,
        priority=SharePriority.HIGH,
        profile=WorkloadProfile.COMPUTE_BOUND,
    )
    req = pod_request(_pod(*gpu_resources(share, 1)))
    assert req.num_gpus == 1
    assert req.gpu_memory_mib == 8000
    assert req.gpu_milli == 400
    assert req.gpu_priority is SharePriority.HIGH
    assert req.gpu_profile is WorkloadProfile.COMPUTE_BOUND


def test_whole_gpus_ask_for_the_count_and_no_share_annotations() -> None:
    limits, annotations = gpu_resources(None, 4)
    assert annotations == {}
    req = pod_request(_pod(limits, annotations))
    assert req.num_gpus == 4
    assert req.gpu_priority is None
