"""A TrainingJob's parsed spec, memoised per object version (pure).

Every reconcile reads the other jobs' specs (queue order, quota, gates), so
without a memo a cluster of N waiting jobs validates N specs per reconcile.
The memo key is the object's uid, generation and resourceVersion: any change
to the object makes a new key, so a hit is always the spec of that very
version. Objects without all three (hand-built dicts in tests) are parsed
each time.

The spec the decisions read is the spec as written, except that a job whose
`status.avoidNodes` names nodes gets a template whose node affinity excludes
them (`node_fit.avoiding`): every decision then leaves them out as it leaves
out any node the template rules out, and the workers it creates carry the
exclusion, so kube-scheduler leaves them out too. Its template's metadata names
the job's namespace and carries its job label, as its workers do, so the
decisions know which pods' anti-affinity selects them (`node_fit.NodeRules.who`).
And a job whose placement strategy is Pack or Spread is placed StrictSpread
when two of its workers can never share a node: they ask host ports
(`node_fit.host_ports`, kube-scheduler's NodePorts filter) or keep off each
other's nodes by a required pod anti-affinity (`node_fit.avoids_itself`, its
InterPodAffinity filter); so every decision, and the extender, put each on
its own node. One whose topology spread constraint puts one worker a node
(`node_fit.spreads_itself`, its PodTopologySpread filter: a second goes on a
node once every node they count over runs one) is placed Spread, fewest-first,
so the decisions count what its nodes take in levels (`node_fit.levelled`); or
StrictSpread when it requires one topology domain (not counted in levels).
Likewise a job whose workers must share a node (a required pod affinity
on `kubernetes.io/hostname` their own labels meet: once one runs, kube-scheduler
puts the others only beside it; `node_fit.seeks_itself`) is placed StrictPack,
and one whose workers must share a zone, rack or NVLink domain that way (the
same on that label, `node_fit.seeks_itself_within`) requires that
`placement.topology`, unless it requires a narrower one, and only nodes that
carry the label (`node_fit.labelled`: kube-scheduler refuses such a pod any
other node).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from chronotope.api.v1alpha1.trainingjob import PlacementStrategy, TopologyLevel, TrainingJobSpec
from chronotope.solver.slots import DOMAIN_LABELS
from chronotope.workloads.gang import JOB_LABEL
from chronotope.workloads.node_fit import (
    apart,
    avoiding,
    labelled,
    seeks_itself,
    seeks_itself_within,
    spreads_itself,
)

__all__ = [
    "MEMO_SIZE",
    "apart_why",
    "job_spec",
    "job_spec_or_none",
    "together",
    "within",
]

MEMO_SIZE = 20_000
"""Parsed versions kept (least recently used dropped first)."""

_memo: OrderedDict[tuple[str, str, str], TrainingJobSpec | ValueError] = OrderedDict()
_lock = threading.Lock()


def _version(job: Mapping[str, Any]) -> tuple[str, str, str] | None:
    meta = job.get("metadata") or {}
    uid, gen, rv = meta.get("uid"), meta.get("generation"), meta.get("resourceVersion")
    if uid is None or gen is None or rv is None:
        return None
    return str(uid), str(gen), str(rv)


_LOOSE = (PlacementStrategy.PACK, PlacementStrategy.SPREAD)
_SPREAD = PlacementStrategy.SPREAD
_ANY = TopologyLevel.ANY


def apart_why(job: Mapping[str, Any], spec: TrainingJobSpec) -> str | None:
    """Why two of the job's workers can never share a node, in words; None when they may.

    Not a topology spread of one per node: it lets a second worker onto a node once
    every node of the type runs one (`node_fit.apart`).
    """
    return apart(*_workers(job, spec), spread=False)


def together(job: Mapping[str, Any], spec: TrainingJobSpec) -> bool:
    """Whether the job's workers must share a node (`node_fit.seeks_itself`).

    Their required pod affinity on `kubernetes.io/hostname` is met by their own labels.
    """
    return seeks_itself(*_workers(job, spec))


def _workers(job: Mapping[str, Any], spec: TrainingJobSpec) -> tuple[Any, dict[str, str], str]:
    """The workers' pod spec, labels (the template's and the job label) and namespace."""
    template = spec.template or {}
    meta = template.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    own = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}
    job_meta = job.get("metadata") or {}
    own[JOB_LABEL] = str(job_meta.get("name") or "")
    return template.get("spec"), own, str(job_meta.get("namespace") or "")


def _named(job: Mapping[str, Any], spec: TrainingJobSpec) -> TrainingJobSpec:
    """`spec` with its template's metadata naming the job's namespace and job label.

    As its workers carry them (`workloads.gang`): what pod (anti-)affinity selects.
    """
    meta = job.get("metadata") or {}
    template = dict(spec.template or {})
    pod_meta = template.get("metadata")
    pod_meta = dict(pod_meta) if isinstance(pod_meta, Mapping) else {}
    labels = pod_meta.get("labels")
    labels = dict(labels) if isinstance(labels, Mapping) else {}
    labels[JOB_LABEL] = str(meta.get("name") or "")
    pod_meta |= {"namespace": str(meta.get("namespace") or ""), "labels": labels}
    return spec.model_copy(update={"template": template | {"metadata": pod_meta}})


_NARROW = (
    TopologyLevel.NODE,
    TopologyLevel.NVLINK_DOMAIN,
    TopologyLevel.RACK,
    TopologyLevel.ZONE,
    TopologyLevel.ANY,
)
"""Topology levels, narrowest first."""


def within(job: Mapping[str, Any], spec: TrainingJobSpec) -> TopologyLevel | None:
    """The domain above one node the job's workers must share (`node_fit.seeks_itself_within`).

    Their required pod affinity on a zone, rack or NVLink-domain label is met by their
    own labels.
    """
    return seeks_itself_within(*_workers(job, spec))


def _parsed(job: Mapping[str, Any]) -> TrainingJobSpec:
    spec = _named(job, TrainingJobSpec.model_validate(job.get("spec") or {}))
    level = within(job, spec)
    held = spec.placement.topology if spec.placement.required else TopologyLevel.ANY
    if level is not None:  # kube-scheduler refuses such a pod a node without the label
        spec = spec.model_copy(update={"template": labelled(spec.template, DOMAIN_LABELS[level])})
    if level is not None and _NARROW.index(level) < _NARROW.index(held):
        placement = spec.placement.model_copy(update={"topology": level, "required": True})
        spec = spec.model_copy(update={"placement": placement})
    if spec.placement.strategy in _LOOSE:
        strategy = None
        workers = _workers(job, spec)
        if apart(*workers, spread=False) is not None:
            strategy = PlacementStrategy.STRICT_SPREAD
        elif spreads_itself(*workers):  # in levels, unless within one domain (`levelled`)
            within_one = spec.placement.required and spec.placement.topology is not _ANY
            strategy = PlacementStrategy.STRICT_SPREAD if within_one else _SPREAD
        elif together(job, spec):
            strategy = PlacementStrategy.STRICT_PACK
        if strategy is not None:
            placement = spec.placement.model_copy(update={"strategy": strategy})
            spec = spec.model_copy(update={"placement": placement})
    avoid = (job.get("status") or {}).get("avoidNodes")
    if not avoid or not isinstance(avoid, list):
        return spec
    return spec.model_copy(update={"template": avoiding(spec.template, map(str, avoid))})


def job_spec(job: Mapping[str, Any], *, as_written: bool = False) -> TrainingJobSpec:
    """The job's spec as decisions read it (its avoided nodes excluded; see above).

    `as_written`: the spec exactly as written. Raises ValueError (pydantic's) for a
    spec the models reject.
    """
    key = _version(job)
    if as_written:
        return TrainingJobSpec.model_validate(job.get("spec") or {})
    if key is None:
        return _parsed(job)
    with _lock:
        hit = _memo.get(key)
        if hit is not None:
            _memo.move_to_end(key)
    if hit is None:
        try:
            hit = _parsed(job)
        except ValueError as exc:
            hit = exc
        with _lock:
            _memo[key] = hit
            while len(_memo) > MEMO_SIZE:
                _memo.popitem(last=False)
    if isinstance(hit, ValueError):
        raise hit
    return hit


def job_spec_or_none(job: Mapping[str, Any]) -> TrainingJobSpec | None:
    """The job's spec, or None when the models reject it."""
    try:
        return job_spec(job)
    except ValueError:
        return None
