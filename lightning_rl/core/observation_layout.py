"""How observations are stored: one array per step, Dict and Tuple observations flattened.

Batches never hold dicts. An observation space that is an array space (``Box``, ``Discrete``,
``MultiDiscrete``, ``MultiBinary``) is stored as it is. A ``Dict`` or ``Tuple`` observation
space whose leaves are array spaces (nested ``Dict``/``Tuple`` included) is stored in
gymnasium's flatten layout: each observation becomes exactly what
``gym.spaces.flatten(space, obs)`` returns (keys in the Dict's order, ``Box`` and
``MultiBinary`` leaves raveled, ``Discrete`` leaves one-hot, ``MultiDiscrete`` leaves as
concatenated one-hots), with the bounds of ``gym.spaces.flatten_space(space)`` but a compact
dtype (:func:`_stored_dtype`): uint8 when every part's values fit one (uint8 or bool images,
one-hots, ``MultiBinary``), float32 otherwise. gymnasium's own dtype is numpy's common type of
the parts', which for a uint8 image beside a float32 vector and a ``Discrete`` is float64: eight
times the memory of the image in a replay buffer, for values that float32 holds exactly. The
module built on such a space keeps the ``Dict`` as its ``observation_space`` and splits the flat
row per key itself.

:class:`ObservationLayout` does this for a whole vector-env batch at once (``{key: [N, ...]}``
to ``[N, flatdim]``), one numpy copy per leaf and no Python loop over rows, so image
observations stay fast; :func:`stored_observation_space` is the space of the stored column.
PettingZoo's action-mask Dict (:mod:`~lightning_rl.core.action_masks`) is stored flattened like
any Dict (the mask's columns beside the observation's), so that a single-agent env's final and
next observations carry their masks through episodes and replay rows; where a stored row meets a
module (acting, a replay minibatch), :meth:`ObservationLayout.split_masked_batch` splits it into
the ``obs`` and ``action_mask`` columns the module takes. The multi-agent runner splits the mask
off before storing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from lightning_rl.core.action_masks import ACTION_MASK, OBSERVATION, is_action_masked_space

ARRAY_SPACES: tuple[type[gym.Space], ...] = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)
"""The spaces whose values are one numpy array each, stored as they are."""

_STRUCTURED_SPACES = (gym.spaces.Dict, gym.spaces.Tuple)


@dataclasses.dataclass(frozen=True)
class FlatLeaf:
    """One array space inside a ``Dict`` or ``Tuple`` space, and its columns ``row[start:stop]`` in the flat row.

    What a module reads to split a stored row per key (:mod:`~lightning_rl.core.encoders`).

    Args:
        path: The keys (and Tuple indices) that lead to it, outermost first.
        space: The array space.
        start: Its first column.
        stop: One past its last (``stop - start == gym.spaces.flatdim(space)``).
    """

    path: tuple[str | int, ...]
    space: gym.Space
    start: int
    stop: int

    @property
    def where(self) -> str:
        """Where the leaf sits in an observation: ``observation['image']``."""
        return _place(self.path)


class ObservationLayout:
    """The stored layout of an observation space, and the conversions to and from it.

    Args:
        space: An array space (stored as it is), or a ``Dict`` or ``Tuple`` whose leaves are
            array spaces, nested to any depth (stored flattened).

    Attributes:
        space: The observation space, as given.
        stored_space: The space of the stored ``obs`` column: ``space`` itself, or
            ``gym.spaces.flatten_space(space)`` (a ``Box`` of shape ``(flatdim,)``) in the
            dtype :func:`_stored_dtype` picks.
        flattens: Whether observations are flattened (``space`` is a ``Dict`` or ``Tuple``).
        leaves: The array spaces of a flattened space, each with its columns in the flat row,
            in gymnasium's flatten order; empty for an array space.
        masked: Whether ``space`` is PettingZoo's action-mask Dict (its rows split with
            :meth:`split_masked_batch`).

    Raises:
        ValueError: Naming the space, for a ``Dict`` with a key that is not a ``str``, an empty
            ``Dict`` or ``Tuple``, or any other space or leaf (``Text``, ``Sequence``, ``Graph``,
            ``OneOf``).
    """

    def __init__(self, space: gym.Space) -> None:
        self.space = space
        self.flattens = isinstance(space, _STRUCTURED_SPACES)
        self.masked = is_action_masked_space(space)
        if not self.flattens:
            if not isinstance(space, ARRAY_SPACES):
                raise ValueError(
                    f"observation space {space} cannot be stored as one array per step; supported: Box, Discrete, "
                    "MultiDiscrete, MultiBinary, and Dict or Tuple spaces of those"
                )
            self.stored_space: gym.Space = space
            self.leaves: list[FlatLeaf] = []
            return
        self.leaves = _leaves(space, space, (), 0)
        flat = gym.spaces.flatten_space(space)
        dtype = _stored_dtype(self.leaves)
        self.stored_space = gym.spaces.Box(flat.low.astype(dtype), flat.high.astype(dtype), flat.shape, dtype)

    def flatten_batch(self, obs: Any) -> Any:
        """A batch of observations in the stored layout.

        Called on every vector step, so nothing is checked beyond what numpy checks: use
        :meth:`batch_shape` first on observations from a user.

        Args:
            obs: For a ``Dict`` space ``{key: array[N, ...]}`` (a ``Tuple``'s: a tuple of
                arrays), as a gymnasium vector env returns them; for an array space an
                ``[N, ...]`` array.

        Returns:
            ``[N, flatdim]`` in ``stored_space.dtype``, a new array, equal row by row to
            ``gym.spaces.flatten(space, row)``; ``obs`` itself for an array space.

        Raises:
            ValueError: For a ``Discrete`` or ``MultiDiscrete`` value outside its space, naming
                the leaf.
        """
        if not self.flattens:
            return obs
        num_rows = len(_value_at(obs, self.leaves[0].path))
        flat = np.empty((num_rows, self.stored_space.shape[0]), dtype=self.stored_space.dtype)
        for leaf in self.leaves:
            block = flat[:, leaf.start : leaf.stop]
            value = _value_at(obs, leaf.path)
            if isinstance(leaf.space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
                _write_one_hot(block, leaf, value)
            else:
                # Cast to the leaf's dtype first, as gymnasium's flatten does, then to the row's.
                block[...] = np.asarray(value, dtype=leaf.space.dtype).reshape(num_rows, leaf.stop - leaf.start)
        return flat

    def flatten_one(self, obs: Any) -> np.ndarray:
        """One observation in the stored layout: a new array (``[flatdim]`` for a flattened space).

        Args:
            obs: One observation of the space (for an array space, anything ``np.array`` takes).

        Raises:
            ValueError: As :meth:`flatten_batch`.
        """
        if not self.flattens:
            return np.array(obs)  # a copy: some envs return the same array object at every step
        return self.flatten_batch(_map_leaves(self.space, obs, lambda value: np.asarray(value)[None]))[0]

    def unflatten_batch(self, flat: np.ndarray) -> Any:
        """The observations a batch of flat rows holds, as a vector env returns them.

        The inverse of :meth:`flatten_batch`: ``{key: array[N, ...]}`` (a tuple for a
        ``Tuple``), each leaf in its space's dtype; ``Discrete`` and ``MultiDiscrete`` values
        are read from their one-hots.

        Args:
            flat: ``[N, flatdim]`` rows in the stored layout; for an array space, ``[N, ...]``
                observations, returned as they are.
        """
        if not self.flattens:
            return flat
        flat = np.asarray(flat)

        def unflatten(leaf: FlatLeaf) -> np.ndarray:
            block = flat[:, leaf.start : leaf.stop]
            space = leaf.space
            if isinstance(space, gym.spaces.Discrete):
                return (space.start + np.argmax(block, axis=1)).astype(space.dtype)
            if isinstance(space, gym.spaces.MultiDiscrete):
                sizes = space.nvec.reshape(-1)
                bounds = np.concatenate([[0], np.cumsum(sizes)])
                values = [np.argmax(block[:, bounds[k] : bounds[k + 1]], axis=1) for k in range(len(sizes))]
                indices = np.stack(values, axis=1).reshape(len(flat), *space.shape)
                return (indices + space.start).astype(space.dtype)
            return block.astype(space.dtype).reshape(len(flat), *space.shape)

        by_path = {leaf.path: unflatten(leaf) for leaf in self.leaves}
        return _build(self.space, (), by_path)

    def split_masked_batch(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``obs`` and ``action_mask`` columns of stored rows of an action-mask Dict.

        Args:
            flat: ``[N, flatdim]`` rows in the stored layout of this (masked) space.

        Returns:
            The observation part ``[N, ...]`` in its own stored layout (an array space's values
            in its dtype, a Dict's or Tuple's flat rows) and the masks ``[N, n]`` as bools.

        Raises:
            ValueError: If this layout's space is not an action-mask Dict.
        """
        if not self.masked:
            raise ValueError(f"observation space {self.space} is not an action-mask Dict; there is no mask to split")
        parts = self.unflatten_batch(flat)
        observation = parts[OBSERVATION]
        if isinstance(observation, (dict, tuple)):
            observation = ObservationLayout(self.space[OBSERVATION]).flatten_batch(observation)
        return observation, parts[ACTION_MASK].astype(bool)

    def batch_shape(self, obs: Any) -> tuple[int, ...]:
        """``()`` if ``obs`` is one observation of the space, ``(N,)`` if it is a batch of ``N``.

        For a flattened space, ``obs`` must nest as the space does (a dict with exactly the
        Dict's keys, a tuple or list as long as the Tuple) and every leaf must agree.

        Raises:
            ValueError: Naming the part (``observation['image']``) whose structure or shape fits
                neither one observation nor a batch, or parts that disagree on the batch size.
        """
        if not self.flattens:
            return _leaf_batch_shape(self.space, obs, "observation")
        found: list[tuple[str, tuple[int, ...]]] = []
        _map_leaves(
            self.space, obs, lambda value, space, where: found.append((where, _leaf_batch_shape(space, value, where))),
            with_place=True,
        )  # fmt: skip
        if len({shape for _, shape in found}) > 1:
            parts = ", ".join(f"{where}: {f'batch of {shape[0]}' if shape else 'one'}" for where, shape in found)
            raise ValueError(f"the parts of the observation disagree on the batch size ({parts})")
        return found[0][1]


def stored_observation_space(space: gym.Space) -> gym.Space:
    """The space of the stored ``obs`` column: a flat ``Box`` for a ``Dict`` or ``Tuple`` (see :class:`ObservationLayout`), else ``space``.

    Raises:
        ValueError: For a ``Dict`` or ``Tuple`` that :class:`ObservationLayout` refuses.
    """
    if not isinstance(space, _STRUCTURED_SPACES):
        return space
    return ObservationLayout(space).stored_space


def _leaves(root: gym.Space, space: gym.Space, path: tuple[str | int, ...], start: int) -> list[FlatLeaf]:
    """The array-space leaves of ``space`` (inside ``root``), depth first in gymnasium's flatten order."""
    if isinstance(space, ARRAY_SPACES):
        return [FlatLeaf(path, space, start, start + gym.spaces.flatdim(space))]
    if isinstance(space, gym.spaces.Dict):
        children = list(space.spaces.items())
        for key, _ in children:
            if not isinstance(key, str):
                raise ValueError(f"observation space {root} has the key {key!r}; Dict observation keys must be str")
    elif isinstance(space, gym.spaces.Tuple):
        children = list(enumerate(space.spaces))
    else:
        raise ValueError(
            f"observation space {root} holds {space} at {_place(path)}; Dict and Tuple observations are stored "
            "flattened, so their parts must be Box, Discrete, MultiDiscrete, MultiBinary (or Dict or Tuple of those)"
        )
    if not children:
        raise ValueError(f"observation space {root} is empty at {_place(path)}: there is nothing to observe")
    leaves: list[FlatLeaf] = []
    for key, child in children:
        leaves.extend(_leaves(root, child, (*path, key), leaves[-1].stop if leaves else start))
    return leaves


def _stored_dtype(leaves: list[FlatLeaf]) -> np.dtype:
    """uint8 if every leaf's flattened values are integers in 0..255 (uint8 or bool ``Box``, one-hots, ``MultiBinary``), else float32.

    float32 holds every uint8 value and every one-hot exactly, and is what modules compute in;
    integer ``Box`` leaves beyond 2**24 and float64 leaves lose precision in it.
    """
    small = all(
        isinstance(leaf.space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
        or leaf.space.dtype in (np.uint8, np.bool_)
        for leaf in leaves
    )
    return np.dtype(np.uint8 if small else np.float32)


def _value_at(obs: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        obs = obs[key]
    return obs


def _write_one_hot(block: np.ndarray, leaf: FlatLeaf, value: Any) -> None:
    """Write the one-hots of a ``Discrete`` or ``MultiDiscrete`` leaf's values into ``block`` ``[N, width]``."""
    space = leaf.space
    num_rows = len(block)
    if isinstance(space, gym.spaces.Discrete):
        sizes = np.array([space.n])
        starts = np.array([space.start])
    else:
        sizes, starts = space.nvec.reshape(-1), space.start.reshape(-1)
    indices = np.asarray(value).reshape(num_rows, len(sizes)) - starts
    outside = (indices < 0) | (indices >= sizes)
    if outside.any():
        row, part = (int(k) for k in np.argwhere(outside)[0])
        raise ValueError(
            f"observation {_place(leaf.path)} holds {indices[row, part] + starts[part]} (row {row}), outside its "
            f"space {space}"
        )
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    block[...] = 0
    block[np.arange(num_rows)[:, None], offsets + indices] = 1


def _map_leaves(
    space: gym.Space, obs: Any, fn: Callable[..., Any], *, with_place: bool = False, path: tuple = ()
) -> Any:
    """``obs`` nested as ``space``, ``fn`` applied to each leaf value (``fn(value, space, place)`` if ``with_place``).

    Raises:
        ValueError: Naming the place where ``obs`` does not nest as ``space`` does.
    """
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(obs, Mapping) or set(obs) != set(space.spaces):
            got = f"keys {sorted(map(str, obs))}" if isinstance(obs, Mapping) else f"a {type(obs).__name__}"
            raise ValueError(f"{_place(path)} must be a dict with the keys {list(space.spaces)}, got {got}")
        return {
            key: _map_leaves(sub, obs[key], fn, with_place=with_place, path=(*path, key))
            for key, sub in space.spaces.items()
        }
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(obs, (tuple, list)) or len(obs) != len(space.spaces):
            got = f"{len(obs)} parts" if isinstance(obs, (tuple, list)) else f"a {type(obs).__name__}"
            raise ValueError(f"{_place(path)} must be a tuple of {len(space.spaces)} parts, got {got}")
        return tuple(
            _map_leaves(sub, value, fn, with_place=with_place, path=(*path, index))
            for index, (sub, value) in enumerate(zip(space.spaces, obs))
        )
    return fn(obs, space, _place(path)) if with_place else fn(obs)


def _build(space: gym.Space, path: tuple[str | int, ...], by_path: Mapping[tuple, np.ndarray]) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {key: _build(sub, (*path, key), by_path) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_build(sub, (*path, index), by_path) for index, sub in enumerate(space.spaces))
    return by_path[path]


def _leaf_batch_shape(space: gym.Space, value: Any, where: str) -> tuple[int, ...]:
    """``()`` if ``value`` has the shape of one value of the array space ``space``, ``(N,)`` for ``N`` of them."""
    shape, expected = np.shape(value), tuple(space.shape)
    if shape == expected:
        return ()
    if len(shape) == len(expected) + 1 and shape[1:] == expected:
        return shape[:1]
    batch = ", ".join(map(str, ("batch", *expected)))
    raise ValueError(
        f"{where} has shape {shape}, but its space {space} expects {expected} for one observation or ({batch}) "
        "for a batch"
    )


def _place(path: tuple[str | int, ...]) -> str:
    """``observation['image'][0]``: where a leaf sits in an observation."""
    return "observation" + "".join(f"[{key!r}]" for key in path)
