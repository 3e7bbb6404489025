"""One malformed TrainingJob marks itself and never holds the queue back.

The issue's probe (`containers: "not-a-list"`) can no longer be stored: the CRD
embeds the PodTemplateSpec schema, so the API server refuses it even with the
admission webhook gone. The job that still gets past both is a template of the
right types that the operator cannot build workers from (a container without an
image: the Pod API leaves `image` optional for higher-level controllers, and
only the webhook denies it).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client

from e2e.kubetest import KubeCluster, wait_for

GROUP, VERSION, PLURAL = "chronotope.dev", "v1alpha1", "trainingjobs"


def _job(name: str, template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "gpu": {"count": 1},
            "queue": "shared-q",
            "gpuTypes": [{"name": "L4", "relativeSpeed": 1.0}],
            "estimate": {"referenceGpuType": "L4", "durationSeconds": 600},
            "template": template,
        },
    }


def _create_past_the_webhook(
    kube_cluster: KubeCluster, api: Any, namespace: str, obj: dict[str, Any]
) -> str:
    """Create a job the admission webhook would deny, as if stored before it was installed.

    With the webhook gone, also try the issue's probe; returns the API server's refusal.
    """
    from kubernetes.client.exceptions import ApiException

    from chronotope.devcluster.cluster import WEBHOOK_NAME
    from chronotope.kube.admission import delete_webhook_configurations

    custom = client.CustomObjectsApi(api)
    delete_webhook_configurations(api, WEBHOOK_NAME)

    def created() -> bool:
        try:
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, obj)
        except ApiException as exc:  # the API server may still apply the deleted registration
            if exc.status != 422 or "admission webhook" not in str(exc.body):
                raise
            return False
        return True

    probe = _job("probe", {"spec": {"containers": "not-a-list"}})
    try:
        wait_for(created, 30, "the webhook registration to be gone")
        with pytest.raises(ApiException) as refused:
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, probe)
    finally:
        kube_cluster.local.register_webhooks()
    assert refused.value.status == 422
    return str(refused.value.body)


def test_a_bad_template_is_marked_and_does_not_block_its_queue(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    with kube_cluster.api_client() as api:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        bad = _job("bad-template", {"spec": {"containers": [{"name": "w"}]}})
        refusal = _create_past_the_webhook(kube_cluster, api, namespace, bad)
        assert "admission webhook" not in refusal  # the CRD's schema, not the webhook
        assert "spec.template.spec.containers" in refusal
        assert "must be of type array" in refusal
        time.sleep(1)  # older: ahead of the good one in the queue
        good = _job("good", {"spec": {"containers": [{"name": "w", "image": "x"}]}})
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, good)

        def status(name: str) -> dict[str, Any]:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            return dict(obj.get("status") or {})

        wait_for(lambda: status("good").get("phase") in ("Starting", "Running"), 60, "good starts")
        wait_for(lambda: status("bad-template").get("phase") == "Pending", 30, "bad marked")
        st = status("bad-template")
        assert "template.spec.containers[0] needs a string name and image" in st["whyWaiting"]
        (cond,) = [c for c in st["conditions"] if c["type"] == "Schedulable"]
        assert (cond["status"], cond["reason"]) == ("False", "InvalidSpec")
        time.sleep(5)  # several reconcile cycles: still one event
        events = [
            e
            for e in core.list_namespaced_event(namespace).items
            if e.involved_object.name == "bad-template" and e.reason == "InvalidSpec"
        ]
        assert len(events) == 1
        assert (events[0].count or 1) == 1
