"""The operator's dashboard in a real browser (Debian Chromium driven by Playwright):
the GPU map names a known pod's GPU, the Gantt shows the jobs on their planned GPU types,
a job added with the API appears without a reload, and markup in user strings stays text.
Screenshots go to test-artifacts/."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.kubetest import KubeCluster, wait_for

ROOT = Path(__file__).resolve().parents[2]
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
