"""Gymnasium spaces to and from plain Python data, for checkpoints and config files.

The dicts hold only ``str``, ``int``, ``float``, ``bool``, ``list``, ``dict`` and ``None``,
so they load with ``torch.load(weights_only=True)`` and write to JSON or YAML. Infinite
``Box`` bounds are stored as ``float("inf")``/``float("-inf")``: plain floats for torch and
YAML (``.inf``); Python's ``json`` writes them as ``Infinity``, which it also reads back, but
strict JSON parsers reject. Random number generator seeds are not stored.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import gymnasium as gym
import numpy as np


def space_to_dict(space: gym.Space) -> dict[str, Any]:
    """Describe ``space`` as plain data that :func:`space_from_dict` turns back into it.

    Args:
        space: A ``Box``, ``Discrete``, ``MultiDiscrete``, ``MultiBinary``, or a ``Dict`` or
            ``Tuple`` of those (nested to any depth).

    Raises:
        ValueError: For other space types, and for ``Dict`` spaces with non-``str`` keys.
    """
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "low": space.low.tolist(),
            "high": space.high.tolist(),
            "shape": list(space.shape),
            "dtype": str(space.dtype),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": str(space.dtype),
        }
    if isinstance(space, gym.spaces.MultiBinary):
        # MultiBinary(4).n is 4 but MultiBinary([4]).n is (4,), and the two compare unequal.
        n = space.n if isinstance(space.n, int) else [int(size) for size in space.n]
        return {"type": "MultiBinary", "n": n}
    if isinstance(space, gym.spaces.Dict):
        for key in space.spaces:
            if not isinstance(key, str):
                raise ValueError(f"Dict space keys must be str to be stored, got {key!r}.")
        return {
            "type": "Dict",
            "spaces": {key: space_to_dict(subspace) for key, subspace in space.spaces.items()},
        }
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_dict(subspace) for subspace in space.spaces]}
    raise ValueError(
        f"Cannot store space of type {type(space).__name__}; supported: Box, Discrete, "
        "MultiDiscrete, MultiBinary, Dict, Tuple."
    )


def space_from_dict(data: dict[str, Any]) -> gym.Space:
    """Rebuild the space that :func:`space_to_dict` described.

    Args:
        data: A dict made by :func:`space_to_dict`.

    Raises:
        ValueError: If ``data["type"]`` is not a supported space type.
    """
    space_type = data.get("type")
    if space_type == "Box":
        dtype = np.dtype(data["dtype"])
        return gym.spaces.Box(
            low=np.array(data["low"], dtype=dtype),
            high=np.array(data["high"], dtype=dtype),
            shape=tuple(data["shape"]),
            dtype=dtype,
        )
    if space_type == "Discrete":
        return gym.spaces.Discrete(data["n"], start=data["start"])
    if space_type == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(
            np.array(data["nvec"]), dtype=data["dtype"], start=np.array(data["start"])
        )
    if space_type == "MultiBinary":
        return gym.spaces.MultiBinary(data["n"])
    if space_type == "Dict":
        # Gymnasium sorts the keys of a plain dict but keeps an OrderedDict's order, which
        # decides how the space flattens.
        return gym.spaces.Dict(OrderedDict((key, space_from_dict(sub)) for key, sub in data["spaces"].items()))
    if space_type == "Tuple":
        return gym.spaces.Tuple([space_from_dict(sub) for sub in data["spaces"]])
    raise ValueError(
        f"Cannot rebuild space of type {space_type!r}; supported: Box, Discrete, "
        "MultiDiscrete, MultiBinary, Dict, Tuple."
    )
