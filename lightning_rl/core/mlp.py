"""MLP builders and observation flattening for modules built from a ``model_config``.

The algorithm modules (BC, PPO, DQN, SAC, ...) build their networks from ``model_config`` keys
``fcnet_hiddens`` and ``fcnet_activation``, and feed them observations flattened to one
float vector per row as gymnasium's ``gym.spaces.flatten`` lays them out (image observations
go through a CNN first: :mod:`lightning_rl.core.encoders`); these helpers are that shared part.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor, nn

from lightning_rl.core.action_masks import observation_part

DEFAULT_FCNET_HIDDENS: tuple[int, ...] = (256, 256)
"""Hidden layer sizes :func:`build_mlp_from_config` uses when ``fcnet_hiddens`` is unset."""

DEFAULT_FCNET_ACTIVATION = "tanh"
"""Activation :func:`build_mlp_from_config` uses when ``fcnet_activation`` is unset."""

_ACTIVATIONS: dict[str, type[nn.Module] | None] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "elu": nn.ELU,
    "linear": None,
}

# The observation spaces flatten_obs takes, each as gym.spaces.flatten lays it out.
_FLATTENABLE_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
    gym.spaces.Dict,
)

ACTIVATION_NAMES: frozenset[str] = frozenset(_ACTIVATIONS)
"""The ``fcnet_activation`` (and ``conv_activation``) names :func:`make_activation` accepts."""


def make_activation(name: str) -> nn.Module | None:
    """A new activation layer by name; ``None`` for ``"linear"`` (no activation).

    Args:
        name: One of :data:`ACTIVATION_NAMES`: ``"tanh"``, ``"relu"``, ``"silu"`` (or
            ``"swish"``), ``"elu"``, ``"linear"``.

    Raises:
        ValueError: For an unknown activation name.
    """
    if name not in _ACTIVATIONS:
        raise ValueError(f"Unknown activation {name!r}; choose one of {sorted(_ACTIVATIONS)}.")
    activation_cls = _ACTIVATIONS[name]
    return None if activation_cls is None else activation_cls()


def build_mlp(
    in_dim: int, hiddens: Sequence[int], activation: str, out_dim: int | None = None
) -> nn.Sequential:
    """Build a fully connected network: ``Linear`` + activation per hidden layer.

    Args:
        in_dim: Size of the flat input.
        hiddens: Sizes of the hidden layers, in order; empty for none.
        activation: One of ``"tanh"``, ``"relu"``, ``"silu"`` (or ``"swish"``), ``"elu"``,
            ``"linear"`` (no activation).
        out_dim: Size of a final ``Linear`` layer without activation; ``None`` to end at
            the last hidden layer.

    Raises:
        ValueError: For an unknown activation name.
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"Unknown fcnet_activation {activation!r}; choose one of {sorted(_ACTIVATIONS)}.")
    layers: list[nn.Module] = []
    for size in hiddens:
        layers.append(nn.Linear(in_dim, size))
        activation_layer = make_activation(activation)
        if activation_layer is not None:
            layers.append(activation_layer)
        in_dim = size
    if out_dim is not None:
        layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


def build_mlp_from_config(
    in_dim: int, model_config: Mapping[str, Any], out_dim: int | None = None
) -> nn.Sequential:
    """Build :func:`build_mlp` from ``model_config["fcnet_hiddens"]`` and ``["fcnet_activation"]``.

    Args:
        in_dim: Size of the flat input.
        model_config: The module's model config; missing keys take the module-level defaults.
        out_dim: Size of a final ``Linear`` layer without activation, or ``None``.
    """
    return build_mlp(
        in_dim,
        model_config.get("fcnet_hiddens", DEFAULT_FCNET_HIDDENS),
        model_config.get("fcnet_activation", DEFAULT_FCNET_ACTIVATION),
        out_dim,
    )


def flat_obs_dim(space: gym.Space) -> int:
    """Return the size of one observation after :func:`flatten_obs` (``gym.spaces.flatdim``).

    Args:
        space: A ``Box``, ``Discrete``, ``MultiDiscrete``, ``MultiBinary`` or ``Dict`` observation
            space, or a masked space (:mod:`~lightning_rl.core.action_masks`) whose observation
            part is one.

    Raises:
        ValueError: For other observation spaces.
    """
    return gym.spaces.flatdim(_flattenable(space))


def flatten_obs(obs: Tensor, space: gym.Space) -> Tensor:
    """Turn a batch of observations into float vectors ``[B, flat_obs_dim(space)]``, as ``gym.spaces.flatten`` does.

    ``Box``: flattened; ``Discrete``: one-hot; ``MultiDiscrete``: the one-hots of its dims side
    by side; ``MultiBinary``: flattened 0/1; ``Dict``: the observations already hold
    gymnasium's flat layout of the Dict (:func:`~lightning_rl.core.flat_dict.flat_dict_layout`),
    which is kept. Values are converted to float32 as they are, never rescaled (images are
    :mod:`~lightning_rl.core.encoders`' business).

    Args:
        obs: A batch of observations from ``space``, shape ``[B, *space.shape]`` (``[B,
            flatdim]`` for a ``Dict``); for a masked space, of its observation part (the ``obs``
            column; the mask is a column of its own).
        space: As for :func:`flat_obs_dim`.

    Raises:
        ValueError: For other observation spaces.
    """
    space = _flattenable(space)
    rows = obs.shape[0]
    if isinstance(space, gym.spaces.Discrete):
        return nn.functional.one_hot(obs.long() - int(space.start), int(space.n)).float()
    if isinstance(space, gym.spaces.MultiDiscrete):
        return multi_discrete_one_hot(obs, space.nvec.reshape(-1).tolist(), space.start.reshape(-1).tolist())
    # The width from the space, not -1: a batch of no rows has no -1 to infer. math.prod rather
    # than gym.spaces.flatdim for Boxes: torch.compile traces it without a graph break.
    width = gym.spaces.flatdim(space) if isinstance(space, gym.spaces.Dict) else math.prod(space.shape)
    return obs.reshape(rows, width).float()


def multi_discrete_one_hot(obs: Tensor, sizes: Sequence[int], starts: Sequence[int]) -> Tensor:
    """The one-hots of a batch of ``MultiDiscrete`` values side by side, ``[B, sum(sizes)]`` float32.

    Args:
        obs: ``[B, *nvec.shape]`` values.
        sizes: ``nvec``, flattened, as Python ints (constants to ``torch.compile``).
        starts: The space's ``start``, flattened alike.
    """
    # Each dim's one-hot begins where the previous dims' end.
    offsets = [0, *itertools.accumulate(sizes)][:-1]
    shift = torch.as_tensor([offset - start for offset, start in zip(offsets, starts)], device=obs.device)
    columns = obs.reshape(obs.shape[0], len(sizes)).long() + shift
    return torch.zeros((obs.shape[0], sum(sizes)), device=obs.device).scatter_(1, columns, 1.0)


def _flattenable(space: gym.Space) -> gym.Space:
    """The observation part of ``space``, if :func:`flatten_obs` takes it; else a ValueError naming it."""
    space = observation_part(space)
    if not isinstance(space, _FLATTENABLE_SPACES):
        raise ValueError(
            f"Unsupported observation space {space}; supported: Box, Discrete, MultiDiscrete, MultiBinary and Dict."
        )
    return space
