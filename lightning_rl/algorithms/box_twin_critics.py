"""What the modules of SAC, CQL and IQL share: actions in ``[-1, 1]`` rescaled to a bounded Box, and twin Q critics.

Their actors act in ``[-1, 1]^d`` (``d`` the Box's numbers), rescaled affinely to the Box's
``[low, high]`` and reshaped to its shape for the environment, so batches hold env-space
actions. Their critics ``qf`` and ``qf_twin`` map ``concat(features, action in [-1, 1])`` to a
Q-value, the features from one observation encoder ``qf_obs_encoder`` shared by the twins, and
have frozen ``target_`` copies (``make_target_networks``) that a ``TargetNetworkUpdate``
averages. :class:`BoxTwinCriticModule` holds that part; each algorithm's module adds its actor
and its own networks.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor, nn

from lightning_rl.core.columns import Columns
from lightning_rl.core.encoders import build_observation_encoder
from lightning_rl.core.mlp import build_mlp
from lightning_rl.core.rl_modules import RLModule
from lightning_rl.core.target_network import TargetNetworkAPI, make_target_network

# forward_target's outputs (RLlib's names).
QF_TARGET_PREDS = "qf_target_preds"
QF_TWIN_TARGET_PREDS = "qf_twin_target_preds"


def check_bounded_box_actions(owner: str, action_space: gym.Space, *, otherwise: str) -> None:
    """Raise ``ValueError`` unless ``action_space`` is a ``Box`` (of any shape) with finite bounds.

    The tanh-squashed actors of SAC, CQL and IQL rescale ``[-1, 1]`` to the Box's bounds.

    Args:
        owner: The module class the message names.
        action_space: The space to check.
        otherwise: What the message suggests for Discrete or MultiDiscrete actions.
    """
    if not isinstance(action_space, gym.spaces.Box):
        raise ValueError(
            f"{owner} needs a Box action space (continuous actions), got {action_space}; "
            f"for Discrete or MultiDiscrete actions use {otherwise}"
        )
    if not action_space.is_bounded("both"):
        raise ValueError(
            f"{owner} rescales tanh actions to the Box's bounds, which must be finite; got {action_space}"
        )


def critic_target_pairs(module: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
    """``(online, target)`` pairs of a module with ``qf_obs_encoder``, ``qf``, ``qf_twin`` and their ``target_`` copies.

    The encoder's pair comes first and only when it has weights: a flat observation's encoder
    has nothing to average.
    """
    pairs = [(module.qf, module.target_qf), (module.qf_twin, module.target_qf_twin)]
    if next(module.qf_obs_encoder.parameters(), None) is not None:
        pairs.insert(0, (module.qf_obs_encoder, module.target_qf_obs_encoder))
    return pairs


class BoxTwinCriticModule(RLModule, TargetNetworkAPI):
    """A module acting in a bounded Box through ``[-1, 1]^d``, with twin Q critics and their target copies.

    A subclass's ``setup`` calls :meth:`setup_action_bounds` first, builds its actor, then (unless
    ``inference_only``) :meth:`setup_twin_critics`, its other trainable networks and
    :meth:`make_target_networks` last, so the targets start as copies of the built critics.
    """

    def setup_action_bounds(self) -> None:
        """Set ``action_dim`` (``d``) and the affine map between ``[-1, 1]^d`` and the Box (buffers, not saved)."""
        space = self.action_space
        self.action_dim = math.prod(space.shape)
        low = torch.as_tensor(space.low, dtype=torch.float32).reshape(-1)
        high = torch.as_tensor(space.high, dtype=torch.float32).reshape(-1)
        # Derived from the space, so not saved: they move with the module between devices.
        self.register_buffer("action_center", (high + low) / 2, persistent=False)
        self.register_buffer("action_scale", (high - low) / 2, persistent=False)

    def setup_twin_critics(self, config: dict[str, Any], hiddens: list[int], activation: str) -> None:
        """Build ``qf_obs_encoder`` (from ``config``'s encoder keys) and the critics ``qf``, ``qf_twin`` (MLPs)."""
        self.qf_obs_encoder = build_observation_encoder(self.observation_space, config)
        critic_in = self.qf_obs_encoder.out_dim + self.action_dim
        self.qf = build_mlp(critic_in, hiddens, activation, 1)
        self.qf_twin = build_mlp(critic_in, hiddens, activation, 1)

    # ---- TargetNetworkAPI ----------------------------------------------------------------

    def make_target_networks(self) -> None:
        """Frozen copies of both critics and of their observation encoder, each named ``target_`` + its name."""
        self.target_qf_obs_encoder = make_target_network(self.qf_obs_encoder)
        self.target_qf = make_target_network(self.qf)
        self.target_qf_twin = make_target_network(self.qf_twin)

    def get_target_network_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        """The ``(online, target)`` pairs of :func:`critic_target_pairs`; none for an inference-only module."""
        if self.inference_only:
            return []
        return critic_target_pairs(self)

    # ---- Critics -------------------------------------------------------------------------

    def critic_features(self, obs: Tensor, *, target: bool = False) -> Tensor:
        """The critics' features of observations (the ``obs`` column), from the online or the target encoder."""
        return (self.target_qf_obs_encoder if target else self.qf_obs_encoder)(obs)

    def critic_input(self, batch: dict[str, Any], *, target: bool = False) -> Tensor:
        """``concat(features, action in [-1, 1])`` of ``batch``'s ``obs`` and env-space ``actions``, ``[B, f + d]``."""
        features = self.critic_features(batch[Columns.OBS], target=target)
        return torch.cat([features, self.normalize_actions(batch[Columns.ACTIONS])], dim=-1)

    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The target critics' Q-values of ``batch``'s observations and env-space actions.

        Args:
            batch: ``{"obs": Tensor[B, ...], "actions": Tensor[B, *action_shape]}``.

        Returns:
            ``{"qf_target_preds": [B], "qf_twin_target_preds": [B]}``.
        """
        q_in = self.critic_input(batch, target=True)
        return {
            QF_TARGET_PREDS: self.target_qf(q_in).squeeze(-1),
            QF_TWIN_TARGET_PREDS: self.target_qf_twin(q_in).squeeze(-1),
        }

    # ---- Actions -------------------------------------------------------------------------

    def normalize_actions(self, actions: Tensor) -> Tensor:
        """Map env-space actions ``[B, *action_shape]`` in ``[low, high]`` to flat ``[B, d]`` in ``[-1, 1]``."""
        flat = actions.reshape(actions.shape[0], self.action_dim)  # not -1: a batch may have no rows
        return (flat.float() - self.action_center) / self.action_scale

    def unnormalize_actions(self, actions: Tensor) -> Tensor:
        """Map flat ``[B, d]`` actions in ``[-1, 1]`` to env space ``[B, *action_shape]`` in ``[low, high]``."""
        return (self.action_center + self.action_scale * actions).reshape(actions.shape[0], *self.action_space.shape)
