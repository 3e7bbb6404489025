"""Pure planners that turn a workload description plus available GPUs into a plan.

Planners run inside the operator (and in the simulators) but never talk to the
API server: a snapshot of what is available goes in, a plain result model comes
out, and "cannot plan" is a value with reasons, not an exception. Re-planning
after availability changes is simply calling the planner again.
"""

from __future__ import annotations

__all__: list[str] = []
