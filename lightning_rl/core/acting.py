"""How an RLModule turns a batch of observations into actions: the one mechanism every actor shares.

The env runner (training rollouts and evaluation episodes), ``Policy.act`` and exported
policy graphs all call :func:`compute_actions`, so a greedy action is the same wherever it is
computed: ``forward_inference`` and the inference distribution's ``deterministic_sample``
when the module returns distribution inputs (PPO, BC), or the module's own ``actions`` (DQN,
SAC). :func:`clip_actions` bounds Box actions as the env runner does before stepping an env.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import torch

from lightning_rl.core.action_masks import check_maskable_action_space
from lightning_rl.core.columns import Columns
from lightning_rl.core.rl_modules import RLModule


def compute_actions(
    module: RLModule,
    obs: torch.Tensor,
    *,
    explore: bool,
    with_logp: bool = True,
    action_mask: torch.Tensor | None = None,
) -> tuple[Mapping[str, Any], torch.Tensor]:
    """One forward pass of ``module`` on a batch of observations, and the actions it chooses.

    Args:
        module: A single-agent RLModule.
        obs: Observations ``[B, *obs_shape]`` on the module's device (of a masked space: the
            observation part).
        explore: ``forward_exploration`` and sampled actions; otherwise ``forward_inference``
            and the most likely actions (the greedy policy evaluation uses).
        with_logp: Add the actions' log-probability (what training stores); acting alone
            (``Policy``, an exported graph) leaves it out.
        action_mask: ``[B, n]``, true (or 1) where an action is legal; passed to the forward
            pass as the ``action_mask`` column, which masks the distribution inputs so that
            illegal actions are neither sampled nor chosen greedily. Required for a module on
            a masked observation space.

    Returns:
        The forward pass's outputs (with ``action_logp`` added when the actions were drawn from
        the action distribution and ``with_logp``) and the actions ``[B, ...]``, not clipped.

    Raises:
        ValueError: If the forward pass returns neither ``actions`` nor ``action_dist_inputs``,
            ``action_mask`` is given to a module whose action space is not ``Discrete``, or (from
            the module) a masked module gets no ``action_mask``.
    """
    forward = module.forward_exploration if explore else module.forward_inference
    batch = {Columns.OBS: obs}
    if action_mask is not None:
        # Here too, not only in the module's passes: a module that picks its actions itself
        # (SAC) never reaches RLModule.mask_action_dist_inputs.
        check_maskable_action_space(module.action_space, type(module).__name__)
        batch[Columns.ACTION_MASK] = action_mask
    out = forward(batch)
    actions = out.get(Columns.ACTIONS)
    if actions is not None:
        # The module chose its actions itself (Q-argmax, a squashed Gaussian's mean): only it
        # can honour a mask, so a module that ignores it fails here, not in the env.
        if action_mask is not None:
            _check_legal(module, actions, action_mask)
        return out, actions
    if Columns.ACTION_DIST_INPUTS not in out:
        raise ValueError(
            f"{type(module).__name__}'s forward pass returned neither "
            f"{Columns.ACTIONS!r} nor {Columns.ACTION_DIST_INPUTS!r}; got {sorted(out)}"
        )
    dist_cls = module.get_exploration_action_dist_cls() if explore else module.get_inference_action_dist_cls()
    dist = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
    actions = dist.sample() if explore else dist.deterministic_sample()
    if with_logp:
        out = dict(out)
        out[Columns.ACTION_LOGP] = dist.logp(actions)
    return out, actions


def clip_actions(actions: torch.Tensor, action_space: gym.Space) -> torch.Tensor:
    """Clip actions to a Box space's bounds, as the env runner does before stepping; others pass unchanged.

    Args:
        actions: ``[B, *action_shape]`` actions.
        action_space: The module's action space.
    """
    if not isinstance(action_space, gym.spaces.Box):
        return actions
    low = torch.as_tensor(action_space.low, dtype=actions.dtype, device=actions.device)
    high = torch.as_tensor(action_space.high, dtype=actions.dtype, device=actions.device)
    return torch.maximum(torch.minimum(actions, high), low)


def _check_legal(module: RLModule, actions: torch.Tensor, action_mask: torch.Tensor) -> None:
    legal = action_mask.bool().gather(1, actions.long().reshape(-1, 1)).squeeze(1)
    if not bool(legal.all()):
        row = int((~legal).nonzero()[0])
        raise ValueError(
            f"{type(module).__name__} chose the illegal action {int(actions.reshape(-1)[row])} in row {row} (its "
            "action_mask forbids it): this module picks its actions itself and does not honour action masks; "
            "act on masked observations with a module that returns action_dist_inputs (PPO, BC, MARWIL)"
        )
