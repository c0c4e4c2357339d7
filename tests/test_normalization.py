"""Observation and reward normalization in the env runner: statistics, ranks, evaluation, checkpoints."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import make_trainer
from lightning.pytorch import Callback
from ranks import run_on_ranks

from lightning_rl import RLModuleSpec
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.core.normalization import OBSERVATION_NORMALIZATION_KEY, find_observation_normalization
from lightning_rl.data import OffPolicyDataModule, OnPolicyDataModule
from lightning_rl.env import EnvRunner
from lightning_rl.env.normalization import EPSILON, REWARD_NORMALIZATION_KEY, EnvNormalization
from lightning_rl.env.rollout_buffers import RolloutBuffers, RunningEpisodes

NORMALIZE = {"normalize_observations": True, "normalize_rewards": True}


class RecordSeen(gym.Wrapper):
    """Logs what the runner's statistics should cover, as one env copy sees it.

    ``observations``: every observation the policy acts on (reset ones, and step ones that
    do not end the episode). ``returns``: after each step, the running discounted return
    ``ret = ret * gamma + reward``, restarted at each reset.
    """

    def __init__(self, env: gym.Env, log: dict[str, list], gamma: float) -> None:
        super().__init__(env)
        self.log, self.gamma, self.ret = log, gamma, 0.0

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        self.log["observations"].append(np.array(obs))
        self.ret = 0.0
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.ret = self.ret * self.gamma + float(reward)
        self.log["returns"].append(self.ret)
        if not (terminated or truncated):
            self.log["observations"].append(np.array(obs))
        return obs, reward, terminated, truncated, info


def recorder(gamma: float = 0.99) -> tuple[dict[str, list], Any]:
    log: dict[str, list] = {"observations": [], "returns": []}
    return log, lambda env: RecordSeen(env, log, gamma)


def ppo_module(observation_space: gym.Space, action_space: gym.Space) -> PPOModule:
    torch.manual_seed(0)
    spec = RLModuleSpec(
        module_class=PPOModule, observation_space=observation_space, action_space=action_space,
        model_config={"fcnet_hiddens": [8]},
    )  # fmt: skip
    return spec.build()


def one_rank(vector: np.ndarray) -> np.ndarray:
    """The gather of a single process: its own vector as the only row."""
    return vector[None]


def numpy_state(state: dict[str, Any]) -> dict[str, Any]:
    """The normalization entries of a data module's state, tensors as numpy (picklable, comparable)."""
    return {
        key: {name: np.asarray(value) for name, value in state[key].items()}
        for key in (OBSERVATION_NORMALIZATION_KEY, REWARD_NORMALIZATION_KEY)
    }


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key in (OBSERVATION_NORMALIZATION_KEY, REWARD_NORMALIZATION_KEY):
        assert a[key].keys() == b[key].keys()
        for name in a[key]:
            np.testing.assert_array_equal(np.asarray(a[key][name]), np.asarray(b[key][name]), err_msg=f"{key}/{name}")


def assert_statistics_of(entry: dict[str, Any], rows: np.ndarray) -> None:
    assert float(entry["count"]) == len(rows)
    rows = rows.astype(np.float64)
    np.testing.assert_allclose(np.asarray(entry["mean"]), rows.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.asarray(entry["var"]), rows.var(axis=0), rtol=1e-9, atol=1e-12)


# ---- The statistics -----------------------------------------------------------------------


def test_statistics_are_those_of_every_observation_acted_on_and_every_running_return():
    log, wrapper = recorder(gamma=0.9)
    with EnvRunner(
        "CartPole-v1", num_envs=4, rollout_fragment_length=64, seed=0, wrappers=[wrapper], normalization_gamma=0.9,
        **NORMALIZE,
    ) as runner:  # fmt: skip
        module = ppo_module(runner.observation_space, runner.action_space)
        episodes = [episode for _ in range(3) for episode in runner.sample(module)]
        state = runner.normalization.state_dict()

    # Over all four envs and all three calls: 4 reset observations, then one per step that
    # did not end its episode plus the reset observation of the next episode.
    assert_statistics_of(state[OBSERVATION_NORMALIZATION_KEY], np.stack(log["observations"]))
    assert_statistics_of(state[REWARD_NORMALIZATION_KEY], np.array(log["returns"]))
    assert state[REWARD_NORMALIZATION_KEY]["gamma"] == 0.9
    assert state[OBSERVATION_NORMALIZATION_KEY]["clip"] == 10.0
    observations = np.concatenate([episode.observations for episode in episodes])
    assert observations.dtype == np.float32 and np.abs(observations).max() <= 10.0


def test_rewards_are_normalized_while_episode_returns_stay_in_the_envs_units():
    with EnvRunner("CartPole-v1", num_envs=4, rollout_fragment_length=64, seed=0, **NORMALIZE) as runner:
        module = ppo_module(runner.observation_space, runner.action_space)
        episodes = [episode for _ in range(3) for episode in runner.sample(module)]
        metrics = runner.get_metrics()
    # CartPole pays 1 per step: a return equals a length only in the env's own units.
    assert metrics["num_episodes"] > 5
    assert metrics["episode_return_mean"] == metrics["episode_len_mean"]
    rewards = np.concatenate([episode.rewards for episode in episodes])
    assert not np.any(rewards == 1.0)
    assert 0 < rewards.min() and rewards.max() <= 10.0


def buffers_of(rewards: np.ndarray, ends: np.ndarray, dropped: np.ndarray) -> RolloutBuffers:
    episodes = RunningEpisodes(rewards.shape[1])
    episodes.obs = np.zeros((rewards.shape[1], 1), dtype=np.float32)
    buffers = RolloutBuffers.allocate(len(rewards), gym.spaces.Box(-1, 1, (1,)), episodes)
    buffers.obs[:] = 0.0
    buffers.rewards[:] = rewards
    buffers.terminateds[:] = ends
    buffers.truncateds[:] = False
    buffers.dropped[:] = dropped
    return buffers


def test_rewards_follow_vec_normalizes_rule_and_dropped_steps_count_nowhere():
    rng = np.random.default_rng(0)
    steps, num_envs, gamma, clip = 50, 3, 0.9, 3.0
    rewards = rng.normal(1.0, 2.0, (steps, num_envs)).astype(np.float32)
    ends = rng.random((steps, num_envs)) < 0.1
    dropped = np.zeros((steps, num_envs), dtype=bool)
    dropped[20, 1] = True
    rewards[20, 1] = np.nan  # a NaN reward whose episode is dropped
    buffers = buffers_of(rewards, ends, dropped)
    normalization = EnvNormalization(
        gym.spaces.Box(-1, 1, (1,)), num_envs, normalize_observations=False, normalize_rewards=True, clip=clip,
        gamma=gamma,
    )  # fmt: skip
    for t in range(steps):
        normalization.on_step(buffers, t, training=True)

    # The rule written out: update with the running returns, scale, restart ended returns.
    ret, seen, expected = np.zeros(num_envs), [], np.empty_like(rewards)
    for t in range(steps):
        kept = ~dropped[t]
        ret[kept] = ret[kept] * gamma + rewards[t, kept]
        seen.extend(ret[kept])
        expected[t] = np.clip(rewards[t] / np.sqrt(np.var(seen) + EPSILON), -clip, clip)
        ret[ends[t] | dropped[t]] = 0.0
    kept = ~dropped
    np.testing.assert_allclose(buffers.rewards[kept], expected[kept], rtol=1e-5)
    np.testing.assert_array_equal(buffers.raw_rewards[kept], rewards[kept])
    assert normalization.rewards.current.count == kept.sum()


# ---- Two ranks ------------------------------------------------------------------------------


def _ddp_trainer(world_size: int, root: str) -> Any:
    from lightning.pytorch import Trainer

    return Trainer(
        accelerator="cpu", strategy="ddp", devices=world_size, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=root,
    )  # fmt: skip


def _fit_on_rank(rank: int, world_size: int, root: str) -> dict[str, Any]:
    from lightning.pytorch import seed_everything

    seed_everything(0)
    log, wrapper = recorder(gamma=0.9)
    data = OnPolicyDataModule(
        "CartPole-v1", num_envs=2, rollout_fragment_length=16, seed=0, rollouts_per_epoch=3, wrappers=[wrapper],
        evaluation_wrappers=[], normalization_gamma=0.9, **NORMALIZE,
    )  # fmt: skip
    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=32)
    trainer = _ddp_trainer(world_size, root)
    trainer.fit(learner, datamodule=data)
    return {
        "state": numpy_state(data.state_dict()),
        "observations": np.stack(log["observations"]),
        "returns": np.array(log["returns"]),
    }


def test_two_ranks_hold_the_same_statistics_of_both_ranks_observations_and_returns(tmp_path):
    rank0, rank1 = run_on_ranks(_fit_on_rank, str(tmp_path), world_size=2, timeout=240)

    assert_same_state(rank0["state"], rank1["state"])  # equal to the last bit
    observations = np.concatenate([rank0["observations"], rank1["observations"]])
    assert not np.array_equal(rank0["observations"], rank1["observations"])  # each rank saw its own
    assert_statistics_of(rank0["state"][OBSERVATION_NORMALIZATION_KEY], observations)
    returns = np.concatenate([rank0["returns"], rank1["returns"]])
    assert len(returns) == 2 * 3 * 32  # every env step of both ranks
    assert_statistics_of(rank0["state"][REWARD_NORMALIZATION_KEY], returns)


class FailsAtStep40(gym.Wrapper):
    """Raises on the 40th step taken by any env copy of this process (in the second rollout of 32 env steps)."""

    steps = 0

    def step(self, action: Any) -> Any:
        FailsAtStep40.steps += 1
        if FailsAtStep40.steps == 40:
            raise RuntimeError("the simulator crashed")
        return self.env.step(action)


def _fit_failing_on_rank_1(rank: int, world_size: int, root: str) -> str:

    data = OnPolicyDataModule(
        "CartPole-v1", num_envs=2, rollout_fragment_length=16, seed=0, wrappers=[FailsAtStep40] if rank == 1 else [],
        **NORMALIZE,
    )  # fmt: skip
    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=32)
    trainer = _ddp_trainer(world_size, root)
    try:
        trainer.fit(learner, datamodule=data)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def test_a_rank_that_fails_after_a_merge_still_stops_every_rank_with_normalization_on(tmp_path):
    # The failing rank's exchange vector must be as long as the others' (statistics included),
    # or the gather would fail with a size mismatch instead of naming the failed rank.
    rank0, rank1 = run_on_ranks(_fit_failing_on_rank_1, str(tmp_path), world_size=2, timeout=240)
    assert "the simulator crashed" in rank1
    assert rank0.startswith("SamplingFailedOnAnotherRank: sampling failed on rank(s) [1]")


# ---- Evaluation -----------------------------------------------------------------------------


def test_samplers_reports_merged_and_sent_back_cover_every_row_once():
    # AsyncSamplingDataModule's exchange: each sampler reports its new rows with a rollout, the data
    # module merges the reports, and a sampler normalizes with the merged statistics plus its rows
    # not reported yet.
    logs, runners = [], []
    for seed in (0, 100):
        log, wrapper = recorder()
        logs.append(log)
        runners.append(EnvRunner("CartPole-v1", num_envs=2, rollout_fragment_length=32, seed=seed,
                                 wrappers=[wrapper], **NORMALIZE))  # fmt: skip
    merged = EnvNormalization(runners[0].observation_space, 1, **NORMALIZE)
    try:
        module = ppo_module(runners[0].observation_space, runners[0].action_space)
        for runner in runners:
            runner.sample(module)
        merged.merge_ranks(np.stack([runner.normalization.report_new_statistics() for runner in runners]))
        reported_by_0 = len(logs[0]["observations"])  # sampler 0's observations so far
        runners[0].sample(module)  # rows it has not reported yet
        runners[0].normalization.load_statistics_vector(merged.statistics_vector())

        def rows(key: str, upto: list[int | None]) -> np.ndarray:
            return np.stack([np.asarray(row) for log, end in zip(logs, upto) for row in log[key][:end]])

        # Sampler 0 now normalizes with every row of both samplers, its unreported ones included ...
        state = runners[0].normalization.state_dict()
        assert_statistics_of(state[OBSERVATION_NORMALIZATION_KEY], rows("observations", [None, None]))
        assert_statistics_of(state[REWARD_NORMALIZATION_KEY], rows("returns", [None, None]))
        # ... the merged statistics hold only the reported ones ...
        reported = merged.state_dict()[OBSERVATION_NORMALIZATION_KEY]
        assert_statistics_of(reported, rows("observations", [reported_by_0, None]))
        # ... and its next report holds only the unreported rows: merged, every row counts once.
        merged.merge_ranks(runners[0].normalization.report_new_statistics()[None])
        assert_statistics_of(merged.state_dict()[OBSERVATION_NORMALIZATION_KEY], rows("observations", [None, None]))
        assert_statistics_of(merged.state_dict()[REWARD_NORMALIZATION_KEY], rows("returns", [None, None]))
        assert runners[0].normalization.report_new_statistics()[0] == 0  # nothing new since
        with pytest.raises(ValueError, match="^normalization statistics of 12 numbers expected, got \\(4,\\)$"):
            runners[0].normalization.load_statistics_vector(np.zeros(4))
    finally:
        for runner in runners:
            runner.close()


def test_evaluation_uses_the_training_statistics_and_never_changes_them():
    log, wrapper = recorder()
    data = OnPolicyDataModule(
        "CartPole-v1", num_envs=2, rollout_fragment_length=32, seed=0, evaluation_num_episodes=2,
        evaluation_num_envs=1, evaluation_wrappers=[wrapper], **NORMALIZE,
    )  # fmt: skip
    module = ppo_module(data.observation_space, data.action_space)
    for _ in range(2):
        data.sampling.sample(module, one_rank)
    before = data.state_dict()
    episodes = data.sampling.evaluate(module)
    after = data.state_dict()

    assert_same_state(before, after)
    assert_same_state(data.eval_runner.normalization.state_dict(), after)
    # The evaluation env's observations, normalized with the training statistics; the
    # reset observation of the episode after the second is logged but played in no episode.
    normalize = data.train_runner.normalization.normalize_observations
    played = np.concatenate([episode.observations[:-1] for episode in episodes])
    np.testing.assert_array_equal(played, normalize(np.stack(log["observations"][:-1])))
    for episode in episodes:  # rewards in the env's own units
        np.testing.assert_array_equal(episode.rewards, np.ones(len(episode), dtype=np.float32))
    data.teardown("fit")


def test_sample_episodes_of_a_runner_leaves_its_statistics_as_they_are():
    with EnvRunner("CartPole-v1", num_envs=2, rollout_fragment_length=32, seed=0, **NORMALIZE) as runner:
        module = ppo_module(runner.observation_space, runner.action_space)
        runner.sample(module)
        before = runner.normalization.state_dict()
        runner.sample_episodes(module, 3)
        assert_same_state(before, runner.normalization.state_dict())


# ---- Checkpoints and resuming ---------------------------------------------------------------


def cartpole_data(**kwargs: Any) -> OnPolicyDataModule:
    return OnPolicyDataModule(
        "CartPole-v1", num_envs=2, rollout_fragment_length=24, seed=3, evaluation_num_episodes=2, **NORMALIZE, **kwargs
    )


def through_a_file(state: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_resumed_statistics_are_identical_and_evaluate_as_the_uninterrupted_run():
    uninterrupted, interrupted, resumed = cartpole_data(), cartpole_data(), cartpole_data()
    module = ppo_module(uninterrupted.observation_space, uninterrupted.action_space)
    for data in (uninterrupted, interrupted):
        for rollout in range(2):
            torch.manual_seed(rollout)
            data.sampling.sample(module, one_rank)
    resumed.load_state_dict(through_a_file(interrupted.state_dict()))

    assert_same_state(resumed.state_dict(), uninterrupted.state_dict())
    # Greedy evaluation from the same seeds: the same raw observations, normalized alike.
    expected, got = uninterrupted.sampling.evaluate(module), resumed.sampling.evaluate(module)
    assert len(expected) == len(got) == 2
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a.observations, b.observations)
    # Training goes on from the restored statistics (a fresh module would start from count 0).
    resumed.sampling.sample(module, one_rank)
    restored_count = float(interrupted.state_dict()[OBSERVATION_NORMALIZATION_KEY]["count"])
    assert resumed.state_dict()[OBSERVATION_NORMALIZATION_KEY]["count"] == restored_count + 2 + 48
    for data in (uninterrupted, interrupted, resumed):
        data.teardown("fit")


class RecordRestored(Callback):
    """The data module's normalization state when training starts (after Lightning restored it)."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.state = numpy_state(trainer.datamodule.state_dict())


class RecordEvaluationStatistics(Callback):
    """The evaluation runner's statistics after an evaluation (before teardown closes the runners)."""

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.state = numpy_state(trainer.datamodule.eval_runner.normalization.state_dict())


def test_every_checkpoint_holds_the_statistics_and_a_resumed_fit_starts_from_them(tmp_path: Path):
    data = cartpole_data(max_env_steps=96)
    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=48)
    trainer = make_trainer(tmp_path, max_epochs=-1, limit_val_batches=0)
    trainer.fit(learner, datamodule=data)
    path = tmp_path / "normalized.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["OnPolicyDataModule"]
    assert_same_state(numpy_state(saved), numpy_state(data.state_dict()))
    assert saved[OBSERVATION_NORMALIZATION_KEY]["count"] == 2 + 96  # two reset observations, then one per step

    record = RecordRestored()
    data = cartpole_data(max_env_steps=192)
    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=48)
    make_trainer(tmp_path, max_epochs=-1, limit_val_batches=0, callbacks=[record]).fit(
        learner, datamodule=data, ckpt_path=str(path)
    )
    assert_same_state(record.state, numpy_state(saved))
    assert data.num_env_steps_sampled_lifetime == 192

    # Evaluating a checkpoint (lightning-rl validate) normalizes with its statistics.
    record = RecordEvaluationStatistics()
    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=48)
    make_trainer(tmp_path, callbacks=[record]).validate(learner, datamodule=cartpole_data(), ckpt_path=str(path))
    assert_same_state(record.state, numpy_state(saved))


def test_a_checkpoints_entry_rebuilds_the_runners_normalization(tmp_path: Path):
    data = cartpole_data()
    module = ppo_module(data.observation_space, data.action_space)
    for _ in range(3):
        data.sampling.sample(module, one_rank)
    checkpoint = through_a_file({"OnPolicyDataModule": data.state_dict(), "state_dict": {}})
    rebuilt = find_observation_normalization(checkpoint)
    assert rebuilt is not None

    rng = np.random.default_rng(0)
    obs = (rng.normal(size=(1000, 4)) * np.array([1.0, 2.0, 0.2, 3.0]) * 5).astype(np.float32)
    expected = data.train_runner.normalization.normalize_observations(obs)
    assert np.abs(expected).max() == 10.0  # some rows are clipped
    np.testing.assert_array_equal(rebuilt(torch.from_numpy(obs)).numpy(), expected)
    data.teardown("fit")


def test_a_state_saved_without_statistics_still_resumes_and_statistics_need_normalization_on():
    data = cartpole_data()
    module = ppo_module(data.observation_space, data.action_space)
    data.sampling.sample(module, one_rank)
    state = data.state_dict()
    old = {key: value for key, value in state.items() if "normalization" not in key}

    resumed = cartpole_data()
    resumed.load_state_dict(old)
    assert resumed.num_env_steps_sampled_lifetime == 48
    assert resumed.train_runner.normalization.state_dict()[OBSERVATION_NORMALIZATION_KEY]["count"] == 0  # fresh

    plain = OnPolicyDataModule("CartPole-v1", num_envs=2, rollout_fragment_length=24, seed=3)
    with pytest.raises(ValueError, match="holds observation_normalization statistics but normalize_observations"):
        plain.load_state_dict(state)
    for each in (data, resumed, plain):
        each.teardown("fit")


def test_reward_statistics_are_left_unused_by_a_run_that_does_not_normalize_rewards():
    data = cartpole_data()
    data.sampling.sample(ppo_module(data.observation_space, data.action_space), one_rank)
    state = data.state_dict()
    assert state[REWARD_NORMALIZATION_KEY] is not None

    # Observations normalized, rewards not: fine-tuning, or validate with another config.
    observations_only = OnPolicyDataModule(
        "CartPole-v1", num_envs=2, rollout_fragment_length=24, seed=3, normalize_observations=True
    )
    observations_only.load_state_dict(state)
    restored = observations_only.train_runner.normalization.state_dict()
    assert restored[REWARD_NORMALIZATION_KEY] is None
    assert restored[OBSERVATION_NORMALIZATION_KEY]["count"] == state[OBSERVATION_NORMALIZATION_KEY]["count"]
    for each in (data, observations_only):
        each.teardown("fit")


# ---- Off-policy, arguments ------------------------------------------------------------------


def test_the_off_policy_data_module_fills_its_buffer_with_normalized_observations():
    data = OffPolicyDataModule(
        "CartPole-v1", num_envs=2, train_freq=32, seed=0, learning_starts=0, normalize_observations=True
    )
    module = ppo_module(data.observation_space, data.action_space)
    episodes, _ = data.sampling.sample(module, one_rank)
    data.replay_buffer.add_episodes(episodes)
    obs = data.replay_buffer.sample(32)["obs"]
    assert obs.dtype == np.float32 and np.abs(obs).max() <= 10.0
    normalization = data.state_dict()[OBSERVATION_NORMALIZATION_KEY]
    assert normalization["count"] == 34 and data.state_dict()[REWARD_NORMALIZATION_KEY] is None
    np.testing.assert_allclose(obs.mean(0), 0.0, atol=0.5)
    data.teardown("fit")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"normalize_observations": 1}, "normalize_observations must be True or False, got 1"),
        ({"normalize_rewards": "yes"}, "normalize_rewards must be True or False, got 'yes'"),
        ({"normalization_clip": 0.0}, "normalization_clip must be a finite number > 0, got 0.0"),
        ({"normalization_clip": float("inf")}, "normalization_clip must be a finite number > 0"),
        ({"normalization_gamma": 1.5}, r"normalization_gamma must be a number in \[0, 1\], got 1.5"),
    ],
)
def test_bad_normalization_arguments_are_named(kwargs: dict[str, Any], message: str):
    with pytest.raises(ValueError, match=message):
        OnPolicyDataModule("CartPole-v1", **kwargs)
    with pytest.raises(ValueError, match=message):
        EnvRunner("CartPole-v1", **kwargs)


def test_only_box_observations_can_be_normalized():
    with pytest.raises(ValueError, match=r"normalize_observations needs a Box observation space.*Discrete\(16\)"):
        EnvRunner("FrozenLake-v1", normalize_observations=True)
    with EnvRunner("FrozenLake-v1", normalize_rewards=True) as runner:  # rewards alone need no Box
        assert runner.normalization.observations is None


@pytest.mark.parametrize(
    "space",
    [gym.spaces.Box(0, 255, (10, 10, 3), np.uint8), gym.spaces.Box(0, 1, (4, 10, 10, 4), bool)],
    ids=["uint8_image", "stacked_bool_planes"],
)
def test_image_observations_are_not_normalized_since_the_cnn_scales_them(space: gym.Space):
    # Normalized numbers in a uint8 image space would be divided by 255 again by the encoder.
    with pytest.raises(ValueError, match=r"normalize_observations is for vector observations; .* is an image"):
        EnvNormalization(space, num_envs=2, normalize_observations=True, normalize_rewards=False)
    EnvNormalization(space, num_envs=2, normalize_observations=False, normalize_rewards=True)  # rewards are fine
