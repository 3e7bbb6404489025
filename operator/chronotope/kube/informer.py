"""Watch-fed cache of nodes and pods, delivered to a pure consumer as plain dicts.

A background thread per resource: list (remember the resourceVersion), then
watch from it; on `410 Gone` (the version was compacted away) or any broken
stream, relist and hand the consumer the full set again (`on_sync`), so a
missed event can never leave the consumer's view stale. Objects reach the
consumer as plain JSON-shaped dicts; nothing outside this package sees a
`kubernetes` model.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from kubernetes import client

from chronotope.kube.client import raw_json

__all__ = ["Informer", "Resource"]

log = logging.getLogger(__name__)

_GONE = 410

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    """One kind to watch: how to list it, and where its events and full lists go."""

    name: str
    list_fn: Callable[..., Any]
    on_event: Callable[[str, Obj], None]
    """(ADDED | MODIFIED | DELETED, object)"""
    on_sync: Callable[[list[Obj]], None]
    """The full current set, after every (re)list."""


class Informer:
    """Keeps consumers in step with the API server; see the module docstring."""

    def __init__(self, api: client.ApiClient, resources: list[Resource]) -> None:
        """Watch `resources` through `api`; nothing runs until `start`."""
        self.api = api
        self.resources = resources
        self._stop = threading.Event()
        self._synced = {r.name: threading.Event() for r in resources}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start one daemon thread per resource: list, then watch, relisting when a watch breaks."""
        for res in self.resources:
            thread = threading.Thread(
                target=self._run, args=(res,), name=f"watch-{res.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def wait_synced(self, timeout: float) -> bool:
        """Whether every resource has been listed once, waiting up to `timeout` seconds for each."""
        return all(ev.wait(timeout) for ev in self._synced.values())

    def stop(self) -> None:
        """Ask the watch threads to stop; each notices at its next event or watch timeout."""
        self._stop.set()

    def _run(self, res: Resource) -> None:
        while not self._stop.is_set():
            try:
                version = self._relist(res)
                self._watch(res, version)
            except Exception:  # a broken stream or API hiccup: relist after a pause
                if self._stop.is_set():
                    return  # asked to stop: a stream the shutdown broke is no news
                log.warning("watch %s broke; relisting", res.name, exc_info=True)
                self._stop.wait(1.0)

    def _relist(self, res: Resource) -> str:
        # raw JSON, not client models: deserializing thousands of pods into models and
        # back costs far more than the decisions that consume them
        listed = raw_json(res.list_fn(_preload_content=False))
        res.on_sync(listed.get("items") or [])
        self._synced[res.name].set()
        return str(listed["metadata"]["resourceVersion"])

    def _watch(self, res: Resource, version: str) -> None:
        """Follow the watch from `version` until it is gone (410: relist) or we stop.

        The stream is read raw, a line per event, and decoded with orjson: on a large
        cluster every node's heartbeat is an event, and the client's own watch helper
        spends more on reading and decoding them than the consumer does on them.
        """
        while not self._stop.is_set():
            response = res.list_fn(
                watch=True,
                resource_version=version,
                timeout_seconds=60,
                allow_watch_bookmarks=True,
                _preload_content=False,
            )
            try:
                for line in _lines(response):
                    event = orjson.loads(line)
                    if "type" not in event:  # the answer is a Status, not a stream
                        event = {"type": "ERROR", "object": event}
                    kind = event["type"]
                    obj = event["object"]
                    if kind == "ERROR":
                        if obj.get("code") == _GONE:
                            return
                        raise RuntimeError(f"watch {res.name}: {obj.get('message', obj)}")
                    version = obj["metadata"]["resourceVersion"]
                    if kind == "BOOKMARK":
                        continue
                    res.on_event(kind, obj)
                    if self._stop.is_set():
                        return
            finally:
                response.release_conn()


def _lines(response: Any) -> Iterator[bytes]:
    """The non-empty lines of a streamed (chunked) response, as they arrive."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        data = pending + chunk if pending else chunk
        *lines, pending = data.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if pending.strip():
        yield pending
