"""Parallel degrees from the job's hints for the GPU set the decision chose."""

from __future__ import annotations

from typing import Any

from chronotope.api.v1alpha1.trainingjob import ParallelismHints
from chronotope.workloads.parallelism import choose_degrees


def hints(**kw: Any) -> ParallelismHints:
    return ParallelismHints.model_validate(kw)


def test_without_hints_it_is_data_parallel() -> None:
    d = choose_degrees(None, 4, 8)
    assert (d.data, d.tensor, d.pipeline) == (32, 1, 1)


def test_tensor_parallel_stays_inside_a_worker_and_the_pipeline_short() -> None:
    d = choose_degrees(hints(tensorDegrees=[1, 2, 4, 8], globalBatchSize=512), 4, 8)
    assert (d.data, d.tensor, d.pipeline) == (4, 8, 1)
    assert d.micro_batch_size == 128


def test_pipeline_is_used_when_the_hints_require_it() -> None:
    d = choose_degrees(hints(tensorDegrees=[2], pipelineDegrees=[4], globalBatchSize=256), 4, 8)
    assert (d.data, d.tensor, d.pipeline) == (4, 2, 4)
    assert d.data * d.tensor * d.pipeline == 32
    assert d.micro_batch_size == 4  # 64 per replica in 16 microbatches


def test_data_degree_must_divide_the_global_batch() -> None:
    d = choose_degrees(hints(globalBatchSize=12), 1, 8)
    assert d.data in (1, 2, 3, 4, 6, 12)
    assert 12 % d.data == 0
    assert d.data * d.tensor * d.pipeline == 8


def test_impossible_hints_fall_back_and_say_so() -> None:
    d = choose_degrees(hints(tensorDegrees=[16]), 2, 4)
    assert (d.data, d.tensor, d.pipeline) == (8, 1, 1)
    assert "pure data parallelism" in d.note
