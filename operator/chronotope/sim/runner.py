"""Run (trace x policy x seed) simulations and write the summary, bounds and plot.

Each run is independent, so runs fan out over worker processes; the parent
shows one progress bar over runs and writes the files when all are done.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from chronotope.sim.batched import simulate_batched
from chronotope.sim.bound import (
    allocation_upper_bound,
    pattern_upper_bound,
    protocol_upper_bound,
)
from chronotope.sim.engine import RunResult, arrivals, simulate
from chronotope.sim.openb import load_nodes, load_pods, trace_name
from chronotope.solver.online import make_policy
from chronotope.solver.policies import Choice

__all__ = [
    "BATCHED",
    "RunSpec",
    "make_policy",
    "merge_dirs",
    "plot_curves",
    "run_all",
    "run_one",
    "write_rows",
    "write_simulated_placements",
]

CURVE_POINTS = tuple(range(1, 131))
BATCHED = "batched"
"""Not an online policy: the batched protocol's row (`sim.batched`), asked for by name."""


@dataclass(frozen=True)
class RunSpec:
    """What `run_all` runs: traces x policies x seeds, where it writes, and how."""

    nodes: Path
    pods: tuple[Path, ...]
    policies: tuple[str, ...]
    seeds: tuple[int, ...]
    out: Path
    tune_ratio: float = 1.3
    jobs: int = 1
    bound: bool = True
    bucket_pct: float = 5.0
    """Arrival bucket of the protocol LP, in % of GPU capacity (smaller: tighter, slower)."""


def run_one(task: tuple[str, str, str, int, float]) -> dict[str, object]:
    """One simulation; returns its summary row and allocation curve."""
    nodes_path, pods_path, policy, seed, tune = task
    cluster = load_nodes(Path(nodes_path))
    pods = load_pods(Path(pods_path))
    if policy == BATCHED:
        res = simulate_batched(cluster, pods, seed, tune_ratio=tune)
    else:
        res = simulate(cluster, pods, make_policy(policy), seed, tune_ratio=tune)
    row = summary_row(trace_name(Path(pods_path)), policy, seed, res)
    curve = [res.alloc_pct_at(p) for p in CURVE_POINTS]
    return {"row": row, "curve": curve}


def summary_row(trace: str, policy: str, seed: int, res: RunResult) -> dict[str, object]:
    """One row of summary.csv (`sim.cli.SUMMARY_COLUMNS`).

    A figure the run never reached (a partial replay stops before 100 or 130 %
    of demand) is left blank.
    """

    def pct(value: float) -> object:
        return "" if math.isnan(value) else round(value, 2)

    alloc130 = res.alloc_pct_at(130)
    gpus = res.total_milli // 1000
    return {
        "trace": trace,
        "policy": policy,
        "seed": seed,
        "gpu_alloc_pct_at_100": pct(res.alloc_pct_at(100)),
        "gpu_alloc_pct_at_130": pct(alloc130),
        "unalloc_gpus_at_130": "" if math.isnan(alloc130) else round(gpus * (1 - alloc130 / 100)),
        "frag_amount_pct_at_100": pct(res.frag_amount_pct_at(100)),
        "frag_ratio_pct_at_100": pct(res.frag_ratio_pct_at(100)),
        "failed_pods": res.failed,
        "gpu_alloc_pct_final": res.alloc_pct_final(),
    }


def write_simulated_placements(
    nodes: Path, pods: Path, policy: str, seed: int, *, tune_ratio: float, out: Path
) -> None:
    """Run one (trace, policy, seed) and write its `placements.csv` (as `replay` does)."""
    from chronotope.sim.replay import arrivals_of, simulated_placements, write_placements

    cluster = load_nodes(nodes)
    trace = load_pods(pods)
    choices: list[Choice | None] = []
    simulate(cluster, trace, make_policy(policy), seed, tune_ratio=tune_ratio, placements=choices)
    write_placements(
        out,
        arrivals_of(cluster, trace, seed, tune_ratio),
        simulated_placements(cluster, choices),
    )


def _bound_one(task: tuple[str, str, int, float, float]) -> dict[str, object]:
    nodes_path, pods_path, seed, tune, bucket_pct = task
    cluster = load_nodes(Path(nodes_path))
    pods = load_pods(Path(pods_path))
    total = sum(len(n.gpus) for n in cluster.nodes) * 1000
    order = arrivals(pods, total, seed, tune)
    arrived = [pods[i] for i in order]
    pooled = allocation_upper_bound(cluster, arrived)
    per_gpu = pattern_upper_bound(cluster, arrived)
    protocol = protocol_upper_bound(cluster, arrived, bucket_pct)
    return {
        "trace": trace_name(Path(pods_path)),
        "seed": seed,
        "offline_lp_pooled_pct": round(pooled, 2),
        "offline_lp_per_gpu_pct": round(per_gpu, 2),
        "protocol_lp_pct": round(protocol, 2),
        "upper_bound_pct_at_130": round(min(pooled, per_gpu, protocol), 2),
    }


def run_all(spec: RunSpec) -> list[dict[str, object]]:
    """Run every (trace, policy, seed) and the LP bounds, write the files; returns the summary rows.

    Writes summary.csv, bounds.csv, curves.csv and allocation.png under `spec.out`,
    fanning runs out over `spec.jobs` processes.
    """
    from tqdm import tqdm

    spec.out.mkdir(parents=True, exist_ok=True)
    tasks = [
        (str(spec.nodes), str(p), pol, seed, spec.tune_ratio)
        for p in spec.pods
        for pol in spec.policies
        for seed in spec.seeds
    ]
    results: list[dict[str, object]] = []
    with get_context("spawn").Pool(spec.jobs) if spec.jobs > 1 else _Serial() as pool:
        bar = tqdm(total=len(tasks), desc="simulate", unit="run")
        for res in pool.imap_unordered(run_one, tasks):
            row = res["row"]
            assert isinstance(row, dict)
            bar.set_postfix_str(f"{row['trace']}/{row['policy']}/{row['seed']}")
            bar.update()
            results.append(res)
        bar.close()
        bounds: list[dict[str, object]] = []
        if spec.bound:
            btasks = [
                (str(spec.nodes), str(p), s, spec.tune_ratio, spec.bucket_pct)
                for p in spec.pods
                for s in spec.seeds
            ]
            bbar = tqdm(total=len(btasks), desc="upper bounds", unit="LP")
            for b in pool.imap_unordered(_bound_one, btasks):
                bounds.append(b)
                bbar.update()
            bbar.close()
    rows = sorted(
        (r["row"] for r in results),
        key=lambda r: (str(r["trace"]), str(r["policy"]), int(str(r["seed"]))),  # type: ignore[index]
    )
    if bounds:
        write_rows(
            spec.out / "bounds.csv", sorted(bounds, key=lambda b: (str(b["trace"]), str(b["seed"])))
        )
    if results:
        write_rows(spec.out / "summary.csv", rows)  # type: ignore[arg-type]
        _write_curves(spec.out / "curves.csv", results)
        plot_curves(spec.out / "allocation.png", results)
    return rows  # type: ignore[return-value]


def _write_curves(path: Path, results: list[dict[str, object]]) -> None:
    """Per-run allocation curves, so runs split over invocations can be merged."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["trace", "policy", "seed", *(f"alloc_at_{p}" for p in CURVE_POINTS)])
        for res in results:
            row = res["row"]
            curve = res["curve"]
            assert isinstance(row, dict)
            assert isinstance(curve, list)
            writer.writerow(
                [row["trace"], row["policy"], row["seed"], *(round(c, 3) for c in curve)]
            )


def merge_dirs(out: Path, dirs: list[Path]) -> None:
    """Merge the summary, bounds and curves of several output dirs into `out` and re-plot.

    A later dir wins for a (trace, policy, seed) that appears twice.
    """
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[tuple[str, str, str], dict[str, str]] = {}
    bounds: dict[tuple[str, str], dict[str, str]] = {}
    curves: dict[tuple[str, str, str], list[float]] = {}
    for d in dirs:
        if (d / "summary.csv").exists():  # a --bound-only dir has none
            with (d / "summary.csv").open() as fh:
                for r in csv.DictReader(fh):
                    rows[r["trace"], r["policy"], r["seed"]] = r
        if (d / "bounds.csv").exists():
            with (d / "bounds.csv").open() as fh:
                for r in csv.DictReader(fh):
                    bounds[r["trace"], r["seed"]] = r
        if (d / "curves.csv").exists():
            with (d / "curves.csv").open() as fh:
                for r in csv.DictReader(fh):
                    key = (r["trace"], r["policy"], r["seed"])
                    curves[key] = [float(r[f"alloc_at_{p}"]) for p in CURVE_POINTS]
    order = sorted(rows, key=lambda k: (k[0], k[1], int(k[2])))
    write_rows(out / "summary.csv", [dict(rows[k]) for k in order])
    if bounds:
        write_rows(out / "bounds.csv", [dict(bounds[k]) for k in sorted(bounds)])
    results: list[dict[str, object]] = [
        {"row": {"trace": k[0], "policy": k[1], "seed": k[2]}, "curve": c}
        for k, c in sorted(curves.items())
    ]
    _write_curves(out / "curves.csv", results)
    plot_curves(out / "allocation.png", results)


class _Serial:
    """Stand-in for a process pool when --jobs is 1 (easier to profile and debug)."""

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def imap_unordered(self, fn, items):  # type: ignore[no-untyped-def]
        return map(fn, items)


def write_rows(path: Path, rows: Sequence[Mapping[str, object]]) -> None:
    """`rows` as CSV at `path`, the first row's keys as the header (nothing when empty)."""
    if not rows:
        return
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot_curves(path: Path, results: list[dict[str, object]]) -> None:
    """Plot, per trace, each policy's mean allocation curve against arrived demand."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[str, dict[str, list[list[float]]]] = {}
    for res in results:
        row = res["row"]
        assert isinstance(row, dict)
        curve = res["curve"]
        assert isinstance(curve, list)
        curves.setdefault(str(row["trace"]), {}).setdefault(str(row["policy"]), []).append(curve)
    traces = sorted(curves)
    cols = min(3, len(traces))
    rows = (len(traces) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for ax, trace in zip(axes.flat, traces, strict=False):
        for policy, runs in sorted(curves[trace].items()):
            mean = np.nanmean(np.array(runs, dtype=float), axis=0)
            ax.plot(CURVE_POINTS, mean, label=policy)
        ax.plot(CURVE_POINTS, np.minimum(CURVE_POINTS, 100), "k:", linewidth=0.8)
        ax.set_title(f"openb {trace}")
        ax.set_xlabel("arrived GPU demand (% of capacity)")
        ax.set_ylabel("allocated GPUs (% of capacity)")
        ax.set_xlim(60, 131)
        ax.set_ylim(60, 101)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(traces) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
