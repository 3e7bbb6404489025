#!/usr/bin/env bash
# Regenerate the Python modules for the kubelet device-plugin API (v1beta1) from
# operator/chronotope/deviceplugin/_pb/api.proto. The output is committed; the unit
# test tests/unit/deviceplugin/test_proto_current.py fails when it drifts.
#
# Usage: hack/gen-deviceplugin-proto.sh [OUT_ROOT]   (default: operator)
# The proto is compiled with `-I operator` so the generated modules import each
# other as `chronotope.deviceplugin._pb.*` rather than as top-level modules.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT="${1:-operator}"
PROTO=chronotope/deviceplugin/_pb/api.proto
mkdir -p "$OUT/chronotope/deviceplugin/_pb"
"$PY" -m grpc_tools.protoc -I operator \
  --python_out="$OUT" --grpc_python_out="$OUT" \
  --mypy_out="$OUT" --mypy_grpc_out="$OUT" \
  --plugin=protoc-gen-mypy="$(dirname "$PY")/protoc-gen-mypy" \
  --plugin=protoc-gen-mypy_grpc="$(dirname "$PY")/protoc-gen-mypy_grpc" \
  "$PROTO"
