"""Identical log lines and events pass once per window, with the count held back."""

from __future__ import annotations

import logging

import pytest

from chronotope.ratelimit import RepeatFilter, RepeatLimiter, install


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([("a", 0)], [0], id="first-passes"),
        pytest.param([("a", 0), ("a", 1), ("a", 9.9)], [0, None, None], id="held-in-window"),
        pytest.param([("a", 0), ("a", 5), ("a", 10)], [0, None, 1], id="next-window-counts"),
        pytest.param([("a", 0), ("a", 10), ("a", 20)], [0, 0, 0], id="spaced-all-pass"),
        pytest.param([("a", 0), ("b", 1), ("a", 2)], [0, 0, None], id="keys-apart"),
        pytest.param(
            [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("a", 12), ("a", 13)],
            [0, None, None, None, 3, None],
            id="window-from-the-line-that-passed",
        ),
    ],
)
def test_limiter_table(steps: list[tuple[str, float]], expected: list[int | None]) -> None:
    clock = Clock()
    limiter = RepeatLimiter(10.0, clock=clock)
    got = []
    for key, at in steps:
        clock.now = 1000.0 + at
        got.append(limiter.admit(key))
    assert got == expected


def test_limiter_memory_is_bounded_least_recent_forgotten() -> None:
    clock = Clock()
    limiter = RepeatLimiter(10.0, clock=clock, max_keys=2)
    assert [limiter.admit(k) for k in ("a", "b", "a", "c")] == [0, 0, None, 0]
    # "b" was the least recently seen: forgotten, so it passes again; "a" is still held
    assert limiter.admit("b") == 0
    assert limiter.admit("c") is None


@pytest.mark.parametrize(("window", "keys"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_limiter_refuses_bad_settings(window: float, keys: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        RepeatLimiter(window, max_keys=keys)


def _logger(name: str, clock: Clock) -> tuple[logging.Logger, list[str]]:
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    logger = logging.getLogger(name)
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.INFO)
    for _ in range(2):  # one filter on two handlers decides each record once
        logger.addHandler(Collect())
    repeat = RepeatFilter(RepeatLimiter(60.0, clock=clock))
    for handler in logger.handlers:
        handler.addFilter(repeat)
    return logger, lines


def test_filter_holds_back_identical_records_and_reports_the_count() -> None:
    clock = Clock()
    log, lines = _logger("chronotope.test.repeat", clock)
    for _ in range(552):  # the issue: one pod's "fits no node", logged on every retry
        log.info("pod %s fits no node: %s", "ns/p", "3 nodes: too few GPUs")
        clock.now += 1
    log.warning("pod %s fits no node: %s", "ns/p", "3 nodes: too few GPUs")  # another level
    log.info("pod %s fits no node: %s", "ns/q", "3 nodes: too few GPUs")  # another message
    first = "pod ns/p fits no node: 3 nodes: too few GPUs"
    once = [
        first,
        *[f"{first} (repeated 59 times)"] * 9,  # at 60 s, 120 s, ... 540 s
        first,  # the warning
        "pod ns/q fits no node: 3 nodes: too few GPUs",
    ]
    assert lines == [line for line in once for _ in range(2)]  # both handlers, same text


def test_install_attaches_to_the_root_handlers() -> None:
    root = logging.getLogger()
    handler = logging.NullHandler()
    root.addHandler(handler)
    try:
        repeat = install(5.0)
        assert repeat in handler.filters
        assert repeat.limiter.window == 5.0
    finally:
        root.removeHandler(handler)


def test_the_operator_posts_an_identical_event_on_a_job_once_per_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's reason that flaps (A, B, A, B...) is posted once per text, not per flap."""
    from chronotope.kube import trainingjob_ops
    from chronotope.ratelimit import EVENT_WINDOW_S

    posted: list[tuple[str, str]] = []

    def post_event(
        api: object, involved: dict[str, str], reason: str, message: str, **_: object
    ) -> None:
        posted.append((involved["name"], message))

    monkeypatch.setattr(trainingjob_ops, "post_event", post_event)  # the one API call
    clock = Clock()
    ops = trainingjob_ops.KubeClusterOps(api=None, clock=clock)
    job = {"metadata": {"namespace": "ns", "name": "j", "uid": "u-1"}}
    other = {"metadata": {"namespace": "ns", "name": "k", "uid": "u-2"}}
    for i in range(20):
        why = "waits for 4 x A100" if i % 2 else "queued behind ns/a"
        ops.write(job, {}, {}, [("Normal", "Waiting", why)])
        clock.now += 1
    ops.write(other, {}, {}, [("Normal", "Waiting", "queued behind ns/a")])  # another job
    clock.now += EVENT_WINDOW_S
    ops.write(job, {}, {}, [("Normal", "Waiting", "queued behind ns/a")])  # a window later
    assert ops.flush(timeout=30)  # events are posted in the background, each write's in order
    assert sorted(posted) == [
        ("j", "queued behind ns/a"),
        ("j", "queued behind ns/a"),
        ("j", "waits for 4 x A100"),
        ("k", "queued behind ns/a"),
    ]
