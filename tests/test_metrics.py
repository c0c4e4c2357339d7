"""The MetricsLogger: RLlib's reduce, window, EMA and clear settings, checks, peek and state."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from lightning_rl import MetricsLogger


def _log_and_reduce(metrics: MetricsLogger, values: list[float], **settings) -> dict:
    for value in values:
        metrics.log_value("x", torch.tensor(value), **settings)
    return metrics.reduce()


# Each row: settings, values logged before the first reduce, that reduce's value, values
# logged before the second reduce, its value (None: the key is not reported).
SETTINGS_CASES = {
    "mean is an EMA with coeff 0.01": ({}, [1.0, 2.0, 3.0], 1.0299, [], 1.0299),
    "mean EMA keeps going": ({"ema_coeff": 0.5}, [2.0, 4.0], 3.0, [8.0], 5.5),
    "mean EMA cleared": ({"ema_coeff": 0.5, "clear_on_reduce": True}, [2.0, 4.0], 3.0, [8.0], 8.0),
    "mean EMA cleared, nothing new": ({"ema_coeff": 0.5, "clear_on_reduce": True}, [2.0], 2.0, [], None),
    "mean window spans reduces": ({"window": 2}, [1.0, 2.0, 3.0], 2.5, [10.0], 6.5),
    "mean window cleared": ({"window": 2, "clear_on_reduce": True}, [1.0, 2.0, 3.0], 2.5, [10.0], 10.0),
    "last value is window 1": ({"window": 1}, [0.1, 0.2], 0.2, [], 0.2),
    "mean of one update": ({"window": math.inf, "clear_on_reduce": True}, [1.0, 2.0, 3.0], 2.0, [5.0], 5.0),
    "mean over every value": ({"window": math.inf}, [1.0, 3.0], 2.0, [8.0], 4.0),
    "sum keeps counting": ({"reduce": "sum"}, [5.0, 7.0], 12.0, [1.0], 13.0),
    "sum keeps counting, nothing new": ({"reduce": "sum"}, [5.0, 7.0], 12.0, [], 12.0),
    "sum cleared": ({"reduce": "sum", "clear_on_reduce": True}, [5.0, 7.0], 12.0, [1.0], 1.0),
    "sum cleared, infinite window": (
        {"reduce": "sum", "window": math.inf, "clear_on_reduce": True}, [5.0, 7.0], 12.0, [], None
    ),
    "sum over a window": ({"reduce": "sum", "window": 2}, [1.0, 2.0, 4.0], 6.0, [8.0], 12.0),
    "max over every value": ({"reduce": "max"}, [4.0, 2.0], 4.0, [3.0], 4.0),
    "max cleared": ({"reduce": "max", "clear_on_reduce": True}, [4.0, 2.0], 4.0, [3.0], 3.0),
    "max over a window": ({"reduce": "max", "window": 2}, [5.0, 1.0, 2.0], 2.0, [0.0], 2.0),
    "min over every value": ({"reduce": "min"}, [3.0, 1.0], 1.0, [5.0], 1.0),
    "min cleared": ({"reduce": "min", "clear_on_reduce": True}, [3.0, 1.0], 1.0, [5.0], 5.0),
    "min over a window": ({"reduce": "min", "window": 2}, [0.0, 4.0, 3.0], 3.0, [9.0], 3.0),
}


@pytest.mark.parametrize("case", list(SETTINGS_CASES))
def test_each_setting_reduces_to_its_hand_computed_value(case):
    settings, first_values, first, second_values, second = SETTINGS_CASES[case]
    metrics = MetricsLogger()
    assert _log_and_reduce(metrics, first_values, **settings) == {"x": pytest.approx(first)}
    expected_second = {} if second is None else {"x": pytest.approx(second)}
    assert _log_and_reduce(metrics, second_values, **settings) == expected_second


def test_reduce_turns_logged_values_into_nested_python_floats():
    metrics = MetricsLogger()
    metrics.log_value(("p", "loss"), torch.tensor(1.0), window=math.inf, clear_on_reduce=True)
    metrics.log_value(("p", "loss"), torch.tensor(3, dtype=torch.int64), window=math.inf, clear_on_reduce=True)
    metrics.log_value("steps", 5, reduce="sum", clear_on_reduce=True)
    metrics.log_value("steps", torch.tensor(7), reduce="sum", clear_on_reduce=True)
    results = metrics.reduce()
    assert results == {"p": {"loss": 2.0}, "steps": 12.0}
    assert type(results["p"]["loss"]) is float and type(results["steps"]) is float


def test_a_cpu_tensor_is_logged_as_its_value_then_not_as_a_tensor_that_can_still_change():
    # Kept as its number: no small tensor per step stays alive among a step's large ones until the
    # reduce (that pinned about 24 bytes of freed heap per row of a LearnerGroup update on the CPU).
    metrics = MetricsLogger()
    value = torch.tensor(1.0)
    metrics.log_value("loss", value, window=math.inf)
    value += 10.0  # an in-place change after logging (an optimizer's step on a logged parameter)
    assert metrics.reduce() == {"loss": 1.0}


def test_a_tensor_with_several_elements_is_one_value():
    metrics = MetricsLogger()
    # Its mean for a mean (then averaged with the other values), its sum, its extreme.
    metrics.log_value("mean", torch.tensor([1.0, 3.0]), window=math.inf)
    metrics.log_value("mean", 6.0, window=math.inf)
    metrics.log_value("ints", torch.tensor([1, 2]), window=math.inf)
    metrics.log_value("sum", torch.tensor([1.0, 2.0]), reduce="sum")
    metrics.log_value("max", torch.tensor([[1.0, 5.0]]), reduce="max")
    metrics.log_value("ema", torch.tensor([2.0, 4.0]), ema_coeff=0.5)
    metrics.log_value("numpy", np.array([1.0, 5.0]), reduce="min")
    metrics.log_value("numpy", np.float32(0.5), reduce="min")
    assert metrics.reduce() == {"mean": 4.0, "ints": 1.5, "sum": 3.0, "max": 5.0, "ema": 3.0, "numpy": 0.5}


@pytest.mark.parametrize(
    "settings",
    [{"window": 2}, {"window": math.inf}, {"reduce": "max"}, {"reduce": "min", "window": 3}, {"ema_coeff": 0.5}],
)
def test_nan_values_are_reported_not_dropped(settings):
    metrics = MetricsLogger()
    metrics.log_value("loss", torch.tensor(1.0), **settings)
    metrics.log_value("loss", torch.tensor(float("nan")), **settings)
    assert math.isnan(metrics.reduce()["loss"])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"window": 0}, "window must be None, an int >= 1 or math.inf, got 0"),
        ({"window": 2.5}, "window must be None, an int >= 1 or math.inf, got 2.5"),
        ({"window": True}, "window must be None, an int >= 1 or math.inf, got True"),
        ({"ema_coeff": 0.0}, r"ema_coeff must be a number in \(0, 1\], got 0.0"),
        ({"ema_coeff": 1.5}, r"ema_coeff must be a number in \(0, 1\], got 1.5"),
        ({"reduce": "sum", "ema_coeff": 0.1}, "ema_coeff is only allowed with reduce='mean', got reduce='sum'"),
        ({"window": 3, "ema_coeff": 0.1}, "give either window or ema_coeff, not both"),
        ({"reduce": "last"}, r"got 'last' \(RLlib's 'last' value is reduce='mean', window=1\)"),
        ({"reduce": "median"}, r"reduce must be one of \['mean', 'sum', 'min', 'max'\], got 'median'"),
        ({"clear_on_reduce": 1}, "clear_on_reduce must be a bool, got 1"),
    ],
)
def test_invalid_settings_are_rejected_with_what_was_expected(settings, message):
    with pytest.raises(ValueError, match=message):
        MetricsLogger().log_value("x", 1.0, **settings)


def test_logging_one_key_with_other_settings_names_both():
    metrics = MetricsLogger()
    metrics.log_value("x", 1.0)
    metrics.log_value("x", 2.0, ema_coeff=0.01)  # the default, spelled out: the same settings
    with pytest.raises(
        ValueError,
        match=r"metric 'x' was first logged with reduce='mean', window=None, ema_coeff=0.01, "
        r"clear_on_reduce=False; cannot log it with reduce='sum', window=None, ema_coeff=None, clear_on_reduce=False",
    ):
        metrics.log_value("x", 1.0, reduce="sum")


def test_an_empty_tensor_is_rejected():
    with pytest.raises(ValueError, match="metric 'p/x': cannot log an empty tensor"):
        MetricsLogger().log_value(("p", "x"), torch.zeros(0))


def test_peek_reads_pending_values_without_clearing_them():
    metrics = MetricsLogger()
    metrics.log_value(("p", "kl"), torch.tensor(0.5), window=math.inf, clear_on_reduce=True)
    metrics.log_value(("p", "kl"), torch.tensor(1.5), window=math.inf, clear_on_reduce=True)
    assert metrics.peek(("p", "kl")) == pytest.approx(1.0)
    assert metrics.reduce() == {"p": {"kl": 1.0}}
    with pytest.raises(KeyError, match="no metric .p/kl. has been logged since the last reduce"):
        metrics.peek(("p", "kl"))
    with pytest.raises(KeyError, match="no metric .never. has been logged"):
        metrics.peek("never")


def test_peek_reads_lasting_values_between_reduces():
    metrics = MetricsLogger()
    metrics.log_value("lr", 0.1, window=1)
    metrics.log_value("lifetime", 4, reduce="sum")
    metrics.log_value("smooth", 2.0, ema_coeff=0.5)
    metrics.reduce()
    assert metrics.peek("lr") == pytest.approx(0.1)
    metrics.log_value("lifetime", 2, reduce="sum")
    metrics.log_value("smooth", 4.0, ema_coeff=0.5)
    assert (metrics.peek("lifetime"), metrics.peek("smooth")) == (6.0, 3.0)
    assert (metrics.peek("lifetime"), metrics.peek("smooth")) == (6.0, 3.0)  # peeking changed nothing
    assert metrics.reduce() == {"lr": pytest.approx(0.1), "lifetime": 6.0, "smooth": 3.0}


def test_delete_forgets_a_prefix_and_its_settings():
    metrics = MetricsLogger()
    metrics.log_value(("a", "x"), 1.0, reduce="sum")
    metrics.log_value(("b", "x"), 1.0, window=math.inf, clear_on_reduce=True)
    metrics.reduce()
    metrics.delete("a")
    assert metrics.reduce() == {}
    metrics.log_value(("a", "x"), 5.0, reduce="max")  # other settings are fine after a delete
    assert metrics.reduce() == {"a": {"x": 5.0}}


def test_log_dict_logs_nested_entries_under_a_prefix_with_the_settings():
    metrics = MetricsLogger()
    metrics.log_dict({"loss": torch.tensor(2.0), "extra": {"kl": 0.5}}, key="p", window=1)
    metrics.log_dict({"steps": 3}, reduce="sum")
    assert metrics.reduce() == {"p": {"loss": 2.0, "extra": {"kl": 0.5}}, "steps": 3.0}


def _weights_only_round_trip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"ema_coeff": 0.5},
        {"window": 3},
        {"window": 1},
        {"window": math.inf},
        {"reduce": "sum"},
        {"reduce": "sum", "window": 2},
        {"reduce": "min"},
        {"reduce": "max", "window": 2},
    ],
)
def test_state_round_trips_through_a_weights_only_load(settings):
    original, restored = MetricsLogger(), MetricsLogger()
    for value in [3.0, 1.0, 4.0]:
        original.log_value("x", torch.tensor(value), **settings)
    original.reduce()
    original.log_value("x", 1.5, **settings)  # pending values are part of the state
    restored.set_state(_weights_only_round_trip(original.get_state()))
    for metrics in (original, restored):
        metrics.log_value("x", 5.0, **settings)
    assert restored.reduce() == pytest.approx(original.reduce())


def test_state_holds_lasting_metrics_only():
    metrics = MetricsLogger()
    metrics.log_value("loss", 1.0, window=math.inf, clear_on_reduce=True)
    metrics.log_value("lifetime", 10, reduce="sum")
    assert metrics.get_state() == {
        "lifetime": {
            "reduce": "sum", "window": None, "ema_coeff": None, "clear_on_reduce": False, "value": 10.0, "weight": 1.0
        }
    }


def test_state_saved_before_windows_and_emas_still_loads():
    metrics = MetricsLogger()
    metrics.set_state(
        {
            "steps": {"reduce": "sum", "value": 30.0},
            "lr": {"reduce": "last", "value": 0.1},
            "mean": {"reduce": "mean", "value": 2.0, "weight": 4.0},
            "best": {"reduce": "max", "value": 7.0},
        }
    )
    metrics.log_value("steps", 1, reduce="sum")
    metrics.log_value("mean", 7.0, window=math.inf)  # a mean over every value: (4 * 2 + 7) / 5
    metrics.log_value("best", 3.0, reduce="max")
    assert metrics.reduce() == {"steps": 31.0, "lr": pytest.approx(0.1), "mean": 3.0, "best": 7.0}
    with pytest.raises(ValueError, match="metric 'x': unknown reduce 'median' in the saved state"):
        metrics.set_state({"x": {"reduce": "median", "value": 1.0}})


def test_a_saved_state_with_invalid_settings_names_the_metric():
    entry = {"reduce": "sum", "window": None, "ema_coeff": 0.5, "clear_on_reduce": False, "value": 1.0, "weight": 1.0}
    with pytest.raises(ValueError, match="metric 'x' in the saved state: ema_coeff is only allowed with reduce='mean'"):
        MetricsLogger().set_state({"x": entry})


def test_restored_settings_must_match_the_next_log():
    metrics = MetricsLogger()
    metrics.set_state({"steps": {"reduce": "sum", "value": 30.0}})
    with pytest.raises(ValueError, match="metric 'steps' was first logged with reduce='sum'"):
        metrics.log_value("steps", 1, reduce="sum", clear_on_reduce=True)
