"""OnPolicyDataModule under Trainer.fit/validate: on-policy items, budgets, resume, evaluation, logs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_rl import RLModuleSpec
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.data import OnPolicyDataModule
from lightning_rl.data.rank_stats import combine_rank_stats, local_rank_stats
from lightning_rl.env.env_runner import EnvRunner


def small_ppo(**kwargs: Any) -> PPOLearner:
    options = dict(model_config={"fcnet_hiddens": [16]}, num_epochs=2, minibatch_size=64)
    options.update(kwargs)
    return PPOLearner(**options)


def small_data(**kwargs: Any) -> OnPolicyDataModule:
    options = dict(env="CartPole-v1", num_envs=2, rollout_fragment_length=32, seed=0, rollouts_per_epoch=4)
    options.update(kwargs)
    return OnPolicyDataModule(**options)


def trainer(tmp_path: Any, **kwargs: Any) -> Trainer:
    options = dict(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    options.update(kwargs)
    return Trainer(**options)


def test_every_rollout_is_sampled_with_the_weights_it_trains():
    """Lightning prefetches one item ahead unless the loader is sized; ours must never be stale."""
    learner, data = small_ppo(), small_data(rollouts_per_epoch=5)
    seen = []
    sample = data.sample_train_item

    def recording_sample():
        seen.append(("sampled", learner._weights_seq_no))
        return sample()

    update = learner.update_from_episodes

    def recording_update(*args, **kwargs):
        seen.append(("trained", learner._weights_seq_no))
        return update(*args, **kwargs)

    data.sample_train_item = recording_sample
    learner.update_from_episodes = recording_update
    trainer(None, limit_val_batches=0).fit(learner, datamodule=data)
    assert [kind for kind, _ in seen] == ["sampled", "trained"] * 5
    for (_, sampled_at), (_, trained_at) in zip(seen[::2], seen[1::2]):
        assert sampled_at == trained_at


def test_learner_takes_its_spaces_from_the_data_module(tmp_path):
    learner, data = small_ppo(), small_data(env="Pendulum-v1", rollouts_per_epoch=1)
    trainer(tmp_path, limit_val_batches=0).fit(learner, datamodule=data)
    module = learner.module["default_policy"]
    assert module.observation_space.shape == (3,)
    assert module.action_space.shape == (1,)


def test_max_env_steps_ends_the_fit_and_a_resumed_fit_continues_the_counters(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    learner = small_ppo(lr=[[0, 1e-3], [1024, 0.0]])
    data = small_data(max_env_steps=320)  # 5 rollouts of 64 steps: 2 epochs of 4 items, the second cut short
    fit = trainer(tmp_path, max_epochs=10, callbacks=[checkpoint], enable_checkpointing=True, limit_val_batches=0)
    fit.fit(learner, datamodule=data)
    assert data.num_env_steps_sampled_lifetime == 320
    assert learner._timesteps["num_env_steps_sampled_lifetime"] == 320

    resumed_learner = small_ppo(lr=[[0, 1e-3], [1024, 0.0]])
    resumed_data = small_data(max_env_steps=640)
    resumed = trainer(tmp_path, max_epochs=10, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt2")],
                      enable_checkpointing=True, limit_val_batches=0)
    steps = []
    resumed_learner.update_from_episodes = _recording(resumed_learner.update_from_episodes, steps)
    resumed.fit(resumed_learner, datamodule=resumed_data, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert steps == [384, 448, 512, 576, 640]  # continues from 320, not from 0
    assert resumed_data.num_env_steps_sampled_lifetime == 640
    # The learning-rate schedule continued too: at 640 of 1024 steps, lr = 1e-3 * (1 - 640/1024).
    optimizer = resumed_learner.get_optimizer()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * (1 - 640 / 1024))


def _recording(update, steps):
    def recording_update(episodes, *, timesteps=None, **kwargs):
        steps.append(int(timesteps["num_env_steps_sampled_lifetime"]))
        return update(episodes, timesteps=timesteps, **kwargs)

    return recording_update


def test_validate_plays_complete_evaluation_episodes_and_reports_their_return(tmp_path):
    learner, data = small_ppo(), small_data(evaluation_num_episodes=3)
    results = trainer(tmp_path).validate(learner, datamodule=data, verbose=False)
    assert results[0]["eval/num_episodes"] == 3
    assert 8 <= results[0]["eval/episode_return_mean"] <= 500  # CartPole lasts 8 to 500 steps
    assert data.num_env_steps_sampled_lifetime == 0  # evaluation does not count as training data


def test_tensorboard_receives_the_documented_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path, name="tb")
    learner, data = small_ppo(), small_data(rollouts_per_epoch=3)
    trainer(tmp_path, logger=logger, log_every_n_steps=1).fit(learner, datamodule=data)
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    documented = {
        "env_runners/episode_return_mean",
        "env_runners/episode_len_mean",
        "env_runners/num_env_steps_sampled_lifetime",
        "env_runners/env_steps_per_sec",
        "default_policy/total_loss",
        "default_policy/policy_loss",
        "default_policy/vf_loss",
        "default_policy/entropy",
        "default_policy/mean_kl_loss",
        "default_policy/default_optimizer_learning_rate",
        "default_policy/gradients_default_optimizer_global_norm",
        "__all_modules__/num_env_steps_trained",
        "__all_modules__/num_env_steps_trained_lifetime",
        "eval/episode_return_mean",
        "eval/episode_len_mean",
    }
    assert documented <= scalars, sorted(documented - scalars)
    steps = [event.value for event in events.Scalars("env_runners/num_env_steps_sampled_lifetime")]
    assert steps == [64.0, 128.0, 192.0]


def test_metrics_are_logged_on_logging_steps_and_the_epochs_last_item_only(tmp_path):
    from lightning.pytorch import Callback

    seen = []

    class Record(Callback):
        def on_train_batch_end(self, trainer, *args):
            steps = trainer.callback_metrics.get("env_runners/num_env_steps_sampled_lifetime")
            seen.append(None if steps is None else int(steps))

    learner, data = small_ppo(), small_data(rollouts_per_epoch=5)
    trainer(tmp_path, log_every_n_steps=2, callbacks=[Record()], limit_val_batches=0).fit(learner, datamodule=data)
    # Items 2 and 4 are logging steps; item 5 ends the epoch; in between the last values stay.
    assert seen == [None, 128, 128, 256, 320]


def test_wrappers_with_arguments_apply_to_training_and_evaluation_can_do_without(tmp_path):
    clip = {"class_path": "gymnasium.wrappers.ClipReward", "init_args": {"min_reward": 0.0, "max_reward": 0.5}}
    data = small_data(wrappers=[clip], evaluation_wrappers=[], evaluation_num_episodes=2)
    learner = small_ppo()
    fit = trainer(tmp_path, max_epochs=1)
    rewards = []
    update = learner.update_from_episodes

    def recording_update(episodes, **kwargs):
        rewards.extend(float(r) for episode in episodes for r in episode.rewards)
        return update(episodes, **kwargs)

    learner.update_from_episodes = recording_update
    fit.fit(learner, datamodule=data)
    assert set(rewards) == {0.5}  # CartPole's reward of 1, clipped
    evaluation = fit.callback_metrics
    assert evaluation["eval/episode_return_mean"] == evaluation["eval/episode_len_mean"]  # unclipped: 1 per step


def test_the_kl_coefficient_adapts_under_trainer_fit_through_the_learners_own_callback(tmp_path):
    from lightning_rl.algorithms.ppo import KLCoeffAdaptation

    learner = small_ppo(use_kl_loss=True, kl_coeff=0.2, kl_target=1e-9)  # any KL is too large: x1.5 per update
    fit = trainer(tmp_path, limit_val_batches=0)
    fit.fit(learner, datamodule=small_data(rollouts_per_epoch=3))
    assert sum(isinstance(callback, KLCoeffAdaptation) for callback in fit.callbacks) == 1
    assert learner.curr_kl_coeff("default_policy") == pytest.approx(0.2 * 1.5**3)


def test_a_minibatch_larger_than_the_rollout_fails_at_setup_naming_both(tmp_path):
    with pytest.raises(ValueError, match="minibatch_size=128 is larger than the data module's train batch of 64"):
        trainer(tmp_path).fit(small_ppo(minibatch_size=128), datamodule=small_data())


def test_a_learner_without_spaces_and_without_data_module_says_what_to_do():
    learner = small_ppo()
    with pytest.raises(ValueError, match="no observation/action space"):
        trainer(None).fit(learner, train_dataloaders=[TrainItem(TrainingData(batch={}))])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"env": "NoSuchEnv-v0"}, "Unknown env id 'NoSuchEnv-v0'"),
        ({"num_envs": 0}, "num_envs must be an int >= 1"),
        ({"rollout_fragment_length": -5}, "rollout_fragment_length must be an int >= 1"),
        ({"max_env_steps": 0}, "max_env_steps must be an int >= 1"),
        ({"vectorize_mode": "threads"}, "vectorize_mode must be"),
    ],
)
def test_bad_data_module_arguments_fail_at_construction_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        small_data(**kwargs)


@pytest.mark.slow
def test_trainer_fit_learns_cartpole():
    seed_everything(0)
    learner = PPOLearner(
        model_config={"fcnet_hiddens": [64, 64]},
        lr=[[0, 1e-3], [100_000, 0.0]],
        clip_param=[[0, 0.2], [100_000, 0.0]],
        gamma=0.98,
        gae_lambda=0.8,
        num_epochs=20,
        minibatch_size=256,
        vf_clip_param=None,
    )
    data = OnPolicyDataModule(
        "CartPole-v1", num_envs=8, rollout_fragment_length=32, rollouts_per_epoch=20,
        max_env_steps=30_720, evaluation_num_episodes=10,
    )
    fit = trainer(None, max_epochs=-1, limit_val_batches=0)
    fit.fit(learner, datamodule=data)
    results = trainer(None).validate(learner, datamodule=data, verbose=False)[0]
    # A random policy scores about 22; seeds 0, 1 and 2 all evaluate at 500 by 25k env steps.
    assert data.num_env_steps_sampled_lifetime == 30_720
    assert results["eval/episode_return_mean"] >= 300
    assert math.isfinite(fit.callback_metrics["env_runners/episode_return_mean"].item())


# ----------------------------------------------------------------------------------------
# Several ranks (the 2-process end-to-end run is tests/test_ddp_fit.py)
# ----------------------------------------------------------------------------------------


def on_rank(data: OnPolicyDataModule, rank: int, world_size: int) -> OnPolicyDataModule:
    """Attach a stand-in for the Trainer of rank ``rank`` (all the data module reads of it here)."""
    from types import SimpleNamespace

    data.trainer = SimpleNamespace(global_rank=rank, world_size=world_size)
    return data


def test_each_rank_seeds_its_training_and_evaluation_envs_apart_and_rank_0_keeps_the_seed():
    seeds = []
    for rank in range(3):
        data = on_rank(small_data(seed=7, evaluation_num_episodes=5), rank, 3)
        seeds.append((data.train_runner.seed, data.eval_runner.seed))
        assert data.evaluation_episodes_per_rank == 2  # ceil(5 / 3)
        assert data.eval_runner.num_envs == 2  # min(num_envs, this rank's episodes)
        data.teardown("fit")
    assert seeds == [(7 + 10_000_000 * rank, 7 + 1_000_003 + 10_000_000 * rank) for rank in range(3)]
    single = small_data(seed=7)
    assert (single.train_runner.seed, single.eval_runner.seed) == seeds[0]  # one process = rank 0
    single.teardown("fit")


def test_without_a_seed_ranks_seeded_alike_by_seed_everything_still_sample_apart_and_reproducibly():
    def first_obs(rank: int) -> np.ndarray:
        seed_everything(3)  # what every rank of a seeded run does
        data = on_rank(small_data(seed=None), rank, 2)
        obs, _ = data.train_runner.env.reset(seed=data.train_runner.seed)
        data.teardown("fit")
        return obs

    assert not np.array_equal(first_obs(0), first_obs(1))
    np.testing.assert_array_equal(first_obs(1), first_obs(1))


def test_a_runner_built_before_the_trainer_attached_is_rebuilt_with_this_ranks_seed_at_setup():
    data = small_data(seed=0)
    assert data.observation_space.shape == (4,)  # builds the runner as rank 0
    on_rank(data, 1, 2).setup("fit")
    assert data.train_runner.seed == 10_000_000
    data.teardown("fit")


def test_rank_statistics_combine_weighted_by_episodes_and_a_rank_without_episodes_adds_no_nan():
    class Stub(EnvRunner):
        def __init__(self, returns, lens):
            self._returns, self._lens = returns, lens

    def row(returns, lens, lifetime, steps, seconds, restarts=0, nonfinite=0):
        metrics = {
            "num_env_steps_sampled_lifetime": lifetime, "num_episodes_lifetime": 10 * len(returns),
            "num_env_steps_sampled": steps, "num_episodes": len(returns),
            "env_steps_per_sec": steps / seconds if seconds else float("nan"),
            "num_env_restarts": restarts, "num_nonfinite_env_steps": nonfinite,
        }
        return local_rank_stats(Stub(returns, lens), metrics)

    busy = row([10.0, 20.0, 30.0], [10, 20, 30], lifetime=300, steps=64, seconds=2.0)
    idle = row([], [], lifetime=100, steps=64, seconds=4.0, restarts=2)
    one = row([100.0], [100], lifetime=200, steps=64, seconds=1.0, restarts=1, nonfinite=3)
    stats = combine_rank_stats(np.stack([busy, idle, one]))
    assert stats["episode_return_mean"] == pytest.approx((10 + 20 + 30 + 100) / 4)  # not the mean of means (60)
    assert (stats["episode_return_min"], stats["episode_return_max"]) == (10.0, 100.0)
    assert stats["episode_len_mean"] == pytest.approx(40.0)
    assert stats["num_env_steps_sampled_lifetime"] == 600
    assert stats["num_episodes_lifetime"] == 40
    assert (stats["num_env_steps_sampled"], stats["num_episodes"]) == (192, 4)
    assert stats["env_steps_per_sec"] == pytest.approx(192 / 4.0)  # all ranks' steps over the slowest rank's time
    assert (stats["num_env_restarts"], stats["num_nonfinite_env_steps"]) == (3, 3)
    nothing_yet = combine_rank_stats(np.stack([idle, idle]))
    assert all(math.isnan(nothing_yet[key]) for key in ("episode_return_mean", "episode_return_min", "episode_len_mean"))
    assert nothing_yet["num_env_steps_sampled_lifetime"] == 200


def test_a_single_rank_reports_exactly_what_its_runner_reports():
    with EnvRunner("CartPole-v1", num_envs=3, rollout_fragment_length=40, seed=0, episode_stats_window=5) as runner:
        policy = RLModuleSpec(
            module_class=PPOModule, observation_space=runner.observation_space, action_space=runner.action_space,
            model_config={"fcnet_hiddens": [8]},
        ).build()
        for _ in range(4):
            runner.sample(policy)
            metrics = runner.get_metrics()
            combined = combine_rank_stats(local_rank_stats(runner, metrics)[None])
            assert combined.keys() == metrics.keys()
            for key, value in metrics.items():
                if key == "env_steps_per_sec":
                    assert combined[key] == pytest.approx(value)
                else:
                    assert combined[key] == value or (math.isnan(value) and math.isnan(combined[key])), key


def test_a_checkpoint_of_rank_0_resumes_on_any_rank_with_the_global_counters_on_rank_0_only():
    state = {
        "train_runner": {
            "num_env_steps_sampled_lifetime": 192, "num_episodes_lifetime": 9, "num_resets": 1,
            "episode_returns": [12.0, 30.0], "episode_lens": [12, 30],
        },
        "rank": 0,
        "num_env_steps_sampled_lifetime": 384,  # summed over the 2 ranks that wrote it
        "num_episodes_lifetime": 17,
    }
    restored = {}
    for rank in (0, 1, 2):
        data = on_rank(small_data(), rank, 3)
        data.load_state_dict(state)
        assert data.num_env_steps_sampled_lifetime == 384  # every rank: the global count
        restored[rank] = data.train_runner.get_state()
        assert data.state_dict()["num_env_steps_sampled_lifetime"] == 384
        data.teardown("fit")
    # Rank 0 carries the global counters and its window; the others count from 0, window empty.
    assert restored[0] == {**state["train_runner"], "num_env_steps_sampled_lifetime": 384, "num_episodes_lifetime": 17}
    for rank in (1, 2):
        assert restored[rank] == {
            "num_env_steps_sampled_lifetime": 0, "num_episodes_lifetime": 0, "num_resets": 1,
            "episode_returns": [], "episode_lens": [],
        }
    # A state from before the global counters (one rank) still loads: its runner's counters are the totals.
    data = small_data()
    data.load_state_dict({"train_runner": state["train_runner"]})
    assert data.num_env_steps_sampled_lifetime == 192
    assert data.train_runner.get_state()["episode_returns"] == [12.0, 30.0]
    data.teardown("fit")


def test_max_env_steps_counts_the_rollouts_of_all_ranks():
    data = on_rank(small_data(max_env_steps=300, rollouts_per_epoch=10), 1, 2)
    assert data._rollouts_left() == 3  # 128 env steps per rollout over 2 ranks: ceil(300 / 128)
    data.load_state_dict({"train_runner": {}, "num_env_steps_sampled_lifetime": 256, "num_episodes_lifetime": 0})
    assert data._rollouts_left() == 1


def test_a_negative_seed_fails_at_construction():
    with pytest.raises(ValueError, match="seed must be an int >= 0 or None"):
        small_data(seed=-1)
