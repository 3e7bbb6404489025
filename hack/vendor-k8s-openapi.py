#!/usr/bin/env python3
"""Refresh operator/chronotope/api/k8s/core-v1.json from the Kubernetes OpenAPI v3 spec.

Reads `api/openapi-spec/v3/api__v1_openapi.json` of the pinned Kubernetes
release (devcluster settings' `k8s_version`) from, in order: the path given as
the first argument, the Go module cache (`$(go env GOMODCACHE)/k8s.io/
kubernetes@VERSION`, filled by hack/build-binaries.sh), or the source tree
build-binaries.sh unpacks (`~/.cache/chronotope/src/kubernetes-VERSION`).
Keeps the definitions the CRDs embed and their `$ref` closure, without
descriptions (`chronotope.api.k8s.openapi.subset`). Then run
`chronotope gen-crds` and `chronotope gen-api-docs`.

Usage: hack/vendor-k8s-openapi.py [PATH-TO-api__v1_openapi.json]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from chronotope.api.k8s.openapi import VENDORED, subset  # noqa: E402
from chronotope.devcluster.settings import ClusterSettings  # noqa: E402

SPEC = Path("api/openapi-spec/v3/api__v1_openapi.json")


def _candidates(version: str) -> list[Path]:
    found = []
    try:
        modcache = subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()
        found.append(Path(modcache) / f"k8s.io/kubernetes@{version}" / SPEC)
    except (OSError, subprocess.SubprocessError):
        pass
    found.append(ClusterSettings.from_env().cache_dir / "src" / f"kubernetes-{version}" / SPEC)
    return found


def main() -> int:
    version = ClusterSettings.from_env().k8s_version
    paths = [Path(sys.argv[1])] if len(sys.argv) > 1 else _candidates(version)
    source = next((p for p in paths if p.is_file()), None)
    if source is None:
        print(f"no {SPEC} for Kubernetes {version}; looked in:", file=sys.stderr)
        for p in paths:
            print(f"  {p}", file=sys.stderr)
        print("run hack/build-binaries.sh first, or pass the file's path", file=sys.stderr)
        return 1
    document = json.loads(source.read_text(encoding="utf-8"))
    trimmed = subset(
        document,
        version=version,
        source=f"github.com/kubernetes/kubernetes@{version}/{SPEC.as_posix()}",
    )
    VENDORED.write_text(json.dumps(trimmed, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    count = len(trimmed["components"]["schemas"])
    print(f"wrote {VENDORED.relative_to(ROOT)} ({count} definitions) from {source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
