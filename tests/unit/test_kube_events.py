"""`kube.events.post_event`: an event is advice, and a stalled post gives up."""

from __future__ import annotations

from typing import Any

import pytest
import urllib3
from kubernetes import client

from chronotope.kube import events


def _api(answer: Any) -> tuple[client.ApiClient, list[dict[str, Any]]]:
    api = client.ApiClient(configuration=client.Configuration())
    calls: list[dict[str, Any]] = []

    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        calls.append({"method": method, "url": url, **kwargs})
        raise answer

    api.rest_client.request = request
    return api, calls


@pytest.mark.parametrize(
    "failure",
    [
        urllib3.exceptions.ReadTimeoutError(None, "/events", "read timed out"),  # type: ignore[arg-type]
        client.ApiException(status=403, reason="Forbidden"),
    ],
)
def test_a_post_that_times_out_or_is_refused_is_given_up_quietly(failure: Exception) -> None:
    api, calls = _api(failure)
    involved = {"apiVersion": "chronotope.dev/v1alpha1", "kind": "TrainingJob"}
    events.post_event(
        api, involved | {"name": "a", "namespace": "ns"}, "Started", "ok", component="c"
    )
    assert len(calls) == 1
    assert calls[0]["method"] == "POST"
    assert calls[0]["url"].endswith("/api/v1/namespaces/ns/events")
    assert calls[0]["_request_timeout"] == events.TIMEOUT_S
