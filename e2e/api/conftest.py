"""Install the committed CRDs into the session's real cluster once, for the API tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from e2e.kubetest import KubeCluster, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
CRDS_DIR = REPO_ROOT / "crds"


def crd_names() -> list[str]:
    return [
        yaml.safe_load(path.read_text())["metadata"]["name"]
        for path in sorted(CRDS_DIR.glob("*.yaml"))
    ]


@pytest.fixture(scope="session")
def chronotope_crds(kube_cluster: KubeCluster) -> list[str]:
    """Server-side apply `crds/` and wait until every CRD is Established and served."""
    kube_cluster.run_kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=chronotope-tests",
        "-f", str(CRDS_DIR),
    )  # fmt: skip
    names = crd_names()
    kube_cluster.run_kubectl(
        "wait", "--for", "condition=established", "--timeout=60s", *[f"crd/{n}" for n in names]
    )

    def served() -> bool:
        result = subprocess.run(
            [*kube_cluster.kubectl, "api-resources", "--api-group=chronotope.dev", "-o", "name"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        return all(name in result.stdout.split() for name in names)

    wait_for(served, timeout=60, what="chronotope.dev resources in discovery")
    return names
