"""Training-cluster simulator: Philly arrivals, Gavel throughputs, rival policies.

Pure and deterministic for a seed: a job list and a cluster capacity go in,
per-job completion times and summary figures come out. The command line lives
in `chronotope.sim.training_cli`; see docs/training-sim.md for the model.
"""

from __future__ import annotations

__all__: list[str] = []
