"""The MetricsLogger reduces across ranks: two gloo processes on this machine agree."""

from __future__ import annotations

import math
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


# The settings of a value that reports the mean of one update.
PER_UPDATE = {"window": math.inf, "clear_on_reduce": True}


def _reduce_and_state(rank: int) -> tuple:
    metrics = MetricsLogger()
    # Rank 0 logs 1 and 2, rank 1 logs 6: the mean over all values is 3.
    for value in [1.0, 2.0] if rank == 0 else [6.0]:
        metrics.log_value(("p", "loss"), torch.tensor(value), **PER_UPDATE)
    metrics.log_value("steps", 10 * (rank + 1), reduce="sum")
    first = metrics.reduce()
    saved = metrics.get_state()
    restored = MetricsLogger()
    restored.set_state(saved)
    restored.log_value("steps", 1, reduce="sum")
    return first, saved, restored.reduce()


def _uneven_keys(rank: int) -> tuple:
    metrics = MetricsLogger()
    # Only rank 0 trained module "a"; only rank 1 logged a max and a min; both logged "kl".
    if rank == 0:
        metrics.log_value(("a", "loss"), torch.tensor([2.0, 4.0]), **PER_UPDATE)
        metrics.log_value("lifetime", 5, reduce="sum")
    else:
        metrics.log_value("best", 7.0, reduce="max", clear_on_reduce=True)
        metrics.log_value("worst", -1.0, reduce="min", clear_on_reduce=True)
    metrics.log_value("kl", 0.1 if rank == 0 else 0.3, **PER_UPDATE)
    peeked = (
        metrics.peek("kl", across_ranks=True),
        metrics.peek("kl"),
        metrics.peek(("a", "loss"), across_ranks=True),
    )
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
        settings = {"reduce": "sum", "window": None, "ema_coeff": None, "clear_on_reduce": False}
        assert saved == {"steps": {**settings, "value": 30.0, "weight": 2.0}}  # weight: values logged
        # The restored total stays 30 over both ranks (not 60), plus one step per rank.
        assert after_restore == {"steps": 32.0}


# Per setting: what rank 0 logs, what rank 1 logs, and the value over both ranks.
LASTING = {
    "ema": ({"ema_coeff": 0.5}, [2.0, 4.0], [6.0], 4.5),  # the ranks' EMAs 3 and 6, averaged
    "window_mean": ({"window": 2}, [1.0, 2.0, 3.0], [10.0], 5.0),  # (2 + 3 + 10) / 3
    "window_max": ({"reduce": "max", "window": 2}, [5.0, 1.0, 2.0], [0.0], 2.0),
    "window_sum": ({"reduce": "sum", "window": 2}, [1.0, 2.0, 4.0], [10.0], 16.0),
    "mean_ever": ({"window": math.inf}, [1.0, 3.0], [8.0], 4.0),
    "min": ({"reduce": "min"}, [3.0], [1.0], 1.0),
}


def _lasting_settings_and_their_state(rank: int) -> tuple:
    original = MetricsLogger()
    for name, (settings, rank0_values, rank1_values, _) in LASTING.items():
        for value in rank0_values if rank == 0 else rank1_values:
            original.log_value(name, torch.tensor(value), **settings)
    first = original.reduce()
    state = original.get_state()
    restored = MetricsLogger()
    restored.set_state(state)
    after_restore = restored.reduce()
    for metrics in (original, restored):
        for name, (settings, *_) in LASTING.items():
            metrics.log_value(name, 8.0 + rank, **settings)
    return first, state, after_restore, original.reduce(), restored.reduce()


def test_every_lasting_setting_folds_over_ranks_and_its_state_restores_the_fold():
    results = run_on_ranks(_in_process_group, _lasting_settings_and_their_state)
    expected = {name: value for name, (*_, value) in LASTING.items()}
    assert results[0][1] == results[1][1]  # every rank saves the same state
    assert results[0][1]["window_mean"]["windows"] == [[2.0, 3.0], [10.0]]
    for rank in (0, 1):
        first, _, after_restore, original_next, restored_next = results[rank]
        assert first == pytest.approx(expected)
        assert after_restore == pytest.approx(expected)
        # Restored, the ranks go on as the originals do: each rank's window is its own again.
        assert restored_next == pytest.approx(original_next)


def _collectives_per_reduce(rank: int) -> list[int]:
    calls = {"count": 0}
    for name in ("all_reduce", "all_gather_object"):
        function = getattr(dist, name)

        def counted(*args: Any, _function: Callable = function, **kwargs: Any) -> Any:
            calls["count"] += 1
            return _function(*args, **kwargs)

        setattr(dist, name, counted)
    counts = []
    for num_keys in (2, 60):
        metrics = MetricsLogger()
        for key in range(num_keys):
            metrics.log_value(("m", str(key)), torch.tensor(float(key)), **PER_UPDATE)
            metrics.log_value(("m", str(key)), torch.tensor(1.0), **PER_UPDATE)
        calls["count"] = 0
        metrics.reduce()
        counts.append(calls["count"])
    return counts


def test_the_fold_makes_three_collective_calls_whatever_the_number_of_keys():
    for counts in run_on_ranks(_in_process_group, _collectives_per_reduce):
        assert counts == [3, 3]  # the keys, then the added and the maximized tensor
