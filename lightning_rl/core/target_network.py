"""Target networks: slowly moving copies of a module's networks, for stable bootstrap targets.

DQN and SAC compute their regression targets with copies of the Q networks that change
only by explicit updates: a hard copy every few gradient steps, or a Polyak average
``target <- tau * online + (1 - tau) * target`` after each step. A module opts in by
implementing :class:`TargetNetworkAPI`; the ``TargetNetworkUpdate`` callback then updates
its targets after the Learner's gradient updates.

The targets are submodules of the module, so they are saved and restored with it
(checkpoints, ``get_state``), but their parameters do not require gradients, so no
optimizer and no data-parallel gradient reduction sees them.
"""

from __future__ import annotations

import abc
import copy
from typing import Any

import torch
from torch import nn

from lightning_rl.core.arguments import check_number


class TargetNetworkAPI(abc.ABC):
    """What an RLModule implements to have target networks (RLlib's API of the same name)."""

    @abc.abstractmethod
    def make_target_networks(self) -> None:
        """Build the target networks (usually with :func:`make_target_network`); called in ``setup``."""

    @abc.abstractmethod
    def get_target_network_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        """``(online, target)`` pairs, each target a structural copy of its online network."""

    @abc.abstractmethod
    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The target networks' outputs on ``batch`` (no gradients needed)."""


def make_target_network(online: nn.Module) -> nn.Module:
    """A frozen deep copy of ``online``: same weights, parameters without gradients."""
    target = copy.deepcopy(online)
    for param in target.parameters():
        param.requires_grad_(False)
    return target


@torch.no_grad()
def update_target_network(online: nn.Module, target: nn.Module, tau: float) -> None:
    """Move ``target`` towards ``online``: ``target <- tau * online + (1 - tau) * target``.

    ``tau == 1`` copies exactly (a hard update). Buffers (e.g. normalization statistics)
    are always copied, as averaging them has no meaning.

    Args:
        online: The trained network.
        target: Its copy; must have the same parameter names and shapes.
        tau: The step size, in ``(0, 1]``.

    Raises:
        ValueError: If ``tau`` is outside ``(0, 1]`` or the two networks differ in structure.
    """
    check_number("tau", tau, low=0, high=1, low_open=True)
    # Plain parameter lists, not name dicts: this runs after every SAC gradient step.
    online_params, target_params = list(online.parameters()), list(target.parameters())
    if [p.shape for p in online_params] != [p.shape for p in target_params]:
        raise ValueError(
            f"the target network's parameter shapes {[tuple(p.shape) for p in target_params]} differ from the "
            f"online network's {[tuple(p.shape) for p in online_params]}"
        )
    for param, target_param in zip(online_params, target_params):
        if tau == 1:
            target_param.copy_(param)
        else:
            target_param.lerp_(param, tau)
    for buffer, target_buffer in zip(online.buffers(), target.buffers()):
        target_buffer.copy_(buffer)


def update_target_networks(module: TargetNetworkAPI, tau: float) -> None:
    """Apply :func:`update_target_network` to every ``(online, target)`` pair of ``module``."""
    for online, target in module.get_target_network_pairs():
        update_target_network(online, target, tau)
