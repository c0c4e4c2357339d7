"""vectorize_mode="async": each PettingZoo env copy in a worker process, with the sync runner's fault rules.

A hanging PettingZoo env (a sleep in C code, which no alarm interrupts) hung a fit for 844 s
and ignored two SIGTERMs. In async mode the runner waits for each worker on its pipe until
``sample_timeout_s`` and kills the one that did not answer; a SIGTERM ends the wait at once.
The env (``_faulty_pettingzoo.Countdown``) is in a module of its own, which workers import by
name without this module's imports.
"""

from __future__ import annotations

import signal
import sys
import textwrap
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _faulty_pettingzoo import OBS, Countdown
from _process_tree import signal_once_hanging, still_running

from lightning_rl.core.rl_modules import MultiRLModule
from lightning_rl.data import MultiAgentDataModule
from lightning_rl.env import MultiAgentEnvRunner, NonFiniteEnvError, SampleTimeoutError, SubEnvError
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode
from lightning_rl.env.multi_agent_rollout import seeded_episode_id

torch.set_num_threads(1)


def module() -> MultiRLModule:
    from lightning_rl.algorithms.ppo import PPOModule

    torch.manual_seed(0)
    return MultiRLModule({"default_policy": PPOModule(OBS, gym.spaces.Discrete(2), {"fcnet_hiddens": [8]})})


def summary(episodes: list[MultiAgentEpisode]) -> list[tuple]:
    """Everything an episode holds that the env or the sampling decides, as comparable plain data."""
    return [
        (
            episode.id_,
            episode.env_t_started,
            episode.is_done,
            {
                agent: (
                    np.asarray(agent_episode.observations).tolist(),
                    np.asarray(agent_episode.actions).tolist(),
                    np.asarray(agent_episode.rewards).tolist(),
                )
                for agent, agent_episode in episode.agent_episodes.items()
            },
        )
        for episode in episodes
    ]


def sampled(runner: MultiAgentEnvRunner) -> list[tuple]:
    torch.manual_seed(1)  # actions are drawn from torch's generator in this process
    acting = module()
    episodes = runner.sample(acting, num_env_steps=8, explore=True)
    episodes += runner.sample(acting, num_env_steps=5, explore=True)
    episodes += runner.sample_episodes(acting, num_episodes=3, explore=True)
    return summary(episodes)


@pytest.mark.parametrize("env", [Countdown, "pettingzoo.classic.tictactoe_v3"])
def test_the_same_seed_gives_the_same_episodes_in_sync_and_async_mode(env):
    results = {}
    for mode in ("sync", "async"):
        with MultiAgentEnvRunner(env, num_envs=3, seed=4, vectorize_mode=mode) as runner:
            if env == Countdown:
                results[mode] = sampled(runner)
            else:  # tictactoe: turn-based (AEC), masked actions
                spaces = runner.module_spaces()["default_policy"]
                from lightning_rl.algorithms.ppo import PPOModule

                torch.manual_seed(0)
                acting = PPOModule(*spaces, {"fcnet_hiddens": [8]})
                torch.manual_seed(1)
                results[mode] = summary(runner.sample(acting, num_env_steps=12, explore=True))
            results[mode + "_state"] = runner.get_state()
    assert results["sync"] and results["async"] == results["sync"]
    assert results["async_state"] == results["sync_state"]


def test_a_worker_hanging_in_c_code_is_a_sample_timeout_naming_the_copy_the_agents_and_the_step():
    with MultiAgentEnvRunner(
        Countdown, env_kwargs={"fault": "hang"}, num_envs=2, seed=0, sample_timeout_s=1.0, vectorize_mode="async"
    ) as runner:
        start = time.monotonic()
        with pytest.raises(
            SampleTimeoutError,
            match=r"env copy 1 did not return from step 2 of its episode \(agents \['a', 'b'\]\): its worker process "
            r"did not answer within sample_timeout_s=1.0",
        ):
            runner.sample(module(), num_env_steps=5)
        assert time.monotonic() - start < 60  # not the 1000 s of the hang
        # The next call starts with a new worker in the hung one's place (two steps: before the hang).
        assert len(runner.sample(module(), num_env_steps=2)) == 2


def test_with_restarts_a_hung_worker_is_killed_rebuilt_and_counted():
    with MultiAgentEnvRunner(
        Countdown, env_kwargs={"fault": "hang"}, num_envs=2, seed=0, sample_timeout_s=1.0, vectorize_mode="async",
        restart_failed_sub_environments=True,
    ) as runner:  # fmt: skip
        with pytest.warns(UserWarning, match=r"env copy 1 did not return from step 2 .*the env copy is rebuilt"):
            episodes = runner.sample(module(), num_env_steps=10)
        assert runner.get_metrics()["num_env_restarts_lifetime"] == 1.0
        assert sum(episode.env_steps() for episode in episodes) > 10  # both copies went on sampling
        # The hung copy's unfinished episode (the first after its seeded reset) is dropped.
        assert seeded_episode_id(1, 0) not in {episode.id_ for episode in episodes}
        assert seeded_episode_id(0, 0) in {episode.id_ for episode in episodes}


def test_a_worker_killed_with_sigkill_is_rebuilt_and_counted_or_an_error_naming_it():
    with MultiAgentEnvRunner(
        Countdown, env_kwargs={"fault": "die"}, num_envs=2, seed=0, vectorize_mode="async",
        restart_failed_sub_environments=True,
    ) as runner:  # fmt: skip
        with pytest.warns(UserWarning, match=r"env copy 1 failed at step 2 .*died of signal 9 \(SIGKILL\)"):
            runner.sample(module(), num_env_steps=10)
        assert runner.num_env_restarts == 1
    with MultiAgentEnvRunner(Countdown, env_kwargs={"fault": "die"}, num_envs=2, seed=0, vectorize_mode="async") as runner:
        with pytest.raises(
            SubEnvError, match=r"env copy 1 failed at step 2 of its episode \(agents \['a', 'b'\]\): its worker process"
        ):
            runner.sample(module(), num_env_steps=10)


def test_an_env_that_raises_in_its_worker_is_an_error_naming_the_copy_the_agents_and_the_step():
    with MultiAgentEnvRunner(Countdown, env_kwargs={"fault": "raise"}, num_envs=2, seed=0, vectorize_mode="async") as runner:
        with pytest.raises(
            SubEnvError, match=r"env copy 1 raised at step 2 of its episode \(agents \['a', 'b'\]\): RuntimeError: boom"
        ):
            runner.sample(module(), num_env_steps=10)


def test_nan_rewards_from_a_worker_raise_or_drop_the_episode():
    kwargs = {"env_kwargs": {"fault": "nan_reward"}, "num_envs": 2, "seed": 0, "vectorize_mode": "async"}
    with MultiAgentEnvRunner(Countdown, **kwargs) as runner:
        with pytest.raises(NonFiniteEnvError, match=r"env copy 1, agent 'b', step 2 of its episode: the reward is nan"):
            runner.sample(module(), num_env_steps=10)
    with MultiAgentEnvRunner(Countdown, on_nonfinite="drop_episode", **kwargs) as runner:
        with pytest.warns(UserWarning, match=r"env copy 1, agent 'b', step 2 of its episode: the reward is nan"):
            episodes = runner.sample(module(), num_env_steps=10)
        assert runner.num_nonfinite_env_steps == 1
        for episode in episodes:
            for agent_episode in episode.agent_episodes.values():
                assert np.isfinite(agent_episode.rewards).all()


def test_a_fit_whose_env_hangs_in_c_code_ends_with_a_sample_timeout_and_an_async_fit_trains():
    from lightning.pytorch import Trainer

    from lightning_rl.algorithms.ppo import PPOLearner

    def fit(env_kwargs: dict[str, Any]) -> MultiAgentDataModule:
        data = MultiAgentDataModule(
            Countdown, env_kwargs=env_kwargs, num_envs=2, seed=0, rollout_fragment_length=8, rollouts_per_epoch=2,
            max_env_steps=32, evaluation_num_episodes=2, sample_timeout_s=2.0, vectorize_mode="async",
        )  # fmt: skip
        learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, minibatch_size=8, num_epochs=1)
        Trainer(
            max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0,
        ).fit(learner, datamodule=data)  # fmt: skip
        return data

    assert fit({}).num_env_steps_sampled_lifetime == 32
    with pytest.raises(SampleTimeoutError, match=r"env copy 1 did not return from step 2 of its episode"):
        fit({"fault": "hang"})


def test_vectorize_mode_is_checked_and_reaches_the_runners():
    with pytest.raises(ValueError, match="vectorize_mode must be one of"):
        MultiAgentDataModule(Countdown, vectorize_mode="envpool")
    with pytest.raises(ValueError, match="vectorize_mode must be one of"):
        MultiAgentEnvRunner(Countdown, vectorize_mode="threads")
    with pytest.raises(ValueError, match="unknown PettingZoo env"):  # a wrong name fails here, not in a worker
        MultiAgentEnvRunner("pettingzoo.classic.no_such_game_v0", vectorize_mode="async")
    with pytest.raises(SubEnvError, match=r"env copy \d could not be built in its worker process: TypeError: .*'bogus'"):
        MultiAgentEnvRunner(Countdown, env_kwargs={"bogus": 1}, num_envs=2, vectorize_mode="async")
    data = MultiAgentDataModule(Countdown, vectorize_mode="async")
    try:
        assert data.train_runner.vectorize_mode == "async"
        with pytest.raises(RuntimeError, match="live in worker processes"):
            data.train_runner.envs
    finally:
        data.teardown("fit")


def test_sigterm_stops_a_fit_whose_env_hangs_in_c_code_and_leaves_no_worker(tmp_path):
    marker = tmp_path / "hanging"
    config = tmp_path / "fit.yaml"
    config.write_text(textwrap.dedent(f"""
        seed_everything: 0
        trainer:
          max_epochs: 1
          logger: false
          enable_checkpointing: false
          enable_progress_bar: false
          enable_model_summary: false
          num_sanity_val_steps: 0
          default_root_dir: {str(tmp_path)!r}
        model:
          class_path: lightning_rl.algorithms.ppo.PPOLearner
          init_args:
            model_config: {{fcnet_hiddens: [8]}}
            minibatch_size: 8
            num_epochs: 1
        data:
          class_path: lightning_rl.data.MultiAgentDataModule
          init_args:
            env: _faulty_pettingzoo.Countdown
            env_kwargs: {{fault: hang, marker: {str(marker)!r}}}
            num_envs: 2
            seed: 0
            rollout_fragment_length: 8
            rollouts_per_epoch: 1
            sample_timeout_s: 600
            vectorize_mode: async
    """))
    command = [sys.executable, "-m", "lightning_rl", "fit", "--config", str(config)]
    returncode, output, workers = signal_once_hanging(command, marker, signal.SIGTERM)
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "stopped by SIGTERM" in output
    assert still_running(workers) == []


def test_the_workers_die_with_a_runner_killed_with_sigkill_while_one_hangs_in_c_code(tmp_path):
    marker = tmp_path / "hanging"
    script = tmp_path / "sample.py"
    script.write_text(textwrap.dedent(f"""
        import gymnasium as gym
        from _faulty_pettingzoo import OBS, Countdown
        from lightning_rl.env.multi_agent_runner import MultiAgentEnvRunner
        from lightning_rl.env.opponents import RandomLegalModule

        runner = MultiAgentEnvRunner(
            Countdown, env_kwargs={{"fault": "hang", "marker": {str(marker)!r}}}, num_envs=2, seed=0,
            sample_timeout_s=600, vectorize_mode="async",
        )
        runner.sample(RandomLegalModule(OBS, gym.spaces.Discrete(2), model_config={{"seed": 0}}), num_env_steps=5)
    """))
    returncode, output, workers = signal_once_hanging([sys.executable, str(script)], marker, signal.SIGKILL)
    assert returncode == -signal.SIGKILL, output[-3000:]
    assert still_running(workers) == []
