"""The MetricsLogger: cheap logging, reduction to floats, lifetime counters and state."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_rl import MetricsLogger


def test_reduce_turns_logged_values_into_nested_floats():
    metrics = MetricsLogger()
    metrics.log_value(("p", "loss"), torch.tensor(1.0))
    metrics.log_value(("p", "loss"), torch.tensor(3.0))
    metrics.log_value("steps", 5, reduce="sum")
    metrics.log_value("steps", 7, reduce="sum")
    metrics.log_value("lr", 0.1, reduce="last")
    metrics.log_value("lr", 0.2, reduce="last")
    metrics.log_value("best", 4.0, reduce="max")
    metrics.log_value("best", 2.0, reduce="max")
    assert metrics.reduce() == {"p": {"loss": 2.0}, "steps": 12.0, "lr": pytest.approx(0.2), "best": 4.0}
    assert metrics.reduce() == {}


def test_lifetime_sums_keep_counting_across_reduces_and_survive_state():
    metrics = MetricsLogger()
    metrics.log_value("lifetime", 10, reduce="sum", clear_on_reduce=False)
    assert metrics.reduce() == {"lifetime": 10.0}
    assert metrics.reduce() == {"lifetime": 10.0}
    restored = MetricsLogger()
    restored.set_state(metrics.get_state())
    restored.log_value("lifetime", 5, reduce="sum", clear_on_reduce=False)
    assert restored.reduce() == {"lifetime": 15.0}


def test_nan_values_are_reported_not_dropped():
    metrics = MetricsLogger()
    metrics.log_value("loss", torch.tensor(float("nan")))
    metrics.log_value("loss", torch.tensor(1.0))
    assert math.isnan(metrics.reduce()["loss"])


def test_peek_reads_pending_values_without_clearing_them():
    metrics = MetricsLogger()
    metrics.log_value(("p", "kl"), torch.tensor(0.5))
    metrics.log_value(("p", "kl"), torch.tensor(1.5))
    assert metrics.peek(("p", "kl")) == pytest.approx(1.0)
    assert metrics.reduce() == {"p": {"kl": 1.0}}
    with pytest.raises(KeyError, match="no metric .p/kl. has been logged since the last reduce"):
        metrics.peek(("p", "kl"))


def test_delete_forgets_a_prefix():
    metrics = MetricsLogger()
    metrics.log_value(("a", "x"), 1.0, reduce="sum", clear_on_reduce=False)
    metrics.log_value(("b", "x"), 1.0)
    metrics.reduce()
    metrics.delete("a")
    assert metrics.reduce() == {}


def test_logging_one_key_with_two_reduce_rules_is_an_error():
    metrics = MetricsLogger()
    metrics.log_value("x", 1.0)
    with pytest.raises(ValueError, match="first logged with reduce='mean'"):
        metrics.log_value("x", 1.0, reduce="sum")


def test_log_dict_logs_nested_entries_under_a_prefix():
    metrics = MetricsLogger()
    metrics.log_dict({"loss": torch.tensor(2.0), "extra": {"kl": 0.5}}, key="p")
    metrics.log_dict({"steps": 3}, reduce="sum")
    assert metrics.reduce() == {"p": {"loss": 2.0, "extra": {"kl": 0.5}}, "steps": 3.0}


def test_peek_reads_lasting_values_between_reduces():
    metrics = MetricsLogger()
    metrics.log_value("lr", 0.1, reduce="last", clear_on_reduce=False)
    metrics.log_value("lifetime", 4, reduce="sum", clear_on_reduce=False)
    metrics.reduce()
    assert metrics.peek("lr") == pytest.approx(0.1)
    metrics.log_value("lifetime", 2, reduce="sum", clear_on_reduce=False)
    assert metrics.peek("lifetime") == 6.0
    assert metrics.reduce() == {"lr": pytest.approx(0.1), "lifetime": 6.0}
