"""Multi-agent sampling faults are errors naming the env copy, the agent and the step.

A hanging PettingZoo env hung a fit for good (844 s, two SIGTERMs ignored); a NaN reward trained
to exit 0 with a NaN episode return; an inf observation or an env exception crashed without
naming the env, the agent or the step. The runner now has the single-agent runner's rules:
``sample_timeout_s``, ``NonFiniteEnvError`` and ``SubEnvError``.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from test_multi_agent_runner import OBS, Fixed, JoinLeave

from lightning_rl.data import MultiAgentDataModule
from lightning_rl.env import MultiAgentEnvRunner, NonFiniteEnvError, SampleTimeoutError, SubEnvError


class Faulty(JoinLeave):
    """JoinLeave whose copy 1 (odd seeds) misbehaves at step 2 (``fault`` says how)."""

    fault = "nan_reward"

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.faulty = seed % 2 == 1  # copy 1 of two, at every full reset
        return super().reset(seed=seed, options=options)

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if self.faulty and self.t == 2:
            if self.fault == "hang":
                time.sleep(3600)
            if self.fault == "raise":
                raise RuntimeError("boom")
        observations, rewards, terminations, truncations, infos = super().step(actions)
        if self.faulty and self.t == 3:
            self.faulty = self.fault != "nan_reward"  # once per full reset
            if self.fault == "nan_reward":
                rewards["b"] = float("nan")
            if self.fault == "inf_obs":
                observations["a"] = observations["a"] + np.array([np.inf, 0], np.float32)
        return observations, rewards, terminations, truncations, infos


def faulty(fault: str) -> type[Faulty]:
    return type(f"Faulty_{fault}", (Faulty,), {"fault": fault})


MODULE = Fixed(OBS, gym.spaces.Discrete(2), [0.0, 5.0])


@pytest.mark.parametrize(
    ("fault", "error", "message"),
    [
        ("nan_reward", NonFiniteEnvError, r"env copy 1, agent 'b', step 2 of its episode: the reward is nan"),
        ("inf_obs", NonFiniteEnvError, r"env copy 1, agent 'a', step 2 of its episode: the observation holds inf"),
        (
            "raise",
            SubEnvError,
            r"env copy 1 raised at step 2 of its episode \(agents \['a', 'b'\]\): RuntimeError: boom",
        ),
    ],
)
def test_a_bad_step_is_an_error_naming_the_copy_the_agent_and_the_step(fault: str, error: type, message: str):
    with MultiAgentEnvRunner(faulty(fault), num_envs=2, seed=0) as runner:
        with pytest.raises(error, match=message):
            runner.sample(MODULE, num_env_steps=5, explore=False)
        with pytest.raises(error, match=message):  # evaluation too
            runner.sample_episodes(MODULE, num_episodes=4)


def test_a_hanging_env_is_a_sample_timeout_naming_the_copy():
    with MultiAgentEnvRunner(faulty("hang"), num_envs=2, seed=0, sample_timeout_s=1.0) as runner:
        start = time.monotonic()
        with pytest.raises(SampleTimeoutError, match=r"sample_timeout_s=1.0: env copy 1 did not return from step 2"):
            runner.sample(MODULE, num_env_steps=5, explore=False)
        assert time.monotonic() - start < 30


def test_sample_timeout_s_is_checked_and_reaches_the_runners():
    with pytest.raises(ValueError, match="sample_timeout_s must be"):
        MultiAgentDataModule("pettingzoo.classic.connect_four_v3", sample_timeout_s=0)
    data = MultiAgentDataModule("pettingzoo.classic.connect_four_v3", sample_timeout_s=5.0)
    try:
        assert data.train_runner.sample_timeout_s == 5.0
    finally:
        data.teardown("fit")


def test_drop_episode_throws_a_nonfinite_episode_away_and_goes_on():
    with MultiAgentEnvRunner(faulty("nan_reward"), num_envs=2, seed=0, on_nonfinite="drop_episode") as runner:
        with pytest.warns(UserWarning, match=r"env copy 1, agent 'b', step 2 of its episode: the reward is nan"):
            episodes = runner.sample(MODULE, num_env_steps=10, explore=False)
        assert runner.num_nonfinite_env_steps >= 1
        for episode in episodes:  # nothing NaN reaches the Learner
            for agent_episode in episode.agent_episodes.values():
                assert np.isfinite(agent_episode.rewards).all()
        assert np.isfinite(runner.get_metrics()["episode_return_mean"])
        with pytest.warns(UserWarning, match="dropped"):
            evaluated = runner.sample_episodes(MODULE, num_episodes=4)
        assert len(evaluated) == 4  # others played in the dropped ones' place
        assert all(episode.is_done for episode in evaluated)
    with pytest.raises(ValueError, match="on_nonfinite must be one of"):
        MultiAgentEnvRunner(JoinLeave, on_nonfinite="ignore")


def test_an_evaluation_that_drops_more_episodes_than_it_plays_is_an_error():
    runner = MultiAgentEnvRunner(faulty("inf_obs"), num_envs=2, seed=0, on_nonfinite="drop_episode")
    # Copy 1 returns inf in every episode: its games are dropped one after another.
    with runner, pytest.warns(UserWarning), pytest.raises(NonFiniteEnvError, match=r"evaluation dropped 5 episodes"):
        runner.sample_episodes(MODULE, num_episodes=4)


class RaisesOnce(JoinLeave):
    """JoinLeave whose first instance to reach step 2 raises there, once; its rebuilt copies do not."""

    raised = 0

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if self.t == 2 and type(self).raised == 0:
            type(self).raised += 1
            raise RuntimeError("boom")
        return super().step(actions)


def raises_once() -> type[RaisesOnce]:
    return type("RaisesOnceHere", (RaisesOnce,), {"raised": 0})


def test_restart_failed_sub_environments_rebuilds_the_copy_that_raised_and_goes_on():
    with MultiAgentEnvRunner(raises_once(), num_envs=2, seed=0, restart_failed_sub_environments=True) as runner:
        with pytest.warns(UserWarning, match=r"RuntimeError: boom; the env copy is rebuilt"):
            episodes = runner.sample(MODULE, num_env_steps=10, explore=False)
        assert runner.num_env_restarts == 1
        assert runner.get_metrics()["num_env_restarts_lifetime"] == 1.0
        assert sum(episode.env_steps() for episode in episodes) > 0
        for episode in episodes:  # the failed copy's unfinished episode is dropped, the others are whole
            for agent_episode in episode.agent_episodes.values():
                assert np.isfinite(agent_episode.rewards).all()
    # Evaluation: the failed copy's game is replaced, so all the games asked for are played out.
    with MultiAgentEnvRunner(raises_once(), num_envs=2, seed=0, restart_failed_sub_environments=True) as runner:
        with pytest.warns(UserWarning, match="the env copy is rebuilt"):
            evaluated = runner.sample_episodes(MODULE, num_episodes=4)
        assert len(evaluated) == 4 and all(episode.is_done for episode in evaluated)
        assert runner.num_env_restarts == 1


def test_the_restart_count_is_saved_and_restored():
    # It was not in the saved state: a resumed run counted its restarts from 0 again.
    with MultiAgentEnvRunner(raises_once(), num_envs=2, seed=0, restart_failed_sub_environments=True) as runner:
        with pytest.warns(UserWarning, match="the env copy is rebuilt"):
            runner.sample(MODULE, num_env_steps=10, explore=False)
        state = runner.get_state()
    assert state["num_env_restarts_lifetime"] == 1
    with MultiAgentEnvRunner(JoinLeave, num_envs=2, seed=0) as restored:
        restored.set_state(state)
        assert restored.get_metrics()["num_env_restarts_lifetime"] == 1.0
        # A state saved before the count existed restores it as 0.
        restored.set_state({key: value for key, value in state.items() if key != "num_env_restarts_lifetime"})
        assert restored.num_env_restarts == 0


def test_evaluation_builds_no_more_copies_than_the_episodes_it_plays():
    # evaluation_num_envs was not capped: 1,000 copies were built to play 4 episodes.
    data = MultiAgentDataModule(JoinLeave, num_envs=2, evaluation_num_envs=1000, evaluation_num_episodes=4)
    assert data.eval_runner.num_envs == 4
    data.eval_runner.close()


def test_restart_failed_sub_environments_is_checked_and_reaches_the_runners():
    with pytest.raises(ValueError, match="restart_failed_sub_environments must be True or False"):
        MultiAgentEnvRunner(JoinLeave, restart_failed_sub_environments="yes")
    with pytest.raises(ValueError, match="restart_failed_sub_environments must be True or False"):
        MultiAgentDataModule("pettingzoo.classic.connect_four_v3", restart_failed_sub_environments=1)
    data = MultiAgentDataModule("pettingzoo.classic.connect_four_v3", restart_failed_sub_environments=True)
    try:
        assert data.train_runner.restart_failed_sub_environments is True
    finally:
        data.teardown("fit")
