"""Say a repeated thing once per window: identical log lines and events, rate-limited.

Why: a controller or scheduler that retries an object every few seconds says
the same thing every time (an unschedulable pod's "fits no node", a job's
reason to wait). Repeated verbatim, those lines bury everything else in the
log and fill the events of the namespace. `RepeatLimiter` lets the first
occurrence of a key through, then at most one per `window` seconds, and says
how many it held back; `RepeatFilter` applies it to log records, keyed by
(logger, level, message), as a `logging.Filter` on the handlers (`install`);
callers that post events key it by (object, reason, message).

A count held back after the last line that got through is never reported:
the line stopped repeating, and the next occurrence (if any) reports it.

Pure: no I/O; the clock is injected.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

__all__ = ["DEFAULT_WINDOW_S", "EVENT_WINDOW_S", "RepeatFilter", "RepeatLimiter", "install"]

DEFAULT_WINDOW_S = 60.0
"""The components' window for log lines: an identical line at most once a minute."""

EVENT_WINDOW_S = 600.0
"""The window for events: an identical event on one object at most once in 10 minutes,
the window in which kube's event correlator folds identical events into one."""

_DECIDED = "chronotope_repeat_admitted"
"""Record attribute: this record was already decided (by the filter on another handler)."""

_MAX_KEYS = 4096
"""Keys remembered; the least recently seen are forgotten first (a bounded memory)."""


class RepeatLimiter:
    """The first occurrence of a key passes, then at most one per `window` seconds.

    Thread-safe. Memory is bounded by `max_keys` (least recently seen forgotten).
    """

    def __init__(
        self,
        window: float = DEFAULT_WINDOW_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = _MAX_KEYS,
    ) -> None:
        """`window` in seconds (> 0); `clock` returns seconds; `max_keys` >= 1."""
        if window <= 0:
            raise ValueError(f"window must be positive, not {window}")
        if max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, not {max_keys}")
        self.window = window
        self._clock = clock
        self._max_keys = max_keys
        self._lock = threading.Lock()
        self._seen: OrderedDict[Hashable, tuple[float, int]] = OrderedDict()
        """key -> (when it last passed, how many were held back since)."""

    def admit(self, key: Hashable) -> int | None:
        """None to hold this occurrence back; else how many were held back before it (0..)."""
        now = self._clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.window:
                self._seen[key] = (last[0], last[1] + 1)
                self._seen.move_to_end(key)
                return None
            self._seen[key] = (now, 0)
            self._seen.move_to_end(key)
            while len(self._seen) > self._max_keys:
                self._seen.popitem(last=False)
            return last[1] if last is not None else 0


class RepeatFilter(logging.Filter):
    """A `logging.Filter` holding back identical (logger, level, message) records.

    The record that passes after a window in which others were held back ends
    with "(repeated N times)". Attach one instance to handlers (`install`):
    each record is decided once, however many handlers it reaches.
    """

    def __init__(self, limiter: RepeatLimiter | None = None) -> None:
        """`limiter` decides (a fresh one with the default window if None)."""
        super().__init__()
        self.limiter = limiter or RepeatLimiter()

    def filter(self, record: logging.LogRecord) -> bool:
        """True to emit the record (possibly with the repeat count added)."""
        decided = record.__dict__.get(_DECIDED)
        if decided is not None:  # a second handler of the same record
            return bool(decided)
        message = record.getMessage()
        held = self.limiter.admit((record.name, record.levelno, message))
        if held:
            record.msg, record.args = f"{message} (repeated {held} times)", None
        record.__dict__[_DECIDED] = held is not None
        return held is not None


def install(window: float = DEFAULT_WINDOW_S, logger: logging.Logger | None = None) -> RepeatFilter:
    """Attach one `RepeatFilter` to every handler of `logger` (the root logger if None).

    Call after logging is configured (the CLI's `basicConfig`). Returns the filter.
    """
    target = logger or logging.getLogger()
    repeat = RepeatFilter(RepeatLimiter(window))
    for handler in target.handlers:
        handler.addFilter(repeat)
    return repeat
