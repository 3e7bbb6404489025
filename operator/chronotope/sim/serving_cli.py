"""`chronotope simulate variants`: many fine-tuned variants of one base on G GPUs, per policy."""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path
from typing import Any

from chronotope.paths import data_file

__all__ = ["SUMMARY", "add_parser"]

SUMMARY = (
    "policy",
    "seed",
    "variants",
    "gpus",
    "requests",
    "slo_attainment_pct",
    "p99_ttft_ms",
    "p99_latency_ms",
    "swaps_per_1k",
    "max_qps_at_slo",
)


def add_parser(traces: Any) -> None:
    """Register `simulate variants` on the trace subcommands."""
    p = traces.add_parser(
        "variants", help="fine-tuned variants over a shared base (DeltaZip) on an LLM trace"
    )
    p.add_argument(
        "--trace",
        type=Path,
        default=data_file("azure-llm", "AzureLLMInferenceTrace_conv.csv"),
        help="Azure LLM CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or Mooncake JSONL "
        "(default: the Azure conv trace in data/azure-llm/)",
    )
    p.add_argument("--variants", type=int, default=64, help="variants of the base")
    p.add_argument("--zipf", type=float, default=1.0, help="popularity: Zipf exponent")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--gpu-type", default="A100-SXM4-80GB", help="a GPU type of the catalogue")
    p.add_argument("--policies", default="dedicated,swap,deltazip,chronotope")
    p.add_argument("--seed", type=int, default=0, help="seeds the variant of each request")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--base-mib", type=int, default=13000, help="base weights (Llama-2-7B FP16)")
    p.add_argument("--params-b", type=float, default=6.7, help="base parameters, billions")
    p.add_argument("--delta-mib", type=int, default=1300, help="compressed delta size")
    p.add_argument("--max-deltas", type=int, default=8, help="distinct deltas in one batch")
    p.add_argument("--ttft-slo-ms", type=float, default=2000.0)
    p.add_argument("--tpot-slo-ms", type=float, default=150.0)
    p.add_argument("--requests", type=int, default=0, help="first N requests only (0: all)")
    p.add_argument(
        "--qps",
        type=float,
        default=0.0,
        help="rate of the per-policy rows (0: the deltazip policy's max_qps_at_slo, "
        "so every row is measured at one rate)",
    )
    p.set_defaults(func=_handle)


def _handle(args: argparse.Namespace) -> int:
    import numpy as np

    from chronotope.planners.llmcost import GPUS, CostModel, ModelShape
    from chronotope.sim.inference import load_requests
    from chronotope.sim.serving import (
        SERVING_POLICIES,
        ServingSetup,
        Slo,
        Workload,
        max_rate_at_slo,
        simulate,
        zipf_variants,
    )

    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in SERVING_POLICIES]
    if unknown or args.gpu_type not in GPUS:
        print(
            f"error: policies from {SERVING_POLICIES}, --gpu-type from {sorted(GPUS)}",
            file=sys.stderr,
        )
        return 2
    trace = load_requests(args.trace)
    n = len(trace.times) if args.requests <= 0 else min(args.requests, len(trace.times))
    prompt, output = trace.prompt_tokens[:n], trace.output_tokens[:n]
    if (prompt < 0).any() or (output < 0).any():
        print(f"error: {args.trace} has no token counts", file=sys.stderr)
        return 2
    work = Workload(
        trace.times[:n],
        np.maximum(prompt, 1),
        np.maximum(output, 1),
        zipf_variants(n, args.variants, args.zipf, args.seed),
    )
    cost = CostModel(GPUS[args.gpu_type], ModelShape.of(args.base_mib, args.params_b))
    setup = ServingSetup(
        args.gpus,
        cost,
        args.variants,
        delta_mib=args.delta_mib,
        max_deltas=args.max_deltas,
        slo=Slo(args.ttft_slo_ms / 1000, args.tpot_slo_ms / 1000),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    best: dict[str, float] = {}
    curves: dict[str, list[Any]] = {}
    for policy in policies:
        started = time.perf_counter()
        best[policy], curves[policy] = max_rate_at_slo(policy, setup, work)
        took = time.perf_counter() - started
        print(f"{policy}: max_qps_at_slo={best[policy]} ({len(curves[policy])} runs, {took:.0f} s)")
    qps = args.qps or best.get("deltazip") or max(best.values()) or work.qps
    print(f"per-policy rows at {qps:.3f} QPS")
    rows = []
    for policy in policies:
        run = simulate(policy, setup, work.at_rate(qps))
        rows.append(
            {
                "policy": policy,
                "seed": args.seed,
                "variants": args.variants,
                "gpus": args.gpus,
                "requests": run.requests,
                "slo_attainment_pct": run.slo_attainment_pct,
                "p99_ttft_ms": run.p99_ttft_ms,
                "p99_latency_ms": run.p99_latency_ms,
                "swaps_per_1k": run.swaps_per_1k,
                "max_qps_at_slo": best[policy],
            }
        )
        print(", ".join(f"{k}={v}" for k, v in rows[-1].items()))
    with (args.out / "summary.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=SUMMARY)
        writer.writeheader()
        writer.writerows(rows)
    _write_curve(args.out / "attainment.csv", curves)
    _plot(args.out / "attainment.png", curves, setup.slo.attainment, args)
    print(f"written to {args.out}")
    return 0


def _write_curve(path: Path, curves: dict[str, list[Any]]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(("policy", "qps", "slo_attainment_pct", "complete"))
        for policy, runs in curves.items():
            for run in sorted(runs, key=lambda r: r.qps):
                writer.writerow((policy, run.qps, run.slo_attainment_pct, run.complete))


def _plot(path: Path, curves: dict[str, list[Any]], target: float, args: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for policy, runs in curves.items():
        done = sorted((r for r in runs if r.complete), key=lambda r: r.qps)
        ax.plot([r.qps for r in done], [r.slo_attainment_pct for r in done], "o-", label=policy)
    ax.axhline(100 * target, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("request rate (QPS, trace time axis rescaled)")
    ax.set_ylabel("requests within SLO (%)")
    ax.set_title(
        f"{args.variants} variants, Zipf {args.zipf:g}, {args.gpus} x {args.gpu_type}", fontsize=10
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
