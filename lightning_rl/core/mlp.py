"""MLP builders and observation flattening for modules built from a ``model_config``.

The algorithm modules (BC, PPO, DQN, SAC) build their networks from ``model_config`` keys
``fcnet_hiddens`` and ``fcnet_activation``, and feed them observations flattened to one
float vector per row; these helpers are that shared part.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
from torch import Tensor, nn

from lightning_rl.core.action_masks import observation_part
from lightning_rl.core.observation_layout import stored_observation_space

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

ACTIVATION_NAMES: frozenset[str] = frozenset(_ACTIVATIONS)
"""The ``fcnet_activation`` names :func:`build_mlp` accepts."""


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
    activation_cls = _ACTIVATIONS[activation]
    layers: list[nn.Module] = []
    for size in hiddens:
        layers.append(nn.Linear(in_dim, size))
        if activation_cls is not None:
            layers.append(activation_cls())
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
    """Return the size of one observation after :func:`flatten_obs`.

    Args:
        space: A ``Box`` (flattened) or ``Discrete`` (one-hot encoded) observation space, a
            ``Dict`` or ``Tuple`` of array spaces (stored flattened: ``gym.spaces.flatdim``), or
            a masked space (:mod:`~lightning_rl.core.action_masks`) whose observation part is one.

    Raises:
        ValueError: For other observation spaces.
    """
    space = stored_observation_space(observation_part(space))
    if isinstance(space, gym.spaces.Box):
        return math.prod(space.shape)
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    raise ValueError(f"Unsupported observation space {space}; supported: Box, Discrete, and Dict or Tuple spaces.")


def flatten_obs(obs: Tensor, space: gym.Space) -> Tensor:
    """Turn a batch of observations into float vectors ``[B, flat_obs_dim(space)]``.

    Args:
        obs: A batch of observations from ``space``, shape ``[B, *space.shape]``; for a masked
            space, of its observation part (the ``obs`` column; the mask is a column of its own);
            for a ``Dict`` or ``Tuple`` space, the stored flat rows ``[B, flatdim]``.
        space: A ``Box`` (flattened) or ``Discrete`` (one-hot encoded) observation space, a
            ``Dict`` or ``Tuple`` of array spaces, or a masked space whose observation part is one.

    Raises:
        ValueError: For other observation spaces.
    """
    space = stored_observation_space(observation_part(space))
    if isinstance(space, gym.spaces.Box):
        # The width from the space, not -1: a batch of no rows has no -1 to infer.
        return obs.reshape(obs.shape[0], math.prod(space.shape)).float()
    if isinstance(space, gym.spaces.Discrete):
        return nn.functional.one_hot(obs.long() - int(space.start), int(space.n)).float()
    raise ValueError(f"Unsupported observation space {space}; supported: Box, Discrete, and Dict or Tuple spaces.")

