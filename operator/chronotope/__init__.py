"""Chronotope: space-time, heterogeneity- and sharing-aware scheduling for AI workloads.

The package is laid out in layers (see ARCHITECTURE.md): pure decision code
(`api`, `solver`, `sim`) never imports a Kubernetes client; only `kube` talks
to the API server; `devcluster` runs a real local control plane for
development and tests.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
