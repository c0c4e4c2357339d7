import io
import json
from collections import OrderedDict

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl.core.spaces import space_from_dict, space_to_dict

SPACES = {
    "box_finite": gym.spaces.Box(low=np.float32([-1.0, -2.0]), high=np.float32([1.0, 3.5]), dtype=np.float32),
    "box_infinite_2d": gym.spaces.Box(-np.inf, np.inf, shape=(2, 3), dtype=np.float64),
    "box_mixed_bounds": gym.spaces.Box(low=np.float32([0.0, -np.inf]), high=np.float32([np.inf, 5.0]), dtype=np.float32),
    "box_int": gym.spaces.Box(low=0, high=255, shape=(4,), dtype=np.uint8),
    "discrete": gym.spaces.Discrete(5),
    "discrete_with_start": gym.spaces.Discrete(3, start=-1),
    "multi_discrete": gym.spaces.MultiDiscrete([3, 4], start=[1, 0], dtype=np.int32),
    "multi_binary_int": gym.spaces.MultiBinary(4),
    "multi_binary_shape": gym.spaces.MultiBinary([2, 3]),
    "nested": gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-np.inf, np.inf, (3,)),
            "parts": gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.MultiBinary(3)]),
        }
    ),
}


def _assert_plain(value: object) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            assert type(key) is str
            _assert_plain(item)
    elif isinstance(value, list):
        for item in value:
            _assert_plain(item)
    else:
        assert value is None or type(value) in (str, int, float, bool), f"{value!r} is a {type(value)}"


@pytest.mark.parametrize("name", SPACES)
def test_space_round_trips_to_an_equal_space(name: str):
    space = SPACES[name]
    rebuilt = space_from_dict(space_to_dict(space))
    assert rebuilt == space
    assert rebuilt.dtype == space.dtype


@pytest.mark.parametrize("name", SPACES)
def test_space_dict_holds_only_plain_python_data(name: str):
    _assert_plain(space_to_dict(SPACES[name]))


@pytest.mark.parametrize("name", SPACES)
def test_space_dict_survives_torch_weights_only_load(name: str):
    buffer = io.BytesIO()
    torch.save({"space": space_to_dict(SPACES[name])}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert space_from_dict(loaded["space"]) == SPACES[name]


@pytest.mark.parametrize("name", SPACES)
def test_space_dict_survives_json(name: str):
    assert space_from_dict(json.loads(json.dumps(space_to_dict(SPACES[name])))) == SPACES[name]


def test_infinite_box_bounds_are_stored_as_float_inf():
    data = space_to_dict(gym.spaces.Box(-np.inf, np.inf, (2,)))
    assert data["low"] == [float("-inf")] * 2 and data["high"] == [float("inf")] * 2


def test_dict_space_keeps_unsorted_key_order():
    space = gym.spaces.Dict(OrderedDict(b=gym.spaces.Discrete(2), a=gym.spaces.Discrete(3)))
    assert list(space_from_dict(space_to_dict(space)).spaces) == list(space.spaces)


def test_unsupported_space_type_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="Text"):
        space_to_dict(gym.spaces.Text(5))
    with pytest.raises(ValueError, match="'Graph'"):
        space_from_dict({"type": "Graph"})
