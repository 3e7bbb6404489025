"""How fast the operator fills a fresh demo cluster with one-GPU TrainingJobs (issue 18, item 6).

Usage: python bench/operator_backfill.py [--jobs 100,200] [--every 30] [--until 150] [--seed 0]
       [--checkpoint]

For each job count: starts a fresh local cluster with the demo spec
(manifests/clusters/demo.yaml: 60 GPUs, of which 56 are H100, A100, V100 or L4),
the Chronotope scheduler (kube-scheduler + extender) and the operator, submits
that many one-GPU TrainingJobs at once (each accepts the four types, relative
speeds H100 1.6, A100 1.0, V100 0.6, L4 0.5; `estimate.durationSeconds`
uniform in 1-4 h, seeded; no deadlines), then every `--every` seconds until
`--until` prints the GPUs busy (workers bound to a node, counted by their GPU
limit), per type, the jobs by phase, the operator's CPU seconds and the gangs
restarted so far (with `--checkpoint` every job checkpoints, so the cluster
policy's lease may stop a job for shorter work or move it to a faster type).
The goal of the issue is at least 54 of the 56 GPUs busy within 150 s with
200 jobs. Prints figures only; never fails on them. The cluster is torn down
at the end (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import client

from chronotope.devcluster.cluster import LocalCluster
from chronotope.devcluster.settings import ClusterSettings
from chronotope.kube.client import api_client
from chronotope.paths import REPO_ROOT
from chronotope.sim.clusterspec import load_spec

GROUP, VERSION, PLURAL = "chronotope.dev", "v1alpha1", "trainingjobs"
NAMESPACE = "scale"
TYPES = (("A100-SXM4-80GB", 1.0), ("H100-SXM5-80GB", 1.6), ("V100-SXM2-32GB", 0.6), ("L4", 0.5))
GPU_LABEL = "nvidia.com/gpu.product"


def job(name: str, seconds: int, *, checkpoint: bool = False) -> dict[str, Any]:
    """One one-GPU TrainingJob accepting the four training types, no deadline.

    `checkpoint`: the job checkpoints, so the cluster policy's lease may stop and move it.
    """
    out: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "gpu": {"count": 1},
            "gpuTypes": [{"name": t, "relativeSpeed": s} for t, s in TYPES],
            "estimate": {"referenceGpuType": TYPES[0][0], "durationSeconds": seconds},
            "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
        },
    }
    if checkpoint:
        out["spec"]["checkpoint"] = {"path": f"/ckpt/{name}"}
    return out


def usable_gpus(core: client.CoreV1Api) -> dict[str, int]:
    """GPUs per type of the four training types on Ready nodes."""
    out: Counter[str] = Counter()
    wanted = {t for t, _ in TYPES}
    for n in core.list_node().items:
        product = (n.metadata.labels or {}).get(GPU_LABEL)
        if product in wanted:
            out[product] += int((n.status.allocatable or {}).get("nvidia.com/gpu", "0"))
    return dict(out)


def busy_gpus(core: client.CoreV1Api, node_types: dict[str, str]) -> dict[str, int]:
    """GPUs held by bound TrainingJob workers, per type."""
    out: Counter[str] = Counter()
    for pod in core.list_namespaced_pod(NAMESPACE, label_selector="chronotope.dev/job").items:
        if pod.metadata.deletion_timestamp or not pod.spec.node_name:
            continue
        if pod.status.phase in ("Succeeded", "Failed"):
            continue
        gpus = sum(
            int(((c.resources and c.resources.limits) or {}).get("nvidia.com/gpu", "0"))
            for c in pod.spec.containers
        )
        out[node_types.get(pod.spec.node_name, "?")] += gpus
    return dict(out)


def phases(custom: client.CustomObjectsApi) -> tuple[Counter[str], int]:
    """The jobs by phase, and their gang restarts so far (lease stops among them)."""
    items = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
    statuses = [j.get("status") or {} for j in items]
    restarts = sum(int(s.get("restarts") or 0) for s in statuses)
    return Counter(str(s.get("phase") or "-") for s in statuses), restarts


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(n: int, args: argparse.Namespace, state_root: Path) -> None:
    """One fresh cluster, `n` jobs, the figures every `args.every` seconds."""
    base = ClusterSettings.from_env()
    settings = ClusterSettings(
        cache_dir=base.cache_dir, state_root=state_root, bin_dir=base.bin_dir
    )
    cluster = LocalCluster(settings, name=f"bench-backfill-{n}")
    state = cluster.up(load_spec(REPO_ROOT / "manifests" / "clusters" / "demo.yaml"))
    try:
        cluster.start_chronotope_scheduler()
        cluster.start_operator(webhook=False)
        record = cluster.load_state()
        assert record is not None
        pid = next(p["pid"] for p in record.processes if p["name"] == "chronotope-operator")
        with api_client(state.kubeconfig) as api:
            core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            while True:  # the ServiceAccount admission plugin needs the default account
                try:
                    core.read_namespaced_service_account("default", NAMESPACE)
                    break
                except client.ApiException:
                    time.sleep(0.5)
            node_types = {
                n.metadata.name: (n.metadata.labels or {}).get(GPU_LABEL, "")
                for n in core.list_node().items
            }
            usable = usable_gpus(core)
            total = sum(usable.values())
            rng = random.Random(args.seed)
            cpu0 = cpu_seconds(pid)
            t0 = time.monotonic()
            for i in range(n):
                seconds = rng.randint(3600, 4 * 3600)
                custom.create_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    NAMESPACE,
                    PLURAL,
                    job(f"s{i:03d}", seconds, checkpoint=args.checkpoint),
                )
            print(
                f"\n{n} jobs submitted in {time.monotonic() - t0:.1f} s; usable GPUs "
                f"{total} ({', '.join(f'{t} {c}' for t, c in sorted(usable.items()))})"
            )
            print(
                f"{'t (s)':>6} {'busy':>9} {'operator CPU s':>15} {'restarts':>9}  "
                "per type / phases"
            )
            for tick in range(args.every, args.until + 1, args.every):
                time.sleep(max(0.0, t0 + tick - time.monotonic()))
                busy = busy_gpus(core, node_types)
                ph, restarts = phases(custom)
                print(
                    f"{tick:>6} {sum(busy.values()):>4}/{total:<4} "
                    f"{cpu_seconds(pid) - cpu0:>15.1f} {restarts:>9}  "
                    f"{dict(sorted(busy.items()))} {dict(sorted(ph.items()))}",
                    flush=True,
                )
    finally:
        cluster.down()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="200", help="comma-separated job counts, one cluster each")
    ap.add_argument("--every", type=int, default=30, help="seconds between samples")
    ap.add_argument("--until", type=int, default=150, help="seconds after submitting to stop")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--checkpoint",
        action="store_true",
        help="every job checkpoints (the cluster policy's lease may stop and move it)",
    )
    args = ap.parse_args()
    counts = [int(x) for x in args.jobs.split(",") if x]
    print(f"machine: {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="chronotope-bench-") as tmp:
        for n in counts:
            run(n, args, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
