"""The objects a TrainingJob's gang is made of: worker pods and a headless Service (pure).

Workers carry the gang labels the extender reads (all-or-nothing placement),
`schedulerName: chronotope`, a node selector for the chosen GPU type, owner
references (so deleting the job deletes its workers), and the environment a
distributed launcher needs (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, and
the chosen data/tensor/pipeline degrees).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from chronotope.api.v1alpha1.trainingjob import TopologyLevel, TrainingJobSpec
from chronotope.sharing.assignment import is_scheduler_key
from chronotope.sharing.labels import (
    GANG_LABEL,
    GANG_SIZE_ANNOTATION,
    GPU_PRODUCT_LABEL,
    SCHEDULER_NAME,
    STRATEGY_ANNOTATION,
    TOPOLOGY_ANNOTATION,
)
from chronotope.workloads.parallelism import Degrees, choose_degrees
from chronotope.workloads.podreq import (
    PLANNED_GANG_ANNOTATION,
    PLANNED_GPUS_ANNOTATION,
    PLANNED_NODE_ANNOTATION,
    gang_plan_annotation,
    gpu_resources,
)
from chronotope.workloads.training import Decision

__all__ = [
    "GENERATION_LABEL",
    "JOB_LABEL",
    "MASTER_PORT",
    "headless_service",
    "worker_pods",
]

JOB_LABEL = "chronotope.dev/job"
GENERATION_LABEL = "chronotope.dev/gang-generation"
"""Bumped on every (re)start of the gang, so a resize never mixes old and new workers."""
MASTER_PORT = 29500


def _owner(job: Mapping[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": job.get("apiVersion", "chronotope.dev/v1alpha1"),
        "kind": "TrainingJob",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def headless_service(job: Mapping[str, Any]) -> dict[str, Any]:
    """The headless Service that gives the gang's workers stable DNS names for rendezvous.

    Only a gang of two or more workers gets one; a one-worker gang's MASTER_ADDR is
    localhost.
    """
    name = job["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {JOB_LABEL: name}, "ownerReferences": [_owner(job)]},
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_LABEL: name},
            "ports": [{"name": "rendezvous", "port": MASTER_PORT}],
            "publishNotReadyAddresses": True,
        },
    }


def worker_pods(
    job: Mapping[str, Any],
    spec: TrainingJobSpec,
    decision: Decision,
    generation: int,
    degrees: Degrees | None = None,
) -> list[dict[str, Any]]:
    """The gang for `decision` (which must be a start decision), run with `degrees`."""
    assert decision.gpu_type is not None
    assert decision.workers > 0
    meta = job["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    template = copy.deepcopy(spec.template or {})
    pod_meta = template.get("metadata") or {}
    pod_spec = template.get("spec") or {"containers": [{"name": "worker", "image": "busybox"}]}
    if degrees is None:
        degrees = choose_degrees(spec.parallelism, decision.workers, decision.gpus_per_worker)
    gang = f"{name}-g{generation}"
    # rank 0's DNS name through the gang's headless Service; a one-worker gang has none
    master = f"{name}-0.{name}.{namespace}.svc" if decision.workers > 1 else "localhost"
    pods = []
    for rank in range(decision.workers):
        spec_copy = copy.deepcopy(pod_spec)
        container = spec_copy["containers"][0]
        resources = container.setdefault("resources", {})
        limits = resources.setdefault("limits", {})
        gpu_limits, gpu_annotations = gpu_resources(spec.gpu.shared, decision.gpus_per_worker)
        limits.update(gpu_limits)
        # the template's own annotations, less any only the scheduler may write
        user = {
            k: v for k, v in (pod_meta.get("annotations") or {}).items() if not is_scheduler_key(k)
        }
        annotations = user | gpu_annotations
        env = [e for e in container.get("env", []) if e.get("name") not in _ENV_NAMES]
        env += [
            {"name": "MASTER_ADDR", "value": master},
            {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
            {"name": "WORLD_SIZE", "value": str(decision.workers)},
            {"name": "RANK", "value": str(rank)},
            {"name": "CHRONOTOPE_DATA_PARALLEL", "value": str(degrees.data)},
            {"name": "CHRONOTOPE_TENSOR_PARALLEL", "value": str(degrees.tensor)},
            {"name": "CHRONOTOPE_PIPELINE_PARALLEL", "value": str(degrees.pipeline)},
            {"name": "CHRONOTOPE_GPU_TYPE", "value": decision.gpu_type},
        ]
        if degrees.micro_batch_size is not None:
            env.append({"name": "CHRONOTOPE_MICRO_BATCH", "value": str(degrees.micro_batch_size)})
        if spec.checkpoint is not None:
            env.append({"name": "CHRONOTOPE_CHECKPOINT_PATH", "value": spec.checkpoint.path})
        container["env"] = env
        spec_copy["schedulerName"] = SCHEDULER_NAME
        spec_copy["hostname"] = f"{name}-{rank}"
        spec_copy["subdomain"] = name
        spec_copy["restartPolicy"] = "Never"
        selector = dict(spec_copy.get("nodeSelector") or {})
        selector[GPU_PRODUCT_LABEL] = decision.gpu_type
        spec_copy["nodeSelector"] = selector
        labels = dict(pod_meta.get("labels") or {})
        labels |= {JOB_LABEL: name, GENERATION_LABEL: str(generation), GANG_LABEL: gang}
        annotations |= {
            GANG_SIZE_ANNOTATION: str(decision.workers),
            STRATEGY_ANNOTATION: spec.placement.strategy.value,
        }
        if spec.placement.required and spec.placement.topology is not TopologyLevel.ANY:
            annotations[TOPOLOGY_ANNOTATION] = spec.placement.topology.value
        if len(decision.placements) == decision.workers:  # the pass's node and GPUs
            node, gpus = decision.placements[rank]
            annotations |= {
                PLANNED_NODE_ANNOTATION: node,
                PLANNED_GPUS_ANNOTATION: ",".join(map(str, gpus)),
            }
            if decision.workers > 1:  # the extender reserves the whole gang from it
                annotations[PLANNED_GANG_ANNOTATION] = gang_plan_annotation(decision.placements)
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-g{generation}-{rank}",
                    "namespace": namespace,
                    "labels": labels,
                    "annotations": annotations,
                    "ownerReferences": [_owner(job)],
                },
                "spec": spec_copy,
            }
        )
    return pods


_ENV_NAMES = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "CHRONOTOPE_DATA_PARALLEL",
    "CHRONOTOPE_TENSOR_PARALLEL",
    "CHRONOTOPE_PIPELINE_PARALLEL",
    "CHRONOTOPE_GPU_TYPE",
    "CHRONOTOPE_CHECKPOINT_PATH",
    "CHRONOTOPE_MICRO_BATCH",
}
