"""Names every layer agrees on: GPU resources, node labels, pod phases (pure constants).

Nodes advertise GPUs the way the NVIDIA device plugin and GPU feature
discovery do; Chronotope adds its share resource. Defined once here so the
cluster specs, the extender, the controllers and the simulators cannot drift.
"""

from __future__ import annotations

__all__ = [
    "DONE_PHASES",
    "GANG_LABEL",
    "GANG_SIZE_ANNOTATION",
    "GENERATION_ANNOTATION",
    "GPU_COUNT_LABEL",
    "GPU_MEMORY_LABEL",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "HOSTNAME_LABEL",
    "NVLINK_LABEL",
    "PLANNED_FOR_ANNOTATION",
    "PREEMPTED_BY_ANNOTATION",
    "QUEUE_LABEL",
    "RACK_LABEL",
    "SCHEDULER_NAME",
    "SHARE_RESOURCE",
    "STRATEGY_ANNOTATION",
    "TOPOLOGY_ANNOTATION",
    "ZONE_LABEL",
]

SCHEDULER_NAME = "chronotope"
"""The `spec.schedulerName` of pods the Chronotope scheduler (kube-scheduler + extender) places."""
GPU_RESOURCE = "nvidia.com/gpu"
SHARE_RESOURCE = "chronotope.dev/gpu-share"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
ZONE_LABEL = "topology.kubernetes.io/zone"
RACK_LABEL = "chronotope.dev/rack"
"""Node label: the rack a node is in (a TrainingJob's `placement.topology: Rack`)."""
NVLINK_LABEL = "chronotope.dev/nvlink-domain"
"""Node label: the NVLink domain a node is in (`placement.topology: NVLinkDomain`)."""
HOSTNAME_LABEL = "kubernetes.io/hostname"
GANG_LABEL = "chronotope.dev/pod-group"
"""Pod label: the gang (pod group) a pod belongs to."""
GANG_SIZE_ANNOTATION = "chronotope.dev/pod-group-size"
"""Pod annotation: how many members the gang has."""
QUEUE_LABEL = "chronotope.dev/queue"
"""Pod label: the LocalQueue (in the pod's namespace) a serving pod's GPUs count against
(InferencePipeline stages: `spec.queue`; absent: `default`)."""
STRATEGY_ANNOTATION = "chronotope.dev/placement-strategy"
"""Pod annotation: the gang's placement strategy (`PlacementStrategy` values)."""
TOPOLOGY_ANNOTATION = "chronotope.dev/placement-topology"
"""Pod annotation: the topology domain every member of the gang must share (`TopologyLevel`
values but Any; a TrainingJob's worker carries it when its `placement.required` is true)."""
DONE_PHASES = ("Succeeded", "Failed")
"""Pod phases after which a pod holds no resources."""
GENERATION_ANNOTATION = "chronotope.dev/gang-generation"
"""TrainingJob annotation: the generation of its current gang (bumped on every restart)."""
PLANNED_FOR_ANNOTATION = "chronotope.dev/planned-for-replicas"
"""TrainingJob annotation: the `replicas` its gang was planned for, read only for jobs
started by operators that wrote no `status.plan.plannedForReplicas`."""
PREEMPTED_BY_ANNOTATION = "chronotope.dev/preempted-by"
"""TrainingJob annotation: the job that preempted it ("namespace/name"; empty once re-queued)."""
