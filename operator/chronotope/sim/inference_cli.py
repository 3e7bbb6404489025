"""`chronotope simulate inference`: an InferencePipeline's policies on an arrival trace."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]

SUMMARY = (
    "policy",
    "seed",
    "requests",
    "p99_ms",
    "slo_miss_pct",
    "cost_per_hour",
    "gpu_hours",
    "scale_events",
)


def add_parser(traces: Any) -> None:
    """Register `simulate inference` on the trace subcommands."""
    p = traces.add_parser("inference", help="an InferencePipeline on an arrival trace")
    p.add_argument("--pipeline", type=Path, required=True, help="InferencePipeline YAML")
    p.add_argument(
        "--trace",
        type=Path,
        required=True,
        help="Azure LLM CSV (TIMESTAMP,...), Mooncake JSONL (timestamp ms) or one time per line",
    )
    p.add_argument("--target-qps", type=float, required=True, help="rescale to this mean rate")
    p.add_argument("--policies", default="peak,hpa,inferline,chronotope", help="comma-separated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument(
        "--cold-start-s", type=float, default=0.0, help="seconds before a new replica serves"
    )
    p.add_argument(
        "--rate-window-s",
        type=float,
        default=5.0,
        help="the chronotope tuner reads the rate over this window, as rate(x[5s]) would",
    )
    p.add_argument(
        "--tuner-envelope-s",
        type=float,
        default=60.0,
        help="the chronotope tuner also reads rates over windows doubling from the rate window "
        "up to this (the operator's --tuner-envelope-s; no longer than the rate window: one rate)",
    )
    p.add_argument(
        "--tuner-down-delay-s",
        type=float,
        default=60.0,
        help="the tuned rows scale down only this long after their last change "
        "(the operator's --tuner-down-delay-s)",
    )
    p.add_argument(
        "--planning-share",
        type=float,
        default=0.25,
        help="share of the trace the planners see first (the rest is served)",
    )
    p.set_defaults(func=_handle)


def _handle(args: argparse.Namespace) -> int:
    import yaml

    from chronotope.api.v1alpha1.inferencepipeline import InferencePipelineSpec
    from chronotope.planners.inferline import Infeasible, model_from_spec
    from chronotope.sim.inference import (
        INFERENCE_POLICIES,
        TunerSettings,
        cost_floor,
        deadline_floor,
        load_arrivals,
        rescale,
        run_policy,
    )

    doc = yaml.safe_load(args.pipeline.read_text())
    spec = InferencePipelineSpec.model_validate(doc.get("spec", doc))
    model = model_from_spec(spec, {})
    arrivals = rescale(load_arrivals(args.trace), args.target_qps)
    cut = max(1, int(len(arrivals) * args.planning_share))
    planning, serving = arrivals[:cut], arrivals[cut:] - arrivals[cut]
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in INFERENCE_POLICIES]
    if unknown:
        print(f"error: unknown policies {unknown}; one of {INFERENCE_POLICIES}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    runs = []
    for policy in policies:
        run = run_policy(
            policy,
            model,
            planning,
            serving,
            seed=args.seed,
            cold_start_s=args.cold_start_s,
            tuner=TunerSettings(
                rate_window_s=args.rate_window_s,
                down_delay_s=args.tuner_down_delay_s,
                envelope_s=args.tuner_envelope_s,
            ),
        )
        if isinstance(run, Infeasible):
            print(f"error: {policy}: {run.reason}", file=sys.stderr)
            return 1
        runs.append(run)
        rows.append(
            {
                "policy": policy,
                "seed": args.seed,
                "requests": run.requests,
                "p99_ms": round(run.p99_ms, 1),
                "slo_miss_pct": round(run.slo_miss_pct, 2),
                "cost_per_hour": round(run.cost_per_hour, 3),
                "gpu_hours": round(run.gpu_hours, 4),
                "scale_events": run.scale_events,
            }
        )
        print(", ".join(f"{k}={v}" for k, v in rows[-1].items()))
    peak = next((r for r in runs if r.policy == "peak"), None)
    for label, floor in (
        ("cost floor", cost_floor(model, serving)),
        ("deadline floor", deadline_floor(model, serving, seed=args.seed)),
    ):
        line = f"{label}: {floor:.3f}/h (no policy that serves 99 % of the trace costs less)"
        if peak is not None and peak.cost_per_hour > 0:
            line += f"; {floor / peak.cost_per_hour:.2f}x the peak row"
        print(line)
    with (args.out / "summary.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=SUMMARY)
        writer.writeheader()
        writer.writerows(rows)
    _plot(args.out / "replicas.png", runs, [s.name for s in model.stages], serving)
    print(f"written to {args.out}")
    return 0


def _plot(path: Path, runs: list[Any], stages: list[str], serving: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 2.6 * len(runs)), squeeze=False)
    end = float(serving[-1]) if len(serving) else 1.0
    for row, run in zip(axes, runs, strict=True):
        for name, sched in zip(stages, run.schedules, strict=True):
            ts = [t for t, _ in sched] + [end]
            ks = [k for _, k in sched] + [sched[-1][1]]
            row[0].step(ts, ks, where="post", label=name)
        row[0].set_title(f"{run.policy}: replicas per stage")
        row[0].legend(fontsize=7)
        order = np.argsort(serving)
        row[1].plot(serving[order], run.latencies_s[order] * 1000, ",", alpha=0.4)
        row[1].set_title(f"{run.policy}: latency (ms) by arrival time")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
