"""One scheduling pass in process: the operator scale benchmark's jobs on the openb nodes.

Usage: python bench/training_pass.py [--jobs 2000] [--queues 10] [--runs 4] [--seed 0]
       [--when-can-borrow Borrow|TryNextFlavor] [--dedicated FRACTION] [--worker-cpu CORES]
       [--repelling FRACTION [--repelling-key LABEL]] [--racked FRACTION] [--spread FRACTION]
       [--checkpoint] [--settled MINUTES [--first N]]

Builds the TrainingJobs `bench/operator_scale.py` submits (same seeded generator,
round-robin over `--queues` team namespaces, each queue an equal share of every GPU type
in one cohort; `--queues 0`: no queues, quota off) and the openb cluster's 1,213 GPU
nodes as Node objects (`sim.clusterspec.node_manifests`), and times
`workloads.training_pass.schedule` over all of them with no pods yet: the pass the
operator makes when the jobs arrive. No API server: the figure is the pass's own cost,
to compare code changes (`git stash` and run again); prints each run's seconds, the
starts and waits, and a hash of the verdicts so two versions can be checked to decide
the same.

`--dedicated F` taints every 1/F-th GPU node `dedicated=team-00:NoSchedule` and gives
the first team's jobs the toleration, so every other job is decided on the nodes it
may use (`workloads.node_fit`); `--worker-cpu C` makes every worker request C cores,
so each node counts only the workers its CPU holds. Both measure what node rules cost.
`--repelling F` binds to every 1/F-th GPU node a pod (no GPU) whose required pod
anti-affinity keeps pods labelled `app=team-00` (of any namespace) off it, and gives
the first team's workers that label: what pod anti-affinity costs the pass (`NodeRules.shuns`);
with `--repelling-key chronotope.dev/rack` (or a zone label) the anti-affinity is on
that domain (`node_fit.domains`: it keeps them out of the pod's whole rack).
`--racked F` makes every 1/F-th job require one rack (`placement.topology: Rack`,
`required: true`; the openb pools are one rack each): what a required topology
costs the pass (`training.workers_that_fit` per domain, `capacity.take` inside one).
`--spread F` gives every 1/F-th job a topology spread constraint of one worker per
node over its own workers (`maxSkew: 1` on `kubernetes.io/hostname`, `matchLabelKeys:
[chronotope.dev/job]`): what reading topology spread costs (`node_fit.spread_terms`;
such a gang is placed Spread, fewest-first, in levels).
`--checkpoint` makes every job checkpoint (`operator_scale.py --checkpoint`), so the
fleet policy may give a running job's lease up. `--settled M` times the pass after
that one instead: the first pass's starts run (their workers bound where it placed
them, `gang.worker_pods`) for M minutes, the others still wait. With `--checkpoint`
this is the pass that weighs stopping and moving running jobs for waiting ones
(`gates._NodeCheck.fits` with jobs leaving). `--first N`: the first pass sees only
the first N jobs, as a pass does while a burst is still being submitted, so the
settled pass weighs giving the leases of the jobs it started to the later ones.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from chronotope.paths import REPO_ROOT
from chronotope.sharing.labels import GENERATION_ANNOTATION
from chronotope.sim.clusterspec import load_spec, node_manifests
from chronotope.workloads.capacity import cluster_capacity
from chronotope.workloads.gang import worker_pods
from chronotope.workloads.gates import Decider
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.quota import StopCause
from chronotope.workloads.training import Action, Decision
from chronotope.workloads.training_pass import schedule, started_plan
from chronotope.workloads.training_quota import QuotaView

sys.path.insert(0, str(Path(__file__).parent))
from operator_scale import add_when_can_borrow, make_job, per_type, queue_objects

NOW = datetime(2030, 1, 1, 11, 0, tzinfo=UTC)


def ready_nodes(spec_path: Path) -> list[dict[str, Any]]:
    """The spec's nodes as Node objects that are Ready (as kwok marks them)."""
    nodes = node_manifests(load_spec(spec_path))
    for n in nodes:
        n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return nodes


def running(job: dict[str, Any], d: Decision) -> list[dict[str, Any]]:
    """Mark `job` Running as `d` started it at NOW; its workers, bound where `d` placed them."""
    job["metadata"]["annotations"] = {GENERATION_ANNOTATION: "1"}
    plan = started_plan(d, NOW)
    job["status"] = {"phase": "Running", "plan": plan, "startTime": NOW.isoformat()}
    pods = worker_pods(job, job_spec(job), d, 1)
    for pod, (node, _) in zip(pods, d.placements, strict=True):
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
    return pods


def double_booked(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], starts: list[Decision]
) -> list[str]:
    """The nodes where the pass's starts ask for more GPUs than the bound pods leave free.

    Each start's workers go where the pass placed them (`Decision.placements`, which the
    extender honours); a pass must never place two workers on one GPU. Free GPUs are
    the cluster's as the pass reads them (`capacity.cluster_capacity`).
    """
    free = {n.name: n.free for n in cluster_capacity(nodes, pods)}
    asked: Counter[str] = Counter()
    for d in starts:
        for node, indices in d.placements:
            asked[node] += len(indices) or d.gpus_per_worker
    return sorted(n for n, k in asked.items() if k > free.get(n, 0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--queues", type=int, default=10)
    add_when_can_borrow(ap)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cluster", default=str(REPO_ROOT / "manifests" / "clusters" / "openb.yaml"))
    ap.add_argument("--dedicated", type=float, default=0.0)
    ap.add_argument("--worker-cpu", type=int, default=0)
    ap.add_argument("--repelling", type=float, default=0.0)
    ap.add_argument("--repelling-key", default="kubernetes.io/hostname")
    ap.add_argument("--racked", type=float, default=0.0)
    ap.add_argument("--spread", type=float, default=0.0)
    ap.add_argument("--checkpoint", action="store_true", help="every job checkpoints")
    ap.add_argument(
        "--settled",
        type=float,
        default=0.0,
        metavar="MINUTES",
        help="time the pass after the first one's starts have run this long",
    )
    ap.add_argument(
        "--first",
        type=int,
        default=0,
        metavar="N",
        help="with --settled: the first pass sees only the first N jobs (those submitted first)",
    )
    ap.add_argument(
        "--verdicts", type=Path, help="also write each job's verdict here, one per line (to diff)"
    )
    args = ap.parse_args()
    spec_path = Path(args.cluster)
    total, widest = per_type(load_spec(spec_path))
    nodes = ready_nodes(spec_path)
    taint = {"key": "dedicated", "value": "team-00", "effect": "NoSchedule"}
    if args.dedicated > 0:
        for n in nodes[:: max(1, round(1 / args.dedicated))]:
            n["spec"] = {**(n.get("spec") or {}), "taints": [taint]}
    pods = []
    if args.repelling > 0:
        term = {
            "labelSelector": {"matchLabels": {"app": "team-00"}},
            "topologyKey": args.repelling_key,
            "namespaceSelector": {},  # every namespace: the team's too
        }
        anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        for k, n in enumerate(nodes[:: max(1, round(1 / args.repelling))]):
            spec = {"nodeName": n["metadata"]["name"], "affinity": anti, "containers": [{}]}
            meta = {"name": f"serve-{k}", "namespace": "serving", "labels": {"app": "serve"}}
            pods.append({"metadata": meta, "spec": spec, "status": {"phase": "Running"}})
    queues = queue_objects(args.queues, total, args.when_can_borrow)
    teams = [local["metadata"]["namespace"] for _, local in queues] or ["scale"]
    view = QuotaView.parse([q for q, _ in queues], [local for _, local in queues])
    rng = random.Random(args.seed)
    jobs = []
    for i in range(args.jobs):
        job = make_job(f"j{i:04d}", rng, widest, checkpoint=args.checkpoint)
        job["metadata"].update(
            namespace=teams[i % len(teams)],
            creationTimestamp=f"2030-01-01T10:{i // 60 % 60:02d}:{i % 60:02d}Z",
            uid=f"uid-{i}",
            generation=1,
            resourceVersion=str(i + 1),
        )
        pod = job["spec"]["template"]["spec"]
        if args.dedicated > 0 and i % len(teams) == 0:
            pod["tolerations"] = [{**taint, "operator": "Equal"}]
        if args.repelling > 0 and i % len(teams) == 0:
            meta = job["spec"]["template"].setdefault("metadata", {})
            meta["labels"] = {**(meta.get("labels") or {}), "app": "team-00"}
        if args.worker_cpu:
            pod["containers"][0]["resources"] = {"requests": {"cpu": str(args.worker_cpu)}}
        if args.racked > 0 and i % max(1, round(1 / args.racked)) == 0:
            placement = job["spec"].get("placement") or {}
            job["spec"]["placement"] = placement | {"topology": "Rack", "required": True}
        if args.spread > 0 and i % max(1, round(1 / args.spread)) == 0:
            pod["topologySpreadConstraints"] = [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {},
                    "matchLabelKeys": ["chronotope.dev/job"],
                }
            ]
        jobs.append(job)
    now = NOW
    if args.settled > 0:
        decider = Decider(lambda _ns, name: f"no profile {name}", lambda *_: [])
        early = jobs[: args.first] if args.first > 0 else jobs
        first = schedule(early, nodes, pods, view, decider=decider, now=NOW)
        now = NOW + timedelta(minutes=args.settled)
        for job in jobs:
            v = first.verdicts.get(f"{job['metadata']['namespace']}/{job['metadata']['name']}")
            if v is not None and v.decision.action is Action.START:
                pods += running(job, v.decision)
    seconds = []
    for _ in range(args.runs):
        decider = Decider(lambda _ns, name: f"no profile {name}", lambda *_: [])
        started = time.perf_counter()
        done = schedule(jobs, nodes, pods, view, decider=decider, now=now)
        seconds.append(time.perf_counter() - started)
    verdicts = sorted(
        (k, v.decision.action.value, v.decision.gpu_type, v.decision.reason)
        for k, v in done.verdicts.items()
    )
    # a settled pass's lease stops are part of what it decided
    verdicts += sorted((k, "Stop", None, why) for k, why in done.stops.items())
    starts = sum(v.decision.action is Action.START for v in done.verdicts.values())
    waits = len(done.verdicts) - starts
    gpus = sum(
        v.decision.workers * v.decision.gpus_per_worker
        for v in done.verdicts.values()
        if v.decision.action is Action.START
    )
    # and so are quota's: the leases within a queue (`quota.admit` pass 6)
    in_queue = sorted(
        (k, v.admission.victims)
        for k, v in done.verdicts.items()
        if v.admission is not None and v.admission.cause is StopCause.LEASE and v.admission.victims
    )
    verdicts += [(k, "Lease", None, " ".join(victims)) for k, victims in in_queue]
    stops = (
        f"; {len(done.stops)} lease stops, {len(in_queue)} leases within a queue"
        if args.settled > 0
        else ""
    )
    over = double_booked(
        nodes,
        pods,
        [v.decision for v in done.verdicts.values() if v.decision.action is Action.START],
    )
    if over:
        print(f"FAULT: the pass double-books GPUs on {len(over)} node(s): {', '.join(over[:5])}")
    digest = hashlib.sha1(repr(verdicts).encode()).hexdigest()[:12]
    if args.verdicts is not None:
        args.verdicts.write_text("".join(f"{k} {a} {t} {why}\n" for k, a, t, why in verdicts))
    print(
        f"{len(jobs)} jobs on {len(nodes)} nodes: pass {', '.join(f'{s:.2f}' for s in seconds)} s "
        f"(best {min(seconds):.2f} s); {starts} starts on {gpus} GPUs, {waits} "
        f"waits{stops}; verdicts {digest}"
    )
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
