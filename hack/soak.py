"""The long chaos run (`make soak`): the chaos test's driver, round after round.

Usage: python hack/soak.py [--minutes 10] [--seed 1] [--objects 60] [--kills 12] [--admin]

Starts a cluster of its own (`e2e.chaos.chaos_cluster`: kwok GPU nodes, the
Chronotope scheduler and the operator under the chart's identities; `--admin`
runs them as cluster-admin), then runs chaos rounds (`e2e.chaos.Chaos`) until
`--minutes` have passed: each round submits a fresh seeded workload into a new
namespace while killing the extender, the operator, the `chronotope`
kube-scheduler, the apiserver and etcd at seeded points, waits for the cluster
to settle, checks the invariants, and deletes the previous round's namespace
before it starts. The defaults come from the environment (SOAK_MINUTES,
SOAK_SEED), so `make soak SOAK_MINUTES=30` works. Prints the report after each
round and writes the last to test-artifacts/soak-seed<SEED>.json. Exits 1 when
any invariant was violated. docs/chaos.md has the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]  # e2e.chaos is a test helper, not installed

from chronotope.devcluster.settings import ClusterSettings  # noqa: E402
from e2e.chaos import Chaos, Plan, chaos_cluster, write_report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run the soak; 0 when no invariant was violated."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=os.environ.get("SOAK_MINUTES", "10"))
    parser.add_argument("--seed", type=int, default=os.environ.get("SOAK_SEED", "1"))
    parser.add_argument("--objects", type=int, default=60, help="objects created per round")
    parser.add_argument("--kills", type=int, default=12, help="crashes per round")
    parser.add_argument("--admin", action="store_true", help="components as cluster-admin")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.objects < 1 or args.kills < 0:
        parser.error("--minutes and --objects must be positive, --kills at least 0")
    plan = Plan(seed=args.seed, objects=args.objects, kills=args.kills)
    start = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - start:7.1f} s] {message}", flush=True)

    with tempfile.TemporaryDirectory(prefix="chronotope-soak-") as state:
        settings = dataclasses.replace(ClusterSettings.from_env(), state_root=Path(state))
        with chaos_cluster(settings, identities=not args.admin, name="soak") as cluster:
            log("cluster up; chaos rounds start")
            chaos = Chaos(cluster, plan, log=log)
            try:
                report = chaos.run(minutes=args.minutes)
            finally:
                chaos.close()
    print(report.text())
    out = REPO / "test-artifacts" / f"soak-seed{args.seed}.json"
    write_report(report, out)
    print(f"report: {out}")
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
