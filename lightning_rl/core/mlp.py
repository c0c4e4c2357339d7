"""MLP builders and observation flattening for modules built from a ``model_config``.

The algorithm modules (BC, PPO, DQN, SAC, ...) build their networks from ``model_config`` keys
``fcnet_hiddens`` and ``fcnet_activation`` (PPO's separate policy and value networks from their
``pi_``/``vf_`` variants where set), and feed them observations flattened to one
float vector per row as gymnasium's ``gym.spaces.flatten`` lays them out (image observations
go through a CNN first: :mod:`lightning_rl.core.encoders`); these helpers are that shared part.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import torch
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


def separate_network_layers(config: Mapping[str, Any], network: str) -> tuple[list[int], str]:
    """The hidden layer sizes and activation of a ``PPOModule``'s separate policy or value MLP.

    ``pi_fcnet_hiddens`` / ``vf_fcnet_hiddens`` and their activations where set, else
    ``fcnet_hiddens`` and ``fcnet_activation``.

    Args:
        config: A resolved ``model_config`` (every key set, as ``resolved_model_config()`` returns).
        network: ``"pi"`` or ``"vf"``.

    Raises:
        ValueError: For another ``network``.
    """
    if network not in ("pi", "vf"):
        raise ValueError(f"network must be 'pi' or 'vf', got {network!r}")
    hiddens = config[f"{network}_fcnet_hiddens"]
    activation = config[f"{network}_fcnet_activation"]
    return (
        list(config["fcnet_hiddens"] if hiddens is None else hiddens),
        config["fcnet_activation"] if activation is None else activation,
    )


def flat_obs_dim(space: gym.Space) -> int:
    """Return the size of one observation after :func:`flatten_obs` (``gym.spaces.flatdim``).

    Args:
        space: A ``Box``, ``Discrete``, ``MultiDiscrete`` or ``MultiBinary`` observation space, a
            ``Dict`` or ``Tuple`` of those (stored flattened, see
            :mod:`~lightning_rl.core.observation_layout`), or a masked space
            (:mod:`~lightning_rl.core.action_masks`) whose observation part is one.

    Raises:
        ValueError: For other observation spaces.
    """
    return ObservationFlattener.of(space).width


def flatten_obs(obs: Tensor, space: gym.Space) -> Tensor:
    """Turn a batch of observations into float vectors ``[B, flat_obs_dim(space)]``, as ``gym.spaces.flatten`` does.

    Args:
        obs: A batch of observations from ``space``, shape ``[B, *space.shape]``; for a masked
            space, of its observation part (the ``obs`` column; the mask is a column of its own);
            for a ``Dict`` or ``Tuple`` space, the stored flat rows ``[B, flatdim]``.
        space: As for :func:`flat_obs_dim`.

    Raises:
        ValueError: For other observation spaces.
    """
    return ObservationFlattener.of(space)(obs)


@dataclasses.dataclass(frozen=True)
class ObservationFlattener:
    """gymnasium's flatten layout for a batch of one space's observations, read off the space once.

    ``Box`` and ``MultiBinary``: raveled; ``Discrete``: one-hot; ``MultiDiscrete``: the one-hots
    of its dims side by side; a ``Dict`` or ``Tuple``: its stored rows, which hold that layout
    already. Values become float32 as they are, never rescaled. Only Python ints are kept, so
    that ``torch.compile`` traces a call without a graph break.

    Args:
        width: The flat size of one observation.
        one_hot_sizes: For ``Discrete`` (one) and ``MultiDiscrete`` spaces, the number of values
            of each dim; ``None`` for the others.
        one_hot_starts: The smallest value of each of those dims.
    """

    width: int
    one_hot_sizes: tuple[int, ...] | None = None
    one_hot_starts: tuple[int, ...] | None = None

    @classmethod
    def of(cls, space: gym.Space) -> ObservationFlattener:
        """The flattener of ``space`` (see :func:`flat_obs_dim` for the spaces it takes).

        Raises:
            ValueError: For other observation spaces.
        """
        space = stored_observation_space(observation_part(space))
        if isinstance(space, gym.spaces.Discrete):
            return cls(int(space.n), (int(space.n),), (int(space.start),))
        if isinstance(space, gym.spaces.MultiDiscrete):
            sizes = tuple(int(n) for n in space.nvec.reshape(-1))
            return cls(sum(sizes), sizes, tuple(int(start) for start in space.start.reshape(-1)))
        if isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary)):
            return cls(math.prod(space.shape))
        raise ValueError(
            f"Unsupported observation space {space}; supported: Box, Discrete, MultiDiscrete, MultiBinary, and Dict "
            "or Tuple spaces of those."
        )

    def __call__(self, obs: Tensor) -> Tensor:
        """``[B, ...]`` observations as float32 ``[B, width]``."""
        rows = obs.shape[0]  # the width from the space, not -1: a batch of no rows has no -1 to infer
        if self.one_hot_sizes is None:
            return obs.reshape(rows, self.width).float()
        # Each dim's one-hot begins where the previous dims' end.
        offsets = [0, *itertools.accumulate(self.one_hot_sizes)][:-1]
        shift = torch.as_tensor([o - s for o, s in zip(offsets, self.one_hot_starts)], device=obs.device)
        columns = obs.reshape(rows, len(self.one_hot_sizes)).long() + shift
        return torch.zeros((rows, self.width), device=obs.device).scatter_(1, columns, 1.0)
