"""Recurrent modules acting: every place that acts keeps a state per env (per agent), reset where an episode starts.

The single-agent runner (autoresets, rollout cuts, dropped episodes, evaluation in between),
the multi-agent runner, ``Policy`` (one episode, a batch, reset), checkpoints, ONNX and
torch.export graphs that carry the state, and ``evaluate`` / ``record``. Each stored step's
``state_in``, ``prev_actions`` and ``prev_rewards`` is checked against the module replayed
one step at a time from the initial state.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import minari
import numpy as np
import pytest
import torch
from test_env_faults import faulty_runner
from test_multi_agent_runner import OBS, TurnGame, whole_agent_episodes

from lightning_rl import Policy
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.cli import evaluate_command, record_command
from lightning_rl.cli.evaluate_command import HELD_OUT_SEED_OFFSET
from lightning_rl.core.columns import Columns
from lightning_rl.core.recurrent import batched_initial_state, pack_state, unpack_state
from lightning_rl.core.rl_module_specs import RLModuleSpec
from lightning_rl.env.env_runner import EnvRunner
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.multi_agent_runner import MultiAgentEnvRunner
from lightning_rl.policy.export import export_policy

torch.set_num_threads(1)

LSTM = {"use_lstm": True, "lstm_cell_size": 8, "fcnet_hiddens": [8]}
WITH_PREVIOUS = {**LSTM, "lstm_use_prev_action": True, "lstm_use_prev_reward": True}
_cartpole = gym.make("CartPole-v1")
CARTPOLE_SPACES = (_cartpole.observation_space, _cartpole.action_space)
_cartpole.close()


class UnevenEpisodes(gym.Env):
    """Episodes of 2 to 6 steps (drawn at each reset); reward = action + 0.5; one reward is NaN when ``nan_at`` says so.

    ``nan_at``: the env step (counted over the env's life) whose reward is NaN, or ``None``.
    """

    observation_space = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, nan_at: int | None = None) -> None:
        self.nan_at = nan_at
        self.life_steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.length = int(self.np_random.integers(2, 7))
        self.t = 0
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.length, self.np_random.standard_normal()], np.float32)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        self.life_steps += 1
        reward = float("nan") if self.life_steps == self.nan_at else float(action) + 0.5
        return self._obs(), reward, self.t >= self.length, False, {}


def recurrent_module(observation_space: gym.Space, action_space: gym.Space, config: dict, seed: int = 0) -> PPOModule:
    torch.manual_seed(seed)
    return PPOModule(observation_space, action_space, model_config=dict(config))


def check_replays(module: PPOModule, episode: SingleAgentEpisode, env_rewards: np.ndarray | None = None) -> None:
    """An episode's stored state_in, prev_actions and prev_rewards are the module's, stepped from the initial state.

    ``env_rewards``: the env's own rewards when the episode stores normalized ones (prev_rewards are the env's).
    """
    assert episode.t_started == 0
    extra = episode.extra_model_outputs
    actions = np.asarray(episode.actions)
    rewards = np.asarray(episode.rewards if env_rewards is None else env_rewards, dtype=np.float32)
    np.testing.assert_array_equal(extra[Columns.PREV_ACTIONS], np.concatenate([[0], actions[:-1]]))
    np.testing.assert_array_equal(extra[Columns.PREV_REWARDS], np.concatenate([[0.0], rewards[:-1]]))
    template = module.get_initial_state()
    state = batched_initial_state(module, 1)
    with torch.no_grad():
        for step in range(len(actions)):
            np.testing.assert_allclose(extra[Columns.STATE_IN][step], pack_state(state)[0].numpy(), atol=1e-6)
            batch = {
                Columns.OBS: torch.as_tensor(np.asarray(episode.observations[step]))[None, None],
                Columns.STATE_IN: unpack_state(torch.as_tensor(extra[Columns.STATE_IN][step])[None], template),
                Columns.PREV_ACTIONS: torch.as_tensor(extra[Columns.PREV_ACTIONS][step])[None, None],
                Columns.PREV_REWARDS: torch.as_tensor(extra[Columns.PREV_REWARDS][step])[None, None],
            }
            state = module.forward_inference(batch)[Columns.STATE_OUT]


def whole_episodes(chunks: list[SingleAgentEpisode]) -> list[SingleAgentEpisode]:
    """Each episode that started in these calls, its chunks concatenated into its first (the last may run on)."""
    whole: dict[str, SingleAgentEpisode] = {}
    for chunk in chunks:
        if chunk.id_ in whole:
            whole[chunk.id_].concat_episode(chunk)
        elif chunk.t_started == 0:
            whole[chunk.id_] = chunk
    return list(whole.values())


# ----------------------------------------------------------------------------------------
# The single-agent runner
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalize_rewards", [False, True])
def test_state_restarts_at_every_autoreset_and_carries_across_sample_calls(normalize_rewards: bool) -> None:
    # Fragments of 4 steps cut episodes of 2-6 steps; three envs end their episodes at different steps.
    module = recurrent_module(UnevenEpisodes.observation_space, UnevenEpisodes.action_space, WITH_PREVIOUS)
    with EnvRunner(
        UnevenEpisodes, num_envs=3, rollout_fragment_length=4, seed=0, normalize_rewards=normalize_rewards
    ) as runner:
        chunks = [chunk for _ in range(6) for chunk in runner.sample(module)]
    episodes = whole_episodes(chunks)
    assert len(episodes) >= 8 and any(len(episode) > 4 for episode in episodes)
    for episode in episodes:
        # prev_rewards are the env's own rewards (UnevenEpisodes pays action + 0.5), also when
        # the episodes store normalized ones: what evaluation and a deployed Policy feed too.
        env_rewards = np.asarray(episode.actions, np.float32) + 0.5
        if normalize_rewards:
            assert not np.allclose(np.asarray(episode.rewards), env_rewards)
        check_replays(module, episode, env_rewards)
    continued = [chunk for chunk in chunks if chunk.t_started > 0]
    assert continued and all(np.abs(chunk.extra_model_outputs[Columns.STATE_IN][0]).sum() > 0 for chunk in continued)


def test_dropped_episodes_and_evaluation_restart_the_state() -> None:
    module = recurrent_module(UnevenEpisodes.observation_space, UnevenEpisodes.action_space, LSTM)
    with EnvRunner(
        UnevenEpisodes, env_kwargs={"nan_at": 3}, num_envs=2, rollout_fragment_length=5, seed=1,
        on_nonfinite="drop_episode",
    ) as runner:  # fmt: skip
        chunks = runner.sample(module)
        assert runner.get_metrics()["num_nonfinite_env_steps"] == 2  # both envs dropped their first episode
        evaluation = runner.sample_episodes(module, 3)
        after = runner.sample(module)
    for episode in [*whole_episodes(chunks), *evaluation]:
        check_replays(module, episode)
    # Evaluation left the envs mid-episode: training starts afresh, its state too.
    assert all(chunk.t_started == 0 for chunk in after)
    for episode in whole_episodes(after):
        check_replays(module, episode)


@pytest.mark.parametrize("fault, vectorize_mode", [("raise", "sync"), ("exit", "async")])
def test_rebuilt_envs_start_their_episodes_from_the_initial_state(fault: str, vectorize_mode: str) -> None:
    # "raise": env 1 alone is rebuilt at its step 3; "exit": every async worker is (EnvsRebuilt).
    with faulty_runner(fault, vectorize_mode, num_envs=2, restart_failed_sub_environments=True) as runner:
        module = recurrent_module(runner.observation_space, runner.action_space, WITH_PREVIOUS)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "env 1's worker process exited ..."
            chunks = [chunk for _ in range(3) for chunk in runner.sample(module)]
        assert runner.get_metrics()["num_env_restarts"] >= 1
    episodes = whole_episodes(chunks)
    assert any(episode.observations[0, 1] == -1 for episode in episodes)  # a rebuilt env's (reset without a seed)
    for episode in episodes:
        check_replays(module, episode)


def test_a_feed_forward_module_stores_no_state() -> None:
    module = recurrent_module(UnevenEpisodes.observation_space, UnevenEpisodes.action_space, {"fcnet_hiddens": [8]})
    with EnvRunner(UnevenEpisodes, num_envs=2, rollout_fragment_length=4, seed=0) as runner:
        (chunk, *_) = runner.sample(module)
    assert Columns.STATE_IN not in chunk.extra_model_outputs and Columns.PREV_ACTIONS not in chunk.extra_model_outputs


# ----------------------------------------------------------------------------------------
# The multi-agent runner
# ----------------------------------------------------------------------------------------


def test_the_multi_agent_runner_keeps_a_state_per_agent_per_copy() -> None:
    module = recurrent_module(OBS, gym.spaces.Discrete(3), WITH_PREVIOUS)
    with MultiAgentEnvRunner(TurnGame, num_envs=2, seed=0) as runner:
        chunks = [chunk for _ in range(5) for chunk in runner.sample(module, num_env_steps=3)]
        evaluation = runner.sample_episodes(module, num_episodes=2)
    ids = {chunk.id_ for chunk in chunks if chunk.env_t_started == 0}
    whole = whole_agent_episodes([chunk for chunk in chunks if chunk.id_ in ids])
    done = [episode for episode in whole.values() if episode.is_done]
    assert len(done) >= 4  # x and y of two games or more, each crossing rollout cuts
    for episode in done:
        check_replays(module, episode)
    for game in evaluation:
        for episode in game.agent_episodes.values():
            check_replays(module, episode)


# ----------------------------------------------------------------------------------------
# Policy, checkpoints, export
# ----------------------------------------------------------------------------------------


def stepped_by_hand(policy: Policy, observations: np.ndarray) -> np.ndarray:
    """Greedy actions of ``observations [T, B, ...]`` through PolicyNet's pure step, the state carried by hand."""
    net = policy.net
    state = pack_state(batched_initial_state(policy.module, observations.shape[1]))
    prev_actions = torch.zeros(observations.shape[1], dtype=torch.long)
    prev_rewards = torch.zeros(observations.shape[1])
    actions = []
    with torch.no_grad():
        for obs in observations:
            extra = {"prev_actions": prev_actions, "prev_rewards": prev_rewards}
            action, state = net(torch.as_tensor(obs), state, **{name: extra[name] for name in net.state_inputs[1:]})
            actions.append(action.numpy())
            prev_actions = action
    return np.stack(actions)


def test_policy_acts_with_state_on_one_episode_and_a_batch_and_resets_rows() -> None:
    policy = Policy(recurrent_module(*CARTPOLE_SPACES, {**LSTM, "lstm_use_prev_action": True}))
    assert policy.is_stateful and policy.net.state_inputs == ("state_in", "prev_actions")
    observations = np.random.default_rng(0).standard_normal((6, 3, 4)).astype(np.float32)
    expected = stepped_by_hand(policy, observations)
    batch = np.stack([policy.act(obs) for obs in observations])
    np.testing.assert_array_equal(batch, expected)
    policy.reset()
    single = np.array([policy.act(obs[1]) for obs in observations])  # one episode: one observation per call
    np.testing.assert_array_equal(single, expected[:, 1])
    refusal = r"a batch of 3 observations, but this recurrent policy acts for 1 rows .*call policy\.reset\(\)"
    with pytest.raises(ValueError, match=refusal):
        policy.act(observations[0])
    policy.reset()
    first = [policy.act(obs) for obs in observations[:3]]
    policy.reset(rows=[2])  # env 2 starts a new episode; envs 0 and 1 go on
    later = np.stack(first + [policy.act(obs) for obs in observations[:3]])
    np.testing.assert_array_equal(later[:, :2], stepped_by_hand(policy, np.concatenate([observations[:3]] * 2))[:, :2])
    np.testing.assert_array_equal(later[3:, 2], expected[:3, 2])
    policy.reset()
    policy.act(observations[0])
    subset = policy.act(observations[1][[0, 2]], rows=[0, 2])  # env 1's episode is over: only 0 and 2 act
    np.testing.assert_array_equal(subset, expected[1, [0, 2]])


def test_a_feed_forward_policy_ignores_reset_and_takes_any_batch() -> None:
    policy = Policy(recurrent_module(*CARTPOLE_SPACES, {"fcnet_hiddens": [8]}))
    observations = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    first = policy.act(observations)
    policy.reset()
    policy.reset(rows=[0])
    assert not policy.is_stateful and policy.net.state_inputs == ()
    np.testing.assert_array_equal(policy.act(observations), first)
    np.testing.assert_array_equal(policy.act(observations[0]), first[0])


@pytest.fixture(scope="module")
def recurrent_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PPOLearner]:
    """An untrained recurrent PPO CartPole Learner (built, never updated) and its ``save_to_path`` directory."""
    torch.manual_seed(0)
    spec = RLModuleSpec(PPOModule, *CARTPOLE_SPACES, model_config=dict(WITH_PREVIOUS))
    learner = PPOLearner(spec, minibatch_size=16)
    learner.build()
    return Path(learner.save_to_path(str(tmp_path_factory.mktemp("lstm") / "ppo"))), learner


def test_from_checkpoint_rebuilds_a_recurrent_module(recurrent_checkpoint) -> None:
    path, learner = recurrent_checkpoint
    policy = Policy.from_checkpoint(path)
    assert policy.is_stateful and policy.module.resolved_model_config()["lstm_cell_size"] == 8
    original = Policy.from_learner(learner)
    observations = np.random.default_rng(1).standard_normal((5, 2, 4)).astype(np.float32)
    for obs in observations:
        np.testing.assert_array_equal(policy.act(obs), original.act(obs))


GRU_WITH_REWARD = {**LSTM, "recurrent_cell": "gru", "lstm_use_prev_reward": True}


@pytest.mark.parametrize("config", [LSTM, WITH_PREVIOUS, GRU_WITH_REWARD])
@pytest.mark.parametrize("export_format", ["torch", "onnx"])
def test_exported_graphs_carry_the_state_over_steps(config: dict, export_format: str, tmp_path: Path) -> None:
    if export_format == "onnx":
        onnxruntime = pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    policy = Policy(recurrent_module(*CARTPOLE_SPACES, config))
    output = export_policy(policy, tmp_path / f"policy.{export_format}", export_format)
    observations = np.random.default_rng(2).standard_normal((6, 3, 4)).astype(np.float32)
    rewards = np.random.default_rng(3).standard_normal((6, 3)).astype(np.float32)
    inputs: dict[str, np.ndarray] = {"state_in": np.zeros((3, 4 * 8), np.float32)}  # two LSTM states (h, c) of 8
    if config.get("recurrent_cell") == "gru":
        inputs["state_in"] = np.zeros((3, 2 * 8), np.float32)
    if config.get("lstm_use_prev_action"):
        inputs["prev_actions"] = np.zeros(3, np.int64)
    if config.get("lstm_use_prev_reward"):
        inputs["prev_rewards"] = np.zeros(3, np.float32)
    if export_format == "onnx":
        session = onnxruntime.InferenceSession(str(output), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == ["obs", *inputs]
        assert [o.name for o in session.get_outputs()] == ["actions", "state_out"]
    else:
        program = torch.export.load(output).module()
    for obs, reward in zip(observations, rewards):
        if export_format == "onnx":
            actions, state_out = session.run(["actions", "state_out"], {"obs": obs, **inputs})
        else:
            prev = {name: torch.from_numpy(value) for name, value in inputs.items() if name != "state_in"}
            result = program(torch.from_numpy(obs), torch.from_numpy(inputs["state_in"]), **prev)
            actions, state_out = (value.numpy() for value in result)
        np.testing.assert_array_equal(actions, policy.act(obs))
        policy.observe_rewards(reward)
        inputs["state_in"] = state_out
        if "prev_actions" in inputs:
            inputs["prev_actions"] = actions
        if "prev_rewards" in inputs:
            inputs["prev_rewards"] = reward


# ----------------------------------------------------------------------------------------
# evaluate and record
# ----------------------------------------------------------------------------------------


def played_by_hand(policy: Policy, seeds: range) -> list[SingleAgentEpisode]:
    """Greedy CartPole episodes, one after the other, the policy reset and told its rewards."""
    env = gym.make("CartPole-v1")
    episodes = []
    for seed in seeds:
        policy.reset()
        episode = SingleAgentEpisode()
        obs, _ = env.reset(seed=seed)
        episode.add_env_reset(obs)
        while not episode.is_done:
            action = policy.act(obs)
            obs, reward, terminated, truncated, _ = env.step(action)
            policy.observe_rewards([reward])
            episode.add_env_step(obs, action, reward, terminated=terminated, truncated=truncated)
        episodes.append(episode)
    return episodes


def test_evaluate_plays_a_recurrent_checkpoint_with_its_state_per_env(recurrent_checkpoint, tmp_path, capsys) -> None:
    path, _ = recurrent_checkpoint
    args = ["--ckpt_path", str(path), "--env", "CartPole-v1", "--num_episodes", "3", "--num_envs", "2"]
    evaluate_command.main([*args, "--json", str(tmp_path / "stats.json")])
    episodes = played_by_hand(Policy.from_checkpoint(path), range(HELD_OUT_SEED_OFFSET, HELD_OUT_SEED_OFFSET + 3))
    returns = [float(np.sum(episode.rewards)) for episode in episodes]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert (stats["episode_return_min"], stats["episode_return_max"]) == (min(returns), max(returns))
    assert stats["episode_return_mean"] == pytest.approx(np.mean(returns))


def test_record_plays_a_recurrent_checkpoint_with_its_state_per_env(
    recurrent_checkpoint, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari_datasets"))
    path, _ = recurrent_checkpoint
    record_command.main(
        ["--env", "CartPole-v1", "--ckpt_path", str(path), "--num_episodes", "3", "--num_envs", "2"]
        + ["--dataset_id", "cartpole/lstm-v0"]
    )
    episodes = played_by_hand(Policy.from_checkpoint(path), range(HELD_OUT_SEED_OFFSET, HELD_OUT_SEED_OFFSET + 3))
    stored = list(minari.load_dataset("cartpole/lstm-v0").iterate_episodes())
    assert [len(episode.actions) for episode in stored] == [len(episode) for episode in episodes]
    for read, played in zip(stored, episodes):
        np.testing.assert_array_equal(read.actions, np.asarray(played.actions))


def test_a_box_action_is_fed_back_as_the_env_executes_it_clipped_to_its_bounds() -> None:
    from lightning_rl.core.acting import Acting

    space = gym.spaces.Box(-0.1, 0.1, (1,), np.float32)
    module = recurrent_module(gym.spaces.Box(-1, 1, (3,), np.float32), space, {**LSTM, "lstm_use_prev_action": True})
    acting = Acting(module, num_rows=64)
    with torch.no_grad():
        _, actions = acting.act(torch.zeros(64, 3), explore=True)
        out, _ = acting.act(torch.zeros(64, 3), explore=True)
    assert (actions.abs() > 0.1).any()  # a unit Gaussian leaves these narrow bounds
    torch.testing.assert_close(out[Columns.PREV_ACTIONS], actions.clamp(-0.1, 0.1))
