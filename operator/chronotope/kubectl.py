"""`kubectl chronotope`: the GPU map, why an object waits, the plan, GPU use, queue order.

Installed as the `kubectl-chronotope` executable, which kubectl finds on PATH.
It follows kubectl's conventions: `--kubeconfig` (else `$KUBECONFIG`, else
~/.kube/config), `--context`, `-n/--namespace` or `-A/--all-namespaces`, and
`-o json|yaml|wide`. The views are built by `workloads.views` from plain
objects; this module only reads them (`kube.views`) and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

__all__ = ["main"]

CELLS_WIDTH = 120
"""GPU cells beyond this many characters are cut in the table (not with -o wide)."""


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    common.add_argument("--context", help="kubeconfig context")
    common.add_argument(
        "-n", "--namespace", help="namespace (default: the context's, else default)"
    )
    common.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    common.add_argument(
        "-o", "--output", choices=("table", "wide", "json", "yaml"), default="table"
    )
    parser = argparse.ArgumentParser(
        prog="kubectl chronotope", description=__doc__.splitlines()[0], parents=[common]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gpus = sub.add_parser("gpus", parents=[common], help="GPU map: holders and shares per GPU")
    gpus.add_argument("--gpu-type", help="only nodes with this GPU type")
    gpus.add_argument("-l", "--selector", help="node label selector, key=value[,key=value]")
    why = sub.add_parser("why", parents=[common], help="why KIND/NAME waits or sits where it is")
    why.add_argument("target", help="KIND/NAME: trainingjob, inferencepipeline, modelvariant, pod")
    sub.add_parser("plan", parents=[common], help="the TrainingJobs' space-time plan (text Gantt)")
    sub.add_parser(
        "top", parents=[common], help="GPU use by type, namespace and queue; pipelines' P99"
    )
    queue = sub.add_parser(
        "queue",
        parents=[common],
        help="pending TrainingJobs in admission order, with their positions",
    )
    queue.add_argument("name", nargs="?", help="only this Queue (default: every Queue)")
    queue.add_argument(
        "--local-queue", help="only this LocalQueue of the namespace (-n), with its positions"
    )
    return parser


def _connect(args: argparse.Namespace) -> tuple[Any, str]:
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(
        config_file=args.kubeconfig, context=args.context, client_configuration=cfg
    )
    namespace = args.namespace
    if namespace is None:
        _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
        if args.context:
            contexts, _ = config.list_kube_config_contexts(config_file=args.kubeconfig)
            active = next((c for c in contexts if c["name"] == args.context), active)
        namespace = (active.get("context") or {}).get("namespace") or "default"
    return client.ApiClient(cfg), namespace


def _print(data: Any, output: str) -> None:
    if output == "json":
        print(json.dumps(data, indent=2, default=str))
    else:
        import yaml

        print(yaml.safe_dump(data, sort_keys=False), end="")


def _gpus(api: Any, args: argparse.Namespace) -> int:
    from chronotope.kube.views import list_kind
    from chronotope.workloads.views import gpu_map, gpu_totals

    labels = dict(p.split("=", 1) for p in (args.selector or "").split(",") if "=" in p)
    rows = gpu_map(
        list_kind(api, "node", None),
        list_kind(api, "pod", None),
        gpu_type=args.gpu_type,
        labels=labels,
    )
    totals = gpu_totals(rows)
    if args.output in ("json", "yaml"):
        _print({"nodes": [r.as_dict() for r in rows], "totals": totals}, args.output)
        return 0
    width = max([len(r.node) for r in rows] + [4])
    print(f"{'NODE':<{width}}  {'TYPE':<16} GPUS")
    for r in rows:
        cells = "  ".join(f"{c.index}:{c.text()}" for c in r.gpus)
        if args.output != "wide" and len(cells) > CELLS_WIDTH:
            cells = cells[: CELLS_WIDTH - 3] + "..."
        print(f"{r.node:<{width}}  {r.gpu_type:<16} {cells}")
    for gpu_type, t in sorted(totals.items()):
        print(f"total {gpu_type}: {t['free']} free, {t['shared']} shared, {t['whole']} whole")
    return 0


def _why(api: Any, args: argparse.Namespace, namespace: str) -> int:
    from chronotope.kube.views import canonical, events_for, list_kind, read_kind
    from chronotope.workloads.views import gpu_map, gpu_totals

    kind_text, _, name = args.target.partition("/")
    kind = canonical(kind_text)
    if kind is None or not name:
        print(
            f"error: {args.target!r}: give KIND/NAME with KIND one of trainingjob, "
            "inferencepipeline, modelvariant, pod",
            file=sys.stderr,
        )
        return 2
    obj = read_kind(api, kind, namespace, name)
    if obj is None:
        print(f"error: {kind} {namespace}/{name} not found", file=sys.stderr)
        return 1
    totals = gpu_totals(gpu_map(list_kind(api, "node", None), list_kind(api, "pod", None)))
    free = {t: v["free"] for t, v in totals.items()}
    from chronotope.kube.views import KINDS
    from chronotope.workloads.training_quota import ENDED, HOLDING
    from chronotope.workloads.views import explain

    order = None
    if kind == "trainingjob" and (obj.get("status") or {}).get("phase") not in (*HOLDING, *ENDED):
        jobs = list_kind(api, "trainingjob", None)
        order, _ = _pending_order(api, list_kind(api, "queue", None), jobs)
    lines = explain(
        KINDS[kind][0],
        obj,
        events_for(api, namespace, kind, name),
        free_by_type=free,
        queue_order=order,
    )
    if args.output in ("json", "yaml"):
        _print(
            {"object": f"{namespace}/{name}", "kind": KINDS[kind][0], "lines": lines}, args.output
        )
    else:
        print("\n".join(lines))
    return 0


def _pending_order(
    api: Any, queues: list[Any], jobs: list[Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Every Queue's pending workloads in admission order (`training_quota.pending_order`).

    The InferencePipelines and serving groups that wait for quota are placed as
    the Queue's status places them (by age among the TrainingJobs; one whose
    status does not say what it asks after them); the second map is why each of those waits
    (its `whyWaiting`, a group's of its oldest variant).
    """
    from chronotope.kube.views import list_kind
    from chronotope.workloads.training_quota import (
        QuotaView,
        pending_order,
        serving_workloads,
        waiting_serving,
    )

    view = QuotaView.parse(
        queues, list_kind(api, "localqueue", None), list_kind(api, "namespace", None)
    )
    held = serving_workloads(view, list_kind(api, "pod", None))
    waiting = waiting_serving(
        list_kind(api, "inferencepipeline", None), list_kind(api, "modelvariant", None)
    )
    why = {w.workload.key: w.why for w in waiting}
    return dict(pending_order(view, jobs, held, waiting)), why


def _queue(api: Any, args: argparse.Namespace, namespace: str) -> int:
    from chronotope.kube.views import list_kind

    queues, jobs = list_kind(api, "queue", None), list_kind(api, "trainingjob", None)
    order, serving_why = _pending_order(api, queues, jobs)
    known = {str(q["metadata"]["name"]) for q in queues}
    if args.name is not None and args.name not in known:
        print(f"error: Queue {args.name} not found", file=sys.stderr)
        return 1
    why = {
        f"{j['metadata']['namespace']}/{j['metadata']['name']}": (j.get("status") or {}).get(
            "whyWaiting"
        )
        or ""
        for j in jobs
    } | serving_why
    rows = []
    for queue in sorted(known if args.name is None else {args.name}):
        for entry in order.get(queue, []):
            if args.local_queue is not None and (
                entry.local_queue != args.local_queue
                or not entry.workload.startswith(namespace + "/")
            ):
                continue
            row = entry.model_dump(by_alias=True, mode="json")
            rows.append({"queue": queue, **row, "whyWaiting": why.get(entry.workload, "")})
    if args.output in ("json", "yaml"):
        _print(rows, args.output)
        return 0
    if not rows:
        print("no pending workloads")
        return 0
    width = max([len(r["workload"]) for r in rows] + [8])
    print(
        f"{'QUEUE':<16}{'POS':>5}{'LQ-POS':>8}  {'WORKLOAD':<{width}}  {'LOCALQUEUE':<16}"
        f"{'PRIORITY':>9}  {'REASON':<18}{'START':<13}WHY"
    )
    for r in rows:
        text = r["whyWaiting"]
        if args.output != "wide" and len(text) > CELLS_WIDTH:
            text = text[: CELLS_WIDTH - 3] + "..."
        print(
            f"{r['queue']:<16}{r['position']:>5}{r['localQueuePosition']:>8}  "
            f"{r['workload']:<{width}}  {r['localQueue']:<16}{r['priority']:>9}  "
            f"{r.get('reason') or '-':<18}{_start_cell(r.get('predictedStartTime')):<13}{text}"
        )
    return 0


def _start_cell(at: str | None) -> str:
    """A predicted start as `MM-DD HH:MM` (UTC), or `-` when there is none."""
    from chronotope.workloads.replan import parse_time

    when = parse_time(at)
    return "-" if when is None else f"{when:%m-%d %H:%M}"


def _plan(api: Any, args: argparse.Namespace, namespace: str | None) -> int:
    from chronotope.kube.views import list_kind
    from chronotope.workloads.views import gantt

    jobs = list_kind(api, "trainingjob", namespace)
    if args.output in ("json", "yaml"):
        _print(
            [
                {
                    "job": f"{j['metadata']['namespace']}/{j['metadata']['name']}",
                    "phase": (j.get("status") or {}).get("phase"),
                    "plan": (j.get("status") or {}).get("plan"),
                }
                for j in jobs
            ],
            args.output,
        )
        return 0
    print("\n".join(gantt(jobs, datetime.now(UTC))))
    return 0


def _top(api: Any, args: argparse.Namespace) -> int:
    from chronotope.kube.views import list_kind
    from chronotope.workloads.views import pipeline_latency, usage

    data: dict[str, Any] = dict(
        usage(
            list_kind(api, "node", None),
            list_kind(api, "pod", None),
            list_kind(api, "trainingjob", None),
            list_kind(api, "localqueue", None),
        )
    )
    data["pipelines"] = pipeline_latency(list_kind(api, "inferencepipeline", None))
    if args.output in ("json", "yaml"):
        _print(data, args.output)
        return 0
    print(f"{'GPU TYPE':<18}{'USED':>8}{'TOTAL':>8}")
    for t, v in sorted(data["byType"].items()):
        print(f"{t:<18}{v['used']:>8.2f}{v['total']:>8.0f}")
    print(f"\n{'NAMESPACE':<26}{'GPUS':>8}")
    for ns, v in sorted(data["byNamespace"].items()):
        print(f"{ns:<26}{v['gpus']:>8.2f}")
    print(f"\n{'QUEUE':<26}{'GPUS':>8}{'JOBS':>6}")
    for q, v in sorted(data["byQueue"].items()):
        print(f"{q:<26}{v['gpus']:>8.0f}{v['jobs']:>6.0f}")
    if data["pipelines"]:
        _print_latency(data["pipelines"])
    return 0


def _print_latency(rows: list[dict[str, Any]]) -> None:
    """The pipelines' P99 table: predicted, observed, SLO (ms) and SloMet."""

    def ms(v: Any) -> str:
        return "-" if v is None else f"{v:g}"

    width = max([len(r["pipeline"]) for r in rows] + [8])
    print(f"\n{'PIPELINE':<{width}}{'PREDICTED':>11}{'OBSERVED':>10}{'SLO':>8}  SLO-MET")
    for r in rows:
        met = f"{r['sloMet']} ({r['reason']})" if r["sloMet"] else "-"
        print(
            f"{r['pipeline']:<{width}}{ms(r['predictedP99Ms']):>11}"
            f"{ms(r['observedP99Ms']):>10}{ms(r['sloMs']):>8}  {met}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `kubectl chronotope` command; a cluster that cannot be reached is one line."""
    args = _parser().parse_args(argv)
    try:
        api, namespace = _connect(args)
    except Exception as exc:  # a missing or broken kubeconfig: one line, no traceback
        print(f"error: cannot load the kubeconfig: {exc}", file=sys.stderr)
        return 1
    scope = None if args.all_namespaces else namespace
    try:
        with api:
            if args.command == "gpus":
                return _gpus(api, args)
            if args.command == "why":
                return _why(api, args, namespace)
            if args.command == "plan":
                return _plan(api, args, scope)
            if args.command == "queue":
                return _queue(api, args, namespace)
            return _top(api, args)
    except Exception as exc:  # unreachable or refusing cluster: one line, no traceback
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 1


def _one_line(exc: Exception) -> str:
    """An API error as `status reason`, anything else as its first line."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is not None and reason:
        return f"the API server answered {status} {reason}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


if __name__ == "__main__":
    raise SystemExit(main())
