"""Env faults: hangs, raising envs, dead async workers and NaN values end in named errors, or restarts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from lightning.pytorch import Trainer

from lightning_rl import RLModuleSpec
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.data import OffPolicyDataModule, OnPolicyDataModule
from lightning_rl.env import EnvRunner, NonFiniteEnvError, SampleTimeoutError, SingleAgentEpisode, SubEnvError

MODES = ["sync", "async"]


class FaultyEnv(gym.Env):
    """Observations ``[step in episode, env index]``, reward 1, episodes of ``episode_len`` steps.

    The env whose first reset had seed ``fail_index`` (a runner with ``seed=0`` gives env ``i``
    seed ``i``; ``None`` for envs reset without a seed) misbehaves as ``fault`` says at its
    step ``fail_at`` (counted over episodes). A rebuilt env is reset without a seed, so with
    an int ``fail_index`` it never fails.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(
        self, fault: str = "none", fail_index: int | None = 1, fail_at: int = 3, episode_len: int = 10
    ) -> None:
        self.fault, self.fail_index, self.fail_at, self.episode_len = fault, fail_index, fail_at, episode_len
        self.index: int | None = None
        self.total = 0
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if self.index is None and seed is not None:
            self.index = seed
        self.t = 0
        obs = self._obs()
        if self.fault == "nan_reset" and self.index == self.fail_index:
            obs[1] = np.nan
        return obs, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = 1.0
        obs_fault = None
        if self.index == self.fail_index and self.total == self.fail_at:
            if self.fault == "raise":
                raise ValueError("boom")
            if self.fault == "hang":
                time.sleep(600)
            if self.fault == "exit":
                os._exit(3)
            if self.fault == "shape":
                return np.zeros(3, np.float32), 1.0, False, False, {}
            if self.fault == "nan_reward":
                reward = float("nan")
            obs_fault = {"nan_obs": np.nan, "inf_obs": np.inf}.get(self.fault)
        self.total += 1
        self.t += 1
        obs = self._obs()
        if obs_fault is not None:
            obs[1] = obs_fault
        return obs, reward, self.t >= self.episode_len, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.t, -1 if self.index is None else self.index], dtype=np.float32)


def faulty_runner(fault: str, vectorize_mode: str = "sync", **kwargs: Any) -> EnvRunner:
    env_kwargs = {"fault": fault, **kwargs.pop("env_kwargs", {})}
    options = dict(num_envs=3, rollout_fragment_length=8, seed=0, vectorize_mode=vectorize_mode)
    options.update(kwargs)
    return EnvRunner(FaultyEnv, env_kwargs=env_kwargs, **options)


def policy_for(runner: EnvRunner) -> Any:
    return RLModuleSpec(PPOModule, runner.observation_space, runner.action_space, {"fcnet_hiddens": [4]}).build()


def check_whole_steps(episode: SingleAgentEpisode) -> None:
    """Every step of the chunk is a real transition of one episode: no dropped or rebuilt step in it."""
    steps = episode.observations[:, 0]
    np.testing.assert_array_equal(steps, np.arange(episode.t_started, episode.t_started + len(episode) + 1))
    assert np.isfinite(episode.observations).all() and (episode.rewards == 1.0).all()


# ------------------------------------------------------------------------------------------
# sample_timeout_s
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vectorize_mode", MODES)
def test_a_hanging_env_raises_naming_its_index_after_sample_timeout_s(vectorize_mode: str) -> None:
    with faulty_runner("hang", vectorize_mode, sample_timeout_s=0.5) as runner:
        with pytest.raises(SampleTimeoutError, match=r"env 1 did not return from step\(\) at env step 3") as raised:
            runner.sample(policy_for(runner))
    assert "sample_timeout_s=0.5" in str(raised.value)


def test_a_sync_timeout_leaves_an_earlier_alarm_and_its_handler_in_place() -> None:
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    signal.setitimer(signal.ITIMER_REAL, 300.0)
    try:
        with faulty_runner("none", sample_timeout_s=30.0) as runner:
            runner.sample(policy_for(runner))
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # re-armed with what was left of it
        signal.raise_signal(signal.SIGALRM)
        assert fired == [True]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------------------
# Envs that raise, return a wrong shape, or whose worker exits
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vectorize_mode", MODES)
def test_an_env_that_raises_is_named_with_its_env_step_and_episode_step(vectorize_mode: str) -> None:
    with faulty_runner("raise", vectorize_mode, env_kwargs={"episode_len": 2}) as runner:
        with pytest.raises(SubEnvError, match=r"env 1 raised ValueError: boom in step\(\) at env step 3 \(step 1 of"):
            runner.sample(policy_for(runner))


@pytest.mark.parametrize("vectorize_mode", MODES)
def test_an_observation_of_the_wrong_shape_is_named_with_the_env(vectorize_mode: str) -> None:
    with faulty_runner("shape", vectorize_mode) as runner:
        with pytest.raises(SubEnvError, match=r"env 1 raised ValueError: step\(\) returned an observation of shape \(3,\)"):
            runner.sample(policy_for(runner))


def test_an_async_worker_that_exits_is_named_with_its_exit_code() -> None:
    with faulty_runner("exit", "async") as runner:
        with pytest.raises(SubEnvError, match=r"env 1's worker process exited with code 3 at env step 3"):
            runner.sample(policy_for(runner))


def test_after_an_async_error_the_workers_are_terminated_and_the_next_sample_builds_new_ones() -> None:
    with faulty_runner("raise", "async", num_envs=2, env_kwargs={"fail_at": 12}) as runner:
        policy = policy_for(runner)
        runner.sample(policy)
        old_workers = runner.env.processes
        with pytest.raises(SubEnvError, match="env 1 raised"):
            runner.sample(policy)
        assert not any(worker.is_alive() for worker in old_workers)
        episodes = runner.sample(policy)  # fresh workers (their envs reset with new seeds)
        assert runner.env.processes is not old_workers
    for episode in episodes:
        check_whole_steps(episode)


def test_async_workers_die_on_sigterm_whatever_handler_the_runner_process_had() -> None:
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # as Lightning's: notes the signal, goes on
    try:
        runner = faulty_runner("none", "async", num_envs=2)
    finally:
        signal.signal(signal.SIGTERM, previous)
    worker = runner.env.processes[0]
    worker.terminate()
    worker.join(60)
    assert not worker.is_alive() and worker.exitcode == -signal.SIGTERM
    runner._vector.terminate()


def test_a_failing_async_fit_raises_and_the_process_exits(tmp_path: Path) -> None:
    """The error names the env; no worker keeps the interpreter from exiting (it used to hang here)."""
    script = tmp_path / "fit.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import torch
        torch.set_num_threads(1)
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from lightning.pytorch import Trainer
        from lightning_rl.algorithms.ppo import PPOLearner
        from lightning_rl.data import OnPolicyDataModule
        from test_env_faults import FaultyEnv

        data = OnPolicyDataModule(
            FaultyEnv, env_kwargs={{"fault": "raise", "fail_at": 40}}, num_envs=2, vectorize_mode="async",
            rollout_fragment_length=16, rollouts_per_epoch=2, seed=0, evaluation_num_episodes=1,
        )
        learner = PPOLearner(model_config={{"fcnet_hiddens": [8]}}, minibatch_size=16, num_epochs=1)
        Trainer(
            max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, default_root_dir={str(tmp_path)!r},
        ).fit(learner, datamodule=data)
    """))
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()
        output, _ = child.communicate()
        pytest.fail(f"the process did not exit after the fit failed:\n{output[-3000:]}")
    assert child.returncode != 0
    assert "SubEnvError: env 1 raised ValueError: boom in step() at env step 40" in output


# ------------------------------------------------------------------------------------------
# restart_failed_sub_environments
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vectorize_mode", MODES)
def test_restart_rebuilds_the_failed_env_drops_its_unfinished_episode_and_counts_it(vectorize_mode: str) -> None:
    with faulty_runner("raise", vectorize_mode, restart_failed_sub_environments=True) as runner:
        policy = policy_for(runner)
        episodes = runner.sample(policy)
        metrics = runner.get_metrics()
        later = runner.sample(policy)
    for episode in episodes + later:
        check_whole_steps(episode)
    # Env 1's steps 0-3 (the failed one included) are dropped; its rebuilt env starts afresh.
    rebuilt = [episode for episode in episodes if episode.observations[0, 1] == -1]
    assert [(episode.t_started, len(episode)) for episode in rebuilt] == [(0, 4)]
    assert metrics["num_env_restarts"] == 1
    assert metrics["num_env_steps_sampled"] == 3 * 8 - 4
    assert runner.get_metrics()["num_env_restarts"] == 1


def test_restart_rebuilds_every_async_worker_when_one_exits_and_drops_the_running_episodes() -> None:
    with faulty_runner("exit", "async", num_envs=2, restart_failed_sub_environments=True) as runner:
        with pytest.warns(UserWarning, match="env 1's worker process exited with code 3: rebuilding all 2"):
            episodes = runner.sample(policy_for(runner))
        metrics = runner.get_metrics()
    for episode in episodes:
        check_whole_steps(episode)
        assert episode.t_started == 0 and episode.observations[0, 1] == -1  # only the rebuilt envs' episodes
    assert metrics["num_env_restarts"] == 2
    assert metrics["num_env_steps_sampled"] == 2 * (8 - 3)  # steps 0-2 of both envs dropped


def test_an_async_worker_that_fails_again_right_after_the_rebuild_stops_the_rebuilding() -> None:
    # Unseeded, every env (the rebuilt ones too) has index None, and so exits on its first step.
    env_kwargs = {"fail_index": None, "fail_at": 0}
    with faulty_runner("exit", "async", num_envs=2, seed=None, restart_failed_sub_environments=True, env_kwargs=env_kwargs) as runner:
        with pytest.warns(UserWarning, match="rebuilding all 2"):
            with pytest.raises(SubEnvError, match="failed again on the first step after every env was rebuilt"):
                runner.sample(policy_for(runner))


def test_evaluation_episodes_stay_whole_when_a_failed_env_is_rebuilt() -> None:
    with faulty_runner("raise", restart_failed_sub_environments=True, env_kwargs={"fail_at": 5}) as runner:
        episodes = runner.sample_episodes(policy_for(runner), 4)
        assert runner.get_metrics()["num_env_restarts"] == 1
    assert len(episodes) == 4
    for episode in episodes:
        check_whole_steps(episode)
        assert episode.t_started == 0 and episode.is_done


# ------------------------------------------------------------------------------------------
# NaN and inf (on_nonfinite)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vectorize_mode", MODES)
def test_a_nan_reward_raises_naming_the_env_and_the_step(vectorize_mode: str) -> None:
    with faulty_runner("nan_reward", vectorize_mode, env_kwargs={"fail_at": 12}) as runner:
        with pytest.raises(NonFiniteEnvError, match=r"env 1 returned a NaN reward at env step 12 \(step 2 of its"):
            runner.sample(policy_for(runner))
            runner.sample(policy_for(runner))


def test_an_inf_observation_raises_naming_the_env_the_step_and_the_element() -> None:
    with faulty_runner("inf_obs") as runner:
        with pytest.raises(NonFiniteEnvError, match=r"env 1 returned an inf observation \(element \(1,\)\) at env step 3"):
            runner.sample(policy_for(runner))


@pytest.mark.parametrize("vectorize_mode", MODES)
def test_drop_episode_drops_the_episode_with_a_nan_resets_its_env_and_counts_it(vectorize_mode: str) -> None:
    with faulty_runner("nan_obs", vectorize_mode, on_nonfinite="drop_episode") as runner:
        episodes = runner.sample(policy_for(runner))
        metrics = runner.get_metrics()
    for episode in episodes:
        check_whole_steps(episode)
    env_1 = [episode for episode in episodes if episode.observations[0, 1] == 1]
    assert [(episode.t_started, len(episode)) for episode in env_1] == [(0, 4)]  # reset after step 3
    assert metrics["num_nonfinite_env_steps"] == 1
    assert metrics["num_env_steps_sampled"] == 3 * 8 - 4


def test_an_env_that_resets_to_nan_raises_even_when_dropping_episodes() -> None:
    with faulty_runner("nan_reset", on_nonfinite="drop_episode") as runner:
        with pytest.raises(NonFiniteEnvError, match=r"env 1 returned a NaN observation .* again right after a reset"):
            runner.sample(policy_for(runner))


# ------------------------------------------------------------------------------------------
# Data modules
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [OnPolicyDataModule, OffPolicyDataModule])
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sample_timeout_s": 0}, "sample_timeout_s must be a number of seconds > 0 or None, got 0"),
        ({"sample_timeout_s": "60"}, "sample_timeout_s"),
        ({"restart_failed_sub_environments": "yes"}, "restart_failed_sub_environments must be True or False"),
        ({"on_nonfinite": "ignore"}, r"on_nonfinite must be one of \('raise', 'drop_episode'\), got 'ignore'"),
    ],
)
def test_bad_env_fault_arguments_fail_at_construction_naming_them(cls: type, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cls("CartPole-v1", **kwargs)


def test_a_fit_with_restarts_keeps_training_and_logs_num_env_restarts(tmp_path: Path) -> None:
    data = OnPolicyDataModule(
        FaultyEnv, env_kwargs={"fault": "raise", "fail_at": 20}, num_envs=2, rollout_fragment_length=16,
        rollouts_per_epoch=3, seed=0, restart_failed_sub_environments=True, on_nonfinite="drop_episode",
    )
    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, minibatch_size=16, num_epochs=1)
    trainer = Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path,
    )
    trainer.fit(learner, datamodule=data)
    assert trainer.global_step > 0
    assert trainer.callback_metrics["env_runners/num_env_restarts"] == 1
    assert trainer.callback_metrics["env_runners/num_nonfinite_env_steps"] == 0
