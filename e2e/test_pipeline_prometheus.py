"""The InferencePipeline tuner on live traffic: a real Prometheus scrapes a process that
replays a request counter, the operator queries it, and the stage Deployments scale up
when the traffic bursts and back down only after the tuner's delay. The same process
exports a request-latency histogram: the observed P99 reaches the status, and crossing
the SLO flips `SloMet` with one event each way."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.conftest import TUNER_DOWN_DELAY_S
from e2e.kubetest import KubeCluster, operator_metrics, prometheus_server, wait_for

GROUP, VERSION, PLURAL = "chronotope.dev", "v1alpha1", "inferencepipelines"


BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0)
"""Upper bounds (seconds) of the exported latency histogram's buckets."""


def p99_in(bucket: int) -> float:
    """histogram_quantile(0.99, ...) in ms when every request falls in bucket `bucket`.

    Prometheus interpolates linearly within the bucket; the buckets below hold nothing.
    """
    lower = BUCKETS[bucket - 1] if bucket else 0.0
    return (lower + (BUCKETS[bucket] - lower) * 0.99) * 1000


class Replay:
    """A request counter that grows at a rate the test sets, and a latency histogram whose
    requests all take as long as bucket `latency_bucket` says (what a server would export)."""

    def __init__(self) -> None:
        self.rate = 40.0
        self.latency_bucket = 1
        self._count = 0.0
        self._buckets = [0.0] * len(BUCKETS)
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def set_rate(self, rate: float) -> None:
        with self._lock:
            self._advance()
            self.rate = rate

    def set_latency_bucket(self, bucket: int) -> None:
        with self._lock:
            self._advance()
            self.latency_bucket = bucket

    def value(self) -> float:
        with self._lock:
            self._advance()
            return self._count

    def exposition(self) -> str:
        """The counter and the histogram in Prometheus' text format."""
        with self._lock:
            self._advance()
            lines = [
                "# TYPE requests_total counter",
                f"requests_total {self._count:.3f}",
                "# TYPE pipeline_request_seconds histogram",
            ]
            cumulative = 0.0
            for bound, n in zip(BUCKETS, self._buckets, strict=True):
                cumulative += n
                lines.append(f'pipeline_request_seconds_bucket{{le="{bound}"}} {cumulative:.3f}')
            lines.append(f'pipeline_request_seconds_bucket{{le="+Inf"}} {cumulative:.3f}')
            lines.append(f"pipeline_request_seconds_count {cumulative:.3f}")
            return "\n".join(lines) + "\n"

    def _advance(self) -> None:
        now = time.monotonic()
        arrived = self.rate * (now - self._at)
        self._count += arrived
        self._buckets[self.latency_bucket] += arrived
        self._at = now


@pytest.fixture
def traffic(tmp_path: Path) -> Iterator[tuple[Replay, str]]:
    """The replaying exporter and a real Prometheus scraping it every second; (replay, URL)."""
    replay = Replay()

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = replay.exposition()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *_: Any) -> None:
            return

    exporter = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "replay",
                "static_configs": [{"targets": [f"127.0.0.1:{exporter.server_address[1]}"]}],
            }
        ],
    }
    try:
        with prometheus_server(config, tmp_path) as url:
            # the plan is made for the rate when the pipeline is created: let it settle first
            wait_for(lambda: abs((_rate(url) or 0.0) - replay.rate) < 4, 60, "Prometheus rate ~40")
            yield replay, url
    finally:
        exporter.shutdown()


QUERY = "rate(requests_total[5s])"


def _query(url: str, query: str) -> float | None:
    q = urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=2) as resp:
            result = json.loads(resp.read())["data"]["result"]
    except OSError:
        return None
    return float(result[0]["value"][1]) if result else None


def _rate(url: str) -> float | None:
    return _query(url, QUERY)


P99_QUERY = "histogram_quantile(0.99, sum(rate(pipeline_request_seconds_bucket[5s])) by (le))"


def _pipeline(url: str, **slo: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferencePipeline",
        "metadata": {"name": "live"},
        "spec": {
            "stages": [
                {
                    "name": "embed",
                    "model": {"image": "registry.example/embed:1"},
                    "profiles": [
                        {
                            "gpuType": "V100-SXM2-32GB",
                            "batches": [
                                {"batchSize": 1, "latencyMs": 10, "throughputQPS": 100},
                                {"batchSize": 8, "latencyMs": 40, "throughputQPS": 200},
                            ],
                        }
                    ],
                    "maxReplicas": 8,
                }
            ],
            "slo": {"p99LatencyMs": 200, **slo},
            "traffic": {"prometheus": {"query": QUERY, "address": url}},
            "costs": [{"gpuType": "V100-SXM2-32GB", "perHour": 1.5}],
        },
    }


def test_the_tuner_follows_live_traffic_from_prometheus(
    kube_cluster: KubeCluster,
    chronotope_operator: None,
    namespace: str,
    traffic: tuple[Replay, str],
) -> None:
    replay, url = traffic
    with kube_cluster.api_client() as api:
        custom, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)

        def replicas() -> int:
            d = apps.read_namespaced_deployment("live-embed", namespace)
            return int(d.spec.replicas)

        def status() -> dict[str, Any]:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "live")
            return dict(obj.get("status") or {})

        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _pipeline(url))
        wait_for(lambda: status().get("phase") == "Serving", 60, "serving")
        base = replicas()
        assert base == status()["stages"][0]["plannedReplicas"]
        replay.set_rate(600.0)  # a burst well past what the plan was made for
        burst_at = time.monotonic()
        wait_for(lambda: replicas() > base, 30, "scaled up")
        up_at = time.monotonic()
        assert up_at - burst_at < 20  # within a few tuner periods and the 5 s rate window
        assert status()["tuner"]["mode"] in ("ScalingUp", "Steady")
        grown = replicas()
        replay.set_rate(40.0)
        wait_for(lambda: replicas() < grown, TUNER_DOWN_DELAY_S + 60, "scaled down")
        down_at = time.monotonic()
        assert down_at - up_at >= TUNER_DOWN_DELAY_S  # never down within the delay
        wait_for(lambda: replicas() == base, TUNER_DOWN_DELAY_S + 60, "back to the plan")

        def reasons() -> set[str]:
            return {
                e.reason
                for e in client.CoreV1Api(api).list_namespaced_event(namespace).items
                if e.involved_object.name == "live"
            }

        # the events are posted after the Deployment patch: give them a moment
        wait_for(lambda: {"Planned", "ScaledUp", "ScaledDown"} <= reasons(), 30, "tuner events")
        assert len(status()["tuner"]["scalingTable"]) >= 3
        # the current-replicas gauge is read from status.stages, which the operator writes at
        # the reconcile after the Deployment scaled down: wait for that write, then read
        wait_for(lambda: status()["stages"][0].get("replicas") == base, 30, "status at the plan")
        metrics = operator_metrics(kube_cluster)
        for reason in ("Planned", "ScaledUp", "ScaledDown"):
            assert f'chronotope_pipeline_events_total{{reason="{reason}"}}' in metrics
        stage = f'namespace="{namespace}",pipeline="live",stage="embed"'
        assert f'chronotope_pipeline_replicas{{kind="planned",{stage}}} {base}.0' in metrics
        assert f'chronotope_pipeline_replicas{{kind="current",{stage}}} {base}.0' in metrics
        assert "chronotope_pipeline_cost_per_hour{" in metrics


def test_observed_p99_from_prometheus_against_the_slo(
    kube_cluster: KubeCluster,
    chronotope_operator: None,
    namespace: str,
    traffic: tuple[Replay, str],
) -> None:
    replay, url = traffic
    within, over = p99_in(1), p99_in(3)  # 99.5 ms and 497.5 ms against a 200 ms SLO
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

        def status() -> dict[str, Any]:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "live")
            return dict(obj.get("status") or {})

        def slo_met() -> dict[str, Any]:
            found = [c for c in status().get("conditions") or [] if c["type"] == "SloMet"]
            return found[0] if found else {}

        def events(reason: str) -> list[Any]:
            return [
                e
                for e in core.list_namespaced_event(namespace).items
                if e.involved_object.name == "live" and e.reason == reason
            ]

        def observed_near(ms: float) -> bool:
            got = status().get("observedP99Ms")
            return got is not None and abs(got - ms) <= 0.1

        wait_for(lambda: (_query(url, P99_QUERY) or 0) > 0, 30, "the histogram in Prometheus")
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, _pipeline(url, observedP99Query=P99_QUERY)
        )
        wait_for(lambda: observed_near(within), 60, f"observedP99Ms ~{within} ms")
        # what Prometheus answers is what the status says, to the rounding (0.1 ms)
        assert abs(status()["observedP99Ms"] - _query(url, P99_QUERY) * 1000) <= 0.1  # type: ignore[operator]
        met = slo_met()
        assert (met["status"], met["reason"]) == ("True", "ObservedWithinSlo")
        point = status()["p99History"][-1]
        assert point["observedMs"] == status()["observedP99Ms"]
        assert point["predictedMs"] == status()["predictedP99Ms"]
        assert events("SloViolated") == []

        replay.set_latency_bucket(3)  # every request now takes 250-500 ms
        wait_for(lambda: slo_met().get("status") == "False", 30, "SloMet=False")
        assert slo_met()["reason"] == "ObservedOverSlo"
        wait_for(lambda: observed_near(over), 30, f"observedP99Ms ~{over} ms")
        time.sleep(6)  # several more passes over the SLO: still one event
        (violated,) = events("SloViolated")
        assert violated.type == "Warning"
        assert "over the SLO of 200 ms" in violated.message
        assert status()["phase"] == "Serving"  # planning and serving are untouched

        replay.set_latency_bucket(1)  # back within; the 5 s rate window forgets the slow ones
        wait_for(lambda: slo_met().get("status") == "True", 30, "SloMet=True again")
        wait_for(lambda: len(events("SloRecovered")) == 1, 15, "one SloRecovered event")
        time.sleep(4)
        assert len(events("SloViolated")) == 1
        assert len(events("SloRecovered")) == 1
