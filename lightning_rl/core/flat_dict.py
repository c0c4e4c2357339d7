"""Where each key of a ``Dict`` observation sits in its flat row: gymnasium's ``flatten`` layout.

Batches never hold dicts: an env runner stores a ``Dict`` observation as the one flat array
``gym.spaces.flatten(space, obs)`` (the keys in the Dict's order, each part
``gym.spaces.flatdim(subspace)`` wide: a Box flattened, Discrete one-hot, MultiDiscrete the
one-hots of its dims, MultiBinary 0/1), and reports the ``Dict`` itself as its observation
space. :func:`flat_dict_layout` says where each key's part starts and stops, so that the env
side writes and the module side (:mod:`lightning_rl.core.encoders`) reads the same layout.
The flat row takes the parts' common dtype, so an image key's uint8 pixels may arrive as floats.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym


@dataclasses.dataclass(frozen=True)
class FlatDictSlice:
    """One key's part of a flat ``Dict`` observation: ``row[start:stop]``.

    Args:
        key: The Dict key.
        space: Its subspace.
        start: The first column of its part.
        stop: One past the last column (``stop - start == gym.spaces.flatdim(space)``).
    """

    key: str
    space: gym.Space
    start: int
    stop: int


def flat_dict_layout(space: gym.spaces.Dict) -> tuple[FlatDictSlice, ...]:
    """The part of each key in ``gym.spaces.flatten(space, obs)``, in the Dict's key order.

    Args:
        space: A ``Dict`` space whose subspaces gymnasium can flatten.

    Raises:
        ValueError: If ``space`` is not a ``Dict``.
    """
    if not isinstance(space, gym.spaces.Dict):
        raise ValueError(f"flat_dict_layout takes a Dict space, got {space}")
    slices = []
    start = 0
    for key, subspace in space.spaces.items():
        stop = start + gym.spaces.flatdim(subspace)
        slices.append(FlatDictSlice(key, subspace, start, stop))
        start = stop
    return tuple(slices)
