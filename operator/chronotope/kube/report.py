"""Human-readable views of cluster state for the CLI (a read-only client)."""

from __future__ import annotations

from collections import Counter

from kubernetes import client

__all__ = ["gpu_node_table"]

_GPU = "nvidia.com/gpu"


def gpu_node_table(api: client.ApiClient, limit: int = 40) -> str:
    """A table of nodes with GPU model, capacity and topology; summarised when long."""
    nodes = client.CoreV1Api(api).list_node().items
    rows = [("NAME", "GPU", "GPUS", "GPU-MEM(MiB)", "ZONE", "RACK", "READY")]
    per_model: Counter[str] = Counter()
    for node in nodes:
        labels = node.metadata.labels or {}
        gpus = (node.status.capacity or {}).get(_GPU, "0")
        model = labels.get("nvidia.com/gpu.product", "-")
        per_model[model] += int(gpus)
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
        rows.append(
            (
                node.metadata.name,
                model,
                gpus,
                labels.get("nvidia.com/gpu.memory", "-"),
                labels.get("topology.kubernetes.io/zone", "-"),
                labels.get("chronotope.dev/rack", "-"),
                "yes" if ready else "no",
            )
        )
    shown = rows[: limit + 1]
    widths = [max(len(r[i]) for r in shown) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in shown]
    if len(rows) > len(shown):
        lines.append(f"... and {len(rows) - len(shown)} more nodes")
    totals = ", ".join(f"{m}: {n}" for m, n in sorted(per_model.items()) if m != "-")
    lines.append(f"{len(nodes)} nodes, {sum(per_model.values())} GPUs ({totals})")
    return "\n".join(lines)
