"""Fuzzing the extender's wire format: any JSON is either parsed or refused with a
WireError (HTTP 400), and what is parsed never crashes the filter."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronotope.extender import wire

sys.path.insert(0, str(Path(__file__).parent))
from test_service import Recorder, service

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
KEYS = st.sampled_from(
    [
        "metadata",
        "spec",
        "annotations",
        "labels",
        "containers",
        "resources",
        "limits",
        "nodeSelector",
        "name",
        "namespace",
        "chronotope.dev/gpu-share",
        "nvidia.com/gpu",
        "chronotope.dev/gpu-compute-percent",
        "chronotope.dev/pod-group",
        "requests",
    ]
)
# pod-shaped documents with wrong types in the places the extender reads
POD_LIKE = st.recursive(
    st.none() | st.integers(-2, 9) | st.sampled_from(["1", "50", "x", "", "T4", "8Gi"]),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=16,
)


def _check(body: Any) -> None:
    try:
        args = wire.parse_extender_args(body)
    except wire.WireError:
        return
    out = service(Recorder()).filter(args.pod, args.node_names)
    assert set(out.passed) <= set(args.node_names)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_any_json_is_parsed_or_refused(body: Any) -> None:
    _check(body)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {"metadata": st.dictionaries(KEYS, POD_LIKE, max_size=4), "spec": POD_LIKE}
    ),
    st.lists(st.sampled_from(["a", "t", "v", "ghost"]), max_size=4),
)
def test_pod_shaped_nonsense_never_crashes_the_filter(
    pod: dict[str, Any], names: list[str]
) -> None:
    _check({"Pod": pod, "NodeNames": names})
