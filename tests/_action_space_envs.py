"""Two tiny envs with the action spaces beyond Discrete and 1-D Box; importing this module registers them.

``MatchTargetsEnv`` (``MultiDiscrete``): each step shows ``k`` targets one-hot; each action
dimension earns ``1 / k`` for choosing its target, so an episode's return is at most its
length and a uniformly random policy earns ``mean(1 / nvec)`` per step.

``ReachTargetsEnv`` (``Box`` of shape ``(2, 3)``): each step shows a target in the box; the
reward is minus the mean squared distance of the action from it.

Both check every action they are stepped with: its shape is the space's and it lies in the
space, so a test that steps them proves the action column kept the space's shape on its way
from the module to the env. The CLI tests name them by id, ``_action_space_envs:<ID>``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

MATCH_TARGETS_ID = "LightningRLTest/MatchTargets-v0"
REACH_TARGETS_ID = "LightningRLTest/ReachTargets-v0"
NVEC = (3, 4, 2)
ACTION_SHAPE = (2, 3)
EPISODE_STEPS = 16


class MatchTargetsEnv(gym.Env):
    """Match ``len(nvec)`` targets at once; the observation shows them one-hot, concatenated.

    Args:
        nvec: The number of choices of each action dimension.
        episode_steps: Steps until the episode is truncated.
    """

    def __init__(self, nvec: tuple[int, ...] = NVEC, episode_steps: int = EPISODE_STEPS) -> None:
        self.nvec = np.asarray(nvec, dtype=np.int64)
        self.episode_steps = episode_steps
        self.action_space = gym.spaces.MultiDiscrete(self.nvec)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (int(self.nvec.sum()),), np.float32)
        self._offsets = np.concatenate([[0], np.cumsum(self.nvec)[:-1]])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._new_targets(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = np.asarray(action)
        if action.shape != self.action_space.shape or not self.action_space.contains(action.astype(np.int64)):
            raise ValueError(f"MatchTargetsEnv got the action {action!r}, not one of {self.action_space}")
        reward = float(np.mean(action == self._targets))
        self._t += 1
        return self._new_targets(), reward, False, self._t >= self.episode_steps, {}

    def best_action(self) -> np.ndarray:
        """The action that earns the most now: every target."""
        return self._targets.copy()

    def _new_targets(self) -> np.ndarray:
        self._targets = self.np_random.integers(0, self.nvec)
        obs = np.zeros(self.observation_space.shape, np.float32)
        obs[self._offsets + self._targets] = 1.0
        return obs


class ReachTargetsEnv(gym.Env):
    """Act as close as possible to a target in ``[-0.8, 0.8]^(2, 3)`` that the observation shows flat.

    Args:
        episode_steps: Steps until the episode is truncated.
    """

    def __init__(self, episode_steps: int = EPISODE_STEPS) -> None:
        self.episode_steps = episode_steps
        self.action_space = gym.spaces.Box(-1.0, 1.0, ACTION_SHAPE, np.float32)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (int(np.prod(ACTION_SHAPE)),), np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._new_target(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = np.asarray(action)
        if action.shape != ACTION_SHAPE or not self.action_space.contains(action.astype(np.float32)):
            raise ValueError(f"ReachTargetsEnv got the action {action!r}, not one of {self.action_space}")
        reward = -float(np.mean((action - self._target.reshape(ACTION_SHAPE)) ** 2))
        self._t += 1
        return self._new_target(), reward, False, self._t >= self.episode_steps, {}

    def best_action(self) -> np.ndarray:
        """The action that earns the most now: the target, in the action's shape."""
        return self._target.reshape(ACTION_SHAPE).copy()

    def _new_target(self) -> np.ndarray:
        self._target = self.np_random.uniform(-0.8, 0.8, self.observation_space.shape).astype(np.float32)
        return self._target.copy()


for _env_id, _env_class in ((MATCH_TARGETS_ID, MatchTargetsEnv), (REACH_TARGETS_ID, ReachTargetsEnv)):
    if _env_id not in gym.registry:
        gym.register(_env_id, entry_point=_env_class)
