"""Admission decisions for the Chronotope kinds: what the CRD's schema and CEL cannot check.

The API server checks each object against its CRD schema and CEL rules, but
CEL sees one object only (and the pod template's schema cannot say, for example,
that GPUs belong in `spec.gpu`, not in the containers' resources).
The operator's admission webhook (`controllers.webhook`) asks this module:

- `validate`: deny a pod template the Pod API would refuse (by field path,
  `workloads.pod_shape`), a spec the models reject, and a change to a field
  that must not change while a TrainingJob's gang runs (`IMMUTABLE_WHILE_RUNNING`;
  `replicas` stays free, so `kubectl scale` and elastic resizes work); warn,
  never deny, about references to objects that do not exist (yet: `kubectl
  apply -f dir/` creates them in any order, and the controllers wait for them
  with a reason) and GPU types or GPU memory no node has (nodes join later).
- `default`: add the defaults the models define that the CRD cannot express
  (object-valued fields such as a TrainingJob's `placement` and `restart`),
  so the stored object shows what the operator will use.

Pure: the object, the old object and small lookups (`Lookups`) in, a `Review`
out; `admission_wire` speaks the AdmissionReview format and declares the
registration. docs/webhook.md says why each check denies or warns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from chronotope.api.v1alpha1.common import GpuShare
from chronotope.api.v1alpha1.inferencepipeline import InferencePipelineSpec
from chronotope.api.v1alpha1.modelvariant import ModelVariantSpec
from chronotope.api.v1alpha1.trainingjob import PlacementStrategy, TopologyLevel, TrainingJobSpec
from chronotope.planners.profile import profile_from_data
from chronotope.sharing.labels import (
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    SCHEDULER_NAME,
    SHARE_RESOURCE,
)
from chronotope.workloads.capacity import admitting, cluster_capacity
from chronotope.workloads.job_spec import apart_why, together
from chronotope.workloads.node_fit import job_rules
from chronotope.workloads.pod_shape import TypeTable, check_shape
from chronotope.workloads.training import least_workers

__all__ = [
    "IMMUTABLE_WHILE_RUNNING",
    "KINDS",
    "MAX_WARNINGS",
    "RUNNING_PHASES",
    "AdmissionLookupError",
    "Lookups",
    "Review",
    "default",
    "validate",
]

MAX_WARNINGS, _WARNING_CHARS = 10, 240  # the API server may cut long or many warnings

KINDS: dict[str, type[BaseModel]] = {
    "TrainingJob": TrainingJobSpec,
    "InferencePipeline": InferencePipelineSpec,
    "ModelVariant": ModelVariantSpec,
}

RUNNING_PHASES = ("Starting", "Running")
"""TrainingJob phases in which a gang built from the spec is running."""

IMMUTABLE_WHILE_RUNNING: tuple[tuple[str, str], ...] = (
    (
        "template",
        "the running workers were built from it; a change would only take effect at the "
        "gang's next restart, whenever that happens",
    ),
    (
        "gpu",
        "the running workers hold GPUs (and share limits) allocated for it; a change would "
        "only take effect at the gang's next restart",
    ),
    (
        "checkpoint.path",
        "resizes and restarts resume from it; moving it under a running gang would resume "
        "from a checkpoint the workers never wrote",
    ),
)
"""(field under spec, why) that a TrainingJob in `RUNNING_PHASES` may not change."""

_RESERVED_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "CHRONOTOPE_GPU_TYPE",
    "CHRONOTOPE_CHECKPOINT_PATH",
)


class AdmissionLookupError(Exception):
    """A lookup could not be answered (API error, timeout); the webhook warns, never denies."""


class Lookups(Protocol):
    """What validation reads from the cluster."""

    def gpu_nodes(self) -> Sequence[Mapping[str, Any]]:
        """The node objects labelled with a GPU type."""
        ...

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        """The ConfigMap's data, or None when it does not exist."""
        ...

    def model_variant_exists(self, namespace: str, name: str) -> bool:
        """Whether the ModelVariant exists."""
        ...


@dataclass(frozen=True)
class Review:
    """One admission answer: allowed or why not, warnings, and a JSON patch (mutating only)."""

    allowed: bool = True
    message: str = ""
    warnings: tuple[str, ...] = ()
    patch: tuple[dict[str, Any], ...] = ()


# ---------------------------------------------------------------------- validate
def validate(
    kind: str,
    obj: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    lookups: Lookups,
    pod_types: TypeTable,
) -> Review:
    """Admit, warn about, or deny `obj` (`old` on update); see the module docstring. Pure."""
    spec = obj.get("spec")
    if old is not None and old.get("spec") == spec:
        return Review()  # a metadata or finalizer write: the spec was admitted before
    if not isinstance(spec, dict) or kind not in KINDS:
        return Review(False, f"{kind} needs a spec object")
    deny: list[str] = []
    warn: list[str] = []
    template = spec.get("template")
    if kind == "TrainingJob" and isinstance(template, dict):
        shape = check_shape(template, "V1PodTemplateSpec", pod_types, "spec.template")
        deny += shape.errors
        deny += _gpu_in_template(template)
        warn += [f"{path}: unknown field, dropped from the worker pods" for path in shape.unknown]
        warn += _replaced_by_operator(template)
    try:
        parsed = KINDS[kind].model_validate(spec)
    except ValidationError as exc:
        deny += [e for e in _errors(exc) if not (deny and e.startswith("spec.template"))]
    else:
        if old is not None and kind == "TrainingJob":
            deny += _immutable(old, spec)
        if kind == "TrainingJob":
            assert isinstance(parsed, TrainingJobSpec)
            deny += _packed_apart(obj, parsed)
        if not deny:
            namespace = str((obj.get("metadata") or {}).get("namespace") or "")
            warn += _CHECKS[kind](parsed, namespace, lookups)
    if deny:
        return Review(False, "; ".join(deny), warnings=_capped(warn))
    return Review(True, warnings=_capped(warn))


def _packed_apart(obj: Mapping[str, Any], spec: TrainingJobSpec) -> list[str]:
    """A gang of more than one worker its strategy and its pods' rules keep from ever running.

    StrictPack (or a required Node topology), but its workers may not share a node; or
    StrictSpread, but they must.
    """
    least = least_workers(spec)
    if least < 2:  # noqa: PLR2004
        return []
    strategy = spec.placement.strategy
    one_node = spec.placement.required and spec.placement.topology is TopologyLevel.NODE
    if strategy is PlacementStrategy.STRICT_SPREAD and one_node:
        return [
            f"spec.placement: StrictSpread puts each of its {least} workers on a node of its "
            "own, but topology Node (required) puts them all on one: it could never be "
            "scheduled"
        ]
    packed = strategy is PlacementStrategy.STRICT_PACK or one_node
    why = apart_why(obj, spec) if packed else None
    if why is not None:
        field = (
            "spec.placement.strategy: StrictPack"
            if strategy is PlacementStrategy.STRICT_PACK
            else "spec.placement.topology: Node (required)"
        )
        return [
            f"{field} puts all {least} workers on one node, but "
            f"{why}, so no two of them may share a node: it could never be scheduled "
            "(use StrictSpread)"
        ]
    if strategy is PlacementStrategy.STRICT_SPREAD and together(obj, spec):
        return [
            f"spec.placement.strategy: StrictSpread puts each of its {least} workers on a node "
            "of its own, but a required pod affinity on kubernetes.io/hostname is met by its "
            "workers' own labels, so once one runs the others may go only beside it: it could "
            "never be scheduled (use StrictPack)"
        ]
    return []


def _errors(exc: ValidationError) -> list[str]:
    out = []
    for error in exc.errors():
        path = "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        out.append(f"{path}: {error['msg'].removeprefix('Value error, ')}")
    return out


def _at(spec: Mapping[str, Any], dotted: str) -> Any:
    value: Any = spec
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _immutable(old: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    phase = (old.get("status") or {}).get("phase")
    if phase not in RUNNING_PHASES:
        return []
    before = old.get("spec") or {}
    changed = [
        f"spec.{name}: cannot change while the job is {phase}: {why}"
        for name, why in IMMUTABLE_WHILE_RUNNING
        if _at(before, name) != _at(spec, name)
    ]
    if changed:
        changed[-1] += (
            " (to change it, delete and re-create the job: it resumes from its checkpoint; "
            "`kubectl scale` changes replicas)"
        )
    return changed


def _containers(template: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any]]]:
    spec = template.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if not isinstance(containers, list):
        return []
    return [(i, c) for i, c in enumerate(containers) if isinstance(c, Mapping)]


def _gpu_in_template(template: Mapping[str, Any]) -> list[str]:
    """GPUs asked for in container resources: the planner and scheduler would not count them."""
    out = []
    for i, container in _containers(template):
        resources = container.get("resources")
        for part in ("limits", "requests"):
            asked = resources.get(part) if isinstance(resources, Mapping) else None
            for name in (GPU_RESOURCE, SHARE_RESOURCE):
                if isinstance(asked, Mapping) and name in asked:
                    out.append(
                        f"spec.template.spec.containers[{i}].resources.{part}[{name}]: "
                        "request GPUs through spec.gpu (the operator sets the worker's GPUs)"
                    )
    return out


def _replaced_by_operator(template: Mapping[str, Any]) -> list[str]:
    """Template fields the operator overwrites in every worker (`workloads.gang`)."""
    out = []
    spec = template.get("spec")
    if isinstance(spec, Mapping):
        for key, value in (("schedulerName", SCHEDULER_NAME), ("restartPolicy", "Never")):
            if spec.get(key) not in (None, value):
                out.append(f"spec.template.spec.{key}: replaced by {value!r} in every worker")
        selector = spec.get("nodeSelector")
        if isinstance(selector, Mapping) and GPU_PRODUCT_LABEL in selector:
            out.append(
                f"spec.template.spec.nodeSelector[{GPU_PRODUCT_LABEL}]: replaced by the "
                "GPU type the planner picks from spec.gpuTypes"
            )
    for i, container in _containers(template)[:1]:
        env = container.get("env")
        entries = env if isinstance(env, list) else []
        names = {str(e.get("name")) for e in entries if isinstance(e, Mapping)}
        for name in sorted(names & set(_RESERVED_ENV)):
            out.append(f"spec.template.spec.containers[{i}].env {name}: set by the operator")
    return out


def _capped(warnings: Sequence[str]) -> tuple[str, ...]:
    out = [w if len(w) <= _WARNING_CHARS else w[: _WARNING_CHARS - 3] + "..." for w in warnings]
    if len(out) > MAX_WARNINGS:
        out = [*out[: MAX_WARNINGS - 1], f"... and {len(out) - MAX_WARNINGS + 1} more warnings"]
    return tuple(out)


# ---------------------------------------------------------------------- per-kind warnings
_UNKNOWN = object()
"""What `_lookup` returns when the cluster could not answer (None means "not found")."""


def _lookup(what: str, call: Callable[[], Any], warn: list[str]) -> Any:
    """`call()`, or `_UNKNOWN` with a warning when the cluster could not answer."""
    try:
        return call()
    except AdmissionLookupError as exc:
        warn.append(f"could not check {what}: {exc}")
        return _UNKNOWN


def _gpu_nodes(lookups: Lookups, warn: list[str]) -> Sequence[Mapping[str, Any]] | None:
    nodes = _lookup("the nodes' GPU types", lookups.gpu_nodes, warn)
    return None if nodes is _UNKNOWN else list(nodes)


def node_gpus(nodes: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """GPU type -> the largest per-GPU memory in MiB (0: unknown) of nodes labelled with it."""
    out: dict[str, int] = {}
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        product = labels.get(GPU_PRODUCT_LABEL)
        if product:
            memory = str(labels.get(GPU_MEMORY_LABEL) or "0")
            out[product] = max(out.get(product, 0), int(memory) if memory.isdigit() else 0)
    return out


def _known_gpus(nodes: Sequence[Mapping[str, Any]] | None) -> Mapping[str, int] | None:
    return None if nodes is None else node_gpus(nodes)


def _node_rules(spec: TrainingJobSpec, nodes: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """A warning when no node of some (or all) of the job's GPU types admits its workers.

    By the template's nodeSelector, required node affinity, tolerations and its
    workers' CPU and memory against each node's allocatable: the nodes as the
    scheduling pass sees them (`capacity.admitting`), with nothing running; the
    job waits for such a node, so this only warns.
    """
    if nodes is None:
        return []
    names = {t.name for t in spec.gpu_types}
    capacity = cluster_capacity(
        [
            n
            for n in nodes
            if ((n.get("metadata") or {}).get("labels") or {}).get(GPU_PRODUCT_LABEL) in names
        ],
        [],
    )
    rules = job_rules(spec)
    shut: list[str] = []
    present = 0
    for option in spec.gpu_types:
        seen = admitting(capacity, option.name, rules, spec.gpu.count or 1)
        if not seen.nodes and not seen.refused:
            continue
        present += 1
        if not seen.nodes:
            first, count = Counter(seen.refused).most_common(1)[0]
            shut.append(
                f"{option.name} ({count} of {sum(seen.refused.values())} node(s) by {first})"
            )
    if not shut:
        return []
    tail = "it waits until one does" if len(shut) == present else "the others are used"
    return [
        "spec.template: no node of GPU type " + "; ".join(shut) + f" admits its workers now; {tail}"
    ]


def _gpu_types(field: str, wanted: Sequence[str], known: Mapping[str, int] | None) -> list[str]:
    """A warning when some (or all) GPU types in `wanted` are on no node."""
    if known is None:
        return []
    absent = [t for t in dict.fromkeys(wanted) if t not in known]
    if not absent:
        return []
    names = ", ".join(absent)
    if len(absent) == len(set(wanted)):
        return [
            f"{field}: no node has GPU type {names} ({GPU_PRODUCT_LABEL}); it waits until one joins"
        ]
    return [f"{field}: no node has GPU type {names} ({GPU_PRODUCT_LABEL}); the others are used"]


def _share_fits(
    field: str, share: GpuShare | None, types: Sequence[str], known: Mapping[str, int] | None
) -> list[str]:
    """A warning when a GPU share asks for more memory than any GPU of its types has."""
    if share is None or known is None:
        return []
    sizes = [known[t] for t in types if known.get(t)]
    if sizes and share.memory_mib > max(sizes):
        return [
            f"{field}.memoryMiB: {share.memory_mib} MiB is more than any GPU of its types "
            f"has ({max(sizes)} MiB): it cannot be placed"
        ]
    return []


def _training_job(spec: BaseModel, namespace: str, lookups: Lookups) -> list[str]:
    assert isinstance(spec, TrainingJobSpec)
    warn: list[str] = []
    nodes = _gpu_nodes(lookups, warn)
    known = _known_gpus(nodes)
    names = [t.name for t in spec.gpu_types]
    warn += _gpu_types("spec.gpuTypes", names, known)
    warn += _share_fits("spec.gpu.shared", spec.gpu.shared, names, known)
    warn += _node_rules(spec, nodes)
    profile = spec.parallelism.model_profile if spec.parallelism else None
    if profile:
        what = f"model profile ConfigMap {namespace}/{profile}"
        data = _lookup(what, lambda: lookups.config_map(namespace, profile), warn)
        if data is not _UNKNOWN:
            warn += _profile_warnings(what, data, names)
    return warn


def _profile_warnings(what: str, data: Mapping[str, str] | None, names: Sequence[str]) -> list[str]:
    if data is None:
        return [
            f"spec.parallelism.modelProfile: {what} not found; the job waits for it "
            "(create it with `chronotope profile configmap`)"
        ]
    try:
        parsed = profile_from_data(data, source=what)
    except ValueError as exc:
        return [f"spec.parallelism.modelProfile: {exc}"]
    missing = [t for t in names if t not in parsed.gpus]
    if missing:
        return [
            f"spec.parallelism.modelProfile: {what} has no layer times for "
            f"{', '.join(missing)}; the planner skips those GPU types"
        ]
    return []


def _pipeline(spec: BaseModel, namespace: str, lookups: Lookups) -> list[str]:
    assert isinstance(spec, InferencePipelineSpec)
    warn: list[str] = []
    known = _known_gpus(_gpu_nodes(lookups, warn))
    for i, stage in enumerate(spec.stages):
        field = f"spec.stages[{i}]"
        types = [p.gpu_type for p in stage.profiles]
        warn += _gpu_types(f"{field}.profiles", types, known)
        warn += _share_fits(
            f"{field}.gpu.shared", stage.gpu.shared if stage.gpu else None, types, known
        )
        variant = stage.model.variant
        if variant:
            what = f"ModelVariant {namespace}/{variant}"
            found = _lookup(what, _exists(lookups, namespace, variant), warn)
            if found is False:
                warn.append(f"{field}.model.variant: {what} not found; the pipeline waits for it")
    trace = spec.traffic.trace
    if trace is not None:
        what = f"trace ConfigMap {namespace}/{trace.config_map}"
        data = _lookup(what, lambda: lookups.config_map(namespace, trace.config_map), warn)
        if data is None:
            warn.append(
                f"spec.traffic.trace.configMap: {what} not found; the pipeline waits for it"
            )
        elif data is not _UNKNOWN and trace.key not in data:
            warn.append(
                f"spec.traffic.trace.key: {what} has no key {trace.key!r}; "
                "the pipeline waits for it"
            )
    return warn


def _exists(lookups: Lookups, namespace: str, variant: str) -> Callable[[], bool]:
    return lambda: lookups.model_variant_exists(namespace, variant)


def _variant(spec: BaseModel, namespace: str, lookups: Lookups) -> list[str]:
    assert isinstance(spec, ModelVariantSpec)
    warn: list[str] = []
    known = _known_gpus(_gpu_nodes(lookups, warn))
    sizes = [m for m in (known or {}).values() if m]
    need = spec.base.size_mib + spec.delta.compressed_size_mib
    if sizes and need > max(sizes):
        warn.append(
            f"spec.base.sizeMiB: the base and the delta ({need} MiB) fit on no GPU in the "
            f"cluster (largest {max(sizes)} MiB); the variant cannot be served"
        )
    if spec.gpu is not None:
        warn += _share_fits("spec.gpu.shared", spec.gpu.shared, list(known or {}), known)
    return warn


_CHECKS: dict[str, Callable[[BaseModel, str, Lookups], list[str]]] = {
    "TrainingJob": _training_job,
    "InferencePipeline": _pipeline,
    "ModelVariant": _variant,
}


# ---------------------------------------------------------------------- default
def default(kind: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> Review:
    """A JSON patch adding the model defaults `obj`'s spec lacks (never changing a value). Pure.

    Only non-empty defaults are added (an empty list or object says nothing);
    a spec the models reject gets no patch (validation reports it).
    """
    spec = obj.get("spec")
    if kind not in KINDS or not isinstance(spec, dict):
        return Review()
    if old is not None and old.get("spec") == spec:
        return Review()
    try:
        parsed = KINDS[kind].model_validate(spec)
    except ValidationError:
        return Review()
    full = parsed.model_dump(mode="json", by_alias=True, exclude_none=True)
    return Review(patch=tuple(_additions(spec, full, "/spec")))


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _additions(stored: Any, full: Any, path: str) -> list[dict[str, Any]]:
    if isinstance(stored, dict) and isinstance(full, dict):
        ops: list[dict[str, Any]] = []
        for key, value in full.items():
            here = f"{path}/{_escape(key)}"
            if key not in stored:
                if value not in ([], {}):
                    ops.append({"op": "add", "path": here, "value": value})
            else:
                ops += _additions(stored[key], value, here)
        return ops
    if isinstance(stored, list) and isinstance(full, list) and len(stored) == len(full):
        return [
            op
            for i, (s, f) in enumerate(zip(stored, full, strict=True))
            for op in _additions(s, f, f"{path}/{i}")
        ]
    return []
