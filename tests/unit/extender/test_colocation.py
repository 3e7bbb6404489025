"""The extender under the co-location rules: reasons, bounded compute, profiles, restarts."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from chronotope.api.v1alpha1.common import WorkloadProfile
from chronotope.cli import build_parser, main
from chronotope.extender.service import ExtenderService
from chronotope.planners.interference import best_effort_share
from chronotope.sharing.assignment import BindRequest, GpuAssignment
from chronotope.sim.openb import typical_of
from chronotope.solver.cache import ClusterCache
from chronotope.solver.colocation import Colocation
from chronotope.solver.online import PlacementRules
from chronotope.workloads.capacity import cluster_model
from chronotope.workloads.podreq import pod_request, profile_warning
from tests.kernel_streams import greedy, long_request

CB, MB = WorkloadProfile.COMPUTE_BOUND, WorkloadProfile.MEMORY_BOUND


def gpu_node(name: str, gpus: int = 1) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.product": "L4", "nvidia.com/gpu.memory": "23034"},
        },
        "status": {"capacity": {"nvidia.com/gpu": str(gpus)}},
    }


def share_pod(name: str, percent: int, priority: str | None, profile: str | None) -> dict[str, Any]:
    annotations = {
        "chronotope.dev/gpu-compute-percent": str(percent),
        "chronotope.dev/gpu-memory-mib": "4000",
    }
    if priority is not None:
        annotations["chronotope.dev/gpu-priority"] = priority
    if profile is not None:
        annotations["chronotope.dev/gpu-profile"] = profile
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
        "spec": {
            "schedulerName": "chronotope",
            "containers": [
                {"name": "c", "resources": {"limits": {"chronotope.dev/gpu-share": "1"}}}
            ],
        },
    }


class Harness:
    def __init__(self, rules: Colocation, gpus: int = 1) -> None:
        self.bound: dict[str, BindRequest] = {}
        self.events: list[tuple[str, str, str]] = []
        self.pods: dict[str, dict[str, Any]] = {}
        self.svc = ExtenderService(
            bind_fn=lambda req: self.bound.__setitem__(f"{req.namespace}/{req.name}", req),
            fetch_pod=lambda ns, n: self.pods[f"{ns}/{n}"],
            cache=ClusterCache(colocation=rules),
            clock=lambda: 100.0,
            event_fn=lambda key, reason, message: self.events.append((key, reason, message)),
        )
        self.svc.sync_nodes([gpu_node("l4-0", gpus)])

    def place(self, pod: dict[str, Any]) -> GpuAssignment:
        name = pod["metadata"]["name"]
        self.pods[f"ns/{name}"] = pod
        out = self.svc.filter(pod, ["l4-0"])
        assert out.passed == ["l4-0"], out
        assert self.svc.bind("ns", name, f"uid-{name}", "l4-0") == ""
        assignment = self.bound[f"ns/{name}"].assignment
        assert assignment is not None
        return assignment


def test_a_refused_node_fails_with_the_rules_reason() -> None:
    s = Colocation().pair(CB, CB, 40)
    h = Harness(Colocation(budget=s - 0.01))
    h.place(share_pod("infer-a", 40, "high", "compute-bound"))
    out = h.svc.filter(share_pod("infer-b", 30, "high", "compute-bound"), ["l4-0"])
    assert out.passed == []
    assert out.unresolvable == {}  # it may clear: kube-scheduler retries
    assert out.failed["l4-0"].startswith(
        "gpu 0 of l4-0: High share ns/infer-a beside it: predicted slowdown "
    )
    assert out.failed["l4-0"].endswith(f"over the {s - 0.01:.2f}x budget")


def test_a_best_effort_share_is_bound_with_the_bounded_percent() -> None:
    allowed = best_effort_share(greedy(CB), greedy(MB), 1.35)
    assert isinstance(allowed, tuple)
    assert allowed[0] < 60
    h = Harness(Colocation(budget=1.35, trace=greedy))
    hp = h.place(share_pod("infer", 40, "high", "compute-bound"))
    assert (hp.compute_percent, hp.priority, hp.profile) == (40, "high", "compute-bound")
    be = h.place(share_pod("train", 60, "best-effort", "memory-bound"))
    assert be.gpu_indices == hp.gpu_indices
    assert (be.compute_percent, be.priority, be.profile) == (
        allowed[0],
        "best-effort",
        "memory-bound",
    )
    assert be.memory_mib == 4000


def test_under_a_gated_runtime_a_share_binds_where_static_mps_refuses() -> None:
    infer = share_pod("infer", 40, "high", "compute-bound")
    train = share_pod("train", 60, "best-effort", "memory-bound")
    static = Harness(Colocation(trace=long_request))
    static.place(infer)
    out = static.svc.filter(train, ["l4-0"])
    assert out.passed == []
    assert "High share ns/infer beside it" in out.failed["l4-0"]
    gated = Harness(Colocation(trace=long_request, runtime="gated"))
    hp = gated.place(infer)
    be = gated.place(train)
    assert be.gpu_indices == hp.gpu_indices
    assert (be.compute_percent, be.priority) == (60, "best-effort")  # no static cap needed


def test_after_a_restart_the_rules_see_the_bound_shares() -> None:
    s = Colocation().pair(CB, CB, 40)
    rules = Colocation(budget=s - 0.01)
    first = Harness(rules)
    a = first.place(share_pod("infer-a", 40, "high", "compute-bound"))
    bound = share_pod("infer-a", 40, "high", "compute-bound")
    bound["metadata"]["annotations"] |= a.to_annotations()
    bound["spec"]["nodeName"] = "l4-0"

    second = Harness(rules)  # a new extender process: only the cluster's objects
    second.svc.sync_pods([bound])
    tags = second.svc.cache.state().shares[(0, 0)]
    assert [(t.pod, t.priority.value, t.percent) for t in tags] == [("ns/infer-a", "High", 40)]
    out = second.svc.filter(share_pod("infer-b", 30, "high", "compute-bound"), ["l4-0"])
    assert "High share ns/infer-a beside it" in out.failed["l4-0"]


def test_the_assigned_class_wins_over_the_request_on_rebuild() -> None:
    # a pod bound as unknown (its profile did not parse) stays unknown after a restart
    h = Harness(Colocation(budget=10.0))
    pod = share_pod("train", 30, "best-effort", "memory-bound")
    a = h.place(share_pod("train", 30, "best-effort", "gpu-heavy"))
    assert a.profile == "unknown"
    pod["metadata"]["annotations"] |= a.to_annotations()
    pod["spec"]["nodeName"] = "l4-0"
    again = Harness(Colocation(budget=10.0))
    again.svc.on_pod("ADDED", pod)
    (tag,) = again.svc.cache.state().shares[(0, 0)]
    assert tag.profile is WorkloadProfile.UNKNOWN


def test_an_unreadable_profile_falls_back_to_unknown_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(Colocation(budget=10.0))
    pod = share_pod("train", 30, "best-effort", "gpu-heavy")
    assert pod_request(pod).gpu_profile is WorkloadProfile.UNKNOWN
    with caplog.at_level(logging.WARNING):
        a = h.place(pod)
        h.svc.filter(pod, ["l4-0"])  # a retry says nothing new
    assert a.profile == "unknown"
    ((key, reason, message),) = h.events
    assert (key, reason) == ("ns/train", "GpuProfileUnknown")
    assert "chronotope.dev/gpu-profile" in message
    assert "'gpu-heavy' is not one of compute-bound, memory-bound, unknown" in message
    assert "placed as unknown" in message
    assert sum("gpu-heavy" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize(
    ("priority", "profile", "warned"),
    [
        ("high", None, True),  # asks for co-location rules without saying its profile
        (None, None, False),  # a plain share
        ("high", "memory-bound", False),
        (None, "nonsense", True),
    ],
)
def test_profile_warning(priority: str | None, profile: str | None, warned: bool) -> None:
    pod = share_pod("p", 30, priority, profile)
    assert (profile_warning(pod) is not None) == warned
    assert pod_request(pod).gpu_profile in set(WorkloadProfile)


def test_other_bad_share_annotations_still_fail_the_pod() -> None:
    h = Harness(Colocation())
    pod = share_pod("p", 30, "urgent", "memory-bound")
    out = h.svc.filter(pod, ["l4-0"])
    assert "chronotope.dev/gpu-priority" in out.unresolvable["l4-0"]
    assert profile_warning(pod) is None


@pytest.mark.parametrize("command", ["scheduler", "operator"])
def test_the_budget_flag_refuses_less_than_one(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--interference-budget", "0.8"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--interference-budget: interference budget 0.8x is below 1x" in err


@pytest.mark.parametrize("command", ["scheduler", "operator"])
def test_the_runtime_flag_names_its_choices(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--colocation-runtime", "orion"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--colocation-runtime: invalid choice: 'orion' (choose from" in err


def test_the_operator_takes_the_extenders_placement_rules(tmp_path: Path) -> None:
    # the same flags give the same rules: the operator's free-GPU fit places GPU
    # shares under the co-location rules, policy and expected request mix the
    # extender runs with (before stop 60 the operator had no --typical-pods)
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "a,1000,1024,1,1000,\nb,1000,1024,1,500,\nc,1000,1024,1,500,\n"
    )
    flags = ["--policy", "fgd", "--interference-budget", "1.3", "--colocation-runtime", "gated"]
    flags += ["--typical-pods", str(pods)]
    tls = ["--tls-cert-file", "c", "--tls-private-key-file", "k", "--client-ca-file", "ca"]
    parser = build_parser()
    args = [parser.parse_args(["scheduler", *tls, *flags]), parser.parse_args(["operator", *flags])]
    scheduler, operator = (PlacementRules.from_args(a, typical_of(a.typical_pods)) for a in args)
    for rules in (scheduler, operator):
        assert rules.policy.name == "fgd"
        assert (rules.colocation.budget, rules.colocation.runtime) == (1.3, "gated")
        assert rules.typical == scheduler.typical
        # the operator's cluster model expects that mix, as the extender's cache does
        assert cluster_model([], [], placement=rules)[1].typical() == list(rules.typical or ())
    assert scheduler.typical is not None
    assert sorted(t.freq for t in scheduler.typical) == pytest.approx([1 / 3, 2 / 3])
    defaults = PlacementRules.from_args(parser.parse_args(["operator"]))
    assert defaults.policy.name == PlacementRules().policy.name == "chronotope"
    assert defaults.colocation.budget == PlacementRules().colocation.budget
