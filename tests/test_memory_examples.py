"""The memory examples' envs: what their configs name resolves through the env factory and plays.

The configs themselves train once recurrent PPO lands; until then this checks only the env
half (POPGym's task skips without the optional ``popgym`` package).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from lightning_rl.env.env_factory import make_env, resolve_env

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _env_of(example: str) -> str:
    return yaml.safe_load((EXAMPLES / example).read_text())["data"]["init_args"]["env"]


def test_the_cartpole_example_names_the_registered_env_without_velocities():
    env = make_env(resolve_env(_env_of("ppo_cartpole_novel_lstm.yaml")), {}, [])
    assert env.observation_space.shape == (2,) and env.spec.max_episode_steps == 500


def test_the_popgym_example_env_is_a_51_step_card_game_with_discrete_spaces():
    pytest.importorskip("popgym")
    env = make_env(resolve_env(_env_of("ppo_popgym_lstm.yaml")), {}, [])
    assert env.observation_space.n == 4 and env.action_space.n == 4
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    total, steps, done = 0.0, 0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(int(rng.integers(4)))
        assert env.observation_space.contains(obs)
        total, steps, done = total + reward, steps + 1, terminated or truncated
    # One deck: 51 deals after the first card; 48 graded guesses of +-1/48 each.
    assert steps == 51 and terminated and -1.0 <= total <= 1.0
