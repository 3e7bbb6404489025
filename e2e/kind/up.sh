#!/usr/bin/env bash
# Chronotope on kind, for users with Docker: a kind cluster, kwok for simulated
# GPU nodes, the image built locally and loaded into kind, the Helm chart.
# UNTESTED in CI (kind cannot create clusters there); see e2e/kind/README.md.
# Needs: docker, kind, kubectl, helm, and internet access for the kind node
# image, kwok's manifests and the kube-scheduler image.
set -euo pipefail
cd "$(dirname "$0")/../.."
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
SPEC=${SPEC:-manifests/clusters/demo.yaml}

kind create cluster --config e2e/kind/kind-config.yaml
kubectl config use-context kind-chronotope

# the image: `docker build .` (python:3.11-slim base) is enough with internet access
docker build -t chronotope:dev .
kind load docker-image chronotope:dev --name chronotope

# Chronotope first, so its pods land on the real kind node, not on a fake GPU node
# (the device plugin is off: kwok nodes have no kubelet and no GPUs)
helm install chronotope charts/chronotope -n chronotope-system --create-namespace \
  --set image.repository=chronotope --set image.tag=dev --set devicePlugin.enabled=false
kubectl -n chronotope-system rollout status deployment --timeout=300s

# kwok manages the simulated GPU nodes (its controller and the fast pod stages)
base="https://github.com/kubernetes-sigs/kwok/releases/download/${KWOK_VERSION}"
kubectl apply -f "${base}/kwok.yaml"
kubectl apply -f "${base}/stage-fast.yaml"
python3 -m venv .venv >/dev/null 2>&1 || true
.venv/bin/pip install -q -e . >/dev/null
.venv/bin/chronotope dev nodes --spec "$SPEC" --print | kubectl apply -f -

echo "kind cluster 'chronotope' is up; try: kubectl apply -f manifests/profiles/ -f manifests/samples/"
