#!/usr/bin/env bash
# Create (or refresh) the project virtualenv at .venv with the package and its dev extras.
# Fast when nothing changed: pip only re-installs if pyproject.toml is newer than the stamp.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      PY="$cand"; break
    fi
  done
fi
if [[ -z "$PY" ]]; then
  echo "error: Python >= 3.11 is required (set PYTHON=/path/to/python3.11)" >&2
  exit 3
fi
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
stamp=.venv/.chronotope-installed
if [[ ! -f "$stamp" || pyproject.toml -nt "$stamp" ]]; then
  .venv/bin/python -m pip install --quiet -e '.[dev]'
  touch "$stamp"
fi
