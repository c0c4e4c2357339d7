"""What the tests that pin our gradient steps to Stable-Baselines3's share: a fixed replay, a spaces-only env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from torch import nn

from lightning_rl.algorithms.off_policy import BATCH_INDEXES
from lightning_rl.core.columns import Columns


class FixedReplay:
    """Hands our Learner the given minibatch (a uniform replay's columns)."""

    def __init__(self, batch: dict[str, np.ndarray]) -> None:
        self.batch = batch

    def sample(self, batch_size: int, *, n_step: int, gamma: float) -> dict[str, np.ndarray]:
        return {**self.batch, BATCH_INDEXES: np.arange(len(self.batch[Columns.OBS]))}

    def update_priorities(self, batch_indexes: np.ndarray, td_errors: np.ndarray) -> None:
        pass


def spaces_only_env(observation_space: gym.Space, action_space: gym.Space) -> gym.Env:
    """An env with only the spaces SB3 builds its networks from; never stepped."""
    env = gym.Env()
    env.observation_space, env.action_space = observation_space, action_space
    return env


def linears(network: nn.Module) -> list[nn.Linear]:
    """The ``Linear`` layers of ``network``, in order."""
    return [layer for layer in network.modules() if isinstance(layer, nn.Linear)]
