"""Chaos: crash the control plane and Chronotope at random points of a mixed workload.

A seeded driver for a cluster of its own (`chaos_cluster`: etcd, kube-apiserver,
controller-manager, kube-scheduler, kwok GPU nodes, the Chronotope extender
with its kube-scheduler, and the operator with its admission webhook, under the
Helm chart's identities). One round:

1. builds a workload from `random.Random(seed)`: TrainingJobs (gangs of 1-3
   workers on whole GPUs, some elastic, some on a GPU share), share pods
   (some with a priority and profile), whole-GPU pods and pod gangs;
2. submits it one unit at a time, with seeded pauses; at seeded points it
   kills a component with SIGKILL (`LocalCluster.killed`): the extender, the
   operator, the `chronotope` kube-scheduler, the apiserver or etcd. While an
   extender, scheduler or operator is down it keeps submitting (only pods
   while the operator's webhook is gone); while the apiserver or etcd is down
   it waits. Then the component starts again with the same arguments and is
   waited for. A create is retried on a dropped connection, a 5xx or a 429,
   and a 409 on a retry counts as created;
3. waits until the cluster settles (`chaos_invariants.settle_problems` is
   empty and the set of bound pods has not changed for `SETTLE_QUIET_S`),
   checking zero over-allocation on every snapshot meanwhile;
4. checks the invariants on the settled snapshot: zero over-allocation, no
   partially bound gang, no lost object, no duplicated job or worker.

What did not settle within the bound is a violation too. The `Report` counts
kills per component, objects submitted and checked, snapshots, restart times
and violations; `text()` prints it, `to_json()` is what the test and
hack/soak.py write under test-artifacts/. docs/chaos.md has the figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import random
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chronotope.api.v1alpha1.common import GpuShare, SharePriority, WorkloadProfile
from chronotope.devcluster.cluster import LocalCluster
from chronotope.devcluster.settings import ClusterSettings
from chronotope.kube.client import api_client, raw_json
from chronotope.sharing.labels import (
    GANG_LABEL,
    GANG_SIZE_ANNOTATION,
    SCHEDULER_NAME,
    STRATEGY_ANNOTATION,
)
from chronotope.sim.clusterspec import ClusterSpec
from chronotope.workloads.podreq import gpu_resources
from e2e.chaos_invariants import (
    Findings,
    Snapshot,
    gang_problems,
    job_problems,
    lost_objects,
    over_allocation,
    settle_problems,
)

__all__ = [
    "CHAOS_SPEC",
    "COMPONENTS",
    "Chaos",
    "Plan",
    "Report",
    "chaos_cluster",
    "workload",
    "write_report",
]

COMPONENTS = {
    "extender": "chronotope-extender",
    "operator": "chronotope-operator",
    "kube-scheduler": "chronotope-kube-scheduler",
    "apiserver": "kube-apiserver",
    "etcd": "etcd",
}
"""What a chaos run kills, by the name the report uses: the cluster's component name."""
API_DOWN = frozenset({"apiserver", "etcd"})
"""While these are down nothing can be submitted."""

GROUP, VERSION, PLURAL = "chronotope.dev", "v1alpha1", "trainingjobs"
REQUEST_TIMEOUT_S = 15
SUBMIT_TIMEOUT_S = 180.0
"""How long one create is retried (a component coming back is waited for before that)."""
SETTLE_QUIET_S = 10.0
"""How long the bound pods must stay the same, with nothing left moving, to call it settled."""
POLL_S = 2.0

A100, V100, L4, T4 = "A100-SXM4-80GB", "V100-SXM2-32GB", "L4", "T4"
GPU_MEMORY = {A100: 81920, V100: 32510, L4: 23034, T4: 15109}
SPEED = {A100: 1.0, V100: 0.6, L4: 0.4, T4: 0.2}
CHAOS_SPEC = ClusterSpec.model_validate(
    {
        "name": "chaos",
        "pools": [
            {"name": "a100", "count": 2, "gpu": {"model": A100, "perNode": 8, "memoryMiB": 81920}},
            {"name": "v100", "count": 2, "gpu": {"model": V100, "perNode": 4, "memoryMiB": 32510}},
            {"name": "l4", "count": 3, "gpu": {"model": L4, "perNode": 4, "memoryMiB": 23034}},
            {"name": "t4", "count": 2, "gpu": {"model": T4, "perNode": 1, "memoryMiB": 15109}},
        ],
    }
)
"""38 GPUs of four types on nine kwok nodes: small enough that a round's workload contends."""


@dataclass(frozen=True)
class Plan:
    """One chaos round's size and pace; every random choice comes from `seed`."""

    seed: int
    objects: int = 40
    """Objects to create (a TrainingJob or a pod counts one; a gang counts its pods)."""
    kills: int = 7
    """Crashes per round; with at least as many as components, every component dies once."""
    max_pause_s: float = 1.0
    """Longest pause between two submissions."""
    max_down_s: float = 3.0
    """Longest time a killed component stays down."""
    settle_timeout_s: float = 240.0
    """Longest wait for the cluster to settle after the last submission."""
    components: tuple[str, ...] = tuple(COMPONENTS)


@dataclass
class Unit:
    """One submission: create (or delete) a TrainingJob, one pod, or all pods of a pod gang."""

    kind: str
    objects: list[dict[str, Any]]
    delete: bool = False


@dataclass
class Report:
    """What a chaos run did and found; violations must be none."""

    seed: int
    rounds: int = 0
    duration_s: float = 0.0
    kills: Counter[str] = field(default_factory=Counter)
    restart_s: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    submitted: Counter[str] = field(default_factory=Counter)
    objects: int = 0
    retries: int = 0
    snapshots: int = 0
    allocation_checks: Counter[str] = field(default_factory=Counter)
    final_checks: Counter[str] = field(default_factory=Counter)
    settle_s: list[float] = field(default_factory=list)
    job_phases: Counter[str] = field(default_factory=Counter)
    max_generation: int = 0
    violations: dict[str, int] = field(default_factory=dict)
    """Each problem found, with the number of snapshots it was seen in."""

    def violate(self, problems: list[str]) -> None:
        """Record problems (a repeated one is counted, not listed again)."""
        for problem in problems:
            self.violations[problem] = self.violations.get(problem, 0) + 1

    def text(self) -> str:
        """The report as a few lines for a terminal."""

        def counts(c: Counter[str]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "none"

        restart = ", ".join(f"{k} {max(v):.1f}" for k, v in sorted(self.restart_s.items()) if v)
        lines = [
            f"chaos seed {self.seed}: {self.rounds} round(s) in {self.duration_s:.0f} s",
            f"kills: {counts(self.kills)} ({sum(self.kills.values())} in all); "
            f"longest time back to ready, s: {restart or '-'}",
            f"submitted: {counts(self.submitted)}; {self.objects} objects, "
            f"{self.retries} API call retries",
            f"checked: {self.snapshots} snapshots for over-allocation "
            f"({counts(self.allocation_checks)}); once settled (all rounds): "
            f"{counts(self.final_checks)}",
            f"settled after, s: {', '.join(f'{s:.0f}' for s in self.settle_s) or '-'}; "
            f"TrainingJobs at the end: {counts(self.job_phases)}; "
            f"highest gang generation {self.max_generation}",
            f"violations: {len(self.violations)}",
            *(f"  - {v} (seen {n}x)" for v, n in self.violations.items()),
        ]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON data."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["restart_s"] = {k: [round(x, 2) for x in v] for k, v in self.restart_s.items()}
        data["settle_s"] = [round(x, 1) for x in self.settle_s]
        data["duration_s"] = round(self.duration_s, 1)
        return {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}


# ---------------------------------------------------------------------- the workload
def _types(rng: random.Random, count: int) -> list[str]:
    fits = [t for t in (A100, V100, L4) if count <= {A100: 8, V100: 4, L4: 4}[t]]
    return rng.sample(fits, rng.randint(1, len(fits)))


def _job(rng: random.Random, ns: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any]
    if rng.random() < 0.3:  # a share per worker
        types = rng.sample([A100, L4, T4], rng.randint(1, 3))
        spec = {
            "replicas": rng.randint(1, 2),
            "gpu": {
                "shared": {
                    "memoryMiB": rng.choice([2048, 4096, 8192]),
                    "computePercent": rng.choice([20, 30, 50]),
                }
            },
            "gpuTypes": [
                {"name": t, "relativeSpeed": SPEED[t], "memoryMiB": GPU_MEMORY[t]} for t in types
            ],
        }
    else:
        count = rng.choice([1, 1, 2, 4])
        types = _types(rng, count)
        spec = {
            "replicas": rng.randint(1, 3),
            "gpu": {"count": count},
            "gpuTypes": [{"name": t, "relativeSpeed": SPEED[t]} for t in types],
        }
        if rng.random() < 0.3:
            spec |= {"minReplicas": 1, "checkpoint": {"path": f"/ckpt/{name}"}}
    spec |= {
        "estimate": {"referenceGpuType": types[0], "durationSeconds": 3600 * rng.randint(1, 4)},
        "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def _pod(ns: str, name: str, shared: GpuShare | None, gpus: int = 0) -> dict[str, Any]:
    limits, annotations = gpu_resources(shared, gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "containers": [
                {"name": "c", "image": "registry.example/x:1", "resources": {"limits": limits}}
            ],
        },
    }


def _share(rng: random.Random) -> GpuShare:
    share = GpuShare(
        memory_mib=rng.choice([2000, 4000, 8000]), compute_percent=rng.choice([10, 20, 25, 30, 50])
    )
    if rng.random() < 0.4:  # a stated class: the co-location rules apply
        share = share.model_copy(
            update={
                "priority": rng.choice(list(SharePriority)),
                "profile": rng.choice(list(WorkloadProfile)),
            }
        )
    return share


def workload(rng: random.Random, ns: str, objects: int) -> list[Unit]:
    """A mixed workload that creates about `objects` objects in `ns` (names unique in it).

    About one unit in ten deletes what an earlier unit created (frees its GPUs).
    """
    units: list[Unit] = []
    count = 0
    for i in itertools.count():
        if count >= objects:
            break
        r = rng.random()
        gone = {id(u.objects) for u in units if u.delete}
        alive = [u for u in units if not u.delete and id(u.objects) not in gone]
        if len(alive) >= 3 and rng.random() < 0.1:
            target = rng.choice(alive)
            units.append(Unit(f"deleted {target.kind}", target.objects, delete=True))
            continue
        if r < 0.2:
            units.append(Unit("TrainingJob", [_job(rng, ns, f"job-{i}")]))
        elif r < 0.6:
            units.append(Unit("share pod", [_pod(ns, f"share-{i}", _share(rng))]))
        elif r < 0.8:
            units.append(
                Unit("whole-GPU pod", [_pod(ns, f"whole-{i}", None, rng.choice([1, 1, 2]))])
            )
        else:
            size, gpus = rng.randint(2, 3), rng.choice([1, 2])
            strategy = rng.choice(["Pack", "Spread"])
            members = []
            for m in range(size):
                pod = _pod(ns, f"gang-{i}-{m}", None, gpus)
                pod["metadata"]["labels"] = {GANG_LABEL: f"gang-{i}"}
                pod["metadata"]["annotations"] |= {
                    GANG_SIZE_ANNOTATION: str(size),
                    STRATEGY_ANNOTATION: strategy,
                }
                members.append(pod)
            units.append(Unit("pod gang", members))
        count += len(units[-1].objects)
    return units


def _kill_order(rng: random.Random, plan: Plan) -> list[str]:
    """Every component once (when there are enough kills), then seeded picks; shuffled."""
    base = list(plan.components)
    rng.shuffle(base)
    order = base[: plan.kills] + [
        rng.choice(plan.components) for _ in range(plan.kills - len(base))
    ]
    rng.shuffle(order)
    return order


# ---------------------------------------------------------------------- the cluster
@contextlib.contextmanager
def chaos_cluster(
    settings: ClusterSettings, *, identities: bool = True, webhook: bool = True, name: str = "chaos"
) -> Iterator[LocalCluster]:
    """A cluster of its own with `CHAOS_SPEC`, the Chronotope scheduler and the operator.

    With `identities` the extender, its kube-scheduler and the operator run under
    the chart's ServiceAccounts (as in the other cluster tests), else as admin.
    With `webhook` the operator serves its admission webhook (failure policy Fail:
    while the operator is down, no TrainingJob can be created). Everything is
    stopped on exit.
    """
    cluster = LocalCluster(settings, name)
    cluster.up(CHAOS_SPEC)
    try:
        ids = cluster.chart_identities() if identities else None
        cluster.start_chronotope_scheduler(identities=ids)
        cluster.start_operator(identities=ids, webhook=webhook)
        yield cluster
    finally:
        cluster.down()


# ---------------------------------------------------------------------- the driver
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class Chaos:
    """Runs seeded chaos rounds on a running `chaos_cluster` and fills one `Report`."""

    def __init__(
        self, cluster: LocalCluster, plan: Plan, log: Callable[[str], None] = print
    ) -> None:
        """Drive `cluster` (with the scheduler and operator running) as `plan` says."""
        state = cluster.load_state()
        if state is None:
            raise RuntimeError(f"cluster {cluster.name} is not running")
        for component in plan.components:
            if component not in COMPONENTS:
                raise ValueError(f"unknown component {component!r}: one of {', '.join(COMPONENTS)}")
        self.cluster = cluster
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self.report = Report(seed=plan.seed)
        self.log = log
        self._api = api_client(state.kubeconfig)
        self._core = client.CoreV1Api(self._api)
        self._custom = client.CustomObjectsApi(self._api)

    def close(self) -> None:
        """Close the API connections."""
        self._api.close()

    # -------------------------------------------------------------- API calls with retries
    def _retrying(self, what: str, call: Callable[[], Any], done: int = 409) -> Any:
        """`call()`, again after a dropped connection, a 5xx or a 429; None after `done`.

        `done` is the status that says an earlier try went through: 409 for a
        create, 404 for a delete.
        """
        deadline = time.monotonic() + SUBMIT_TIMEOUT_S
        while True:
            try:
                return call()
            except ApiException as exc:
                if exc.status == done:
                    return None
                if exc.status not in _RETRY_STATUS:
                    raise RuntimeError(f"{what}: {exc.status} {exc.reason}: {exc.body}") from exc
                failure: Exception = exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                failure = exc
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{what}: still failing after {SUBMIT_TIMEOUT_S:.0f} s: {failure}"
                ) from failure
            self.report.retries += 1
            time.sleep(0.5)

    def _delete(self, obj: dict[str, Any]) -> None:
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        t = REQUEST_TIMEOUT_S

        def call() -> Any:
            if obj["kind"] == "Pod":
                return self._core.delete_namespaced_pod(name, ns, _request_timeout=t)
            return self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, _request_timeout=t
            )

        self._retrying(f"delete {obj['kind']} {ns}/{name}", call, done=404)

    def _create(self, obj: dict[str, Any]) -> None:
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        if obj["kind"] == "Pod":
            self._retrying(
                f"pod {ns}/{name}",
                lambda: self._core.create_namespaced_pod(
                    ns, obj, _request_timeout=REQUEST_TIMEOUT_S
                ),
            )
        else:
            self._retrying(
                f"TrainingJob {ns}/{name}",
                lambda: self._custom.create_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, obj, _request_timeout=REQUEST_TIMEOUT_S
                ),
            )

    def snapshot(self) -> Snapshot:
        """Nodes, pods and TrainingJobs of the whole cluster, now."""

        def read() -> Snapshot:
            t = REQUEST_TIMEOUT_S
            nodes = raw_json(self._core.list_node(_preload_content=False, _request_timeout=t))
            pods = raw_json(
                self._core.list_pod_for_all_namespaces(_preload_content=False, _request_timeout=t)
            )
            jobs = self._custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, _request_timeout=t
            )
            return Snapshot(nodes["items"], pods["items"], jobs["items"])

        snap: Snapshot = self._retrying("snapshot", read)
        return snap

    def _check_allocation(self, snap: Snapshot) -> None:
        found = over_allocation(snap)
        self.report.snapshots += 1
        self.report.allocation_checks.update(found.checked)
        self.report.violate(found.problems)

    # -------------------------------------------------------------- one round
    def run_round(self, ns: str) -> None:
        """Create `ns`, submit a workload into it under kills, settle and check it."""
        start = time.monotonic()
        self._retrying(
            f"namespace {ns}",
            lambda: self._core.create_namespace(
                {"metadata": {"name": ns}}, _request_timeout=REQUEST_TIMEOUT_S
            ),
        )
        deadline = time.monotonic() + 60
        while not self._core.list_namespaced_service_account(ns).items:
            if time.monotonic() > deadline:
                raise RuntimeError(f"namespace {ns} got no default ServiceAccount in 60 s")
            time.sleep(0.2)
        units = workload(self.rng, ns, self.plan.objects)
        order = _kill_order(self.rng, self.plan)
        at = sorted(self.rng.randint(0, len(units)) for _ in order)
        queue: deque[Unit] = deque(units)
        done = 0
        while queue or order:
            while order and at[0] <= done:
                at.pop(0)
                done += self._burst(queue)
                done += self._kill(order.pop(0), queue)
            if queue:
                self._submit(queue.popleft())
                done += 1
                time.sleep(self.rng.uniform(0, self.plan.max_pause_s))
        self.log(f"round {ns}: {len(units)} units submitted in {time.monotonic() - start:.0f} s")
        snap = self._settle(ns)
        self._final(snap, ns, units)
        self.report.rounds += 1

    def _submit(self, unit: Unit) -> None:
        for obj in unit.objects:
            (self._delete if unit.delete else self._create)(obj)
        self.report.submitted[unit.kind] += 1
        if not unit.delete:
            self.report.objects += len(unit.objects)

    def _burst(self, queue: deque[Unit]) -> int:
        """Submit 0-3 units back to back, so that the kill after them lands mid-work."""
        count = min(len(queue), self.rng.randint(0, 3))
        for _ in range(count):
            self._submit(queue.popleft())
        return count

    def _kill(self, component: str, queue: deque[Unit]) -> int:
        """Kill `component`, submit what can be while it is down, start it again.

        Returns how many units were submitted meanwhile.
        """
        down = self.rng.uniform(0, self.plan.max_down_s)
        want = 0 if component in API_DOWN else self.rng.randint(0, 2)
        during = [
            u
            for u in queue
            if not u.delete and (component != "operator" or u.kind != "TrainingJob")
        ][:want]
        start = time.monotonic()
        with self.cluster.killed(COMPONENTS[component]):
            for unit in during:
                queue.remove(unit)
                self._submit(unit)
            time.sleep(max(0.0, down - (time.monotonic() - start)))
            back = time.monotonic()
        self.report.restart_s[component].append(time.monotonic() - back)
        self.report.kills[component] += 1
        self.log(
            f"killed {component}: down {back - start:.1f} s, "
            f"ready again in {time.monotonic() - back:.1f} s, {len(during)} submitted meanwhile"
        )
        self._check_allocation(self.snapshot())
        return len(during)

    def _settle(self, ns: str) -> Snapshot:
        """Poll until nothing moves (see the module); what still moves at the bound violates."""
        start = time.monotonic()
        deadline = start + self.plan.settle_timeout_s
        last: frozenset[tuple[str, str]] | None = None
        quiet_since: float | None = None
        said: list[str] = []
        while True:
            snap = self.snapshot()
            self._check_allocation(snap)
            problems = settle_problems(snap)
            if problems != said:
                shown = "; ".join(problems[:3]) + (" ..." if len(problems) > 3 else "")
                self.log(f"settling, {len(problems)} left: {shown or 'nothing moves'}")
                said = problems
            bound = frozenset(
                (p["metadata"]["name"], p["spec"].get("nodeName", ""))
                for p in snap.pods
                if p["metadata"].get("namespace") == ns
            )
            now = time.monotonic()
            if problems:
                quiet_since = None
            elif bound != last or quiet_since is None:
                quiet_since = now
            last = bound
            if quiet_since is not None and now - quiet_since >= SETTLE_QUIET_S:
                self.report.settle_s.append(now - start)
                return snap
            if now > deadline:
                self.report.settle_s.append(now - start)
                self.report.violate(
                    [
                        f"not settled {self.plan.settle_timeout_s:.0f} s after submitting: {p}"
                        for p in problems
                    ]
                    or ["bound pods still changing at the settle bound"]
                )
                return snap
            time.sleep(POLL_S)

    def _final(self, snap: Snapshot, ns: str, units: list[Unit]) -> None:
        """The invariants on the settled snapshot, counted into the report."""
        found = Findings()
        found.add(over_allocation(snap)).add(gang_problems(snap)).add(job_problems(snap))
        deleted = {id(o) for u in units if u.delete for o in u.objects}
        keys = [
            (o["kind"], f"{ns}/{o['metadata']['name']}", id(o) in deleted)
            for u in units
            if not u.delete
            for o in u.objects
        ]
        found.add(
            lost_objects(
                snap,
                pods=[k for kind, k, gone in keys if kind == "Pod" and not gone],
                jobs=[k for kind, k, gone in keys if kind == "TrainingJob" and not gone],
                deleted=[k for _, k, gone in keys if gone],
            )
        )
        ours = [p for p in snap.pods if p["metadata"].get("namespace") == ns]
        found.checked["pods"] += len(ours)
        found.checked["bound pods"] += sum(1 for p in ours if p["spec"].get("nodeName"))
        self.report.final_checks.update(found.checked)
        self.report.violate(found.problems)
        for job in snap.jobs:
            if job["metadata"].get("namespace") == ns:
                self.report.job_phases[(job.get("status") or {}).get("phase") or "none"] += 1
        for pod in ours:
            gen = (pod["metadata"].get("labels") or {}).get("chronotope.dev/gang-generation")
            if gen and gen.isdigit():
                self.report.max_generation = max(self.report.max_generation, int(gen))

    def delete_round(self, ns: str, timeout: float = 240.0) -> None:
        """Delete a round's namespace and wait until it is gone (its GPUs are free again)."""
        self._retrying(
            f"delete namespace {ns}",
            lambda: self._core.delete_namespace(ns, _request_timeout=REQUEST_TIMEOUT_S),
        )
        deadline = time.monotonic() + timeout
        while any(n.metadata.name == ns for n in self._core.list_namespace().items):
            if time.monotonic() > deadline:
                self.report.violate([f"namespace {ns} not deleted within {timeout:.0f} s"])
                return
            time.sleep(POLL_S)

    def run(self, *, minutes: float | None = None, rounds: int = 1) -> Report:
        """`rounds` rounds, or as many as start within `minutes`; each in a fresh namespace.

        Rounds after the first start once the previous round's namespace is gone.
        """
        start = time.monotonic()
        for i in itertools.count():
            elapsed = time.monotonic() - start
            if (minutes is None and i >= rounds) or (
                minutes is not None and elapsed >= minutes * 60
            ):
                break
            ns = f"chaos-{self.plan.seed}-{i}"
            if i:
                self.delete_round(f"chaos-{self.plan.seed}-{i - 1}")
            self.run_round(ns)
            self.report.duration_s = time.monotonic() - start
            self.log(self.report.text())
        return self.report


def write_report(report: Report, path: Path) -> None:
    """Write the report's JSON to `path` (directories made as needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
