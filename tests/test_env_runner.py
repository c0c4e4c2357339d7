"""EnvRunner: episode boundaries under vector autoreset, clipping, seeding, counters, state."""

from __future__ import annotations

import functools
import json
import math
from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from _helpers import CoinLengthEnv

from lightning_rl import RLModuleSpec
from lightning_rl.algorithms.bc import BCModule
from lightning_rl.core.columns import Columns
from lightning_rl.env import EnvRunner, SingleAgentEpisode

MAX_STEPS = 6  # the TimeLimit of the counting env


class CountingEnv(gym.Env):
    """Observations ``[tag, episode, t]``: which env copy, which of its episodes, which step.

    ``tag`` is the seed of the env's first (seeded) reset. Episode ``k`` terminates after
    ``terminal_step(tag, k)`` steps (2..9), so with a TimeLimit of 6 some episodes terminate,
    some are truncated and some do both. The reward of step ``t -> t + 1`` is ``t + 1``.
    With ``with_infos`` every reset and step returns ``{"t": t}``.
    """

    def __init__(self, with_infos: bool = False) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.with_infos = with_infos
        self.tag = -1
        self.episode = -1
        self.t = 0

    @staticmethod
    def terminal_step(tag: int, episode: int) -> int:
        return 2 + (3 * episode + tag) % 8

    def _obs(self) -> np.ndarray:
        return np.array([self.tag, self.episode, self.t], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.tag = seed
        self.episode += 1
        self.t = 0
        return self._obs(), ({"t": 0} if self.with_infos else {})

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        terminated = self.t >= self.terminal_step(self.tag, self.episode)
        return self._obs(), float(self.t), terminated, False, ({"t": self.t} if self.with_infos else {})


class BoxActionEnv(gym.Env):
    """Actions in [-0.5, 0.5]; the observation is the last action the env received."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(-0.5, 0.5, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert self.action_space.contains(np.asarray(action, np.float32)), action
        return np.asarray(action, np.float32).copy(), 0.0, False, False, {}


def time_limit(env: gym.Env) -> gym.Env:
    return gym.wrappers.TimeLimit(env, MAX_STEPS)


def counting_runner(**kwargs: Any) -> EnvRunner:
    env = functools.partial(CountingEnv, with_infos=kwargs.pop("with_infos", False))
    options = {"wrappers": [time_limit], "num_envs": 3, "rollout_fragment_length": 4, "seed": 10}
    options.update(kwargs)
    return EnvRunner(env, **options)


def module_for(runner: EnvRunner, hiddens: tuple[int, ...] = (8,)) -> BCModule:
    return RLModuleSpec(
        module_class=BCModule,
        observation_space=runner.observation_space,
        action_space=runner.action_space,
        model_config={"fcnet_hiddens": list(hiddens)},
    ).build()


def check_chunk(episode: SingleAgentEpisode) -> None:
    """Every transition of a chunk stays inside one episode of one env copy, step by step."""
    obs = episode.observations
    assert episode.is_numpy and obs.shape == (len(episode) + 1, 3)
    assert len(episode) >= 1
    tag, number = obs[0, 0], obs[0, 1]
    assert (obs[:, 0] == tag).all() and (obs[:, 1] == number).all(), obs
    np.testing.assert_array_equal(obs[:, 2], episode.t_started + np.arange(len(episode) + 1))
    np.testing.assert_array_equal(episode.rewards, obs[1:, 2])  # reward of t -> t + 1 is t + 1
    last_t = int(obs[-1, 2])
    terminal = CountingEnv.terminal_step(int(tag), int(number))
    # The last observation is the true final one: its step is where the env ended the episode.
    assert episode.is_terminated == (last_t == terminal)
    assert episode.is_truncated == (last_t == MAX_STEPS)
    if not episode.is_done:
        assert last_t < min(terminal, MAX_STEPS)
    for key in (Columns.ACTION_LOGP, Columns.ACTION_DIST_INPUTS):
        assert len(episode.extra_model_outputs[key]) == len(episode)


def join_chunks(rounds: list[list[SingleAgentEpisode]]) -> tuple[dict[str, SingleAgentEpisode], list[str]]:
    whole: dict[str, SingleAgentEpisode] = {}
    for episodes in rounds:
        for episode in episodes:
            if episode.id_ in whole:
                whole[episode.id_].concat_episode(episode)  # checks id, t_started and the shared obs
            else:
                assert episode.t_started == 0, episode
                whole[episode.id_] = episode[:]  # a new episode object: the chunks stay as sampled
    return whole, [id_ for id_, episode in whole.items() if episode.is_done]


@pytest.mark.parametrize(
    ("vectorize_mode", "num_envs", "rollout"),
    [("sync", 3, 4), ("sync", 1, 1), ("sync", 4, 7), ("async", 3, 5)],
)
def test_no_transition_crosses_an_episode_boundary(vectorize_mode: str, num_envs: int, rollout: int) -> None:
    with counting_runner(vectorize_mode=vectorize_mode, num_envs=num_envs, rollout_fragment_length=rollout) as runner:
        module = module_for(runner)
        rounds = [runner.sample(module) for _ in range(max(8, -(-60 // (num_envs * rollout))))]
    for episodes in rounds:
        assert sum(len(episode) for episode in episodes) == rollout * num_envs
        running = [episode for episode in episodes if not episode.is_done]
        assert all(episode.is_done for episode in episodes[: len(episodes) - len(running)])  # ended first
        for episode in episodes:
            check_chunk(episode)
    whole, done_ids = join_chunks(rounds)
    assert len(done_ids) > 3
    seen = set()
    for id_ in done_ids:
        episode = whole[id_]
        check_chunk(episode)  # the joined chunks form one whole episode, from t=0 to its end
        key = (episode.observations[0, 0], episode.observations[0, 1])
        assert key not in seen  # one id per episode of each env copy
        seen.add(key)
    assert any(whole[i].is_truncated and not whole[i].is_terminated for i in done_ids)
    assert any(whole[i].is_terminated for i in done_ids)
    # Every env copy's episodes are numbered 0, 1, 2, ... with none skipped.
    numbers = defaultdict(set)
    for episode in whole.values():
        numbers[episode.observations[0, 0]].add(int(episode.observations[0, 1]))
    assert len(numbers) == num_envs
    for found in numbers.values():
        assert found == set(range(len(found)))


def test_extra_model_outputs_match_the_policy() -> None:
    with counting_runner(num_envs=2, rollout_fragment_length=5) as runner:
        module = module_for(runner)
        episodes = runner.sample(module)
    for episode in episodes:
        with torch.no_grad():
            logits = module.forward_exploration({Columns.OBS: torch.as_tensor(episode.observations[:-1])})[
                Columns.ACTION_DIST_INPUTS
            ]
        np.testing.assert_allclose(
            episode.extra_model_outputs[Columns.ACTION_DIST_INPUTS], logits.numpy(), rtol=1e-5, atol=1e-6
        )
        logp = torch.log_softmax(logits, -1).gather(1, torch.as_tensor(episode.actions)[:, None])[:, 0]
        np.testing.assert_allclose(episode.extra_model_outputs[Columns.ACTION_LOGP], logp.numpy(), rtol=1e-5, atol=1e-6)
        assert episode.actions.dtype == np.int64


def test_greedy_sampling_takes_the_most_likely_action() -> None:
    with counting_runner() as runner:
        episodes = runner.sample(module_for(runner), explore=False)
    for episode in episodes:
        np.testing.assert_array_equal(
            episode.actions, episode.extra_model_outputs[Columns.ACTION_DIST_INPUTS].argmax(-1)
        )


class FixedActionModule(BCModule):
    """Returns actions itself (as epsilon-greedy modules do), plus a value per row."""

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        out = super()._forward(batch)
        rows = len(batch[Columns.OBS])
        return {**out, Columns.ACTIONS: torch.ones(rows, dtype=torch.int64), Columns.VF_PREDS: torch.full((rows,), 2.5)}


def test_module_actions_and_other_outputs_are_used_and_recorded() -> None:
    with counting_runner() as runner:
        module = RLModuleSpec(
            FixedActionModule, runner.observation_space, runner.action_space, {"fcnet_hiddens": [4]}
        ).build()
        episodes = runner.sample(module)
    for episode in episodes:
        assert (episode.actions == 1).all()
        assert (episode.extra_model_outputs[Columns.VF_PREDS] == 2.5).all()
        assert Columns.ACTION_LOGP not in episode.extra_model_outputs  # no distribution was sampled


class FailingModule(BCModule):
    """Raises on its third forward pass."""

    calls = 0

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        FailingModule.calls += 1
        if FailingModule.calls == 3:
            raise RuntimeError("boom")
        return super()._forward(batch)


def test_an_error_mid_rollout_changes_no_counters_and_restarts_the_episodes() -> None:
    with counting_runner(rollout_fragment_length=4) as runner:
        module = RLModuleSpec(
            FailingModule, runner.observation_space, runner.action_space, {"fcnet_hiddens": [4]}
        ).build()
        with pytest.raises(RuntimeError, match="boom"):
            runner.sample(module)
        assert runner.get_state()["num_env_steps_sampled_lifetime"] == 0
        episodes = runner.sample(module)
    assert all(episode.t_started == 0 for episode in episodes)
    for episode in episodes:
        check_chunk(episode)


def test_box_actions_are_clipped_for_the_env_but_stored_unclipped() -> None:
    with EnvRunner(BoxActionEnv, num_envs=2, rollout_fragment_length=50, seed=0) as runner:
        episodes = runner.sample(module_for(runner))
    actions = np.concatenate([episode.actions for episode in episodes])
    assert actions.dtype == np.float32 and actions.shape == (100, 1)
    assert (np.abs(actions) > 0.5).any()  # a unit Gaussian leaves the box often
    for episode in episodes:
        np.testing.assert_array_equal(episode.observations[1:], np.clip(episode.actions, -0.5, 0.5))


@pytest.mark.parametrize("vectorize_mode", ["sync", "async"])
def test_infos_are_recorded_per_step_when_the_env_returns_some(vectorize_mode: str) -> None:
    with counting_runner(with_infos=True, rollout_fragment_length=5, vectorize_mode=vectorize_mode) as runner:
        module = module_for(runner)
        rounds = [runner.sample(module) for _ in range(4)]
    for episodes in rounds:
        for episode in episodes:
            assert [info["t"] for info in episode.infos] == episode.observations[:, 2].tolist()
    whole, done_ids = join_chunks(rounds)
    for id_ in done_ids:
        assert [info["t"] for info in whole[id_].infos] == list(range(len(whole[id_]) + 1))


def test_infos_of_a_string_wrapper_arrive_at_the_end_of_episodes() -> None:
    # RecordEpisodeStatistics puts {"episode": {...}} only into the info of the final step.
    with EnvRunner(
        "CartPole-v1",
        wrappers=["gymnasium.wrappers.RecordEpisodeStatistics"],
        num_envs=2,
        rollout_fragment_length=60,
        seed=0,
    ) as runner:
        episodes = runner.sample(module_for(runner))
    done = [episode for episode in episodes if episode.is_done]
    assert done
    for episode in done:
        assert len(episode.infos) == len(episode) + 1
        assert float(episode.infos[-1]["episode"]["r"]) == episode.get_return()
        assert all("episode" not in info for info in episode.infos[:-1])


def test_cartpole_records_no_infos() -> None:
    with EnvRunner("CartPole-v1", num_envs=2, rollout_fragment_length=40, seed=0) as runner:
        episodes = runner.sample(module_for(runner))
    assert all(episode.infos == [] for episode in episodes)
    assert any(episode.is_done for episode in episodes)


def sample_rounds(seed: int | None, rounds: int = 3) -> list[list[SingleAgentEpisode]]:
    torch.manual_seed(0)
    with EnvRunner("CartPole-v1", num_envs=2, rollout_fragment_length=30, seed=seed) as runner:
        module = module_for(runner)
        return [runner.sample(module) for _ in range(rounds)]


def flat(rounds: list[list[SingleAgentEpisode]]) -> tuple[np.ndarray, np.ndarray]:
    episodes = [episode for episodes in rounds for episode in episodes]
    return np.concatenate([e.observations for e in episodes]), np.concatenate([e.actions for e in episodes])


def test_same_seed_same_episodes() -> None:
    obs_a, actions_a = flat(sample_rounds(seed=3))
    obs_b, actions_b = flat(sample_rounds(seed=3))
    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(actions_a, actions_b)
    obs_c, _ = flat(sample_rounds(seed=4))
    assert not np.array_equal(obs_a[:10], obs_c[:10])


def test_first_reset_uses_seed_plus_env_index() -> None:
    with counting_runner(num_envs=3, seed=7) as runner:
        episodes = runner.sample(module_for(runner))
    assert {episode.observations[0, 0] for episode in episodes} == {7, 8, 9}


def test_counters_and_metrics() -> None:
    with counting_runner(num_envs=2, rollout_fragment_length=5, episode_stats_window=3) as runner:
        metrics = runner.get_metrics()
        assert math.isnan(metrics["episode_return_mean"]) and metrics["num_env_steps_sampled"] == 0
        module = module_for(runner)
        rounds = [runner.sample(module) for _ in range(4)]
        metrics = runner.get_metrics()
        whole, done_ids = join_chunks(rounds)
        lengths = [len(whole[id_]) for id_ in done_ids]
        returns = [whole[id_].get_return() for id_ in done_ids]
        assert metrics["num_env_steps_sampled"] == metrics["num_env_steps_sampled_lifetime"] == 40
        assert metrics["num_episodes"] == metrics["num_episodes_lifetime"] == len(done_ids)
        # Returns and lengths are of whole episodes (over chunks), for the last 3 to end.
        ended_order = [episode.id_ for episodes in rounds for episode in episodes if episode.is_done]
        last3 = [whole[id_] for id_ in ended_order[-3:]]
        assert metrics["episode_return_mean"] == pytest.approx(np.mean([e.get_return() for e in last3]))
        assert metrics["episode_len_mean"] == pytest.approx(np.mean([len(e) for e in last3]))
        assert metrics["episode_return_max"] <= max(returns) and metrics["episode_return_min"] >= min(returns)
        assert all(ret == n * (n + 1) / 2 for ret, n in zip(returns, lengths))
        assert metrics["env_steps_per_sec"] > 0
        runner.sample(module)
        metrics = runner.get_metrics()
        assert metrics["num_env_steps_sampled"] == 10 and metrics["num_env_steps_sampled_lifetime"] == 50


def test_sample_episodes_returns_whole_episodes_and_leaves_training_counters() -> None:
    with counting_runner(num_envs=3, rollout_fragment_length=4) as runner:
        module = module_for(runner)
        runner.sample(module)
        state = runner.get_state()
        metrics_before = runner.get_metrics()
        runner.sample(module)
        state_after_sample = runner.get_state()
        episodes = runner.sample_episodes(module, 7)
        assert len(episodes) == 7
        for episode in episodes:
            assert episode.is_done and episode.t_started == 0
            check_chunk(episode)
        assert len({episode.id_ for episode in episodes}) == 7
        # The episodes are whole (they span several rollout chunks) and fresh: each env copy
        # was reset, with new seeds.
        assert any(len(episode) > 4 for episode in episodes)
        assert {episode.observations[0, 0] for episode in episodes} <= {13, 14, 15}  # seed + 1 reset * 3 envs
        after = runner.get_state()
        for key in ("num_env_steps_sampled_lifetime", "num_episodes_lifetime", "episode_returns"):
            assert after[key] == state_after_sample[key]
        assert after["num_resets"] == state["num_resets"] + 1
        assert metrics_before["num_env_steps_sampled"] == 12
        assert runner.get_metrics()["num_env_steps_sampled"] == 12  # only the second sample()
        # Training continues from fresh episodes.
        for episode in runner.sample(module):
            check_chunk(episode)
            assert episode.t_started == 0


def test_state_round_trip_continues_the_counters() -> None:
    with counting_runner(seed=10) as runner:
        module = module_for(runner)
        for _ in range(3):
            runner.sample(module)
        state = runner.get_state()
    assert state["num_env_steps_sampled_lifetime"] == 36 and state["num_resets"] == 1

    assert json.loads(json.dumps(state)) == state  # plain python data
    with counting_runner(seed=10) as resumed:
        resumed.set_state(state)
        assert resumed.get_state() == state
        episodes = resumed.sample(module)
        # A new reset with seeds derived from the saved count: not the first run's episodes.
        assert {episode.observations[0, 0] for episode in episodes if episode.t_started == 0} >= {13, 14, 15}
        metrics = resumed.get_metrics()
        assert metrics["num_env_steps_sampled_lifetime"] == 48
        assert metrics["num_env_steps_sampled"] == 12
        assert metrics["num_episodes_lifetime"] == state["num_episodes_lifetime"] + metrics["num_episodes"]
        with pytest.raises(ValueError, match=r"missing keys \['num_resets'\]"):
            resumed.set_state({k: v for k, v in state.items() if k != "num_resets"})


def test_unknown_env_id_is_named() -> None:
    with pytest.raises(ValueError, match="CartPoleX-v1.*did you mean"):
        EnvRunner("CartPoleX-v1")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_envs": 0}, "num_envs"),
        ({"rollout_fragment_length": 0}, "rollout_fragment_length"),
        ({"vectorize_mode": "threads"}, "vectorize_mode"),
        ({"episode_stats_window": 0}, "episode_stats_window"),
        ({"wrappers": ["gymnasium.spaces.Box"]}, r"wrappers\[0\]"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EnvRunner("CartPole-v1", **kwargs)


def test_env_kwargs_and_string_wrappers() -> None:
    with EnvRunner(
        "CartPole-v1",
        env_kwargs={"max_episode_steps": 5},
        wrappers=["gymnasium.wrappers.FlattenObservation"],
        num_envs=1,
        rollout_fragment_length=12,
        seed=0,
    ) as runner:
        episodes = runner.sample(module_for(runner))
    assert all(len(episode) <= 5 for episode in episodes)
    assert any(episode.is_truncated for episode in episodes)


@pytest.mark.parametrize("num_envs", [1, 4, 32])
def test_sample_episodes_mean_is_sequential_plays_whatever_the_number_of_envs(num_envs: int) -> None:
    # Keeping the first episodes to *end* favoured short ones: 32 envs read ~10 where sequential
    # play reads ~20.5. Each evaluation now plays the first num_episodes to *start*, whole.
    with EnvRunner(CoinLengthEnv, num_envs=num_envs, rollout_fragment_length=16, seed=3) as runner:
        module = module_for(runner)
        lengths = [len(episode) for _ in range(10) for episode in runner.sample_episodes(module, 32)]
    assert len(lengths) == 320 and set(lengths) == {1, 40}
    assert abs(np.mean(lengths) - 20.5) < 3.5, np.mean(lengths)  # the mean of 1 and 40; sd of the mean ~1.1


def test_sample_episodes_keeps_the_first_episodes_to_start() -> None:
    # Each copy's episodes are numbered (obs[1]) and their lengths known: the episodes kept are
    # exactly the first 8 to start (ties by env index), not the first 8 to end.
    with counting_runner(num_envs=3, rollout_fragment_length=4) as runner:
        module = module_for(runner)
        episodes = runner.sample_episodes(module, 8)
    tags = sorted({int(episode.observations[0, 0]) for episode in episodes})
    starts = []
    for tag in tags:
        start = 0
        first = int(min(episode.observations[0, 1] for episode in episodes if episode.observations[0, 0] == tag))
        for number in range(first, first + 8):
            starts.append((start, tag, number))
            start += min(CountingEnv.terminal_step(tag, number), MAX_STEPS)
    assert len(episodes) == 8
    for episode in episodes:
        check_chunk(episode)
        assert episode.is_done and episode.t_started == 0
    kept = {(int(episode.observations[0, 0]), int(episode.observations[0, 1])) for episode in episodes}
    assert kept == {(tag, number) for _, tag, number in sorted(starts)[:8]}


def test_a_data_modules_evaluation_mean_is_sequential_plays() -> None:
    # What eval/episode_return_mean (EarlyStopping, the "best" ModelCheckpoint) is computed from.
    from lightning_rl.data import OnPolicyDataModule

    lengths = {}
    for num_envs in (1, 32):
        data = OnPolicyDataModule(CoinLengthEnv, num_envs=num_envs, evaluation_num_episodes=32, seed=3)
        try:
            module = module_for(data.sampling.eval_runner)
            lengths[num_envs] = [len(episode) for _ in range(8) for episode in data.sampling.evaluate(module)]
        finally:
            data.teardown("fit")
    assert len(lengths[1]) == len(lengths[32]) == 256
    assert abs(np.mean(lengths[32]) - np.mean(lengths[1])) < 5, (np.mean(lengths[1]), np.mean(lengths[32]))
    assert abs(np.mean(lengths[32]) - 20.5) < 4
