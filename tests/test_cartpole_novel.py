"""CartPole without velocities (``lightning_rl/CartPoleNoVel-v1``): the memory task of the recurrent examples."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
import yaml

from lightning_rl.env import CARTPOLE_NO_VEL_ID, CartPoleNoVelocity
from lightning_rl.env.env_factory import make_env, resolve_env, resolve_wrappers


def test_the_env_observes_only_the_cart_position_and_the_pole_angle():
    env = gym.make(CARTPOLE_NO_VEL_ID)
    full = gym.make("CartPole-v1")
    assert env.observation_space.shape == (2,) and env.observation_space.dtype == np.float32
    # CartPole's bounds of entries 0 and 2 (position +-4.8, angle +-24 degrees).
    np.testing.assert_array_equal(env.observation_space.low, full.observation_space.low[[0, 2]])
    np.testing.assert_array_equal(env.observation_space.high, full.observation_space.high[[0, 2]])
    assert env.action_space == full.action_space
    assert env.spec.max_episode_steps == 500 and env.spec.reward_threshold == 475.0
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2,) and obs.dtype == np.float32 and env.observation_space.contains(obs)


def test_a_seeded_episode_has_cartpole_v1_dynamics_with_the_velocities_dropped():
    env, full = gym.make(CARTPOLE_NO_VEL_ID), gym.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    full_obs, _ = full.reset(seed=3)
    np.testing.assert_array_equal(obs, full_obs[[0, 2]])
    # Actions that keep the pole up a while, then push one way until it falls: a long episode
    # that ends by termination, so every step's dynamics and the terminal step are compared.
    rng = np.random.default_rng(0)
    steps, done = 0, False
    while not done:
        action = int(full_obs[2] + 0.5 * full_obs[3] > 0) if steps < 150 else 1
        if steps < 150 and rng.random() < 0.1:
            action = 1 - action
        obs, reward, terminated, truncated, _ = env.step(action)
        full_obs, full_reward, full_terminated, full_truncated, _ = full.step(action)
        np.testing.assert_array_equal(obs, full_obs[[0, 2]])
        assert (reward, terminated, truncated) == (full_reward, full_terminated, full_truncated)
        steps, done = steps + 1, terminated or truncated
    assert steps > 150 and terminated


def test_the_time_limit_is_cartpole_v1s_500_steps():
    env = gym.make(CARTPOLE_NO_VEL_ID)
    env.reset(seed=0)
    # Balance with the full state, read from inside (a linear controller that holds the pole).
    steps, truncated, terminated = 0, False, False
    while not (terminated or truncated):
        x, x_dot, theta, theta_dot = env.unwrapped.state
        action = int(theta + 0.5 * theta_dot + 0.05 * x + 0.1 * x_dot > 0)
        _, _, terminated, truncated, _ = env.step(action)
        steps += 1
    assert (steps, truncated, terminated) == (500, True, False)


def test_the_wrapper_refuses_an_env_that_is_not_cartpole():
    with pytest.raises(ValueError, match=r"CartPoleNoVelocity wraps CartPole"):
        CartPoleNoVelocity(gym.make("Pendulum-v1"))


@pytest.mark.parametrize("spelling", [CARTPOLE_NO_VEL_ID, f"lightning_rl.env.wrappers:{CARTPOLE_NO_VEL_ID}"])
def test_a_config_names_the_env_by_its_id_and_the_factory_builds_it(spelling: str):
    config = yaml.safe_load(f"env: {spelling}\n")  # the YAML form, as an example config writes it
    env = make_env(resolve_env(config["env"]), {}, [])
    assert env.observation_space.shape == (2,)
    assert env.spec.id == CARTPOLE_NO_VEL_ID


def test_the_wrapper_by_import_path_on_cartpole_v1_gives_the_same_observations():
    env = make_env(resolve_env("CartPole-v1"), {}, resolve_wrappers(["lightning_rl.env.wrappers.CartPoleNoVelocity"]))
    registered = gym.make(CARTPOLE_NO_VEL_ID)
    np.testing.assert_array_equal(env.reset(seed=5)[0], registered.reset(seed=5)[0])
    for step in range(20):  # alternating pushes: the pole stays up, no step after termination
        np.testing.assert_array_equal(env.step(step % 2)[0], registered.step(step % 2)[0])


def test_a_spawned_worker_builds_the_env_by_its_id():
    # A fresh process (spawn: nothing inherited) unpickles the env factory, which imports
    # lightning_rl.env and so registers the id there too: nothing to import by hand.
    make_one = functools.partial(make_env, resolve_env(CARTPOLE_NO_VEL_ID), {}, [])
    envs = gym.vector.AsyncVectorEnv([make_one], context="spawn")
    try:
        obs, _ = envs.reset(seed=0)
        np.testing.assert_array_equal(obs[0], gym.make(CARTPOLE_NO_VEL_ID).reset(seed=0)[0])
    finally:
        envs.close()
