"""The MetricsLogger reduces across ranks: two gloo processes on this machine agree."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from ranks import run_on_ranks

from lightning_rl import MetricsLogger


def _in_process_group(rank: int, world_size: int, body: Callable[[int], Any]) -> Any:
    """``body(rank)`` inside a gloo process group of the ranks that tests/ranks.py starts."""
    # A bounded timeout: a broken collective fails the test instead of hanging CI.
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    try:
        return body(rank)
    finally:
        dist.destroy_process_group()


def _reduce_and_state(rank: int) -> tuple:
    metrics = MetricsLogger()
    # Rank 0 logs 1 and 2, rank 1 logs 6: the mean over all values is 3.
    for value in [1.0, 2.0] if rank == 0 else [6.0]:
        metrics.log_value(("p", "loss"), torch.tensor(value))
    metrics.log_value("steps", 10 * (rank + 1), reduce="sum", clear_on_reduce=False)
    first = metrics.reduce()
    saved = metrics.get_state()
    restored = MetricsLogger()
    restored.set_state(saved)
    restored.log_value("steps", 1, reduce="sum", clear_on_reduce=False)
    return first, saved, restored.reduce()


def _uneven_keys(rank: int) -> tuple:
    metrics = MetricsLogger()
    # Only rank 0 trained module "a"; only rank 1 logged a max and a min; both logged "kl".
    if rank == 0:
        metrics.log_value(("a", "loss"), torch.tensor([2.0, 4.0]))
        metrics.log_value("lifetime", 5, reduce="sum", clear_on_reduce=False)
    else:
        metrics.log_value("best", 7.0, reduce="max")
        metrics.log_value("worst", -1.0, reduce="min")
    metrics.log_value("kl", 0.1 if rank == 0 else 0.3)
    peeked = (metrics.peek("kl", across_ranks=True), metrics.peek("kl"), metrics.peek(("a", "loss"), across_ranks=True))
    try:
        metrics.peek("never", across_ranks=True)
        missing = None
    except KeyError as error:
        missing = str(error)
    first = metrics.reduce()
    second = metrics.reduce()
    return peeked, missing, first, second


def test_ranks_that_logged_different_keys_reduce_to_the_same_results():
    results = run_on_ranks(_in_process_group, _uneven_keys)
    expected_first = {"lifetime": 5.0, "best": 7.0, "worst": -1.0, "kl": 0.2}
    for rank in (0, 1):
        (kl_all, kl_own, loss_all), missing, first, second = results[rank]
        assert kl_all == pytest.approx(0.2) and kl_own == pytest.approx(0.1 if rank == 0 else 0.3)
        assert loss_all == 3.0  # rank 1 never logged it, and still gets rank 0's value
        assert "never" in missing
        assert first.pop("a") == {"loss": 3.0}
        assert first == pytest.approx(expected_first)
        assert second == {"lifetime": 5.0}


def test_reduce_and_state_agree_across_two_ranks():
    results = run_on_ranks(_in_process_group, _reduce_and_state)
    for rank in (0, 1):
        first, saved, after_restore = results[rank]
        assert first == {"p": {"loss": 3.0}, "steps": 30.0}
        assert saved == {"steps": {"reduce": "sum", "value": 30.0}}
        # The restored total stays 30 over both ranks (not 60), plus one step per rank.
        assert after_restore == {"steps": 32.0}
