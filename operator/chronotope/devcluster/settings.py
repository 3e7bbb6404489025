"""Typed settings for the local control plane, built once at the edge and passed down."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from chronotope.paths import REPO_ROOT

__all__ = ["REPO_ROOT", "ClusterSettings"]


@dataclass(frozen=True)
class ClusterSettings:
    """Where binaries and cluster state live, and which versions to run."""

    cache_dir: Path
    state_root: Path
    bin_dir: Path | None = None
    k8s_version: str = "v1.33.13"
    etcd_version: str = "v3.5.21"
    kwok_version: str = "v0.7.0"
    helm_version: str = "v3.18.6"
    repo_root: Path = REPO_ROOT
    ready_timeout: float = 120.0
    scheduler_config: Path = field(
        default_factory=lambda: REPO_ROOT / "manifests" / "scheduler" / "kube-scheduler-config.yaml"
    )
    chronotope_scheduler_config: Path = field(
        default_factory=lambda: REPO_ROOT / "manifests/scheduler/chronotope-scheduler-config.yaml"
    )
    kwok_stages: Path = field(
        default_factory=lambda: REPO_ROOT / "manifests" / "kwok" / "node-stages.yaml"
    )
    node_lease_s: int = 40
    """How long a kwok node's Lease lasts (a kubelet's `nodeLeaseDurationSeconds`, 40 by
    default). kwok renews it every quarter of that, and the node lifecycle controller
    calls a node Unknown after `node_grace_s` without a renewal."""

    @property
    def node_grace_s(self) -> int:
        """The controller-manager's `--node-monitor-grace-period`: five renewals (50 s at 40 s)."""
        return self.node_lease_s * 5 // 4

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClusterSettings:
        """The one place that reads the environment (called from the CLI and test fixtures)."""
        env = os.environ if env is None else env
        home = Path(env.get("HOME", str(Path.home())))
        cache = Path(env.get("CHRONOTOPE_CACHE_DIR", str(home / ".cache" / "chronotope")))
        state = Path(env.get("CHRONOTOPE_STATE_DIR", str(home / ".local/state/chronotope")))
        bin_dir = env.get("CHRONOTOPE_BIN_DIR")
        return cls(
            cache_dir=cache,
            state_root=state / "clusters",
            bin_dir=Path(bin_dir) if bin_dir else None,
        )
