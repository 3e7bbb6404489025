"""The operator's dashboard in a real browser (Debian Chromium driven by Playwright):
the GPU map names a known pod's GPU, the Gantt shows the jobs on their planned GPU types,
a job added with the API appears without a reload, markup in user strings stays text, and
a pipeline's predicted and observed P99 over time is charted against its SLO.
Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client

from e2e.kubetest import KubeCluster, wait_for

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
GROUP, VERSION = "chronotope.dev", "v1alpha1"
MARKUP = '<img src=x onerror="document.title=1"><b>bold</b>'


def _job(name: str, gpu_type: str, description: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if description:
        meta["annotations"] = {"kubernetes.io/description": description}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "gpu": {"count": 1},
            "gpuTypes": [{"name": gpu_type, "relativeSpeed": 1.0}],
            "estimate": {"referenceGpuType": gpu_type, "durationSeconds": 3600},
            "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
        },
    }


@pytest.fixture
def page() -> Iterator[Any]:
    """A headless Chromium page (the system's `chromium`, installed by hack/system-packages.sh)."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail("Debian `chromium` is needed (hack/test.sh installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=binary, args=["--no-sandbox"])
        try:
            yield browser.new_page(viewport={"width": 1100, "height": 900})
        finally:
            browser.close()


def test_the_dashboard_shows_gpus_the_plan_and_new_jobs_live(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str, page: Any
) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", _job("alpha", "V100-SXM2-32GB", MARKUP)
        )
        wait_for(
            lambda: (
                core.list_namespaced_pod(namespace).items
                and all(p.spec.node_name for p in core.list_namespaced_pod(namespace).items)
            ),
            90,
            "alpha's worker bound",
        )
        worker = core.list_namespaced_pod(namespace).items[0]
        gpu = worker.metadata.annotations["chronotope.dev/assigned-gpus"]
        key = f"{namespace}/{worker.metadata.name}"
        page.goto(f"http://127.0.0.1:{chronotope_operator}/")
        cell = page.wait_for_selector(
            f'[data-gpu="{worker.spec.node_name}/{gpu}"][data-holders*="{key}"]', timeout=30000
        )
        assert key in cell.get_attribute("title")
        bar = page.wait_for_selector(f'rect[data-job="{namespace}/alpha"]', timeout=30000)
        wait_for(
            lambda: (
                page.get_attribute(f'rect[data-job="{namespace}/alpha"]', "data-gpu-type")
                == "V100-SXM2-32GB"
            ),
            60,
            "alpha planned on V100 in the Gantt",
        )
        assert bar is not None
        # markup in a description is shown as text, never run or rendered
        row = page.wait_for_selector(f'#jobs tr[data-job="{namespace}/alpha"]', timeout=30000)
        assert MARKUP in row.inner_text()
        assert page.query_selector("#jobs b") is None
        assert page.query_selector("#jobs img") is None
        assert page.title() == "Chronotope"
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        # a job added now appears without a reload
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", _job("beta", "L4")
        )
        started = time.monotonic()
        page.wait_for_selector(f'rect[data-job="{namespace}/beta"]', timeout=30000)
        assert time.monotonic() - started < 30
        page.screenshot(path=str(ARTIFACTS / "dashboard-live.png"), full_page=True)


RATE_QUERY = "rate(requests_total[5s])"
P99_QUERY = "histogram_quantile(0.99, sum(rate(pipeline_request_seconds_bucket[1m])) by (le))"
OBSERVED_S = 0.3125
"""What the stand-in Prometheus answers for the P99 query (seconds): over the 250 ms SLO."""


@pytest.fixture
def prometheus() -> Iterator[str]:
    """A stand-in for Prometheus' instant-query API: 40 queries/s, and P99 = OBSERVED_S.

    The browser test is about rendering; the real Prometheus is in test_pipeline_prometheus.
    """

    class Query(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query).get("query", [""])[0]
            value = OBSERVED_S if query == P99_QUERY else 40.0
            result = [{"metric": {}, "value": [time.time(), str(value)]}]
            body = json.dumps(
                {"status": "success", "data": {"resultType": "vector", "result": result}}
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *_: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Query)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _latency_pipeline(url: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferencePipeline",
        "metadata": {"name": "lat"},
        "spec": {
            "stages": [
                {
                    "name": "embed",
                    "model": {"image": "registry.example/embed:1"},
                    "profiles": [
                        {
                            "gpuType": "V100-SXM2-32GB",
                            "batches": [{"batchSize": 1, "latencyMs": 10, "throughputQPS": 100}],
                        }
                    ],
                }
            ],
            "slo": {"p99LatencyMs": 250, "observedP99Query": P99_QUERY},
            "traffic": {"prometheus": {"query": RATE_QUERY, "address": url}},
            "costs": [{"gpuType": "V100-SXM2-32GB", "perHour": 1.5}],
        },
    }


def _points(polyline: Any) -> list[tuple[float, float]]:
    pairs = polyline.get_attribute("points").split()
    return [(float(x), float(y)) for x, y in (p.split(",") for p in pairs)]


def test_the_dashboard_charts_predicted_against_observed_p99(
    kube_cluster: KubeCluster,
    chronotope_operator: int,
    namespace: str,
    page: Any,
    prometheus: str,
) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    key = f"{namespace}/lat"
    with kube_cluster.api_client() as api:
        custom = client.CustomObjectsApi(api)
        plural = "inferencepipelines"

        def status() -> dict[str, Any]:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, "lat")
            return dict(obj.get("status") or {})

        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, _latency_pipeline(prometheus)
        )
        # the controller's own first point first: a pass that began before the patch below
        # then finds its history unchanged and leaves the patched one alone
        wait_for(lambda: status().get("observedP99Ms") == 312.5, 60, "observed P99 read")
        assert status()["p99History"]
        # ten known points, 30 s apart and ending now: observed climbs over the SLO, one gap
        now = datetime.now(UTC).replace(microsecond=0)
        observed = [100, 120, 140, None, 180, 220, 260, 290, 300, 312.5]
        history = []
        for i, ms in enumerate(observed):
            point: dict[str, Any] = {
                "time": (now - timedelta(seconds=30 * (9 - i))).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "predictedMs": 150.0,
            }
            if ms is not None:
                point["observedMs"] = ms
            history.append(point)
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, plural, "lat", {"status": {"p99History": history}}
        )
        wait_for(lambda: len(status().get("p99History") or []) >= 10, 30, "patched history")

        page.goto(f"http://127.0.0.1:{chronotope_operator}/")
        chart = f'svg.p99[data-pipeline="{key}"]'
        page.wait_for_selector(f'{chart} polyline[data-series="observed"]', timeout=30000)
        wait_for(
            lambda: len(page.query_selector_all(f"{chart} polyline")) == 3,
            30,
            "the patched history drawn",
        )
        predicted = page.query_selector_all(f'{chart} polyline[data-series="predicted"]')
        observed_runs = page.query_selector_all(f'{chart} polyline[data-series="observed"]')
        slo = page.query_selector_all(f'{chart} line[data-series="slo"]')
        assert (len(predicted), len(observed_runs), len(slo)) == (1, 2, 1)  # the gap splits it
        # ten points, or eleven if the controller's next 30 s slot began meanwhile
        drawn = _points(predicted[0])
        assert len(drawn) in (10, 11)
        before_gap, after_gap = (_points(p) for p in observed_runs)
        assert (len(before_gap), len(after_gap)) == (3, len(drawn) - 4)
        # time runs left to right; a higher latency is drawn higher (smaller y)
        xs = [x for x, _ in before_gap + after_gap]
        assert xs == sorted(xs)
        slo_y = float(slo[0].get_attribute("y1"))
        assert slo[0].get_attribute("y1") == slo[0].get_attribute("y2")  # horizontal
        assert before_gap[0][1] > slo_y > after_gap[-1][1]  # 100 ms below, 312.5 ms above
        assert after_gap[1][1] > slo_y > after_gap[2][1]  # 220 ms below, 260 ms above
        assert page.text_content(f'{chart} line[data-series="slo"] title') == "SLO 250 ms"
        # the table row: predicted / observed / SLO, and the SloMet verdict
        row = page.wait_for_selector(f'#pipelines tr[data-pipeline="{key}"]', timeout=30000)
        text = row.inner_text()
        assert " / 312.5 / 250" in text
        assert "False (ObservedOverSlo)" in text
        page.screenshot(path=str(ARTIFACTS / "dashboard-p99.png"), full_page=True)


def test_the_dashboard_shows_a_queues_quota_and_who_waits_next(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str, page: Any
) -> None:
    from e2e.test_queues import (
        _local_queue,
        _queues,
        _reason,
        _running,
        _solo_queue,
        _status,
        _submit,
    )
    from e2e.test_trainingjob import _gpu_nodes

    ARTIFACTS.mkdir(exist_ok=True)
    tag = uuid.uuid4().hex[:6]
    gpu_type, team, ns = f"DASH-{tag.upper()}", f"d{tag}", namespace
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        with (
            _gpu_nodes(api, core, f"dn-{tag}", gpu_type, 1, per_node=8),
            _queues(custom, _solo_queue(team, gpu_type, 2)),
        ):
            custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "localqueues", _local_queue(ns, team)
            )
            _submit(custom, ns, "first", gpu_type, "default")  # 2 GPUs: the whole quota
            _running(custom, ns, "first", 60, "first running")
            _submit(custom, ns, "second", gpu_type, "default")
            wait_for(lambda: _reason(_status(custom, ns, "second")) == "QuotaExceeded", 30, "2nd")
            page.goto(f"http://127.0.0.1:{chronotope_operator}/")
            row = f'#queues tr[data-queue="{team}"]'
            page.wait_for_selector(row, timeout=30000)
            wait_for(
                lambda: f"{ns}/second" in page.inner_text(row), 30, "the waiting job as next up"
            )
            label = page.text_content(f'{row} text[data-gpu-type="{gpu_type}"]')
            assert label == "2 of 2 (0 borrowed, 0 lent)"
            used = page.get_attribute(f'{row} rect[data-part="used"]', "width")
            assert used is not None
            assert float(used) > 0
            cells = page.inner_text(f'#jobs tr[data-job="{ns}/second"]')
            assert f"default → {team}" in cells
            page.screenshot(path=str(ARTIFACTS / "dashboard-queues.png"), full_page=True)
