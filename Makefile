# Chronotope: the two commands are `make demo` and `make test`.
.PHONY: demo demo-helm test soak down status build venv lint fmt

demo: venv  ## bring up the local GPU cluster with the demo workloads and show it
	bash hack/demo.sh

demo-helm: venv  ## the demo with the components under the Helm chart's ServiceAccounts and RBAC
	bash hack/demo.sh --chart-identities

test:  ## run the whole test suite (quality gates + unit + real-cluster tests)
	bash hack/test.sh

SOAK_MINUTES ?= 10
SOAK_SEED ?= 1
soak: venv  ## long chaos run: crash the control plane during workloads for SOAK_MINUTES (docs/chaos.md)
	.venv/bin/chronotope dev build
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_SEED=$(SOAK_SEED) .venv/bin/python hack/soak.py

down: venv  ## stop the demo cluster
	.venv/bin/chronotope dev cluster down

status: venv  ## show the demo cluster
	.venv/bin/chronotope dev cluster status

build: venv  ## build (or find cached) control-plane binaries
	.venv/bin/chronotope dev build

venv:
	bash hack/venv.sh

lint: venv
	.venv/bin/ruff check operator tests e2e bench hack
	.venv/bin/ruff format --check operator tests e2e bench hack
	.venv/bin/mypy
	.venv/bin/lint-imports

fmt: venv
	.venv/bin/ruff format operator tests e2e bench hack
	.venv/bin/ruff check --fix operator tests e2e bench hack
