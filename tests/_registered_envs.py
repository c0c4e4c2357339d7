"""A module that registers a namespaced env id when imported and defines an env factory.

The CLI tests name it as a user names their own package: ``_registered_envs:LightningRLTest/ShortCartPole-v0``
(gymnasium's module:EnvId form) and ``_registered_envs.make_short_cartpole`` (a factory by import path).
"""

from __future__ import annotations

import gymnasium as gym

NAMESPACED_ID = "LightningRLTest/ShortCartPole-v0"
EPISODE_STEPS = 20


def make_short_cartpole(max_episode_steps: int = EPISODE_STEPS, render_mode: str | None = None) -> gym.Env:
    """CartPole whose episodes end after ``max_episode_steps`` steps."""
    return gym.make("CartPole-v1", max_episode_steps=max_episode_steps, render_mode=render_mode)


NOT_A_FACTORY = 3

if NAMESPACED_ID not in gym.registry:
    gym.register(
        NAMESPACED_ID,
        entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        max_episode_steps=EPISODE_STEPS,
    )
