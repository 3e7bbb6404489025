"""Where can any inference policy cost half of `peak`? A sweep of target rates.

For each `--target-qps`, the `peak` and `chronotope` rows of `simulate inference`
(the same code, same split) beside two lower bounds on any policy that keeps
99 % of the queries within the SLO: `sim.inference.cost_floor` (work at the
cheapest profile, minimum replicas) and `sim.inference.deadline_floor` (the
same, but each stage's capacity must be there within the SLO of the queries'
arrivals: a linear programme over slots). Where the deadline floor is above
half the peak row, the issue's "<= 0.5x peak" is impossible for every policy,
clairvoyant ones included.

    .venv/bin/python bench/inference_floor.py \
        --trace ../shared/data/azure-llm/AzureLLMInferenceTrace_conv.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from chronotope.api.v1alpha1.inferencepipeline import InferencePipelineSpec
from chronotope.paths import REPO_ROOT
from chronotope.planners.inferline import Infeasible, model_from_spec
from chronotope.sim.inference import (
    TunerSettings,
    cost_floor,
    deadline_floor,
    load_arrivals,
    rescale,
    run_policy,
)
from chronotope.sim.runner import write_rows

RATES = (50, 100, 130, 140, 150, 160, 170, 180, 200, 250, 300, 400, 600, 800)


def main() -> None:
    """Sweep the rates and print one row each."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--trace", type=Path, required=True)
    sample = REPO_ROOT / "manifests/samples/inferencepipeline-video.yaml"
    p.add_argument("--pipeline", type=Path, default=sample)
    p.add_argument("--rates", default=",".join(str(q) for q in RATES), help="comma-separated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--planning-share", type=float, default=0.25)
    p.add_argument(
        "--tuner-envelope-s",
        type=float,
        default=TunerSettings().envelope_s,
        help="the chronotope tuner's longest envelope window (5: the one 5 s rate)",
    )
    p.add_argument("--out", type=Path, help="also write the rows to this CSV")
    args = p.parse_args()
    doc = yaml.safe_load(args.pipeline.read_text())
    model = model_from_spec(InferencePipelineSpec.model_validate(doc.get("spec", doc)), {})
    trace = load_arrivals(args.trace)
    rows = []
    print(
        f"{'qps':>5} {'peak':>6} {'infl':>6} {'ours':>6} {'miss%':>6} {'ours/infl':>9}"
        f" {'floor':>6} {'deadline':>8}"
        f" {'ours/pk':>7} {'floor/pk':>8} {'dl/pk':>6}  <=0.5x peak"
    )
    for q in (float(x) for x in args.rates.split(",") if x):
        arrivals = rescale(trace, q)
        cut = max(1, int(len(arrivals) * args.planning_share))
        planning, serving = arrivals[:cut], arrivals[cut:] - arrivals[cut]
        peak = run_policy("peak", model, planning, serving, seed=args.seed)
        line = run_policy("inferline", model, planning, serving, seed=args.seed)
        tuner = TunerSettings(envelope_s=args.tuner_envelope_s)
        ours = run_policy("chronotope", model, planning, serving, seed=args.seed, tuner=tuner)
        if any(isinstance(r, Infeasible) for r in (peak, line, ours)):
            print(f"{q:5.0f} infeasible")
            continue
        assert not isinstance(peak, Infeasible)
        assert not isinstance(line, Infeasible)
        assert not isinstance(ours, Infeasible)
        floor = cost_floor(model, serving)
        tight = deadline_floor(model, serving, seed=args.seed)
        half = 0.5 * peak.cost_per_hour
        verdict = "impossible" if tight > half else "not ruled out"
        row = {
            "qps": q,
            "peak": round(peak.cost_per_hour, 3),
            "inferline": round(line.cost_per_hour, 3),
            "chronotope": round(ours.cost_per_hour, 3),
            "chronotope_miss_pct": round(ours.slo_miss_pct, 2),
            "cost_floor": round(floor, 3),
            "deadline_floor": round(tight, 3),
            "verdict": verdict,
        }
        rows.append(row)
        pk = peak.cost_per_hour
        print(
            f"{q:5.0f} {pk:6.2f} {line.cost_per_hour:6.2f} {ours.cost_per_hour:6.2f}"
            f" {ours.slo_miss_pct:6.2f} {ours.cost_per_hour / line.cost_per_hour:9.2f}"
            f" {floor:6.2f} {tight:8.2f} {ours.cost_per_hour / pk:7.2f} {floor / pk:8.2f}"
            f" {tight / pk:6.2f}  {verdict}",
            flush=True,
        )
    if args.out is not None:
        write_rows(args.out, rows)


if __name__ == "__main__":
    main()
