#!/usr/bin/env bash
# The demo: a real local control plane with simulated heterogeneous GPU nodes.
# Leaves the cluster running; `make down` stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
chronotope dev cluster down >/dev/null 2>&1 || true
chronotope dev cluster up --spec manifests/clusters/demo.yaml
kubeconfig="$(chronotope dev cluster status | sed -n 's/^kubeconfig: //p')"
echo
echo "\$ kubectl get nodes (GPU capacity and topology)"
kubectl --kubeconfig "$kubeconfig" get nodes \
  -o custom-columns='NAME:.metadata.name,GPU:.metadata.labels.nvidia\.com/gpu\.product,GPUS:.status.capacity.nvidia\.com/gpu,MEM(MiB):.metadata.labels.nvidia\.com/gpu\.memory,ZONE:.metadata.labels.topology\.kubernetes\.io/zone,RACK:.metadata.labels.chronotope\.dev/rack,NVLINK:.metadata.labels.chronotope\.dev/nvlink-domain'
echo
echo "The cluster keeps running. Use it with:  export KUBECONFIG=$kubeconfig"
echo "Stop it with:                            make down"
