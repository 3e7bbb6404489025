#!/usr/bin/env python3
"""Scheduling throughput of kube-scheduler + the Chronotope extender vs kube-scheduler alone.

Same kwok cluster, same run: POD_COUNT one-GPU pods go to the default
scheduler, then the same number to the `chronotope` scheduler (kube-scheduler
+ extender over HTTPS with a client certificate); throughput is pods bound per second from the first
create to the last binding, and the figure that matters is the ratio. With
`--mix mixed` the chronotope pods alternate whole GPUs (1 or 2) and GPU shares
(the default scheduler cannot place shares, so its run stays one-GPU pods).
Then filter and prioritize latency over HTTPS with every node of the cluster as
candidates (p50/p99, client side over one kept-alive connection as
kube-scheduler's, so TLS, HTTP and JSON costs are included), and the calls of
each verb the extender served during the chronotope run. The latency probe
starts once the cluster is quiet again: every pod of the run Running (kwok has
written their status, and the extender's watch has seen it) and then
`--quiet` seconds more. During the run itself, with the control plane and kwok
saturating this machine's cores, the figure is the share of filters the
extender answered within 10 ms (its own histogram), printed beside it.

With `--rounds N` (N > 1) the two runs alternate N times on the same cluster
(default, chronotope, default, ...; each round's pods stay bound), and each
round's ratio is printed with their median: the default scheduler's own rate
moves by tens of percent between runs on this shared machine, so one pair is
a noisy figure.

Figures only; nothing here gates. Usage:
    .venv/bin/python bench/extender_throughput.py [--spec SPEC.yaml] [--pods 500] [--mix mixed]
                                                  [--rounds 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import ssl
import statistics
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from chronotope.devcluster.cluster import LocalCluster
from chronotope.devcluster.settings import ClusterSettings
from chronotope.kube.client import api_client
from chronotope.kube.nodes import wait_nodes_untainted
from chronotope.sim.clusterspec import load_spec

ROOT = Path(__file__).resolve().parents[1]


SHARES = ((30, 4000), (50, 8000), (20, 2000))


def _pod(name: str, scheduler: str, kind: int = 0) -> dict[str, Any]:
    """Kind 0: one whole GPU; odd kinds: a GPU share; other even kinds: two whole GPUs."""
    limits: dict[str, str] = {"nvidia.com/gpu": "2" if kind and kind % 2 == 0 else "1"}
    annotations: dict[str, str] = {}
    if kind % 2 == 1:
        percent, mib = SHARES[(kind // 2) % len(SHARES)]
        limits = {"chronotope.dev/gpu-share": "1"}
        annotations = {
            "chronotope.dev/gpu-compute-percent": str(percent),
            "chronotope.dev/gpu-memory-mib": str(mib),
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {"name": "c", "image": "registry.example/x:1", "resources": {"limits": limits}}
            ],
        },
    }


def _throughput(
    core: client.CoreV1Api, ns: str, scheduler: str, count: int, mixed: bool = False
) -> float:
    core.create_namespace({"metadata": {"name": ns}})
    while not core.list_namespaced_service_account(ns).items:
        time.sleep(0.2)
    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda i: core.create_namespaced_pod(
                    ns, _pod(f"p-{i}", scheduler, i % 6 if mixed else 0)
                ),
                range(count),
            )
        )
    while True:
        bound = sum(1 for p in core.list_namespaced_pod(ns).items if p.spec.node_name)
        if bound >= count:
            return count / (time.perf_counter() - start)
        if time.perf_counter() - start > 900:
            raise TimeoutError(f"{scheduler}: only {bound}/{count} bound after 900 s")
        time.sleep(0.2)


def _wait_running(core: client.CoreV1Api, ns: str, count: int, timeout: float = 300) -> float:
    """Seconds until all `count` pods in `ns` are Running (kwok wrote their status)."""
    start = time.perf_counter()
    while True:
        running = sum(1 for p in core.list_namespaced_pod(ns).items if p.status.phase == "Running")
        if running >= count:
            return time.perf_counter() - start
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"only {running}/{count} pods Running after {timeout:.0f} s")
        time.sleep(1.0)


def _cpu_seconds(processes: list[dict[str, Any]]) -> dict[str, float]:
    """User + system CPU seconds so far of each cluster process, by name (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for proc in processes:
        try:
            fields = Path(f"/proc/{proc['pid']}/stat").read_text().rsplit(") ", 1)[1].split()
        except OSError:
            continue
        out[str(proc["name"])] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _cpu_per_pod(before: dict[str, float], after: dict[str, float], pods: int) -> dict[str, float]:
    return {k: (after[k] - before.get(k, 0.0)) * 1000 / pods for k in after}


def _latency(
    port: int, tls: ssl.SSLContext, verb: str, nodes: list[str], samples: int
) -> tuple[float, float]:
    """p50 and p99 in ms over one kept-alive HTTPS connection with kube-scheduler's client
    certificate (`tls`), as kube-scheduler's client calls."""
    pod = _pod("probe", "chronotope")
    pod["metadata"]["namespace"] = "default"
    body = json.dumps({"Pod": pod, "NodeNames": nodes}).encode()
    headers = {"Content-Type": "application/json"}
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=tls)
    times = []
    try:
        for _ in range(samples):
            start = time.perf_counter()
            conn.request("POST", f"/{verb}", body=body, headers=headers)
            conn.getresponse().read()
            times.append((time.perf_counter() - start) * 1000)
    finally:
        conn.close()
    times.sort()
    return statistics.median(times), times[int(0.99 * (len(times) - 1))]


def _server_buckets(port: int, tls: ssl.SSLContext, verb: str) -> dict[float, float]:
    """The extender's own latency histogram for `verb`: upper bound (s) -> cumulative count."""
    url = f"https://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10, context=tls) as resp:
        text = resp.read().decode()
    prefix = 'chronotope_extender_request_seconds_bucket{le="'
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix) and f'verb="{verb}"' in line:
            le = line[len(prefix) :].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def _server_within(before: dict[float, float], after: dict[float, float], bound: float) -> float:
    """Share of the requests between two histogram reads that the server answered within
    `bound` seconds (bucket edges; the handler's own time, without the HTTP client's)."""
    total = after[float("inf")] - before.get(float("inf"), 0.0)
    within = after.get(bound, 0.0) - before.get(bound, 0.0)
    return within / total if total else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "manifests/clusters/openb.yaml")
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--samples", type=int, default=1000, help="latency probe requests")
    parser.add_argument(
        "--quiet",
        type=float,
        default=10.0,
        help="seconds to wait after the run's pods are all Running, before the latency probe",
    )
    parser.add_argument("--mix", choices=("whole", "mixed"), default="whole")
    parser.add_argument(
        "--rounds", type=int, default=1, help="alternate the two runs this many times"
    )
    parser.add_argument("--policy", default="chronotope", help="the extender's online policy")
    parser.add_argument(
        "--percentage-of-nodes-to-score",
        type=int,
        default=None,
        help="override the chronotope profile's percentageOfNodesToScore (100 in the shipped "
        "config, so the policy sees every node as the simulator does; 0 is kube-scheduler's "
        "adaptive default)",
    )
    args = parser.parse_args()
    spec = load_spec(args.spec)
    base = ClusterSettings.from_env()
    with tempfile.TemporaryDirectory() as state:
        settings = ClusterSettings(
            cache_dir=base.cache_dir, state_root=Path(state), bin_dir=base.bin_dir
        )
        if args.percentage_of_nodes_to_score is not None:
            config = yaml.safe_load(settings.chronotope_scheduler_config.read_text())
            config["percentageOfNodesToScore"] = args.percentage_of_nodes_to_score
            path = Path(state) / "chronotope-scheduler-config.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            settings = dataclasses.replace(settings, chronotope_scheduler_config=path)
        cluster = LocalCluster(settings, "bench")
        print(f"cluster: {spec.node_count} nodes, {spec.gpu_count} GPUs ({args.spec.name})")
        cluster.up(spec)
        try:
            port = cluster.start_chronotope_scheduler(extender_args=("--policy", args.policy))
            tls = cluster.extender_pki().client_context()  # kube-scheduler's certificate
            state_ = cluster.load_state()
            assert state_ is not None
            with api_client(state_.kubeconfig, qps_connections=16) as api:
                core = client.CoreV1Api(api)
                # both schedulers see the same nodes: none still tainted not-ready
                names = {n.metadata.name for n in core.list_node().items}
                wait_nodes_untainted(api, names, timeout=600)
                procs = (cluster.load_state() or state_).processes
                cpu0 = _cpu_seconds(procs)
                alone = _throughput(core, "bench-default", "default-scheduler", args.pods)
                cpu1 = _cpu_seconds(procs)
                calls0 = {
                    v: _server_buckets(port, tls, v) for v in ("filter", "prioritize", "bind")
                }
                ours = _throughput(
                    core, "bench-chronotope", "chronotope", args.pods, args.mix == "mixed"
                )
                cpu2 = _cpu_seconds(procs)
                rounds = [(alone, ours)]
                for r in range(1, args.rounds):
                    again = _throughput(core, f"bench-default-{r}", "default-scheduler", args.pods)
                    mine = _throughput(
                        core, f"bench-chronotope-{r}", "chronotope", args.pods, args.mix == "mixed"
                    )
                    rounds.append((again, mine))
                    ratio = mine / again
                    print(f"round {r + 1}: {again:.1f} / {mine:.1f} pods/s, ratio {ratio:.2f}")
                run10 = _server_within(calls0["filter"], _server_buckets(port, tls, "filter"), 0.01)
                calls = {  # the chronotope runs of every round
                    v: int(
                        _server_buckets(port, tls, v).get(float("inf"), 0.0)
                        - b.get(float("inf"), 0.0)
                    )
                    for v, b in calls0.items()
                }
                nodes = [n.metadata.name for n in core.list_node().items]
                last = "bench-chronotope" + (f"-{args.rounds - 1}" if args.rounds > 1 else "")
                settle = _wait_running(core, last, args.pods)
                time.sleep(args.quiet)
            hist0 = _server_buckets(port, tls, "filter")
            f50, f99 = _latency(port, tls, "filter", nodes, args.samples)
            server10 = _server_within(hist0, _server_buckets(port, tls, "filter"), 0.01)
            p50, p99 = _latency(port, tls, "prioritize", nodes, args.samples)
        finally:
            cluster.down()
    pct = args.percentage_of_nodes_to_score
    print(
        f"pods: {args.pods} per scheduler, mix {args.mix}, policy {args.policy}, "
        f"percentageOfNodesToScore {100 if pct is None else pct}"
    )
    print(f"{'metric':<44}{'value':>12}")
    print(f"{'kube-scheduler alone (pods/s)':<44}{alone:>12.1f}")
    print(f"{'kube-scheduler + chronotope extender (pods/s)':<44}{ours:>12.1f}")
    print(f"{'ratio (goal >= 0.7)':<44}{ours / alone:>12.2f}")
    if len(rounds) > 1:
        ratios = [b / a for a, b in rounds]
        listed = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"{f'ratio per round ({len(rounds)} rounds)':<44}{listed:>12}")
        print(f"{'ratio, median of the rounds':<44}{statistics.median(ratios):>12.2f}")
        pooled = sum(b for _, b in rounds) / sum(a for a, _ in rounds)
        print(f"{'ratio of the rounds mean rates':<44}{pooled:>12.2f}")
    print(f"{f'filter p50 / p99 ms ({len(nodes)} nodes)':<44}{f50:>6.2f} / {f99:.2f}")
    print(f"{f'prioritize p50 / p99 ms ({len(nodes)} nodes)':<44}{p50:>6.2f} / {p99:.2f}")
    print(f"{'filters within 10 ms, server side, probe':<44}{server10:>12.1%}")
    print(f"{'filters within 10 ms, server side, run':<44}{run10:>12.1%}")
    print(
        f"probe started {settle:.0f} s after the last bind (all pods Running) + {args.quiet:.0f} s;"
        f" {args.samples} samples per verb"
    )
    print("CPU ms per pod by process (default run / chronotope run):")
    for name, ms in sorted(_cpu_per_pod(cpu1, cpu2, args.pods).items()):
        print(f"  {name:<42}{_cpu_per_pod(cpu0, cpu1, args.pods).get(name, 0.0):>6.1f} / {ms:.1f}")
    served = ", ".join(f"{v} {n}" for v, n in calls.items())
    print(f"{'calls served in the chronotope run':<44}{served:>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
