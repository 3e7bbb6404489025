"""`chronotope device-plugin` flags become one typed settings object."""

from __future__ import annotations

from pathlib import Path

import pytest

from chronotope.cli import build_parser
from chronotope.deviceplugin.cli import settings_from_args


def test_flags_to_settings() -> None:
    args = build_parser().parse_args(
        ["device-plugin", "--plugin-dir", "/tmp/dp", "--gpus", "4", "--shares-per-gpu", "5"]
    )
    settings = settings_from_args(args, {"NODE_NAME": "v100-001"})
    assert settings.node_name == "v100-001"
    assert settings.plugin_dir == Path("/tmp/dp")
    assert settings.gpus == 4
    assert settings.shares_per_gpu == 5
    assert settings.resource_name == "chronotope.dev/gpu-share"
    assert settings.socket_path == Path("/tmp/dp/chronotope-dev-gpu-share.sock")
    assert settings.kubelet_socket == Path("/tmp/dp/kubelet.sock")
    assert callable(args.func)


def test_node_name_flag_wins_and_is_required() -> None:
    parser = build_parser()
    args = parser.parse_args(["device-plugin", "--node-name", "t4-001"])
    assert settings_from_args(args, {"NODE_NAME": "x"}).node_name == "t4-001"
    with pytest.raises(ValueError, match="node name"):
        settings_from_args(parser.parse_args(["device-plugin"]), {})
