"""The API calls the InferencePipeline controller makes (`controllers.inferencepipeline`).

Nodes come from the operator's watch-fed cache when there is one; ConfigMaps,
ModelVariants and Deployments are read from the API server; a stage's
Deployment and Service are created, or their replicas and pod template
updated; the live rate is one Prometheus instant query.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chronotope.kube import workloads as kw
from chronotope.kube.client import raw_json
from chronotope.kube.reads import KubeReads
from chronotope.workloads.pipeline import PIPELINE_LABEL

__all__ = ["KubePipelineOps"]

_NOT_FOUND = 404
_CONFLICT = 409


class KubePipelineOps(KubeReads):
    """`PipelineOps` on a real API server; see the module docstring."""

    def model_variant(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ModelVariant (from the watch cache when there is one), or None."""
        if self.cache is not None:
            found = self.cache.variants.list(namespace)
            return next((v for v in found if v["metadata"]["name"] == name), None)
        try:
            obj = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
                "chronotope.dev",
                "v1alpha1",
                namespace,
                "modelvariants",
                name,
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status == _NOT_FOUND:
                return None
            raise
        found_one: dict[str, Any] = raw_json(obj)
        return found_one

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One Deployment, or None."""
        try:
            obj = client.AppsV1Api(self.api).read_namespaced_deployment(
                name, namespace, _preload_content=False
            )
        except ApiException as exc:
            if exc.status == _NOT_FOUND:
                return None
            raise
        found: dict[str, Any] = raw_json(obj)
        return found

    def deployments(self, namespace: str, pipeline: str) -> dict[str, dict[str, Any]]:
        """The pipeline's stage Deployments, by name."""
        apps = client.AppsV1Api(self.api)
        data = raw_json(
            apps.list_namespaced_deployment(
                namespace,
                label_selector=f"{PIPELINE_LABEL}={pipeline}",
                _preload_content=False,
            )
        )
        return {d["metadata"]["name"]: d for d in data.get("items") or []}

    def apply(self, deployment: dict[str, Any], service: dict[str, Any]) -> None:
        """Create the Deployment and Service, or update the Deployment's replicas and template."""
        namespace = deployment["metadata"]["namespace"]
        name = deployment["metadata"]["name"]
        apps = client.AppsV1Api(self.api)
        try:
            apps.create_namespaced_deployment(namespace, deployment)
        except ApiException as exc:
            if exc.status != _CONFLICT:
                raise
            apps.patch_namespaced_deployment(name, namespace, {"spec": deployment["spec"]})
        kw.ensure_service(self.api, namespace, service)
