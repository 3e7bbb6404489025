"""The operator's election Lease (coordination.k8s.io/v1) on the API server.

Reads come back as `workloads.leader.LeaseRecord`; writes are optimistic: an
update sends the `resourceVersion` that was read, and a Lease another process
changed in between answers 409, reported here as False (the caller reads
again at its next attempt). The election itself is decided in
`workloads.leader`; the loop that drives it is `controllers.leader`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chronotope.kube.client import raw_json
from chronotope.workloads.leader import LeaseRecord

__all__ = ["KubeLease", "format_time", "parse_time", "record_from_lease"]

CONFLICT, NOT_FOUND = 409, 404


def format_time(at: datetime | None) -> str | None:
    """A MicroTime as the API server writes it (RFC 3339, microseconds, UTC)."""
    if at is None:
        return None
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> datetime | None:
    """A MicroTime (or Time) string as an aware datetime; None when absent."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def record_from_lease(lease: dict[str, Any]) -> LeaseRecord:
    """The election fields of a Lease object (raw JSON)."""
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_s=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=parse_time(spec.get("acquireTime")),
        renew_time=parse_time(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
    )


class KubeLease:
    """One Lease, `namespace/name`, read and written for the election."""

    def __init__(
        self, api: client.ApiClient, namespace: str, name: str, *, timeout_s: float = 5.0
    ) -> None:
        """Use `api`; each request gives up after `timeout_s` (a renewal must not hang)."""
        self.coordination = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.timeout_s = timeout_s

    def get(self) -> LeaseRecord | None:
        """The Lease as it is now, or None when it does not exist."""
        try:
            lease = raw_json(
                self.coordination.read_namespaced_lease(
                    self.name,
                    self.namespace,
                    _preload_content=False,
                    _request_timeout=self.timeout_s,
                )
            )
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                return None
            raise
        return record_from_lease(lease)

    def create(self, record: LeaseRecord) -> bool:
        """Create the Lease holding `record`; False when another process created it first."""
        try:
            raw_json(
                self.coordination.create_namespaced_lease(
                    self.namespace,
                    self._body(record),
                    _preload_content=False,
                    _request_timeout=self.timeout_s,
                )
            )
        except ApiException as exc:
            if exc.status == CONFLICT:
                return False
            raise
        return True

    def update(self, record: LeaseRecord) -> bool:
        """Replace the Lease with `record` if it is still at `record.version`; else False."""
        body = self._body(record)
        body["metadata"]["resourceVersion"] = record.version
        try:
            raw_json(
                self.coordination.replace_namespaced_lease(
                    self.name,
                    self.namespace,
                    body,
                    _preload_content=False,
                    _request_timeout=self.timeout_s,
                )
            )
        except ApiException as exc:
            if exc.status in (CONFLICT, NOT_FOUND):
                return False
            raise
        return True

    def _body(self, record: LeaseRecord) -> dict[str, Any]:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": record.holder or None,
                "leaseDurationSeconds": record.duration_s,
                "acquireTime": format_time(record.acquire_time),
                "renewTime": format_time(record.renew_time),
                "leaseTransitions": record.transitions,
            },
        }
