"""Action masks: PettingZoo's ``{"action_mask", "observation"}`` observations, and masking logits.

Turn-based games (PettingZoo's classic envs) give each agent an observation space
``Dict({"action_mask": Box(0, 1, (n,), int8), "observation": <space>})`` beside a
``Discrete(n)`` action space: the mask says which of the ``n`` actions are legal now.
Batches never hold dicts: a module built on such a space keeps the Dict as its
``observation_space`` (so specs and checkpoints say what the env gives), takes the
observation part in the ``obs`` column and the mask in the ``action_mask`` column
(``Tensor[B, n]``, bool or 0/1 ints), and the base :class:`~lightning_rl.core.rl_modules.RLModule`
masks its action-distribution inputs with :func:`apply_action_mask`.

Masks are for ``Discrete`` action spaces only (one value per action);
:func:`check_maskable_action_space` refuses others where a mask meets a module, so that a
mask of the right width never silently masks, say, a ``MultiDiscrete`` space's concatenated logits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor

from lightning_rl.core.columns import Columns

ACTION_MASK = Columns.ACTION_MASK
"""The batch column (and Dict-observation key) holding which actions are legal: ``"action_mask"``."""

OBSERVATION = "observation"
"""The Dict-observation key holding the observation itself, beside ``ACTION_MASK``."""

NEXT_ACTION_MASK = "next_action_mask"
"""The replay column of which actions are legal in ``new_obs``: what a Q-learning target maximizes over."""

_MASKED_KEYS = frozenset({ACTION_MASK, OBSERVATION})


def is_action_masked_space(space: gym.Space | None) -> bool:
    """Whether ``space`` is a masked observation space: a ``Dict`` of exactly ``action_mask`` and ``observation``.

    Args:
        space: An observation space, or ``None`` (a container module has none).
    """
    return isinstance(space, gym.spaces.Dict) and set(space.spaces) == _MASKED_KEYS


def observation_part(space: gym.Space | None) -> gym.Space | None:
    """The space of the observation itself: the ``"observation"`` subspace of a masked space, else ``space``.

    What a module's networks see (:func:`~lightning_rl.core.mlp.flat_obs_dim`,
    :func:`~lightning_rl.core.mlp.flatten_obs`) and what the ``obs`` column's shape is checked against.

    Args:
        space: An observation space (``None``, a container's, is returned as it is).
    """
    return space[OBSERVATION] if is_action_masked_space(space) else space


def check_maskable_action_space(action_space: gym.Space | None, owner: str) -> None:
    """Raise unless action masks apply to ``action_space``: a ``Discrete`` one.

    Called where a mask meets a module: when a module is built on a masked observation space,
    and when a pass or ``compute_actions`` gets an ``action_mask``.

    Args:
        action_space: The module's (or agent's) action space.
        owner: Names the module or agent in the message.

    Raises:
        ValueError: For any other action space, naming it.
    """
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(
            f"{owner} has the action space {action_space}, but action masks ({ACTION_MASK!r}) are for Discrete "
            "action spaces only (one value per action; MultiDiscrete and Box actions cannot be masked); "
            "give the module a Discrete action space, or drop the mask from the observations"
        )


def split_masked_observation(obs: Mapping[str, Any]) -> tuple[Any, Any]:
    """Split one masked observation ``{"action_mask": m, "observation": o}`` into ``(o, m)``.

    Args:
        obs: One observation from a masked space.

    Raises:
        ValueError: If ``obs`` is not a dict with both keys.
    """
    if not isinstance(obs, Mapping) or not _MASKED_KEYS <= set(obs):
        got = sorted(obs) if isinstance(obs, Mapping) else type(obs).__name__
        raise ValueError(f"a masked observation must be a dict with keys {sorted(_MASKED_KEYS)}, got {got}")
    return obs[OBSERVATION], obs[ACTION_MASK]


def apply_action_mask(logits: Tensor, mask: Tensor) -> Tensor:
    """Set the logits of illegal actions to the dtype's lowest value; legal ones pass unchanged.

    A masked logit gets exactly zero probability under a softmax and exactly zero gradient
    (``torch.where`` routes no gradient to the branch it did not take). The lowest finite value
    rather than ``-inf`` keeps log-probabilities, entropies and KL terms finite.

    Args:
        logits: ``[B, n]`` action-distribution inputs of a ``Discrete(n)`` action space.
        mask: ``[B, n]``: true (or 1) where the action is legal.

    Raises:
        ValueError: If the shapes differ.
    """
    if tuple(mask.shape) != tuple(logits.shape):
        raise ValueError(
            f"column {ACTION_MASK!r} has shape {tuple(mask.shape)}, but the action-distribution inputs it masks "
            f"have shape {tuple(logits.shape)}; a mask holds one value per action of a Discrete action space"
        )
    return torch.where(mask.to(logits.device).bool(), logits, torch.finfo(logits.dtype).min)


def masked_argmax(values: Tensor, mask: Tensor | None) -> Tensor:
    """The index of the largest value per row among the legal actions (all actions without a mask).

    A row without any legal action (a terminal state's) gets some index, never an error: its
    value must not matter to the caller (a Q target multiplies it by a zero discount).

    Args:
        values: ``[B, n]`` per-action values (Q values, logits).
        mask: ``[B, n]``, true (or 1) where the action is legal, or ``None``.

    Raises:
        ValueError: If the shapes differ.
    """
    return (values if mask is None else apply_action_mask(values, mask)).argmax(-1)


def random_legal_actions(mask: Tensor) -> Tensor:
    """One action index per row, uniformly among the row's legal actions (torch's global generator).

    Each legal action gets a uniform score in [0, 1), each illegal one -1; the argmax is then
    uniform over the legal actions. A row without legal actions gets index 0.

    Args:
        mask: ``[B, n]``, true (or 1) where the action is legal.
    """
    legal = mask.bool()
    scores = torch.rand(legal.shape, device=legal.device)
    return torch.where(legal, scores, -1.0).argmax(-1)
