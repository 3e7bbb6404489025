"""Command lines for each control-plane component.

Pure functions from ports and paths to argv lists, kept apart from process
management so they are easy to read and test. The flags are the minimum for a
single-node control plane that behaves like a real cluster: RBAC
authorization, service-account tokens, the admission chain, and
controller-manager's controllers (Deployments, ReplicaSets, Jobs,
ServiceAccounts, garbage collection).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chronotope.devcluster.pki import Pki
from chronotope.sim.clusterspec import KWOK_ANNOTATION

__all__ = [
    "Ports",
    "apiserver_argv",
    "controller_manager_argv",
    "etcd_argv",
    "kwok_argv",
    "scheduler_argv",
]

SERVICE_CIDR = (
    "10.96.0.0/16"  # addresses are only allocated, never routed: no traffic leaves loopback
)
POD_CIDR = "10.244.0.0/16"


@dataclass(frozen=True)
class Ports:
    """The loopback ports of the control-plane components."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int


def etcd_argv(etcd: Path, data_dir: Path, ports: Ports) -> list[str]:
    """The etcd command line: one member on loopback, no fsync (the cluster is throwaway)."""
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(etcd),
        "--name=chronotope",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=chronotope={peer}",
        "--initial-cluster-state=new",
        "--unsafe-no-fsync",  # a throwaway dev cluster: speed over durability
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
    ]


def apiserver_argv(binary: Path, pki: Pki, ports: Ports, audit_dir: Path) -> list[str]:
    """The kube-apiserver command line: TLS on loopback, Node and RBAC authorization."""
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        f"--service-account-key-file={pki.sa_public}",
        f"--service-account-signing-key-file={pki.sa_private}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--allow-privileged=true",
        "--enable-priority-and-fairness=false",
        "--max-requests-inflight=1000",
        "--max-mutating-requests-inflight=500",
        "--endpoint-reconciler-type=none",
        "--storage-media-type=application/vnd.kubernetes.protobuf",
        "--v=1",
    ]


def controller_manager_argv(
    binary: Path, kubeconfig: Path, pki: Pki, ports: Ports, node_grace_s: int
) -> list[str]:
    """The kube-controller-manager command line, without the cloud and network controllers.

    `node_grace_s`: how long a node's Lease may go unrenewed before it is Unknown.
    """
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.controller_manager}",
        "--leader-elect=false",
        f"--service-account-private-key-file={pki.sa_private}",
        f"--root-ca-file={pki.ca_cert}",
        "--use-service-account-credentials=false",
        # cloud and network controllers have nothing to do without real nodes
        "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route",
        f"--cluster-cidr={POD_CIDR}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        "--concurrent-deployment-syncs=10",
        "--concurrent-replicaset-syncs=10",
        f"--node-monitor-grace-period={node_grace_s}s",
        "--v=1",
    ]


def scheduler_argv(binary: Path, config: Path, kubeconfig: Path, ports: Ports) -> list[str]:
    """The kube-scheduler command line, running the scheduler configuration in `config`."""
    return [
        str(binary),
        f"--config={config}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.scheduler}",
        "--v=1",
    ]


def kwok_argv(
    binary: Path, kubeconfig: Path, ports: Ports, stages: Path, lease_s: int
) -> list[str]:
    """The kwok command line: it fakes the kubelets of nodes annotated for kwok.

    `stages` holds the node Stages it plays (manifests/kwok/node-stages.yaml: a node
    status report every 5-10.5 minutes, as a kubelet with a Lease; kwok v0.7.0's own
    choice writes every node's status every 20-45 s). Pod stages are kwok's own.
    `lease_s`: each node's Lease duration; kwok renews it every quarter of that.
    """
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={stages}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
        f"--cidr={POD_CIDR}",
        "--node-ip=127.0.0.1",
        # renew a Lease per node, as a kubelet does: the node lifecycle controller reads
        # it as the heartbeat (without it, every node went Unknown after the 50 s grace
        # period and every pod NotReady for good)
        f"--node-lease-duration-seconds={lease_s}",
        f"--server-address=127.0.0.1:{ports.kwok}",
    ]
