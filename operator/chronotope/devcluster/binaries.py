"""Find the pinned control-plane binaries, building them on first use.

Binaries live in a versioned cache (`<cache>/bin/<component>-<version>/`)
filled by `hack/build-binaries.sh`; a warm cache builds nothing. Setting
`bin_dir` (CHRONOTOPE_BIN_DIR on the command line) points at a folder of
existing binaries instead and skips the build entirely.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from chronotope.devcluster.settings import ClusterSettings

__all__ = ["Binaries", "BinaryError", "ensure_binaries"]


class BinaryError(RuntimeError):
    """A binary is missing and cannot be built; the message says what to do."""


@dataclass(frozen=True)
class Binaries:
    """Paths of the control-plane binaries one local cluster runs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kwok: Path
    helm: Path

    def all(self) -> list[Path]:
        """Every binary path, in a fixed order."""
        return [
            self.etcd,
            self.kube_apiserver,
            self.kube_controller_manager,
            self.kube_scheduler,
            self.kwok,
            self.helm,
        ]


def _cached(settings: ClusterSettings) -> Binaries:
    if settings.bin_dir is not None:
        d = settings.bin_dir
        return Binaries(
            etcd=d / "etcd",
            kube_apiserver=d / "kube-apiserver",
            kube_controller_manager=d / "kube-controller-manager",
            kube_scheduler=d / "kube-scheduler",
            kwok=d / "kwok",
            helm=d / "helm",
        )
    b = settings.cache_dir / "bin"
    k8s = b / f"kubernetes-{settings.k8s_version}"
    return Binaries(
        etcd=b / f"etcd-{settings.etcd_version}" / "etcd",
        kube_apiserver=k8s / "kube-apiserver",
        kube_controller_manager=k8s / "kube-controller-manager",
        kube_scheduler=k8s / "kube-scheduler",
        kwok=b / f"kwok-{settings.kwok_version}" / "kwok",
        helm=b / f"helm-{settings.helm_version}" / "helm",
    )


def _missing(binaries: Binaries) -> list[Path]:
    return [p for p in binaries.all() if not os.access(p, os.X_OK)]


def ensure_binaries(settings: ClusterSettings, *, build: bool = True) -> Binaries:
    """Return the binaries, running the build script for any that are missing."""
    binaries = _cached(settings)
    missing = _missing(binaries)
    if not missing:
        return binaries
    if settings.bin_dir is not None:
        raise BinaryError(
            f"CHRONOTOPE_BIN_DIR={settings.bin_dir} lacks: {', '.join(p.name for p in missing)}"
        )
    if not build:
        raise BinaryError(f"binaries not built yet: {', '.join(str(p) for p in missing)}")
    if shutil.which("go") is None:
        raise BinaryError(
            "Go is not installed, and the local control plane is built from Go modules. "
            "Install Go >= 1.24, or set CHRONOTOPE_BIN_DIR to a folder holding etcd, "
            "kube-apiserver, kube-controller-manager, kube-scheduler, kwok and helm."
        )
    script = settings.repo_root / "hack" / "build-binaries.sh"
    if not script.is_file():
        raise BinaryError(f"build script {script} not found; set CHRONOTOPE_BIN_DIR instead")
    env = os.environ | {
        "CHRONOTOPE_CACHE_DIR": str(settings.cache_dir),
        "K8S_VERSION": settings.k8s_version,
        "ETCD_VERSION": settings.etcd_version,
        "KWOK_VERSION": settings.kwok_version,
        "HELM_VERSION": settings.helm_version,
    }
    result = subprocess.run(["bash", str(script)], env=env, check=False)
    if result.returncode != 0:
        raise BinaryError(
            f"building the control-plane binaries failed (exit {result.returncode}); "
            f"see the output above of {script}"
        )
    missing = _missing(binaries)
    if missing:
        raise BinaryError(f"build finished but these are missing: {missing}")
    return binaries
