"""Read in-tree admission policies: ValidatingAdmissionPolicy objects and their bindings.

The local dev cluster installs manifests/security/assignment-policy.yaml with this
and `kube.admission.apply_admission_objects` (the Helm chart renders the same
objects itself); see docs/security.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["load_admission_policies"]

_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def load_admission_policies(path: Path) -> list[dict[str, Any]]:
    """The objects of a policy manifest; ValueError names any other kind."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        if kind not in _KINDS:
            raise ValueError(f"{path}: {kind} is not one of {', '.join(_KINDS)}")
    if not docs:
        raise ValueError(f"{path}: no admission policy in the file")
    return docs
