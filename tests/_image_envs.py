"""Small image-observation envs for the encoder tests, importable by path as users name their own.

``_image_envs.make_bright_side_env`` builds :class:`BrightSideEnv` (the CLI tests name it so).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

IMAGE_SHAPE = (10, 10, 3)
EPISODE_STEPS = 8


class BrightSideEnv(gym.Env):
    """10x10x3 uint8 images, one half lit: the action naming the lit half (0 left, 1 right) earns 1.

    Episodes last :data:`EPISODE_STEPS` steps; a random policy earns half of them.

    Args:
        render_mode: Ignored (no rendering); taken so data modules may pass one.
    """

    observation_space = gym.spaces.Box(0, 255, IMAGE_SHAPE, np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self._side = 0
        self._steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._steps = 0
        return self._observe(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(int(action) == self._side)
        self._steps += 1
        return self._observe(), reward, False, self._steps >= EPISODE_STEPS, {}

    def _observe(self) -> np.ndarray:
        self._side = int(self.np_random.integers(2))
        image = self.np_random.integers(0, 60, IMAGE_SHAPE, dtype=np.uint8)
        columns = slice(0, 5) if self._side == 0 else slice(5, 10)
        image[:, columns] += 190
        return image


def make_bright_side_env(render_mode: str | None = None) -> gym.Env:
    """A :class:`BrightSideEnv`."""
    return BrightSideEnv(render_mode=render_mode)
