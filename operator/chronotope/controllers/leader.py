"""The operator's leader-election loop: block until leading, renew, release, or stop.

`chronotope operator --leader-elect` runs the controllers only while it holds
the Lease (the decisions are `workloads.leader`; the API calls `kube.leader`).
The shape is controller-runtime's: a standby waits and keeps trying every
retry period; the leader renews from a background thread, and if it cannot
renew within the renew deadline (or finds another holder) it logs and exits
the process non-zero at once, so its pod restarts and two writers never act
together. On SIGTERM the controllers stop first, then the Lease is released
(holder cleared), so a standby takes over at its next attempt instead of
waiting out the lease.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from chronotope.workloads.leader import Decision, Elector, LeaseRecord, LeaseTiming, Verdict

__all__ = ["LeaderElection", "LeaseOps", "run_elected", "serve_standby_health"]

log = logging.getLogger(__name__)

LOST_EXIT_CODE = 1
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class LeaseOps(Protocol):
    """The Lease on the API server (`kube.leader.KubeLease`; unit tests pass a fake)."""

    def get(self) -> LeaseRecord | None:
        """The Lease now, or None when it does not exist."""
        ...

    def create(self, record: LeaseRecord) -> bool:
        """Create it; False when it already exists."""
        ...

    def update(self, record: LeaseRecord) -> bool:
        """Replace it if still at `record.version`; False on a conflict."""
        ...


def _exit_now(reason: str) -> None:
    # like controller-runtime's "leader election lost": no graceful stop, no more writes
    del reason
    logging.shutdown()
    os._exit(LOST_EXIT_CODE)


class LeaderElection:
    """Drives an `Elector` against a `LeaseOps`: acquire, renew in a thread, release."""

    def __init__(
        self,
        lease: LeaseOps,
        identity: str,
        timing: LeaseTiming | None = None,
        *,
        name: str = "",
        on_leading: Callable[[bool], None] = lambda _: None,
        on_lost: Callable[[str], None] = _exit_now,
        mono: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """Elect `identity` through `lease` (named `name` in the logs).

        `on_leading(True | False)` hears every change of leadership (the metrics
        gauge); `on_lost(reason)` runs when a leader must stop, by default exiting
        the process with status 1.
        """
        self.lease = lease
        self.elector = Elector(identity, timing or LeaseTiming())
        self.name = name
        self.on_leading = on_leading
        self.on_lost = on_lost
        self.mono = mono
        self.wall = wall
        self._stop_renewing = threading.Event()
        self._renewer: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def identity(self) -> str:
        """This process's holder identity."""
        return self.elector.me

    @property
    def leading(self) -> bool:
        """Whether this process holds the Lease (as of its latest attempt)."""
        return self.elector.leading

    def attempt(self) -> Decision | None:
        """One read-decide-write round; None when the API could not be reached."""
        with self._lock:
            try:
                current = self.lease.get()
            except Exception as exc:
                log.warning("reading Lease %s failed: %s", self.name, exc)
                return None
            decision = self.elector.step(current, self.mono(), self.wall())
            ok = False
            if decision.write is not None:
                try:
                    write = self.lease.create if decision.create else self.lease.update
                    ok = write(decision.write)
                except Exception as exc:
                    log.warning("writing Lease %s failed: %s", self.name, exc)
                if not ok:
                    log.info(
                        "could not %s Lease %s (changed under me); will retry",
                        decision.verdict,
                        self.name,
                    )
            self.elector.wrote(decision, ok, self.mono())
            return decision

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this process holds the Lease (True) or `stop` is set (False)."""
        waiting_for = ""
        while not stop.is_set():
            decision = self.attempt()
            if self.leading:
                assert decision is not None
                log.info("acquired Lease %s as %s (%s)", self.name, self.identity, decision.reason)
                self.on_leading(True)
                return True
            if decision is not None and decision.reason != waiting_for:
                waiting_for = decision.reason
                log.info("standing by as %s: Lease %s %s", self.identity, self.name, waiting_for)
            stop.wait(self.elector.timing.retry_s)
        return False

    def start_renewing(self) -> None:
        """Renew every retry period on a daemon thread until `release` (or leadership is lost)."""
        self._renewer = threading.Thread(target=self._renew_loop, name="lease-renew", daemon=True)
        self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop_renewing.wait(self.elector.timing.retry_s):
            decision = self.attempt()
            if self._stop_renewing.is_set():
                return
            if decision is not None and decision.verdict is Verdict.LOST:
                self._lose(decision.reason)
                return
            if self.elector.deadline_passed(self.mono()):
                self._lose(f"no renewal for {self.elector.timing.renew_deadline_s:g} s")
                return

    def _lose(self, reason: str) -> None:
        log.error("lost Lease %s: %s; exiting so that no two operators write", self.name, reason)
        self.on_leading(False)
        self.on_lost(reason)

    def stop_renewing(self) -> None:
        """Stop the renewal thread and wait for its attempt in flight."""
        self._stop_renewing.set()
        if self._renewer is not None:
            self._renewer.join()

    def release(self) -> bool:
        """Stop renewing and hand the Lease back if this process holds it; True if released."""
        self.stop_renewing()
        if not self.leading:
            return False
        self.on_leading(False)
        with self._lock:
            try:
                current = self.lease.get()
                record = None if current is None else self.elector.released(current, self.wall())
                done = record is not None and self.lease.update(record)
            except Exception as exc:
                log.warning("releasing Lease %s failed: %s", self.name, exc)
                return False
        if done:
            log.info("released Lease %s", self.name)
        return done


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path.split("?", 1)[0] == "/healthz"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"standby\n" if ok else b"not found\n")

    def log_message(self, *_: Any) -> None:
        return


def serve_standby_health(address: str, port: int) -> Callable[[], None]:
    """Answer /healthz on `address:port` while standing by; returns the function that stops it.

    kopf serves the operator's liveness endpoint only once it runs, so without
    this a standby replica would fail its liveness probe and restart forever.
    Stopping frees the port for kopf.
    """
    server = ThreadingHTTPServer((address, port), _Healthy)
    thread = threading.Thread(target=server.serve_forever, name="standby-health", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop


def run_elected(
    election: LeaderElection,
    run: Callable[[threading.Event], None],
    *,
    health: tuple[str, int] | None = None,
) -> int:
    """Stand by until `election` leads, then `run(stop)` the controllers; release at the end.

    SIGTERM or SIGINT while standing by ends the wait (exit status 0); once
    leading they set `stop`, which `run` must watch (kopf's `stop_flag`).
    `health` (address, port) serves /healthz while standing by.
    """
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _STOP_SIGNALS}
    try:
        stop_health = serve_standby_health(*health) if health else None
        try:
            leading = election.acquire(stop)
        finally:
            if stop_health is not None:
                stop_health()
        if not leading:
            log.info("stopped while standing by")
            return 0
        election.start_renewing()
        try:
            if not stop.is_set():
                log.info("leading as %s: starting the controllers", election.identity)
                run(stop)
        finally:
            stop.set()  # whatever `run` left waiting on it
            election.release()
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
