"""Queue quota accounting: every rule by a table, and the invariants by hypothesis."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronotope.api.v1alpha1 import LocalQueueSpec, QueueSpec, TrainingJobSpec
from chronotope.api.v1alpha1.queue import (
    DEFAULT_RECLAIM_GRACE_SECONDS,
    ReclaimPolicy,
    StopPolicy,
    WithinQueuePolicy,
)
from chronotope.kube.workloads import delete_pods
from chronotope.workloads import quota as quota_module
from chronotope.workloads.quota import (
    Admission,
    AdmittedWorkload,
    Demand,
    PendingWorkload,
    QuotaBook,
    StopCause,
    Unit,
    Verdict,
    WaitReason,
    admit,
    demands_of,
    forecast_starts,
    policy_first,
    queue_statuses,
)

A100, L4 = "A100", "L4"
GPUS = Unit.GPUS


def _queue(
    *quotas: tuple[str, int] | tuple[str, int, int],
    cohort: str | None = "ml",
    weight: float = 1.0,
    reclaim: str = "Never",
    share: int = 0,
    within: str = "Never",
    lend: int | None = None,
    strict: bool = False,
    fungibility: str = "Borrow",
    preempt: str = "TryNextFlavor",
    fair: str = "Never",
) -> QueueSpec:
    rows: list[dict[str, Any]] = []
    for q in quotas:
        row: dict[str, Any] = {"gpuType": q[0], "gpus": q[1], "shareMilli": share}
        if len(q) == 3:
            row["borrowingLimit"] = q[2]
        if lend is not None:  # a lending limit on every row, at most its nominal quota
            row["lendingLimit"] = min(lend, q[1])
        rows.append(row)
    spec: dict[str, Any] = {
        "quotas": rows,
        "weight": weight,
        "reclaim": {"policy": reclaim, "withinQueue": within, "fairShare": fair},
        "queueingStrategy": "StrictFIFO" if strict else "BestEffortFIFO",
        "flavorFungibility": {"whenCanBorrow": fungibility, "whenCanPreempt": preempt},
    }
    if cohort:
        spec["cohort"] = cohort
    return QueueSpec.model_validate(spec)


def _book(queues: dict[str, QueueSpec], running: Sequence[tuple[str, str, int]] = ()) -> QuotaBook:
    """Queues, a LocalQueue `default` per queue in namespace = queue name, running A100 work."""
    local = {(name, "default"): LocalQueueSpec(queue=name) for name in queues}
    admitted = [
        AdmittedWorkload(key, queue, {(A100, GPUS): n}, admitted_at=float(i))
        for i, (key, queue, n) in enumerate(running)
    ]
    return QuotaBook(queues, local, admitted)


def _job(key: str, queue: str, *alternatives: tuple[str, int]) -> PendingWorkload:
    demands = tuple(Demand(t, gpus=n) for t, n in alternatives) or (Demand(A100, gpus=1),)
    return PendingWorkload(key, queue, "default", demands)


# --- resolution: missing LocalQueue / Queue -----------------------------------------------


def test_no_queue_at_all_means_quotas_are_off() -> None:
    book = QuotaBook({}, {})
    out = admit(book, [_job("j", "ns", (A100, 64))])
    assert out["j"].verdict is Verdict.ADMIT
    assert "quotas are off" in out["j"].message


def test_missing_local_queue_waits_naming_it() -> None:
    book = _book({"team-a": _queue((A100, 8))})
    out = admit(book, [PendingWorkload("j", "other-ns", "default", (Demand(A100, 1),))])
    assert out["j"].verdict is Verdict.WAIT
    assert out["j"].reason is WaitReason.LOCAL_QUEUE_MISSING
    assert out["j"].message == "no LocalQueue default in namespace other-ns"


def test_local_queue_naming_a_missing_queue_waits_naming_both() -> None:
    book = QuotaBook(
        {"team-a": _queue((A100, 8))}, {("ns", "default"): LocalQueueSpec(queue="team-z")}
    )
    out = admit(book, [PendingWorkload("j", "ns", "default", (Demand(A100, 1),))])
    assert out["j"].reason is WaitReason.QUEUE_MISSING
    assert out["j"].queue == "team-z"
    assert "LocalQueue ns/default names Queue team-z, which does not exist" in out["j"].message


# --- nominal quota, borrowing, limits -------------------------------------------------------

# (queues, running, job alternatives, verdict, message fragment)
CASES: list[tuple[str, dict[str, QueueSpec], list[tuple[str, str, int]], tuple[tuple[str, int], ...], Verdict, str]] = [  # noqa: E501
    ("within nominal", {"team-a": _queue((A100, 8))}, [("r", "team-a", 4)], ((A100, 4),),
     Verdict.ADMIT, ""),
    ("no cohort: nominal is the cap", {"team-a": _queue((A100, 8), cohort=None)},
     [("r", "team-a", 8)], ((A100, 1),), Verdict.WAIT,
     "queue team-a: A100 8/8 in use, no cohort to borrow from"),
    ("borrow idle quota of the cohort",
     {"team-a": _queue((A100, 8)), "team-b": _queue((A100, 8))}, [("r", "team-a", 8)],
     ((A100, 4),), Verdict.BORROW, ""),
    ("cohort has nothing to lend",
     {"team-a": _queue((A100, 8)), "team-b": _queue((A100, 8))},
     [("r", "team-a", 8), ("s", "team-b", 8)], ((A100, 1),), Verdict.WAIT,
     "queue team-a: A100 8/8 in use, cohort ml has 0 to lend"),
    ("borrowing limit", {"team-a": _queue((A100, 8, 2)), "team-b": _queue((A100, 8))},
     [("r", "team-a", 8)], ((A100, 3),), Verdict.WAIT,
     "queue team-a: A100 8/8 in use, borrowing limit 2"),
    ("borrowing up to the limit", {"team-a": _queue((A100, 8, 2)), "team-b": _queue((A100, 8))},
     [("r", "team-a", 8)], ((A100, 2),), Verdict.BORROW, ""),
    ("type not in the queue", {"team-a": _queue((A100, 8))}, [], ((L4, 1),), Verdict.WAIT,
     "queue team-a has no quota for L4 (its types: A100)"),
    ("a type listed with 0 GPUs may only borrow",
     {"team-a": _queue((A100, 0)), "team-b": _queue((A100, 8))}, [], ((A100, 2),),
     Verdict.BORROW, ""),
    ("other cohorts lend nothing",
     {"team-a": _queue((A100, 8)), "team-b": _queue((A100, 8), cohort="other")},
     [("r", "team-a", 8)], ((A100, 1),), Verdict.WAIT, "cohort ml has 0 to lend"),
    ("TryNextFlavor: a later alternative within nominal quota wins over borrowing the first",
     {"team-a": _queue((A100, 8), (L4, 4), fungibility="TryNextFlavor"),
      "team-b": _queue((A100, 8))},
     [("r", "team-a", 8)], ((A100, 1), (L4, 1)), Verdict.ADMIT, ""),
    ("Borrow (the default): the first alternative borrows",
     {"team-a": _queue((A100, 8), (L4, 4)), "team-b": _queue((A100, 8))},
     [("r", "team-a", 8)], ((A100, 1), (L4, 1)), Verdict.BORROW, ""),
    ("Borrow: an alternative that needs reclaiming comes after one within nominal quota",
     {"team-a": _queue((A100, 8), (L4, 4), reclaim="PreemptBorrowed"),
      "team-b": _queue((A100, 0))},
     [("r", "team-b", 8)], ((A100, 1), (L4, 1)), Verdict.ADMIT, ""),
    ("quota lent out, policy Never: wait for the borrowers",
     {"team-a": _queue((A100, 8)), "team-b": _queue((A100, 8))},
     [("b1", "team-b", 8), ("b2", "team-b", 8)], ((A100, 2),), Verdict.WAIT,
     "queue team-a: A100 0/8 in use, 2 lent in cohort ml; reclaim policy Never waits"),
]  # fmt: skip


@pytest.mark.parametrize("stop", ["Hold", "HoldAndDrain"])
def test_a_stopped_queue_admits_nothing_and_still_lends(stop: str) -> None:
    spec = _queue((A100, 8), reclaim="PreemptBorrowed").model_dump(by_alias=True)
    held = QueueSpec.model_validate(spec | {"stopPolicy": stop})
    book = _book({"team-a": held, "team-b": _queue((A100, 0))}, [("b1", "team-b", 6)])
    out = admit(book, [_job("a1", "team-a", (A100, 1)), _job("b2", "team-b", (A100, 2))])
    assert out["a1"].verdict is Verdict.WAIT
    assert out["a1"].reason is WaitReason.QUEUE_STOPPED
    assert out["a1"].victims == ()  # a stopped queue reclaims nothing, though b borrows 6
    assert out["a1"].message == (
        f"queue team-a is stopped (stopPolicy {stop}): it admits nothing until its "
        "stopPolicy is None"
    )
    assert out["b2"].verdict is Verdict.BORROW  # its idle quota is still lent


@pytest.mark.parametrize(
    ("queues", "running", "alternatives", "verdict", "message"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_admission_rules(
    queues: dict[str, QueueSpec],
    running: list[tuple[str, str, int]],
    alternatives: tuple[tuple[str, int], ...],
    verdict: Verdict,
    message: str,
) -> None:
    out = admit(_book(queues, running), [_job("j", "team-a", *alternatives)])["j"]
    assert out.verdict is verdict, out
    assert message in out.message
    if verdict is Verdict.WAIT:
        assert out.reason in (WaitReason.QUOTA_EXCEEDED, WaitReason.NO_QUOTA_FOR_TYPE)
        assert out.demand is None
    else:
        assert out.demand is not None


def test_the_ceiling_is_nominal_plus_what_the_cohort_lends_up_to_the_limit() -> None:
    book = _book(
        {
            "a": _queue((A100, 4, 2), (L4, 0)),
            "b": _queue((A100, 8), (L4, 0)),
            "alone": _queue((A100, 3), cohort=None),
        }
    )
    a, b, alone = book.queues["a"], book.queues["b"], book.queues["alone"]
    assert book.ceiling(a, (A100, GPUS)) == 4 + 2  # its limit, below b's 8
    assert book.ceiling(b, (A100, GPUS)) == 8 + 4  # no limit: all a has
    assert book.ceiling(a, (L4, GPUS)) == 0  # nobody has L4 quota to lend
    assert book.ceiling(a, ("H100", GPUS)) == 0  # not listed: never
    assert book.ceiling(alone, (A100, GPUS)) == 3  # no cohort: its own only
    assert book.ceiling(a, (A100, Unit.SHARE_MILLI)) == 0  # nobody has shares of it to lend


def test_a_lending_limit_keeps_part_of_the_nominal_quota_from_the_cohort() -> None:
    # team-a lends at most 2 of its 8 A100s: team-b may borrow 2, not 3, though 8 are idle
    queues = {"team-a": _queue((A100, 8), lend=2), "team-b": _queue((A100, 0))}
    book = _book(queues)
    assert book.ceiling(book.queues["team-b"], (A100, GPUS)) == 2
    big = admit(book, [_job("big", "team-b", (A100, 3))])["big"]
    assert big.verdict is Verdict.WAIT
    assert "cohort ml has 2 to lend" in big.message
    assert admit(book, [_job("small", "team-b", (A100, 2))])["small"].verdict is Verdict.BORROW
    assert queue_statuses(book)["team-a"].gpus[0].lent == 2


def test_the_part_a_queue_does_not_lend_is_its_own_with_no_reclaim() -> None:
    # team-b borrows the 2 team-a lends; team-a's other 6 need nobody stopped, even under
    # Never, and only its lent 2 are reclaimed
    queues = {
        "team-a": _queue((A100, 8), lend=2, reclaim="PreemptBorrowed"),
        "team-b": _queue((A100, 0)),
    }
    book = _book(queues, [("b0", "team-b", 2)])
    out = admit(book, [_job("a6", "team-a", (A100, 6))])["a6"]
    assert (out.verdict, out.victims) == (Verdict.ADMIT, ())
    out = admit(book, [_job("a2", "team-a", (A100, 2))])["a2"]
    assert (out.verdict, out.victims) == (Verdict.RECLAIM, ("b0",))
    never = {"team-a": _queue((A100, 8), lend=2), "team-b": _queue((A100, 0))}
    book = _book(never, [("b0", "team-b", 2)])
    both = admit(book, [_job("a6", "team-a", (A100, 6)), _job("a1", "team-a", (A100, 1))])
    assert both["a6"].verdict is Verdict.ADMIT
    assert both["a1"].verdict is Verdict.WAIT  # the lent 2 come back when b0 ends
    assert "lent in cohort ml; reclaim policy Never waits" in both["a1"].message


def test_a_lending_limit_needs_a_cohort_and_at_most_the_nominal_quota() -> None:
    with pytest.raises(ValueError, match="lendingLimit needs a cohort"):
        _queue((A100, 8), lend=2, cohort=None)
    with pytest.raises(ValueError, match="lendingLimit must not exceed gpus"):
        QueueSpec.model_validate(
            {"cohort": "ml", "quotas": [{"gpuType": A100, "gpus": 2, "lendingLimit": 3}]}
        )


def test_a_strict_fifo_queue_admits_in_order_and_a_best_effort_one_backfills() -> None:
    # 2 of 4 GPUs in use: the 4-GPU job waits; behind it the 1-GPU job waits too under
    # StrictFIFO (the big one is not starved by smaller ones), and runs under BestEffortFIFO
    for strict, small in ((True, Verdict.WAIT), (False, Verdict.ADMIT)):
        book = _book(
            {"team-a": _queue((A100, 4), cohort=None, strict=strict)}, [("r", "team-a", 2)]
        )
        out = admit(book, [_job("big", "team-a", (A100, 4)), _job("small", "team-a", (A100, 1))])
        assert out["big"].verdict is Verdict.WAIT
        assert out["small"].verdict is small
        if strict:
            assert out["big"].message == "queue team-a: A100 2/4 in use, no cohort to borrow from"
            assert out["small"].reason is WaitReason.QUOTA_EXCEEDED
            assert out["small"].message == (
                "queue team-a admits in order (queueingStrategy StrictFIFO): big ahead of it "
                "does not fit yet"
            )


def test_the_policys_wish_goes_first_but_a_strict_fifo_queue_keeps_age_order() -> None:
    # pending in queue order (oldest first): a1, b1, a2, b2, s (kept in place); the
    # cluster policy would run b2 then a2 now. Team a's jobs are dealt the places anew
    # (a2 first); team b is StrictFIFO, so b1 stays ahead of b2; s keeps its place
    book = _book({"a": _queue((A100, 4)), "b": _queue((A100, 4), strict=True)})
    pending = [_job(k, k[0]) for k in ("a1", "b1", "a2", "b2")]
    pending.insert(2, _job("s", "a"))
    out = policy_first(book, pending, {"b2": 0, "a2": 1}, fixed={"s"})
    assert [p.key for p in out] == ["a2", "b1", "s", "a1", "b2"]
    # a higher priority stays ahead of any wish
    first = replace(_job("a0", "a"), priority=5)
    out = policy_first(book, [first, *pending], {"a2": 0})
    assert [p.key for p in out][:2] == ["a0", "a2"]


def test_a_strict_fifo_head_that_fits_lets_the_next_through_in_the_same_cycle() -> None:
    # the head fits its nominal quota, the next borrows: both in one cycle, in order
    queues = {"team-a": _queue((A100, 2), strict=True), "team-b": _queue((A100, 3))}
    book = _book(queues)
    jobs = [_job(k, "team-a", (A100, 2)) for k in ("a1", "a2", "a3")]
    out = admit(book, jobs)
    assert [out[k].verdict for k in ("a1", "a2", "a3")] == [
        Verdict.ADMIT,
        Verdict.BORROW,
        Verdict.WAIT,
    ]
    # another queue's workloads are not held back by it
    # next cycle: a3 still waits (1 left to borrow); a4 would fit that 1 but waits behind
    # a3; another queue's workload is not held back by them
    again = [jobs[2], _job("a4", "team-a", (A100, 1)), _job("b1", "team-b", (A100, 1))]
    out = admit(book, again)
    assert [out[k].verdict for k in ("a3", "a4", "b1")] == [Verdict.WAIT] * 2 + [Verdict.ADMIT]
    assert "a3 ahead of it does not fit yet" in out["a4"].message


def test_a_namespace_selector_admits_only_the_namespaces_it_selects() -> None:
    spec = QueueSpec.model_validate(
        {
            "quotas": [{"gpuType": A100, "gpus": 8}],
            "namespaceSelector": {
                "matchExpressions": [{"key": "team", "operator": "In", "values": ["vision"]}]
            },
        }
    )
    local = {(ns, "default"): LocalQueueSpec(queue="team-a") for ns in ("vision", "nlp")}
    labels = {"vision": {"team": "vision"}, "nlp": {"team": "nlp"}}
    pending = [
        PendingWorkload(f"{ns}/j", ns, "default", (Demand(A100, 1),)) for ns in ("vision", "nlp")
    ]
    out = admit(QuotaBook({"team-a": spec}, local, namespaces=labels), pending)
    assert out["vision/j"].verdict is Verdict.ADMIT
    refused = out["nlp/j"]
    assert (refused.verdict, refused.reason) == (Verdict.WAIT, WaitReason.NAMESPACE_NOT_ALLOWED)
    assert refused.message == "Queue team-a's namespaceSelector does not select namespace nlp"
    # namespace labels not known: a Queue with a selector admits nothing (fails closed)
    out = admit(QuotaBook({"team-a": spec}, local), pending)
    assert "namespace labels are unknown" in out["vision/j"].message
    # without a selector every namespace is admitted, labels known or not
    open_ = {"team-a": QueueSpec.model_validate({"quotas": [{"gpuType": A100, "gpus": 8}]})}
    out = admit(QuotaBook(open_, local), pending)
    assert {d.verdict for d in out.values()} == {Verdict.ADMIT}


def test_borrowed_amount_is_what_lies_above_nominal() -> None:
    book = _book({"team-a": _queue((A100, 8)), "team-b": _queue((A100, 8))}, [("r", "team-a", 6)])
    out = admit(book, [_job("j", "team-a", (A100, 4))])["j"]
    assert out.verdict is Verdict.BORROW
    assert out.borrowed == {(A100, GPUS): 2}


def test_share_quota_is_its_own_pool() -> None:
    queues = {"team-a": _queue((L4, 1), share=500, cohort=None)}
    book = _book(queues)
    big = PendingWorkload("big", "team-a", "default", (Demand(L4, share_milli=600),))
    small = PendingWorkload("small", "team-a", "default", (Demand(L4, share_milli=300),))
    out = admit(book, [big, small])
    assert out["big"].verdict is Verdict.WAIT
    assert "L4 shares (milli) 300/500 in use, no cohort" in out["big"].message
    assert out["small"].verdict is Verdict.ADMIT


def test_a_job_that_does_not_fit_does_not_hold_back_later_ones() -> None:
    book = _book({"team-a": _queue((A100, 8), cohort=None)}, [("r", "team-a", 6)])
    out = admit(book, [_job("big", "team-a", (A100, 4)), _job("small", "team-a", (A100, 2))])
    assert out["big"].verdict is Verdict.WAIT
    assert out["small"].verdict is Verdict.ADMIT


def test_one_cycle_never_admits_the_same_quota_twice() -> None:
    book = _book({"team-a": _queue((A100, 8), cohort=None)})
    out = admit(book, [_job(f"j{i}", "team-a", (A100, 3)) for i in range(4)])
    assert [out[f"j{i}"].verdict for i in range(4)] == [Verdict.ADMIT] * 2 + [Verdict.WAIT] * 2


# --- fair share among borrowers -------------------------------------------------------------


def test_borrowers_are_served_by_weighted_dominant_share() -> None:
    # team-c lends 8; team-a already borrows 2, team-b none: team-b goes first though listed last
    queues = {
        "team-a": _queue((A100, 4)),
        "team-b": _queue((A100, 4)),
        "team-c": _queue((A100, 8)),
    }
    book = _book(queues, [("a0", "team-a", 6), ("b0", "team-b", 4)])
    out = admit(book, [_job("a1", "team-a", (A100, 4)), _job("b1", "team-b", (A100, 4))])
    assert out["b1"].verdict is Verdict.BORROW
    assert out["a1"].verdict is Verdict.WAIT  # 2 left to lend after b1 took 4
    assert "cohort ml has 2 to lend" in out["a1"].message


def test_weight_lets_a_queue_borrow_more_before_others() -> None:
    queues = {
        "team-a": _queue((A100, 4), weight=3),
        "team-b": _queue((A100, 4)),
        "team-c": _queue((A100, 8)),
    }
    # a borrows 2 already (share 2/16/3), b borrows 1 (1/16): a still goes first
    book = _book(queues, [("a0", "team-a", 6), ("b0", "team-b", 5)])
    out = admit(book, [_job("b1", "team-b", (A100, 2)), _job("a1", "team-a", (A100, 2))])
    assert out["a1"].verdict is Verdict.BORROW
    assert out["b1"].verdict is Verdict.BORROW
    book2 = _book(queues, [("a0", "team-a", 6), ("b0", "team-b", 5)])
    first = admit(book2, [_job("b1", "team-b", (A100, 5)), _job("a1", "team-a", (A100, 5))])
    assert first["a1"].verdict is Verdict.BORROW  # 5 left: only one of them fits, a wins
    assert first["b1"].verdict is Verdict.WAIT


# --- reclaim --------------------------------------------------------------------------------


def _reclaim_book(policy: str = "PreemptBorrowed", c_weight: float = 2) -> QuotaBook:
    queues = {
        "team-a": _queue((A100, 8), reclaim=policy, weight=1),
        "team-b": _queue((A100, 4), weight=1),
        "team-c": _queue((A100, 4), weight=c_weight),
    }
    # b borrows 4 (4/1), c borrows 2 (2/2): a uses nothing, all of its 8 lent out but 2
    running = [("b-old", "team-b", 2), ("b-mid", "team-b", 3), ("b-new", "team-b", 3)]
    running += [("c-old", "team-c", 3), ("c-new", "team-c", 3)]
    return _book(queues, running)


def test_reclaim_takes_from_the_biggest_borrower_newest_first_only_as_needed() -> None:
    book = _reclaim_book()
    out = admit(book, [_job("a1", "team-a", (A100, 5))])["a1"]
    assert out.verdict is Verdict.RECLAIM
    assert out.victims == ("b-new",)  # 2 free + 3 freed = 5
    assert out.grace_seconds == DEFAULT_RECLAIM_GRACE_SECONDS
    assert "queue team-a reclaims A100 lent in cohort ml" in out.message


def test_a_demand_on_several_gpu_types_is_admitted_all_together_or_waits() -> None:
    both = Demand.together([Demand(A100, gpus=2), Demand(L4, gpus=1)])
    assert (both.gpu_types, both.label) == ((A100, L4), "A100 + L4")
    assert both.pools() == {(A100, GPUS): 2, (L4, GPUS): 1}

    def one(queues: dict[str, QueueSpec], running: Sequence[tuple[str, str, int]] = ()) -> Any:
        pending = PendingWorkload("a1", "team-a", "default", (both,))
        return admit(_book(queues, running), [pending])["a1"]

    # within nominal quota on both: admitted, holding both
    got = one({"team-a": _queue((A100, 2), (L4, 1), cohort=None)})
    assert (got.verdict, got.demand) == (Verdict.ADMIT, both)
    # its A100 quota taken: it waits, taking no L4 either
    got = one({"team-a": _queue((A100, 2), (L4, 1), cohort=None)}, [("r", "team-a", 1)])
    assert got.verdict is Verdict.WAIT
    assert got.message == "queue team-a: A100 1/2 in use, no cohort to borrow from"
    # a type its queue has no quota for: every missing one named
    got = one({"team-a": _queue((A100, 2), cohort=None)})
    assert (got.verdict, got.reason) == (Verdict.WAIT, WaitReason.NO_QUOTA_FOR_TYPE)
    assert got.message == "queue team-a has no quota for L4 (its types: A100)"
    # its A100 lent to a borrower: reclaimed for it, under PreemptBorrowed
    queues = {
        "team-a": _queue((A100, 2), (L4, 1), reclaim="PreemptBorrowed"),
        "team-b": _queue((A100, 2)),
    }
    got = one(queues, [("b1", "team-b", 2), ("b2", "team-b", 2)])
    assert (got.verdict, got.victims) == (Verdict.RECLAIM, ("b2",))
    assert got.message == "queue team-a reclaims A100 + L4 lent in cohort ml"


def _fair_book(fair: str = "Preempt", b_weight: float = 1, *, b_borrows: bool = False) -> QuotaBook:
    """Cohort ml, all lendable: team-a 2, team-b 2, team-c 4 (idle: it lends all 4).

    team-a runs a1 (its nominal 2), a2 and a3 (2 each: it borrows all 4 of team-c's);
    team-b runs b1 (its nominal 2); with `b_borrows`, a3 is b's (b2) instead.
    """
    queues = {
        "team-a": _queue((A100, 2), fair=fair),
        "team-b": _queue((A100, 2), fair=fair, weight=b_weight),
        "team-c": _queue((A100, 4), fair=fair),
    }
    third = ("b2", "team-b", 2) if b_borrows else ("a3", "team-a", 2)
    return _book(queues, [("a1", "team-a", 2), ("a2", "team-a", 2), ("b1", "team-b", 2), third])


def test_a_borrower_below_its_fair_share_stops_borrowed_work_above_it() -> None:
    # team-b asks 2 more: nothing left to lend; with them its share is 2/8, and team-a's
    # (4/8 borrowed) is still 2/8 without a3, its newest: a3 is stopped (final share rule)
    out = admit(_fair_book(), [_job("b2", "team-b", (A100, 2))])["b2"]
    assert (out.verdict, out.victims, out.cause) == (Verdict.RECLAIM, ("a3",), StopCause.FAIR_SHARE)
    assert out.message == "queue team-b borrows A100 for its fair share of cohort ml"
    assert out.borrowed == {(A100, GPUS): 2}
    assert out.grace_seconds == DEFAULT_RECLAIM_GRACE_SECONDS
    # and team-a cannot take it back: with a3 again its share (4/8) is above team-b's
    book = _fair_book()
    book.remove("a3")
    book.add(AdmittedWorkload("b2", "team-b", {(A100, GPUS): 2}))
    assert admit(book, [_job("a3", "team-a", (A100, 2))])["a3"].verdict is Verdict.WAIT
    # under the default (Never) team-b waits for the borrowers to finish
    out = admit(_fair_book("Never"), [_job("b2", "team-b", (A100, 2))])["b2"]
    assert out.verdict is Verdict.WAIT
    assert out.message == "queue team-b: A100 2/2 in use, cohort ml has 0 to lend"


def test_a_workload_that_does_not_preempt_within_its_queue_still_stops_borrowers() -> None:
    # a serving workload in the admission cycle: its controller stops borrowers (rules 2
    # and 5) but never its own queue's lower-priority work (rule 4)
    serving = replace(_job("b2", "team-b", (A100, 2)), preempts_within_queue=False)
    assert admit(_fair_book(), [serving])["b2"].victims == ("a3",)
    queues = {"team-a": _queue((A100, 4), reclaim="PreemptBorrowed"), "team-b": _queue((A100, 4))}
    book = _book(queues, [("b1", "team-b", 4), ("b2", "team-b", 4)])
    serving = replace(_job("a1", "team-a", (A100, 2)), preempts_within_queue=False)
    assert admit(book, [serving])["a1"].victims == ("b2",)
    book = _book({"team-a": _queue((A100, 4), cohort=None, within="LowerPriority")})
    book.add(AdmittedWorkload("low", "team-a", {(A100, GPUS): 4}, priority=-1, preemptible=True))
    urgent = _job("hi", "team-a", (A100, 2))
    assert admit(book.copy(), [urgent])["hi"].victims == ("low",)
    alone = replace(urgent, preempts_within_queue=False)
    assert admit(book, [alone])["hi"].verdict is Verdict.WAIT


def test_fair_share_preemption_falls_back_to_the_initial_share_rule() -> None:
    # team-a borrows its 4 in one workload: without it its share would be 0, below team-b's
    # 2/8, so the final-share rule stops nothing; team-b's 2/8 is below team-a's 4/8 before
    book = _fair_book()
    for key in ("a2", "a3"):
        book.remove(key)
    book.add(AdmittedWorkload("a-big", "team-a", {(A100, GPUS): 4}, admitted_at=5))
    out = admit(book, [_job("b2", "team-b", (A100, 2))])["b2"]
    assert (out.verdict, out.victims) == (Verdict.RECLAIM, ("a-big",))


def test_fair_share_preemption_weighs_the_shares_and_never_goes_below_the_borrowers() -> None:
    # team-b already borrows 2 as team-a does: with 2 more its share (4/8) is above team-a's
    out = admit(_fair_book(b_borrows=True), [_job("b3", "team-b", (A100, 2))])["b3"]
    assert out.verdict is Verdict.WAIT
    # weight 2 brings it to 0.25, still not below team-a's 0.25; weight 3 does (0.17)
    for weight, verdict in ((2, Verdict.WAIT), (3, Verdict.RECLAIM)):
        book = _fair_book(b_weight=weight, b_borrows=True)
        assert admit(book, [_job("b3", "team-b", (A100, 2))])["b3"].verdict is verdict
    # within its nominal quota a queue reclaims (reclaim.policy), not by fair share
    out = admit(_fair_book(), [_job("c1", "team-c", (A100, 4))])["c1"]
    assert out.verdict is Verdict.WAIT
    assert "reclaim policy Never waits" in out.message


def test_reclaim_takes_the_borrowers_lowest_priority_work_first() -> None:
    # Kueue's candidate order within the borrower: lower priority first, then newest
    book = _reclaim_book()
    low = replace(book.workloads["b-mid"], priority=-1)
    book.remove("b-mid")
    book.add(low)
    out = admit(book, [_job("a1", "team-a", (A100, 5))])["a1"]
    assert out.victims == ("b-mid",)  # not the newest, b-new: b-mid has the lower priority


def test_reclaim_reranks_the_borrowers_after_each_victim() -> None:
    # need 6; b borrows 4, c 2 (same weight): b-new (3) leaves b borrowing 1 < c's 2: c-new
    out = admit(_reclaim_book(c_weight=1), [_job("a1", "team-a", (A100, 8))])["a1"]
    assert out.verdict is Verdict.RECLAIM
    assert out.victims == ("b-new", "c-new")
    # with c's weight 2 (2/2 = 1), b (1/1) and c tie; the first by name, b, gives again
    again = admit(_reclaim_book(), [_job("a1", "team-a", (A100, 8))])["a1"]
    assert again.victims == ("b-new", "b-mid")


def test_a_smaller_job_backfills_the_free_quota_first() -> None:
    pending = [_job("a1", "team-a", (A100, 8)), _job("a2", "team-a", (A100, 1))]
    out = admit(_reclaim_book(), pending)
    assert out["a2"].verdict is Verdict.ADMIT  # fits the 2 free GPUs now (BestEffortFIFO)
    assert out["a1"].verdict is Verdict.WAIT  # 1 + 8 would exceed a's nominal 8: it borrows
    assert "queue team-a: A100 1/8 in use, cohort ml has 1 to lend" in out["a1"].message


def test_reclaim_spares_a_victim_the_others_cover() -> None:
    queues = {"team-a": _queue((A100, 8), reclaim="PreemptBorrowed"), "team-b": _queue((A100, 2))}
    book = _book(queues, [("b-old", "team-b", 3), ("b-new", "team-b", 2)])
    out = admit(book, [_job("a1", "team-a", (A100, 8))])["a1"]
    # need 3: b-new (2) is not enough, b-old (3) is, and alone: b-new is spared
    assert out.victims == ("b-old",)


def test_reclaim_policy_never_waits() -> None:
    out = admit(_reclaim_book("Never"), [_job("a1", "team-a", (A100, 5))])["a1"]
    assert out.verdict is Verdict.WAIT
    assert "3 lent in cohort ml; reclaim policy Never waits" in out.message


def test_reclaim_never_takes_a_workload_of_a_queue_within_its_nominal_quota() -> None:
    queues = {
        "team-a": _queue((A100, 4), reclaim="PreemptBorrowed"),
        "team-b": _queue((A100, 2)),
        "team-c": _queue((A100, 2)),
    }
    # b borrows 2; c uses its own 2 with the newest workload
    book = _book(queues, [("b0", "team-b", 4), ("c0", "team-c", 2)])
    out = admit(book, [_job("a1", "team-a", (A100, 4))])["a1"]
    assert out.verdict is Verdict.RECLAIM
    assert out.victims == ("b0",)


def test_default_grace_is_the_operators_checkpointed_stop() -> None:
    grace = inspect.signature(delete_pods).parameters["grace_seconds"].default
    assert grace == DEFAULT_RECLAIM_GRACE_SECONDS


# --- status numbers -------------------------------------------------------------------------


def test_status_shows_used_borrowed_and_lent_per_type() -> None:
    queues = {
        "team-a": _queue((A100, 8), (L4, 2)),
        "team-b": _queue((A100, 6)),
        "team-c": _queue((A100, 2)),
    }
    book = _book(queues, [("a0", "team-a", 12), ("b0", "team-b", 1)])
    pending = [_job("w", "team-a", (A100, 9))]
    status = queue_statuses(book, admit(book, pending))
    a100 = {name: s.gpus[0] for name, s in status.items()}
    assert (a100["team-a"].used, a100["team-a"].borrowed, a100["team-a"].lent) == (12, 4, 0)
    # 4 borrowed, split over the idle 5 (b) and 2 (c) by largest remainder: 2.86 -> 3, 1.14 -> 1
    assert (a100["team-b"].lent, a100["team-c"].lent) == (3, 1)
    assert [g.gpu_type for g in status["team-a"].gpus] == [A100, L4]
    assert status["team-a"].pending_workloads == 1
    assert status["team-a"].admitted_workloads == 1


def test_a_reclaiming_workload_is_pending_and_its_victims_are_gone_from_the_numbers() -> None:
    book = _reclaim_book()
    decisions = admit(book, [_job("a1", "team-a", (A100, 5))])
    status = queue_statuses(book, decisions)
    assert status["team-a"].pending_workloads == 1
    assert status["team-a"].admitted_workloads == 0
    assert status["team-b"].gpus[0].used == 5


def test_demands_of_a_training_job() -> None:
    base: dict[str, Any] = {
        "replicas": 4,
        "template": {},
        "gpuTypes": [{"name": A100, "relativeSpeed": 1}, {"name": L4, "relativeSpeed": 0.3}],
        "estimate": {"referenceGpuType": A100, "durationSeconds": 60},
    }
    whole = TrainingJobSpec.model_validate({**base, "gpu": {"count": 2}})
    assert demands_of(whole) == (Demand(A100, gpus=8), Demand(L4, gpus=8))
    assert demands_of(whole, workers=1) == (Demand(A100, gpus=2), Demand(L4, gpus=2))
    shared = {"shared": {"memoryMiB": 1024, "computePercent": 30}}
    share = TrainingJobSpec.model_validate({**base, "gpu": shared})
    assert demands_of(share)[0] == Demand(A100, share_milli=1200)


# --- preemption within a queue (withinQueue: LowerPriority) ---------------------------------


def _ranked_book(
    running: Sequence[tuple[str, int, int, bool]], *, within: str = "LowerPriority"
) -> QuotaBook:
    """team-a (8 A100, no cohort) running (key, GPUs, priority, preemptible), oldest first."""
    queues = {"team-a": _queue((A100, 8), cohort=None, within=within)}
    local = {("team-a", "default"): LocalQueueSpec(queue="team-a")}
    admitted = [
        AdmittedWorkload(
            key, "team-a", {(A100, GPUS): n}, float(i), priority=prio, preemptible=preemptible
        )
        for i, (key, n, prio, preemptible) in enumerate(running)
    ]
    return QuotaBook(queues, local, admitted)


def _urgent(key: str, n: int, priority: int) -> PendingWorkload:
    return PendingWorkload(key, "team-a", "default", (Demand(A100, gpus=n),), priority=priority)


def test_a_higher_priority_job_preempts_its_queues_lowest_priority_newest_work() -> None:
    book = _ranked_book([("old", 4, 0, True), ("new", 2, 0, True), ("mid", 2, 5, True)])
    out = admit(book, [_urgent("hi", 2, 10)])["hi"]
    assert out.verdict is Verdict.RECLAIM
    assert out.cause is StopCause.WITHIN_QUEUE
    assert out.victims == ("new",)  # priority 0 before 5; the newest of priority 0 first
    assert out.grace_seconds == DEFAULT_RECLAIM_GRACE_SECONDS
    assert "held by its own lower-priority work; priority 10 preempts it" in out.message
    assert book.used("team-a", (A100, GPUS)) == 8  # hi counted, new no longer


def test_preemption_within_a_queue_spares_a_victim_the_others_cover() -> None:
    # need 3: new (2) is not enough, old (4) is, and alone
    book = _ranked_book([("old", 4, 0, True), ("new", 2, 0, True), ("keep", 2, 9, False)])
    assert admit(book, [_urgent("hi", 3, 10)])["hi"].victims == ("old",)


def test_only_lower_priority_preemptible_work_is_stopped() -> None:
    book = _ranked_book([("same", 4, 10, True), ("pinned", 4, 0, False)])
    out = admit(book, [_urgent("hi", 2, 10)])["hi"]
    assert out.verdict is Verdict.WAIT
    assert out.message == "queue team-a: A100 8/8 in use, no cohort to borrow from"


def test_too_little_to_preempt_stops_nobody() -> None:
    book = _ranked_book([("low", 2, 0, True), ("pinned", 6, 0, False)])
    out = admit(book, [_urgent("hi", 4, 10)])["hi"]
    assert out.verdict is Verdict.WAIT
    assert out.victims == ()
    assert book.used("team-a", (A100, GPUS)) == 8  # the book is left as it was


def test_within_queue_never_is_the_default_and_waits() -> None:
    book = _ranked_book([("low", 8, 0, True)], within="Never")
    assert admit(book, [_urgent("hi", 2, 10)])["hi"].verdict is Verdict.WAIT
    spec = QueueSpec.model_validate({"quotas": [{"gpuType": A100, "gpus": 1}]})
    assert spec.reclaim.within_queue == "Never"


def test_borrowing_comes_before_preempting_within_the_queue() -> None:
    queues = {
        "team-a": _queue((A100, 4), within="LowerPriority"),
        "team-b": _queue((A100, 4)),
    }
    local = {(n, "default"): LocalQueueSpec(queue=n) for n in queues}
    low = AdmittedWorkload("low", "team-a", {(A100, GPUS): 4}, 0.0, priority=0, preemptible=True)
    book = QuotaBook(queues, local, [low])
    out = admit(book, [_urgent("hi", 2, 10)])["hi"]
    assert out.verdict is Verdict.BORROW  # team-b's idle quota, nobody stopped
    assert out.victims == ()


def test_a_job_preempted_for_quota_is_not_picked_twice_in_a_cycle() -> None:
    book = _ranked_book([("low1", 4, 0, True), ("low2", 4, 0, True)])
    out = admit(book, [_urgent("hi1", 4, 10), _urgent("hi2", 4, 10), _urgent("hi3", 1, 10)])
    assert {out["hi1"].victims, out["hi2"].victims} == {("low1",), ("low2",)}
    assert out["hi3"].verdict is Verdict.WAIT  # the two new ones are not preemptible victims


# --- invariants -----------------------------------------------------------------------------

_queue_sizes = st.lists(
    st.tuples(
        st.integers(0, 8),
        st.one_of(st.none(), st.integers(0, 6)),
        st.sampled_from([1, 2]),
        st.one_of(st.none(), st.integers(0, 8)),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(
    sizes=_queue_sizes,
    running=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), max_size=8),
    jobs=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6)), min_size=1, max_size=10),
    reclaim=st.booleans(),
    within=st.booleans(),
    fair=st.booleans(),
    ranks=st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=18, max_size=18),
    stops=st.lists(st.booleans(), min_size=4, max_size=4),
    stricts=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_invariants(
    *,
    sizes: list[tuple[int, int | None, int, int | None]],
    running: list[tuple[int, int]],
    jobs: list[tuple[int, int]],
    reclaim: bool,
    within: bool,
    fair: bool,
    ranks: list[tuple[int, bool]],
    stops: list[bool],
    stricts: list[bool],
) -> None:
    policy = "PreemptBorrowed" if reclaim else "Never"
    queues = {
        f"q{i}": _queue(
            (A100, n, limit) if limit is not None else (A100, n),
            weight=w,
            reclaim=policy,
            within="LowerPriority" if within else "Never",
            lend=lend,
            strict=stricts[i],
            fair="Preempt" if fair else "Never",
        )
        for i, (n, limit, w, lend) in enumerate(sizes)
    }
    names = list(queues)
    # start from a state the accounting itself admitted, then rank what runs
    book = _book(queues)
    admit(
        book, [_job(f"r{i}", names[q % len(names)], (A100, n)) for i, (q, n) in enumerate(running)]
    )
    for key in list(book.workloads):
        prio, preemptible = ranks[int(key[1:])]
        ranked = replace(book.workloads[key], priority=prio, preemptible=preemptible)
        book.remove(key)
        book.add(ranked)
    before = dict(book.workloads)
    stopped = {n for n, stop in zip(names, stops, strict=False) if stop}
    for name in stopped:  # then the platform team holds some queues
        book.queues[name] = replace(book.queues[name], stop=StopPolicy.HOLD)
    pending = [
        replace(_job(f"j{i}", names[q % len(names)], (A100, n)), priority=ranks[8 + i][0])
        for i, (q, n) in enumerate(jobs)
    ]
    priority = {p.key: p.priority for p in pending}
    decisions = admit(book, pending)
    total_nominal = sum(q.nominal.get((A100, GPUS), 0) for q in book.queues.values())
    assert sum(book.used(n, (A100, GPUS)) for n in names) <= total_nominal
    # what the queues hold above their guaranteed quota is never more than they lend:
    # nobody borrows the part of a nominal quota that a lending limit keeps back
    pool = (A100, GPUS)
    above = sum(max(0, book.used(q.name, pool) - q.guaranteed(pool)) for q in book.queues.values())
    assert above <= sum(q.lendable(pool) for q in book.queues.values())
    for queue in book.queues.values():
        limit = queue.borrowing_limit.get((A100, GPUS))
        used = book.used(queue.name, (A100, GPUS))
        if limit is not None:
            assert used <= queue.nominal[(A100, GPUS)] + limit  # never over nominal + borrowable
    for d in decisions.values():
        if d.queue in stopped:  # a stopped queue admits, reclaims and preempts nothing
            assert d.verdict is Verdict.WAIT
            assert d.reason is WaitReason.QUEUE_STOPPED
        for victim in d.victims:
            assert victim in before  # never a workload admitted in the same cycle
            if d.cause is StopCause.WITHIN_QUEUE:  # its own queue's lower-priority preemptible work
                assert within
                assert before[victim].queue == d.queue
                assert before[victim].preemptible
                assert before[victim].priority < priority[d.key]
            else:
                assert before[victim].queue != d.queue  # only others' work
                assert fair if d.cause is StopCause.FAIR_SHARE else reclaim
        # what lies within its nominal quota can always be reclaimed from the borrowers
        assert "too few borrowed workloads" not in d.message
    # a StrictFIFO queue admits in order: nothing of it after a workload that waits
    for name, quota in book.queues.items():  # (a test workload's namespace is its queue)
        mine = [p.key for p in pending if p.namespace == name] if quota.strict else []
        verdicts = [decisions[k].verdict for k in mine]
        if Verdict.WAIT in verdicts:
            assert all(v is Verdict.WAIT for v in verdicts[verdicts.index(Verdict.WAIT) :])
    for name, status in queue_statuses(book, decisions).items():
        row = status.gpus[0]
        quota = book.queues[name]
        nominal = quota.nominal[(A100, GPUS)]
        assert row.lent <= max(0, nominal - row.used)  # lending never goes below what it uses
        assert row.lent <= quota.lendable((A100, GPUS))  # nor beyond its lending limit
        assert row.borrowed == max(0, row.used - nominal)
    lent = sum(s.gpus[0].lent for s in queue_statuses(book).values())
    assert lent == sum(s.gpus[0].borrowed for s in queue_statuses(book).values())
    _assert_fixed_point(book, pending, decisions)


def _assert_fixed_point(
    book: QuotaBook, pending: Sequence[PendingWorkload], decisions: dict[str, Admission]
) -> None:
    """The cycle ended at a fixed point: with nothing stopped, what still waits does not fit
    by the book it left (within nominal quota or by borrowing), on any type it accepts."""
    again = book.copy()
    again.queues = {
        n: replace(
            q, reclaim=ReclaimPolicy.NEVER, within_queue=WithinQueuePolicy.NEVER, fair_share=False
        )
        for n, q in book.queues.items()
    }
    waiting = [p for p in pending if decisions[p.key].verdict is Verdict.WAIT]
    assert all(d.verdict is Verdict.WAIT for d in admit(again, waiting).values())


_two_type_queues = st.lists(
    st.tuples(
        st.integers(0, 6),  # A100 nominal
        st.integers(0, 6),  # L4 nominal
        st.one_of(st.none(), st.integers(0, 4)),  # borrowing limit (both rows)
        st.one_of(st.none(), st.integers(0, 6)),  # lending limit (both rows)
        st.booleans(),  # whenCanBorrow: Borrow (else TryNextFlavor)
        st.booleans(),  # StrictFIFO
        st.booleans(),  # whenCanPreempt: Preempt (else TryNextFlavor)
    ),
    min_size=1,
    max_size=4,
)
_alternatives = st.lists(st.sampled_from([A100, L4]), min_size=1, max_size=2, unique=True)


@settings(max_examples=150, deadline=None)
@given(
    sizes=_two_type_queues,
    running=st.lists(st.tuples(st.integers(0, 3), _alternatives, st.integers(1, 4)), max_size=8),
    jobs=st.lists(
        st.tuples(st.integers(0, 3), _alternatives, st.integers(1, 5)), min_size=1, max_size=10
    ),
    reclaim=st.booleans(),
)
def test_invariants_on_two_gpu_types(
    *,
    sizes: list[tuple[int, int, int | None, int | None, bool, bool, bool]],
    running: list[tuple[int, list[str], int]],
    jobs: list[tuple[int, list[str], int]],
    reclaim: bool,
) -> None:
    """Jobs that accept one or two types, queues of either fungibility: the pools hold."""
    queues = {
        f"q{i}": _queue(
            *[(t, n) if limit is None else (t, n, limit) for t, n in ((A100, a), (L4, b))],
            reclaim="PreemptBorrowed" if reclaim else "Never",
            lend=lend,
            strict=strict,
            fungibility="Borrow" if borrow else "TryNextFlavor",
            preempt="Preempt" if preempt else "TryNextFlavor",
        )
        for i, (a, b, limit, lend, borrow, strict, preempt) in enumerate(sizes)
    }
    names = list(queues)

    def asking(key: str, q: int, types: list[str], n: int) -> PendingWorkload:
        return _job(key, names[q % len(names)], *((t, n) for t in types))

    book = _book(queues)  # a state the accounting itself admitted
    admit(book, [asking(f"r{i}", *row) for i, row in enumerate(running)])
    before = dict(book.workloads)
    pending = [asking(f"j{i}", *row) for i, row in enumerate(jobs)]
    decisions = admit(book, pending)
    for p in pending:  # a job runs on one of the types it accepts, with its GPUs
        d = decisions[p.key]
        if d.verdict is not Verdict.WAIT:
            assert d.demand in p.alternatives
            assert book.workloads[p.key].usage == d.demand.pools()
        for victim in d.victims:
            assert victim in before
            assert before[victim].queue != d.queue
    for gpu_type in (A100, L4):
        pool = (gpu_type, GPUS)
        quotas = book.queues.values()
        assert sum(book.used(q.name, pool) for q in quotas) <= sum(
            q.nominal.get(pool, 0) for q in quotas
        )
        above = sum(max(0, book.used(q.name, pool) - q.guaranteed(pool)) for q in quotas)
        assert above <= sum(q.lendable(pool) for q in quotas)
        for q in quotas:
            limit = q.borrowing_limit.get(pool)
            if limit is not None:
                assert book.used(q.name, pool) <= q.nominal[pool] + limit
    _assert_fixed_point(book, pending, decisions)
    rows = {n: {r.gpu_type: r for r in s.gpus} for n, s in queue_statuses(book).items()}
    for gpu_type in (A100, L4):
        lent = sum(r[gpu_type].lent for r in rows.values())
        assert lent == sum(r[gpu_type].borrowed for r in rows.values())


def test_a_strict_queues_next_workload_after_a_borrowing_head_gets_every_pass() -> None:
    # found by hypothesis (stop 53): StrictFIFO q0 (4 A100, whenCanPreempt: Preempt) admits
    # j0-j2 within quota; its head j3 borrows L4 in pass 3, which lets j5 (A100 or L4) in
    # only then; passes 1 and 2 had run: j5 waited though it could reclaim A100 (or borrow
    # L4). Now the passes repeat after a strict head borrows, and a workload admitted in
    # the same cycle (j4, borrowing A100) is never a victim
    def cycle(running: list[tuple[str, str, int]]) -> dict[str, tuple[str, str, tuple[str, ...]]]:
        queues = {
            "q0": _queue(
                (A100, 4),
                (L4, 0),
                reclaim="PreemptBorrowed",
                strict=True,
                fungibility="TryNextFlavor",
                preempt="Preempt",
            ),
            "q1": _queue((A100, 0), (L4, 0), reclaim="PreemptBorrowed"),
            "q2": _queue((A100, 0), (L4, 2), reclaim="PreemptBorrowed"),
        }
        jobs = [_job(f"j{i}", "q0", (A100, 1)) for i in range(3)]
        jobs += [_job("j3", "q0", (L4, 1)), _job("j4", "q1", (A100, 1))]
        jobs.append(_job("j5", "q0", (A100, 1), (L4, 1)))
        out = admit(_book(queues, running), jobs)
        return {
            k: (d.verdict.value, d.demand.gpu_type if d.demand else "", d.victims)
            for k, d in out.items()
        }

    # r0 borrowed A100 before the cycle: j5 reclaims it
    assert cycle([("r0", "q1", 1)])["j5"] == ("Reclaim", A100, ("r0",))
    # j4 borrows the A100 in this cycle: not a victim, so j5 borrows L4
    got = cycle([])
    assert (got["j4"], got["j5"]) == (("Borrow", A100, ()), ("Borrow", L4, ()))


def test_what_a_reclaim_frees_beyond_its_need_is_admitted_in_the_same_cycle() -> None:
    # found by hypothesis: q1 borrows 2 of q3's GPUs with one 3-GPU job; q3 reclaims for a
    # 1-GPU job, which stops the whole 3-GPU job; q1's own 1-GPU job, waiting since pass 1,
    # now fits q1's nominal quota and is admitted, not told "too few borrowed workloads"
    queues = {
        f"q{i}": _queue((A100, n), reclaim="PreemptBorrowed") for i, n in enumerate((0, 2, 0, 2))
    }
    book = _book(queues)
    admit(book, [_job("r0", "q1", (A100, 1)), _job("r1", "q1", (A100, 3))])
    decisions = admit(book, [_job("j0", "q1", (A100, 1)), _job("j1", "q3", (A100, 1))])
    assert decisions["j1"].victims == ("r1",)
    assert decisions["j0"].verdict is Verdict.ADMIT


# --- forecast: each waiting workload's turn on its quota ------------------------------------


def test_waiting_workloads_take_their_turns_as_the_predicted_ends_free_quota() -> None:
    book = _book({"q": _queue((A100, 4), cohort=None)}, [("r", "q", 4)])
    waiting = [_job("w1", "q", (A100, 4)), _job("w2", "q", (A100, 2)), _job("w3", "q", (A100, 2))]
    before = dict(book.usage["q"])
    got = forecast_starts(book, waiting, [(100.0, "r")], {"w1": 50.0, "w2": 30.0})
    # w1 takes all 4 when r ends; w2 and w3 both fit when w1 ends
    assert got == {"w1": (100.0, "r"), "w2": (150.0, "w1"), "w3": (150.0, "w1")}
    assert dict(book.usage["q"]) == before  # the book is left as it was
    assert set(book.workloads) == {"r"}
    # a workload with no predicted run time holds its quota to the end of the forecast
    got = forecast_starts(book, waiting, [(100.0, "r")], {})
    assert got == {"w1": (100.0, "r")}


def test_the_forecast_sees_borrowing_and_only_the_first_of_each_queue() -> None:
    queues = {"a": _queue((A100, 2)), "b": _queue((A100, 2))}
    book = _book(queues, [("a0", "a", 2), ("b0", "b", 2)])
    waiting = [_job("a1", "a", (A100, 3)), _job("a2", "a", (A100, 1))]
    got = forecast_starts(book, waiting, [(10.0, "a0"), (20.0, "b0")], {"a1": 5.0})
    # a1 needs 3 of the cohort's 4: it borrows once b0 ends too; a2 fits its own quota at 10
    assert got == {"a2": (10.0, "a0"), "a1": (20.0, "b0")}
    assert forecast_starts(book, waiting, [(10.0, "a0"), (20.0, "b0")], {}, depth=1) == {
        "a1": (20.0, "b0")
    }


def test_the_forecast_sees_a_release_that_makes_preempting_within_the_queue_enough() -> None:
    book = _book({"q": _queue((A100, 4), cohort=None, within="LowerPriority")})
    book.add(AdmittedWorkload("high", "q", {(A100, GPUS): 2}, 0.0))
    book.add(AdmittedWorkload("low", "q", {(A100, GPUS): 2}, 1.0, preemptible=True))
    waiting = [replace(_job("w", "q", (A100, 4)), priority=1)]
    # stopping "low" alone is not enough now; once "high" ends, it is
    assert admit(book.copy(), waiting)["w"].verdict is Verdict.WAIT
    assert forecast_starts(book, waiting, [(10.0, "high"), (99.0, "low")], {}) == {
        "w": (10.0, "high")
    }


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=3),
    running=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 4), st.integers(1, 9)), max_size=8
    ),
    jobs=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 6), st.integers(1, 9)), min_size=1, max_size=8
    ),
    reclaim=st.booleans(),
    within=st.booleans(),
    strict=st.booleans(),
)
def test_skipping_cycles_that_admit_nothing_changes_no_forecast(
    *,
    sizes: list[int],
    running: list[tuple[int, int, int]],
    jobs: list[tuple[int, int, int]],
    reclaim: bool,
    within: bool,
    strict: bool,
) -> None:
    queues = {
        f"q{i}": _queue(
            (A100, n),
            reclaim="PreemptBorrowed" if reclaim else "Never",
            within="LowerPriority" if within else "Never",
            strict=strict,
        )
        for i, n in enumerate(sizes)
    }
    names = sorted(queues)
    book = _book(queues)
    for i, (q, n, _) in enumerate(running):
        usage = {(A100, GPUS): n}
        book.add(AdmittedWorkload(f"r{i}", names[q % len(names)], usage, i, preemptible=i % 2 > 0))
    ends = [(float(t), f"r{i}") for i, (_, _, t) in enumerate(running)]
    waiting = [
        replace(_job(f"w{i}", names[q % len(names)], (A100, n)), priority=i % 2)
        for i, (q, n, _) in enumerate(jobs)
    ]
    runs_for = {f"w{i}": float(t) for i, (_, _, t) in enumerate(jobs)}
    fast = forecast_starts(book, waiting, ends, runs_for)
    # every predicted end runs a full admission cycle
    with patch.object(quota_module, "_may_move", lambda *_: True):
        slow = forecast_starts(book, waiting, ends, runs_for)
    assert fast == slow


def _borrowed_from_q3(q2_lends: int | None) -> QuotaBook:
    # q0 (nominal 0) borrows 1 A100, q2 (nominal 1) runs 2: the cohort's 8 are q3's 7 and
    # q2's 1, so both borrow from q3
    sizes = ((0, None), (0, None), (1, q2_lends), (7, None))
    queues = {
        f"q{i}": _queue((A100, n), reclaim="PreemptBorrowed", lend=lend)
        for i, (n, lend) in enumerate(sizes)
    }
    book = _book(queues)
    admit(book, [_job("r0", "q0", (A100, 1)), _job("r1", "q2", (A100, 2))])
    return book


def test_a_victim_frees_only_what_it_took_from_the_cohort() -> None:
    # found by hypothesis: q2 lends nothing, so of r1's 2 GPUs one is q2's own: stopping
    # r1 frees 1 for q3, not 2, and q3's 7 need r0 stopped too; before, r1 alone was
    # taken as enough and q2's next job then put the cohort at 9 of its 8 GPUs
    book = _borrowed_from_q3(0)
    decisions = admit(
        book,
        [_job("j0", "q2", (A100, 1)), _job("j1", "q3", (A100, 1)), _job("j2", "q3", (A100, 6))],
    )
    assert set(decisions["j2"].victims) == {"r0", "r1"}
    assert decisions["j0"].verdict is Verdict.ADMIT
    assert sum(book.used(q, (A100, GPUS)) for q in book.queues) == 8


def test_a_queue_a_reclaim_leaves_below_its_quota_reclaims_in_the_same_cycle() -> None:
    # found by hypothesis: q3 stops r1, so q2 falls below its nominal 1 and its j0 may
    # reclaim r0 (q0 borrows); before, j0 had passed the reclaim pass as a borrower
    # and waited, told there were "too few borrowed workloads to reclaim"
    book = _borrowed_from_q3(None)
    decisions = admit(
        book,
        [_job("j0", "q2", (A100, 1)), _job("j1", "q3", (A100, 1)), _job("j2", "q3", (A100, 6))],
    )
    assert decisions["j2"].victims == ("r1",)
    assert (decisions["j0"].verdict, decisions["j0"].victims) == (Verdict.RECLAIM, ("r0",))
    assert sum(book.used(q, (A100, GPUS)) for q in book.queues) == 8


def test_a_job_whose_preferred_type_others_borrowed_first_takes_its_own_quota() -> None:
    # whenCanBorrow Borrow: ja asks to borrow A100 (team-b lends 1) before its own L4; jc
    # (weight 2, a lower share) borrows that A100 first; ja then fits its L4 quota and
    # is admitted on it in the same cycle, not told to wait
    queues = {
        "team-a": _queue((A100, 8), (L4, 4)),
        "team-b": _queue((A100, 1)),
        "team-c": _queue((A100, 0), weight=2),
    }
    book = _book(queues, [("r", "team-a", 8)])
    out = admit(book, [_job("ja", "team-a", (A100, 1), (L4, 1)), _job("jc", "team-c", (A100, 1))])
    assert out["jc"].verdict is Verdict.BORROW
    assert (out["ja"].verdict, out["ja"].demand) == (Verdict.ADMIT, Demand(L4, 1))


def _lent_a100_book(reclaim: str, preempt: str, reclaimable: bool = True) -> QuotaBook:
    """team-a: A100 4 (all borrowed by team-b's b0) and L4 4 (free); team-b: L4 only."""
    queues = {
        "team-a": _queue((A100, 4), (L4, 4), reclaim=reclaim, preempt=preempt),
        "team-b": _queue((L4, 0)),
    }
    b0 = AdmittedWorkload("b0", "team-b", {(A100, GPUS): 4}, 0.0, reclaimable=reclaimable)
    return QuotaBook(queues, {(n, "default"): LocalQueueSpec(queue=n) for n in queues}, [b0])


def test_when_can_preempt_preempt_reclaims_the_preferred_type_before_a_later_one() -> None:
    ja = _job("ja", "team-a", (A100, 4), (L4, 4))
    # Kueue's default TryNextFlavor: the free L4 quota comes before reclaiming A100
    tried = admit(_lent_a100_book("PreemptBorrowed", "TryNextFlavor"), [ja])["ja"]
    assert (tried.verdict, tried.demand) == (Verdict.ADMIT, Demand(L4, 4))
    # Preempt: its preferred A100, lent to team-b, is reclaimed
    out = admit(_lent_a100_book("PreemptBorrowed", "Preempt"), [ja])["ja"]
    assert (out.verdict, out.demand, out.victims) == (Verdict.RECLAIM, Demand(A100, 4), ("b0",))


def test_when_can_preempt_tries_the_next_type_when_nothing_can_be_reclaimed() -> None:
    ja = _job("ja", "team-a", (A100, 4), (L4, 4))
    # the borrower is a serving workload (never stopped), or the queue never reclaims
    for book in (
        _lent_a100_book("PreemptBorrowed", "Preempt", reclaimable=False),
        _lent_a100_book("Never", "Preempt"),
    ):
        out = admit(book, [ja])["ja"]
        assert (out.verdict, out.demand, out.victims) == (Verdict.ADMIT, Demand(L4, 4), ())


def test_when_can_preempt_preempt_stops_the_queues_lower_priority_work_on_the_preferred_type() -> (
    None
):
    queues = {"team-a": _queue((A100, 4), (L4, 4), within="LowerPriority", preempt="Preempt")}
    low = AdmittedWorkload("low", "team-a", {(A100, GPUS): 4}, 0.0, priority=0, preemptible=True)
    local = {("team-a", "default"): LocalQueueSpec(queue="team-a")}
    high = replace(_job("high", "team-a", (A100, 4), (L4, 4)), priority=10)
    out = admit(QuotaBook(queues, local, [low]), [high])["high"]
    assert (out.verdict, out.demand, out.victims) == (Verdict.RECLAIM, Demand(A100, 4), ("low",))
    assert out.cause is StopCause.WITHIN_QUEUE
    # TryNextFlavor: the free L4 quota, nothing stopped
    queues = {"team-a": _queue((A100, 4), (L4, 4), within="LowerPriority")}
    out = admit(QuotaBook(queues, local, [low]), [high])["high"]
    assert (out.verdict, out.demand, out.victims) == (Verdict.ADMIT, Demand(L4, 4), ())
    # Preempt, but the running work is not preemptible: the next type
    queues = {"team-a": _queue((A100, 4), (L4, 4), within="LowerPriority", preempt="Preempt")}
    kept = replace(low, preemptible=False)
    out = admit(QuotaBook(queues, local, [kept]), [high])["high"]
    assert (out.verdict, out.demand, out.victims) == (Verdict.ADMIT, Demand(L4, 4), ())


@settings(max_examples=150, deadline=None)
@given(
    sizes=_queue_sizes,
    running=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), max_size=8),
    cohort=st.booleans(),
)
def test_room_now_is_exactly_what_admission_admits_or_lends_without_reclaiming(
    *,
    sizes: list[tuple[int, int | None, int, int | None]],
    running: list[tuple[int, int]],
    cohort: bool,
) -> None:
    """`room_now` is the largest demand `_fit` admits or lets borrow, on every queue."""
    queues = {
        f"q{i}": _queue(
            (A100, n, limit) if limit is not None and cohort else (A100, n),
            cohort="ml" if cohort else None,
            lend=lend if cohort else None,
        )
        for i, (n, limit, _w, lend) in enumerate(sizes)
    }
    names = sorted(queues)
    book = _book(queues, [(f"r{k}", names[q % len(names)], n) for k, (q, n) in enumerate(running)])
    for name in names:
        queue = book.queues[name]
        room = book.room_now(queue, (A100, GPUS))
        for amount in range(1, 20):
            fit = quota_module._fit(book, queue, Demand(A100, gpus=amount))
            admitted = fit.verdict in (Verdict.ADMIT, Verdict.BORROW)
            assert admitted == (amount <= room), (name, amount, room, fit)
        assert book.room_now(queue, (L4, GPUS)) == 0  # a type the queue does not list


def test_a_lease_within_the_queue_admits_within_nominal_quota_leaving_the_cohort_to_borrowers() -> (
    None
):
    # queue a runs `v` (2 of its 2 A100s); the cluster policy runs `t` (1 GPU) in its
    # place. Queue b lends its 2 idle A100s, which c's `w` (2 GPUs, no quota of its own)
    # asks to borrow. t fitted by borrowing, so its lease stopped nothing; then w, of the
    # lower share, borrowed first and t waited beside v. The simulator's queues count v's
    # quota free (the wish drops it): t is admitted within a's nominal quota and w borrows.
    # So does the lease now: within nominal quota first
    book = _book({"a": _queue((A100, 2)), "b": _queue((A100, 2)), "c": _queue((A100, 0))})
    book.add(AdmittedWorkload("a/v", "a", {(A100, GPUS): 2}, 0.0, preemptible=True))
    pending = [_job("a/t", "a", (A100, 1)), _job("c/w", "c", (A100, 2))]
    out = admit(book, pending, leases={"a/t": ("a/v",)})
    assert (out["a/t"].verdict, out["a/t"].cause) == (Verdict.RECLAIM, StopCause.LEASE)
    assert out["a/t"].victims == ("a/v",)
    assert out["c/w"].verdict is Verdict.BORROW
