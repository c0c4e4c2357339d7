"""A small env with a Dict observation space, for the tests of Dict observations.

The CLI tests name its factory by import path (``_dict_obs_env.make_dict_obs_env``), as a user
names their own. Each observation is ``{"image": uint8 (8, 8, 3), "mode": Discrete(3),
"vector": float32 (3,)}`` (gymnasium sorts a Dict's keys); the reward is 1 when the action equals
``mode``, which the image shows too (channel ``mode`` is lit), so a policy that reads the
observation earns every step's reward and a random one a third of it. Each step's infos carry
the raw observation (``raw_image``, ``raw_mode``, ``raw_vector``), so that tests can compare
what the runner stored with ``gym.spaces.flatten`` of what the env returned.
:class:`TupleObsEnv` is the same env with the observation as a Tuple.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

NUM_MODES = 3
EPISODE_STEPS = 8

DICT_SPACE = gym.spaces.Dict(
    {
        "image": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
        "vector": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
        "mode": gym.spaces.Discrete(NUM_MODES),
    }
)

TUPLE_SPACE = gym.spaces.Tuple(list(DICT_SPACE.spaces.values()))


class DictObsEnv(gym.Env):
    """Pick the action that equals the observation's ``mode``; episodes end after ``episode_steps`` steps."""

    def __init__(self, episode_steps: int = EPISODE_STEPS) -> None:
        self.observation_space = DICT_SPACE
        self.action_space = gym.spaces.Discrete(NUM_MODES)
        self.episode_steps = episode_steps
        self._t = 0
        self._mode = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        obs = self._observe()
        return self._present(obs), _raw_infos(obs)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        reward = float(int(action) == self._mode)
        self._t += 1
        obs = self._observe()
        return self._present(obs), reward, self._t >= self.episode_steps, False, _raw_infos(obs)

    def _observe(self) -> dict[str, Any]:
        self._mode = int(self.np_random.integers(NUM_MODES))
        image = self.np_random.integers(0, 40, size=(8, 8, 3), dtype=np.uint8)
        image[..., self._mode] += 200
        vector = self.np_random.uniform(-1.0, 1.0, size=3).astype(np.float32)
        return {"image": image, "vector": vector, "mode": self._mode}

    def _present(self, obs: dict[str, Any]) -> Any:
        return obs


class TupleObsEnv(DictObsEnv):
    """The same env with the observation as a Tuple ``(image, mode, vector)``."""

    def __init__(self, episode_steps: int = EPISODE_STEPS) -> None:
        super().__init__(episode_steps)
        self.observation_space = TUPLE_SPACE

    def _present(self, obs: dict[str, Any]) -> Any:
        return tuple(obs[key] for key in DICT_SPACE.spaces)


def _raw_infos(obs: dict[str, Any]) -> dict[str, Any]:
    return {f"raw_{key}": np.array(value) for key, value in obs.items()}


def make_dict_obs_env(episode_steps: int = EPISODE_STEPS) -> gym.Env:
    """The env factory the CLI tests name by import path."""
    return DictObsEnv(episode_steps)
