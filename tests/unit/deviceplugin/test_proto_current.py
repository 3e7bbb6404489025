"""The committed device-plugin gRPC modules match what hack/gen-deviceplugin-proto.sh makes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ROOT / "operator" / "chronotope" / "deviceplugin" / "_pb"


def test_generated_modules_are_current(tmp_path: Path) -> None:
    subprocess.run(
        [str(ROOT / "hack" / "gen-deviceplugin-proto.sh"), str(tmp_path)],
        check=True,
        cwd=ROOT,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        timeout=120,
    )
    fresh = tmp_path / "chronotope" / "deviceplugin" / "_pb"
    names = sorted(p.name for p in fresh.iterdir())
    assert names == ["api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi"]
    stale = [n for n in names if (fresh / n).read_text() != (GENERATED / n).read_text()]
    assert not stale, f"regenerate with hack/gen-deviceplugin-proto.sh: {stale} drifted"


def test_service_names_are_the_kubelet_wire_names() -> None:
    from chronotope.deviceplugin._pb import api_pb2

    services = api_pb2.DESCRIPTOR.services_by_name
    assert services["DevicePlugin"].full_name == "v1beta1.DevicePlugin"
    assert services["Registration"].full_name == "v1beta1.Registration"
