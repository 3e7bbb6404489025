#!/usr/bin/env bash
# The demo: a real local control plane with simulated heterogeneous GPU nodes, the
# Chronotope scheduler (kube-scheduler + extender) and operator, sample custom resources
# and GPU pods placed on whole and shared GPUs. Leaves the cluster running; `make down`.
# `--chart-identities` (make demo-helm): the components run under the Helm chart's
# ServiceAccounts and RBAC (token kubeconfigs), not as cluster-admin.
set -euo pipefail
cd "$(dirname "$0")/.."
identities=()
case "${1:-}" in
  "") ;;
  --chart-identities) identities=(--chart-identities) ;;
  *) echo "usage: $0 [--chart-identities]" >&2; exit 2 ;;
esac
export PATH="$PWD/.venv/bin:$PATH"
chronotope dev cluster down >/dev/null 2>&1 || true
chronotope dev cluster up --spec manifests/clusters/demo.yaml --with-scheduler --with-operator --dashboard-port 8090 "${identities[@]}"
kubeconfig="$(chronotope dev cluster status | sed -n 's/^kubeconfig: //p')"
k() { kubectl --kubeconfig "$kubeconfig" "$@"; }
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

if [[ ${#identities[@]} -gt 0 ]]; then
  ids="$(dirname "$kubeconfig")/identities"
  say "kubectl auth whoami --kubeconfig $ids/chronotope-operator.kubeconfig   # who the operator is"
  kubectl --kubeconfig "$ids/chronotope-operator.kubeconfig" auth whoami
  say "kubectl auth can-i get secrets -A --kubeconfig $ids/chronotope-operator.kubeconfig"
  kubectl --kubeconfig "$ids/chronotope-operator.kubeconfig" auth can-i get secrets -A || true
  say "kubectl auth can-i create pods --kubeconfig $ids/chronotope-scheduler.kubeconfig   # the extender binds, never creates"
  kubectl --kubeconfig "$ids/chronotope-scheduler.kubeconfig" auth can-i create pods || true
fi

say "kubectl get nodes   # GPU capacity and topology"
k get nodes -o custom-columns='NAME:.metadata.name,GPU:.metadata.labels.nvidia\.com/gpu\.product,GPUS:.status.capacity.nvidia\.com/gpu,MEM(MiB):.metadata.labels.nvidia\.com/gpu\.memory,ZONE:.metadata.labels.topology\.kubernetes\.io/zone,RACK:.metadata.labels.chronotope\.dev/rack,NVLINK:.metadata.labels.chronotope\.dev/nvlink-domain'

say "kubectl apply -f manifests/profiles/ -f manifests/demo/video-arrivals.yaml -f manifests/samples/   # a model profile, a sample arrival trace, TrainingJobs, an InferencePipeline, ModelVariants, two teams' Queues"
k apply -f manifests/profiles/ >/dev/null
k apply -f manifests/demo/video-arrivals.yaml >/dev/null
k apply -f manifests/samples/ >/dev/null
for _ in $(seq 30); do
  running=$(k get trainingjobs -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c Running || true)
  [[ "$running" -ge 3 ]] && break
  sleep 1
done
k get chronotope
say "kubectl get trainingjob opt-elastic -o jsonpath='{.status.plan.planner}'   # plan from the model profile"
k get trainingjob opt-elastic -o jsonpath='{.status.plan.planner}{"\n"}' || true
say "kubectl get pods -l chronotope.dev/job   # the TrainingJobs' gangs"
k get pods -l chronotope.dev/job -o custom-columns='POD:.metadata.name,NODE:.spec.nodeName,GPUS:.metadata.annotations.chronotope\.dev/assigned-gpus,GANG:.metadata.labels.chronotope\.dev/pod-group'

say "kubectl apply -f manifests/demo/gpu-pods.yaml   # schedulerName: chronotope"
k apply -f manifests/demo/gpu-pods.yaml >/dev/null
for _ in $(seq 60); do
  bound=$(k get pods -l app=chronotope-demo -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c . || true)
  [[ "$bound" -ge 4 ]] && break
  sleep 1
done
k get pods -l app=chronotope-demo -o custom-columns='POD:.metadata.name,STATUS:.status.phase,NODE:.spec.nodeName,GPUS:.metadata.annotations.chronotope\.dev/assigned-gpus,COMPUTE%:.metadata.annotations.chronotope\.dev/assigned-compute-percent,MEM(MiB):.metadata.annotations.chronotope\.dev/assigned-memory-mib'

say "kubectl get events --field-selector involvedObject.name=too-big-share   # why it waits"
sleep 2
k get events --field-selector involvedObject.name=too-big-share,reason=FailedScheduling -o custom-columns='REASON:.reason,MESSAGE:.message' | awk 'NR <= 2'

say "kubectl get inferencepipeline video-analytics   # planned per stage: GPU type, batch, replicas"
for _ in $(seq 30); do
  [[ "$(k get inferencepipeline video-analytics -o jsonpath='{.status.phase}')" == Serving ]] && break
  sleep 1
done
k get inferencepipeline video-analytics -o custom-columns='NAME:.metadata.name,PHASE:.status.phase,GPUS:.status.gpuTypes,P99-MS:.status.predictedP99Ms,COST/H:.status.costPerHour'

say "kubectl get modelvariants   # one serving group: shared base replicas, deltas on GPU or swapped"
for _ in $(seq 60); do
  serving=$(k get modelvariants -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -cE '^(Serving|Swapped)$' || true)
  [[ "$serving" -ge 3 ]] && break
  sleep 1
done
k get modelvariants -o custom-columns='NAME:.metadata.name,PHASE:.status.phase,GROUP:.spec.servingGroup,GPU-TYPE:.status.gpuType,RESIDENCY:.status.residency,SWAP-MS:.status.expectedSwapLatencyMs,REPLICA:.status.servingReplica'
say "kubectl get configmap llama-7b-placement -o jsonpath='{.data.placement\.txt}'   # the data plane's contract"
k get configmap llama-7b-placement -o jsonpath='{.data.placement\.txt}' || true

say "kubectl chronotope gpus --gpu-type T4   # the GPU map (plugin: .venv/bin/kubectl-chronotope)"
PATH="$PWD/.venv/bin:$PATH" KUBECONFIG="$kubeconfig" kubectl chronotope gpus --gpu-type T4 || true
say "kubectl chronotope plan -A   # the space-time plan"
PATH="$PWD/.venv/bin:$PATH" KUBECONFIG="$kubeconfig" kubectl chronotope plan -A || true

echo
echo "Also: kubectl chronotope why trainingjob/NAME, kubectl chronotope top (with .venv/bin on PATH)"
echo "Dashboard: http://127.0.0.1:8090/"
echo "The cluster keeps running. Use it with:  export KUBECONFIG=$kubeconfig"
echo "Stop it with:                            make down"
