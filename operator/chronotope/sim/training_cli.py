"""`chronotope simulate training`: Philly jobs on a heterogeneous cluster, rival policies.

Registered under `simulate` by `chronotope.sim.cli`. Writes DIR/summary.csv
(columns `SUMMARY_COLUMNS`; with `--queues` each policy also as `NAME+queues`, and
DIR/queues.csv, columns `QUEUE_COLUMNS`), DIR/jct_cdf.png and DIR/bounds.csv (the mean isolated
best run time, a lower bound on every policy's average JCT). START and END are Philly
timestamps ('2017-10-20 08:00:00'); jobs submitted in [START, END) are used.
Heavy imports happen in the handler so `chronotope --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chronotope.paths import data_file
from chronotope.workloads.training_policy import LEASE_S

if TYPE_CHECKING:
    from chronotope.sim.training.engine import SimResult
    from chronotope.sim.training.queues import QueueSetup, QuotaPolicy
    from chronotope.workloads.training_policy import Job

__all__ = ["DEFAULT_GAVEL", "DEFAULT_TRACE", "add_parser", "run_training"]

DEFAULT_GAVEL = data_file("gavel", "isolated_throughputs.json")
"""Gavel's isolated throughputs, shipped in the repository (data/README.md)."""
DEFAULT_TRACE = data_file("philly", "philly.csv")
"""The Philly trace, shipped in the repository (data/README.md)."""


def add_parser(traces: Any) -> None:
    """Add `training` to the `simulate` sub-subparsers."""
    p = traces.add_parser("training", help="Philly training jobs, FIFO/LAS/EDF/Gavel/ours")
    p.add_argument(
        "--trace", type=Path, default=DEFAULT_TRACE, help="philly.csv (default: data/philly/)"
    )
    p.add_argument("--start", required=True, help="window start, e.g. '2017-10-20 08:00:00'")
    p.add_argument("--end", required=True, help="window end (exclusive)")
    p.add_argument("--cluster", type=Path, required=True, help="ClusterSpec YAML")
    p.add_argument("--policies", default="fifo,las,gavel,chronotope", help="comma-separated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--throughputs", type=Path, default=DEFAULT_GAVEL, help="Gavel JSON")
    p.add_argument("--deadline-share", type=float, default=0.3, help="share of jobs with one")
    p.add_argument("--round-s", type=float, default=LEASE_S, help="lease round length")
    p.add_argument("--restart-overhead-s", type=float, default=30.0)
    p.add_argument(
        "--estimate-error",
        default="none",
        metavar="lognormal:SIGMA",
        help="give policies that use durations a noisy estimate: true * exp(N(0, SIGMA)), "
        "seeded (default: none, the exact duration)",
    )
    p.add_argument(
        "--queues",
        type=Path,
        default=None,
        metavar="QUEUES.yaml",
        help="Queue objects (docs/queues.md): each policy runs twice, without and with "
        "quotas; jobs go to queues by a seeded rule; writes DIR/queues.csv",
    )
    p.set_defaults(func=_handle)


def run_training(args: argparse.Namespace) -> list[dict[str, object]]:
    """Simulate each asked-for policy on the Philly window and write the results under `args.out`.

    Writes summary.csv, bounds.csv and jct_cdf.png; returns the summary rows.
    """
    from tqdm import tqdm

    from chronotope.sim.training.engine import EngineSettings, simulate
    from chronotope.sim.training.policies import TRAINING_POLICY_NAMES, make_training_policy
    from chronotope.sim.training.queues import QuotaPolicy
    from chronotope.sim.training.report import (
        jcts_h,
        plot_jct_cdf,
        summary_row,
        write_bounds,
        write_summary,
    )
    from chronotope.sim.training.workload import (
        WorkloadSettings,
        build_jobs,
        load_training_cluster,
        parse_estimate_error,
        read_philly_window,
    )

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = sorted(set(policies) - set(TRAINING_POLICY_NAMES))
    if unknown:
        raise SystemExit(
            f"unknown policies: {', '.join(unknown)} (known: {', '.join(TRAINING_POLICY_NAMES)})"
        )
    capacity, speeds = load_training_cluster(args.cluster, args.throughputs)
    rows = read_philly_window(args.trace, args.start, args.end)
    if not rows:
        raise SystemExit(f"no jobs in [{args.start}, {args.end})")
    workload = WorkloadSettings(
        deadline_share=args.deadline_share, estimate_sigma=parse_estimate_error(args.estimate_error)
    )
    jobs = build_jobs(rows, speeds, max(capacity.values()), workload, args.seed)
    engine = EngineSettings(round_s=args.round_s, restart_overhead_s=args.restart_overhead_s)
    queues, job_queue = _queue_setup(args, capacity, jobs)
    queue_table: list[dict[str, object]] = []
    args.out.mkdir(parents=True, exist_ok=True)
    summary: list[dict[str, object]] = []
    curves: dict[str, list[float]] = {}
    runs = len(policies) * (2 if queues is not None else 1)
    with tqdm(total=len(jobs) * runs, unit="job", desc="simulate training") as bar:
        for name in policies:
            bar.set_postfix_str(name)
            result = simulate(
                jobs,
                capacity,
                make_training_policy(name, args.round_s, args.restart_overhead_s),
                engine,
                bar.update,
            )
            summary.append(summary_row(jobs, result, capacity, args.seed))
            curves[name] = jcts_h(jobs, result)
            if queues is not None:
                wrapped = QuotaPolicy(
                    make_training_policy(name, args.round_s, args.restart_overhead_s),
                    queues,
                    job_queue,
                )
                quota_result = simulate(jobs, capacity, wrapped, engine, bar.update)
                summary.append(summary_row(jobs, quota_result, capacity, args.seed))
                curves[wrapped.name] = jcts_h(jobs, quota_result)
                queue_table += _queue_rows(
                    jobs, wrapped, quota_result, capacity=capacity, summary=summary, seed=args.seed
                )
    if queues is not None:
        from chronotope.sim.training.queue_report import write_queue_rows

        write_queue_rows(queue_table, args.out / "queues.csv")
        _print_queues(queue_table)
    write_summary(summary, args.out / "summary.csv")
    bound = write_bounds(jobs, args.seed, args.out / "bounds.csv")
    print(f"lower bound on avg_jct_h (mean isolated best run time): {bound:.4f} (bounds.csv)")
    title = f"Philly {args.start} to {args.end}, seed {args.seed}, {len(jobs)} jobs"
    if workload.estimate_sigma > 0:
        title += f", estimates lognormal sigma {workload.estimate_sigma:g}"
    plot_jct_cdf(curves, args.out / "jct_cdf.png", title)
    return summary


def _queue_setup(
    args: argparse.Namespace, capacity: dict[str, int], jobs: list[Job]
) -> tuple[QueueSetup | None, dict[int, str]]:
    """The Queues of `--queues` and each job's queue (None, {} without the flag)."""
    from chronotope.sim.training.queues import assign_queues, check_fit, load_queues

    if getattr(args, "queues", None) is None:
        return None, {}
    try:
        queues = load_queues(args.queues, capacity)
        job_queue = assign_queues(jobs, queues, args.seed)
        check_fit(jobs, job_queue, queues)
    except ValueError as exc:
        raise SystemExit(f"chronotope simulate training: error: {exc}") from exc
    return queues, job_queue


def _queue_rows(
    jobs: list[Job],
    wrapped: QuotaPolicy,
    result: SimResult,
    *,
    capacity: dict[str, int],
    summary: list[dict[str, object]],
    seed: int,
) -> list[dict[str, object]]:
    """Per-queue rows of one quota run, with its and the plain run's utilisation."""
    from chronotope.sim.training.queue_report import queue_rows

    rows = queue_rows(
        jobs,
        wrapped.job_queue,
        result,
        trace=wrapped.trace,
        setup=wrapped.setup,
        capacity=capacity,
    )
    for row in rows:
        row.update(
            seed=seed,
            gpu_util_pct=summary[-1]["gpu_util_pct"],
            gpu_util_no_queues_pct=summary[-2]["gpu_util_pct"],
            busy_while_waiting_pct=summary[-1]["busy_while_waiting_pct"],
            busy_while_waiting_no_queues_pct=summary[-2]["busy_while_waiting_pct"],
        )
    return rows


def _print_queues(rows: list[dict[str, object]]) -> None:
    """One line per (policy, queue), then each policy's utilisation with and without quotas."""
    for r in rows:
        print(
            f"{r['policy']} {r['queue']}: jobs={r['jobs']} avg_jct_h={r['avg_jct_h']} "
            f"gpu_h={r['gpu_hours']} borrowed_gpu_h={r['borrowed_gpu_hours']} "
            f"share={r['used_share']} nominal={r['nominal_share']} "
            f"attainment={r['share_attainment']}"
        )
    for policy in dict.fromkeys(str(r["policy"]) for r in rows):
        r = next(x for x in rows if x["policy"] == policy)
        delta = float(str(r["gpu_util_pct"])) - float(str(r["gpu_util_no_queues_pct"]))
        waiting = float(str(r["busy_while_waiting_pct"])) - float(
            str(r["busy_while_waiting_no_queues_pct"])
        )
        print(
            f"{policy}: jain={r['jain']} gpu_util_pct={r['gpu_util_pct']} "
            f"(without queues {r['gpu_util_no_queues_pct']}, {delta:+.2f} pp) "
            f"busy_while_waiting_pct={r['busy_while_waiting_pct']} "
            f"(without queues {r['busy_while_waiting_no_queues_pct']}, {waiting:+.2f} pp)"
        )


def _usage_error(args: argparse.Namespace) -> str | None:
    """The first bad argument, in one line, or None (checked before any heavy work)."""
    from chronotope.sim.training.workload import parse_estimate_error, parse_time

    try:
        start, end = parse_time(args.start), parse_time(args.end)
        parse_estimate_error(args.estimate_error)
    except ValueError as exc:
        return str(exc)
    if end <= start:
        return f"--end {args.end!r} is not after --start {args.start!r}"
    for flag, path in (("--trace", args.trace), ("--cluster", args.cluster)):
        if not path.is_file():
            return f"{flag} {path}: no such file"
    queues = getattr(args, "queues", None)
    if queues is not None and not queues.is_file():
        return f"--queues {queues}: no such file"
    if not args.throughputs.is_file():
        return f"--throughputs {args.throughputs}: no such file"
    return None


def _handle(args: argparse.Namespace) -> int:
    problem = _usage_error(args)
    if problem is not None:
        print(f"chronotope simulate training: error: {problem}", file=sys.stderr)
        return 2
    for row in run_training(args):
        print(", ".join(f"{k}={v}" for k, v in row.items()))
    return 0
