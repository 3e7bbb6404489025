"""Read the openb GPU-sharing trace (Alibaba, ATC'23) into solver models.

Node list columns: `sn,cpu_milli,memory_mib,gpu,model`; pod list columns:
`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`, where
`gpu_spec` is '|'-separated allowed GPU models (empty = any). Some variants
omit the trailing columns; they read as "any model". Source:
alibaba/clusterdata `cluster-trace-gpu-v2023/csv/`.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from chronotope.solver.frag import TypicalPod, typical_pods
from chronotope.solver.model import ClusterSnapshot, Gpu, Node, PodRequest

__all__ = ["load_nodes", "load_pods", "trace_name"]


def load_nodes(path: Path) -> ClusterSnapshot:
    """Read an openb node list CSV into a cluster snapshot."""
    nodes: list[Node] = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            count = int(row["gpu"] or 0)
            model = (row.get("model") or "").strip()
            gpus = tuple(Gpu(index=i, model=model) for i in range(count))
            nodes.append(
                Node(
                    name=row["sn"],
                    cpu_milli=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                    gpus=gpus,
                )
            )
    return ClusterSnapshot(nodes=tuple(nodes))


def typical_of(path: Path | None) -> list[TypicalPod] | None:
    """The request mix of the pod list at `path` (`--typical-pods`); None for no path."""
    return None if path is None else typical_pods(load_pods(path))


def load_pods(path: Path) -> list[PodRequest]:
    """Read an openb pod list CSV; a pod with zero GPUs or zero GPU share asks for no GPU."""
    pods: list[PodRequest] = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            num = int(row["num_gpu"] or 0)
            milli = int(row["gpu_milli"] or 0)
            if num == 0 or milli == 0:
                num, milli = 0, 0
            spec = (row.get("gpu_spec") or "").strip()
            pods.append(
                PodRequest(
                    name=row["name"],
                    cpu_milli=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                    num_gpus=num,
                    gpu_milli=milli,
                    gpu_models=tuple(m for m in spec.split("|") if m),
                )
            )
    return pods


def trace_name(path: Path) -> str:
    """'openb_pod_list_gpushare40.csv' -> 'gpushare40'."""
    stem = path.stem
    match = re.match(r"openb_pod_list_(.+)$", stem)
    return match.group(1) if match else stem
