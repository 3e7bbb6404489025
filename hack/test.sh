#!/usr/bin/env bash
# The whole test suite: quality gates, then unit tests and tests on the real local
# control plane (built from pinned Kubernetes modules on first use, then cached).
# Usage: hack/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
step() { printf '\n== %s (%ss)\n' "$*" "$((SECONDS - start))"; }

step "python environment"
bash hack/venv.sh
export PATH="$PWD/.venv/bin:$PATH"

step "control-plane binaries (cached under \${CHRONOTOPE_CACHE_DIR:-~/.cache/chronotope})"
chronotope dev build

step "system packages (Debian prometheus and chromium, for the tuner and dashboard tests)"
bash hack/system-packages.sh

step "ruff"
ruff check operator tests e2e bench hack
ruff format --check operator tests e2e bench hack

step "mypy --strict"
mypy

step "import-linter"
lint-imports

step "pytest"
set +e
mkdir -p test-artifacts
pytest --junitxml=test-artifacts/junit.xml "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
if [[ $rc -eq 0 && $# -eq 0 ]]; then
  # the whole suite: both tests/ (unit) and e2e/ (real cluster) must have run
  python hack/check-ran.py test-artifacts/junit.xml
fi
step "done (exit $rc)"
exit $rc
