"""MultiAgentEnvRunner on PettingZoo envs: turn-based and parallel agents, forwards per module, masks, metrics, state.

Small hand-written envs give exact expectations; simple_spread (parallel) and connect four
(AEC, action masks) show the real envs run.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from pettingzoo import AECEnv, ParallelEnv

from lightning_rl.algorithms.ppo import PPOModule
from lightning_rl.core.columns import DEFAULT_MODULE_ID, Columns
from lightning_rl.core.rl_modules import MultiRLModule, RLModule
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode
from lightning_rl.env.multi_agent_runner import MultiAgentEnvRunner
from lightning_rl.env.pettingzoo_env import check_pettingzoo_env_name, make_pettingzoo_env
from lightning_rl.env.policy_mapping import (
    module_spaces,
    policy_per_agent,
    resolve_policy_mapping_fn,
    shared_policy,
)

torch.set_num_threads(1)

OBS = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
# connect four's spaces: the board planes and the legal columns.
BOARD = gym.spaces.Dict(
    {"action_mask": gym.spaces.Box(0, 1, (7,), np.int8), "observation": gym.spaces.Box(0, 1, (6, 7, 2), np.int8)}
)


class TurnGame(AECEnv):
    """x and y take turns; a move's reward is the action to the mover and -1 to the other; ends after ``turns`` moves."""

    metadata = {"name": "turn_game_v0", "is_parallelizable": False}

    def __init__(self, turns: int = 5) -> None:
        super().__init__()
        self.possible_agents = ["x", "y"]
        self.turns = turns

    def observation_space(self, agent: str) -> gym.Space:
        return OBS

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(3)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.agents = list(self.possible_agents)
        self.t = 0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: {} for agent in self.agents}
        self.agent_selection = "x"

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.possible_agents.index(agent)], np.float32)

    def step(self, action: Any) -> None:
        if self.terminations[self.agent_selection] or self.truncations[self.agent_selection]:
            self._was_dead_step(action)
            return
        mover = self.agent_selection
        other = "y" if mover == "x" else "x"
        self._cumulative_rewards[mover] = 0.0
        self.rewards = {mover: float(action), other: -1.0}
        self.t += 1
        if self.t >= self.turns:
            self.terminations = dict.fromkeys(self.agents, True)
        self.agent_selection = other
        self._accumulate_rewards()


class JoinLeave(ParallelEnv):
    """Agent a from the reset; b joins after step 2; a terminates at step 3; b is truncated at step 5.

    Rewards: a gets 1 per step, b gets 10 + its action (and 100 when it joins, before it acted).
    """

    metadata = {"name": "join_leave_v0"}

    def __init__(self) -> None:
        self.possible_agents = ["a", "b"]

    def observation_space(self, agent: str) -> gym.Space:
        return OBS

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.possible_agents.index(agent)], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t = 0
        self.agents = ["a"]
        return {"a": self._obs("a")}, {"a": {}}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.t += 1
        rewards = {agent: 1.0 if agent == "a" else 10.0 + actions[agent] for agent in self.agents}
        if self.t == 2:
            self.agents.append("b")
            rewards["b"] = 100.0
        terminations = {agent: agent == "a" and self.t == 3 for agent in self.agents}
        truncations = {agent: self.t == 5 for agent in self.agents}
        observations = {agent: self._obs(agent) for agent in self.agents}
        infos = {agent: {} for agent in self.agents}
        self.agents = [agent for agent in self.agents if not (terminations[agent] or truncations[agent])]
        return observations, rewards, terminations, truncations, infos


class Fixed(RLModule):
    """Logits ``bias`` whatever the observation; counts forward calls and their batch sizes."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, bias: list[float]) -> None:
        self.bias = torch.tensor(bias)
        super().__init__(observation_space, action_space)
        self.batch_sizes: list[int] = []

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        self.batch_sizes.append(len(batch[Columns.OBS]))
        return {Columns.ACTION_DIST_INPUTS: self.bias.expand(len(batch[Columns.OBS]), -1).clone()}


def whole_agent_episodes(chunks: list[MultiAgentEpisode]) -> dict[tuple[str, str], SingleAgentEpisode]:
    """Concatenate the chunks per (episode id, agent)."""
    whole: dict[tuple[str, str], SingleAgentEpisode] = {}
    for chunk in chunks:
        for agent_id, episode in chunk.agent_episodes.items():
            key = (chunk.id_, agent_id)
            if key in whole and len(whole[key]):
                whole[key].concat_episode(episode)
            else:
                # SingleAgentEpisode.concat_episode cannot yet extend a numpy chunk of 0 steps
                # (its extra_model_outputs are empty); such a chunk is only its last observation.
                assert key not in whole or np.array_equal(whole[key].observations[-1], episode.observations[0])
                whole[key] = episode
    return whole


# ----------------------------------------------------------------------------------------
# Turn-based (AEC) agents
# ----------------------------------------------------------------------------------------


def test_turn_based_agents_hold_only_their_turns_with_rewards_collected_between_them() -> None:
    with MultiAgentEnvRunner(TurnGame, seed=0) as runner:
        module = Fixed(OBS, gym.spaces.Discrete(3), [0.0, 0.0, 0.0])
        (episode, *_) = runner.sample(module, num_env_steps=5)
    assert episode.is_terminated and episode.env_steps() == 5 and episode.agent_steps() == 5
    x, y = episode.agent_episodes["x"], episode.agent_episodes["y"]
    # x moves at turns 0, 2, 4 and sees turns 0, 2, 4 and the end; y moves at 1, 3 and sees 1, 3 and the end.
    assert x.observations[:, 0].tolist() == [0, 2, 4, 5] and y.observations[:, 0].tolist() == [1, 3, 5]
    a_x, a_y = x.actions.tolist(), y.actions.tolist()
    assert x.rewards.tolist() == [a_x[0] - 1, a_x[1] - 1, a_x[2]]  # y's moves cost x 1; the game ends after x's
    assert y.rewards.tolist() == [a_y[0] - 1, a_y[1] - 1]  # the -1 before y's first move is not a step of y's
    assert x.is_terminated and y.is_terminated
    assert set(x.extra_model_outputs) == {Columns.ACTION_DIST_INPUTS, Columns.ACTION_LOGP}
    assert module.batch_sizes == [1] * 5  # the two dead steps at the end ran no forward pass


@pytest.mark.parametrize("num_env_steps", [1, 2, 3])
def test_turn_based_chunks_concatenate_to_the_whole_with_pending_actions_carried(num_env_steps: int) -> None:
    module = Fixed(OBS, gym.spaces.Discrete(3), [0.0, 2.0, 1.0])  # greedy: always action 1
    with MultiAgentEnvRunner(TurnGame, env_kwargs={"turns": 7}, seed=0) as whole_runner:
        whole = whole_runner.sample(module, num_env_steps=7, explore=False)[0]
    with MultiAgentEnvRunner(TurnGame, env_kwargs={"turns": 7}, seed=0) as runner:
        chunks = [chunk for _ in range(7 // num_env_steps + 1) for chunk in runner.sample(
            module, num_env_steps=num_env_steps, explore=False)]  # fmt: skip
    first_episode = [chunk for chunk in chunks if chunk.id_ == chunks[0].id_]
    assert sum(chunk.env_steps() for chunk in first_episode) == whole.env_steps() == 7
    assert sum(chunk.agent_steps() for chunk in first_episode) == whole.agent_steps() == 7
    rebuilt = whole_agent_episodes(first_episode)
    for agent_id, episode in whole.agent_episodes.items():
        part = rebuilt[(chunks[0].id_, agent_id)]
        np.testing.assert_array_equal(part.observations, episode.observations)
        np.testing.assert_array_equal(part.actions, episode.actions)
        np.testing.assert_array_equal(part.rewards, episode.rewards)
        np.testing.assert_array_equal(
            part.extra_model_outputs[Columns.ACTION_LOGP], episode.extra_model_outputs[Columns.ACTION_LOGP]
        )
        assert part.is_terminated
    if num_env_steps == 1:
        # After one turn x has acted but not observed again: no agent step yet, so that chunk
        # goes on into the next call. After two, x's step is whole and y's action is pending.
        assert first_episode[0].env_steps() == 2
        assert first_episode[0].agent_episodes_with_steps().keys() == {"x"}
        assert first_episode[1].agent_episodes["y"].t_started == 0


def test_connect_four_turns_and_final_rewards() -> None:
    module = PPOModule(BOARD, gym.spaces.Discrete(7), {"fcnet_hiddens": [8]})
    with MultiAgentEnvRunner("pettingzoo.classic.connect_four_v3", num_envs=2, seed=0) as runner:
        torch.manual_seed(0)
        episodes = runner.sample_episodes(module, num_episodes=4, explore=True)
    for episode in episodes:
        p0, p1 = episode.agent_episodes["player_0"], episode.agent_episodes["player_1"]
        assert episode.is_terminated and p0.is_terminated and p1.is_terminated
        # Turns alternate, player_0 first: it moves once more than player_1, or as often.
        assert len(p0) - len(p1) in (0, 1) and len(p0) + len(p1) == episode.env_steps()
        assert p0.observations.shape == (len(p0) + 1, 6, 7, 2)
        # Only the last step of each player carries the result: +1/-1 for a win, 0 for a draw.
        assert not p0.rewards[:-1].any() and not p1.rewards[:-1].any()
        assert p0.rewards[-1] + p1.rewards[-1] == 0 and abs(p0.rewards[-1]) in (0, 1)


# ----------------------------------------------------------------------------------------
# Parallel agents that join late and leave early
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_env_steps", [5, 2])
def test_agents_join_late_and_leave_early_while_the_episode_goes_on(num_env_steps: int) -> None:
    module = Fixed(OBS, gym.spaces.Discrete(2), [0.0, 5.0])  # greedy: action 1
    with MultiAgentEnvRunner(JoinLeave, num_envs=2, seed=0) as runner:
        chunks = [c for _ in range(5 // num_env_steps + 1) for c in runner.sample(
            module, num_env_steps=num_env_steps, explore=False)]  # fmt: skip
    first = [chunk for chunk in chunks if chunk.id_ == chunks[0].id_]
    whole = whole_agent_episodes(first)
    a, b = whole[(first[0].id_, "a")], whole[(first[0].id_, "b")]
    assert a.observations[:, 0].tolist() == [0, 1, 2, 3] and a.rewards.tolist() == [1, 1, 1] and a.is_terminated
    assert b.observations[:, 0].tolist() == [2, 3, 4, 5] and b.rewards.tolist() == [11, 11, 11] and b.is_truncated
    assert first[-1].is_truncated and sum(chunk.env_steps() for chunk in first) == 5


def test_metrics_hold_per_agent_and_per_module_returns_and_the_counters() -> None:
    modules = MultiRLModule({agent: Fixed(OBS, gym.spaces.Discrete(2), [0.0, 5.0]) for agent in ("a", "b")})
    with MultiAgentEnvRunner(JoinLeave, num_envs=3, policy_mapping_fn="per_agent", seed=0) as runner:
        assert runner.module_spaces() == {"a": (OBS, gym.spaces.Discrete(2)), "b": (OBS, gym.spaces.Discrete(2))}
        episodes = runner.sample(modules, num_env_steps=7, explore=False)
        metrics = runner.get_metrics()
    assert sum(episode.is_done for episode in episodes) == 3
    assert metrics["num_episodes"] == 3 and metrics["episode_len_mean"] == 5
    assert metrics["agent_episode_return_mean/a"] == 3.0 and metrics["agent_episode_return_mean/b"] == 33.0
    assert metrics["module_episode_return_mean/a"] == 3.0 and metrics["module_episode_return_mean/b"] == 33.0
    assert metrics["episode_return_mean"] == 36.0
    # 7 steps per copy: a whole episode (5) and a running chunk of 2 in which a took 2 steps.
    assert metrics["num_env_steps_sampled"] == metrics["num_env_steps_sampled_lifetime"] == 21
    assert metrics["num_agent_steps_sampled"] == metrics["num_agent_steps_sampled_lifetime"] == 3 * (6 + 2)
    assert runner.num_agent_steps_sampled_lifetime == 24 and runner.num_env_steps_sampled_lifetime == 21
    assert runner.get_metrics()["num_episodes"] == 0


# ----------------------------------------------------------------------------------------
# One forward pass per module per step
# ----------------------------------------------------------------------------------------


def test_one_forward_per_module_per_step_over_every_env_copy() -> None:
    a, b = (Fixed(OBS, gym.spaces.Discrete(2), [0.0, 0.0]) for _ in range(2))
    with MultiAgentEnvRunner(JoinLeave, num_envs=3, policy_mapping_fn="per_agent", seed=0) as runner:
        runner.sample(MultiRLModule({"a": a, "b": b}), num_env_steps=10)
    # Per 5-step episode, a acts at steps 1-3 and b at 3-5, in all 3 copies at once.
    assert a.batch_sizes == [3] * 6 and b.batch_sizes == [3] * 6


def test_simple_spread_agents_share_one_forward_pass_per_step() -> None:
    with MultiAgentEnvRunner("mpe2.simple_spread_v3", env_kwargs={"max_cycles": 25}, num_envs=2, seed=0) as runner:
        ((obs_space, act_space),) = runner.module_spaces().values()
        module = Fixed(obs_space, act_space, [0.0] * act_space.n)
        episodes = runner.sample(MultiRLModule({DEFAULT_MODULE_ID: module}), num_env_steps=30)
    assert module.batch_sizes == [6] * 30
    done = [episode for episode in episodes if episode.is_done]
    assert len(done) == 2 and all(episode.env_steps() == 25 and episode.is_truncated for episode in done)
    assert all(episode.agent_ids == ["agent_0", "agent_1", "agent_2"] for episode in episodes)
    assert done[0].agent_episodes["agent_0"].observations.shape == (26, 18)


def test_an_agent_mapped_to_a_missing_module_is_an_error_naming_it() -> None:
    with MultiAgentEnvRunner(JoinLeave, policy_mapping_fn="per_agent") as runner:
        with pytest.raises(ValueError, match="'a'.*lacks.*\\['b'\\]"):
            runner.sample(MultiRLModule({"b": Fixed(OBS, gym.spaces.Discrete(2), [0.0, 0.0])}), num_env_steps=1)
        with pytest.raises(ValueError, match="single RLModule"):
            runner.sample(Fixed(OBS, gym.spaces.Discrete(2), [0.0, 0.0]), num_env_steps=1)


def test_a_new_mapping_applies_to_new_episodes_while_running_ones_keep_theirs() -> None:
    modules = MultiRLModule(
        {name: Fixed(OBS, gym.spaces.Discrete(2), [0.0, 0.0]) for name in (DEFAULT_MODULE_ID, "new")}
    )
    with MultiAgentEnvRunner(JoinLeave, seed=0) as runner:
        (running,) = runner.sample(modules, num_env_steps=3)
        runner.set_policy_mapping_fn(lambda agent, episode: "new")
        rest, fresh = runner.sample(modules, num_env_steps=4)
    assert rest.id_ == running.id_ and rest.is_done and fresh.id_ != running.id_
    assert set(rest.agent_to_module_mapping.values()) == {DEFAULT_MODULE_ID}
    assert set(fresh.agent_to_module_mapping.values()) == {"new"}


def test_episodes_left_running_with_a_removed_module_start_afresh() -> None:
    current = ["old"]
    with MultiAgentEnvRunner(JoinLeave, num_envs=2, policy_mapping_fn=lambda agent, episode: current[0]) as runner:
        before = runner.sample(MultiRLModule({"old": Fixed(OBS, gym.spaces.Discrete(2), [0.0, 0.0])}), num_env_steps=2)
        current[0] = "new"  # a league swapped the module: "old" is gone from the learner
        after = runner.sample(MultiRLModule({"new": Fixed(OBS, gym.spaces.Discrete(2), [0.0, 0.0])}), num_env_steps=2)
    assert all(set(episode.agent_to_module_mapping.values()) == {"old"} for episode in before)
    assert {episode.id_ for episode in after}.isdisjoint(episode.id_ for episode in before)
    assert all(episode.env_t_started == 0 and episode.module_for("a") == "new" for episode in after)


# ----------------------------------------------------------------------------------------
# Action masks
# ----------------------------------------------------------------------------------------


def test_connect_four_samples_10k_agent_steps_without_an_illegal_move() -> None:
    torch.manual_seed(0)
    module = PPOModule(BOARD, gym.spaces.Discrete(7), {"fcnet_hiddens": [8]})
    with MultiAgentEnvRunner("pettingzoo.classic.connect_four_v3", num_envs=16, seed=0) as runner:
        assert runner.module_spaces() == {DEFAULT_MODULE_ID: (BOARD, gym.spaces.Discrete(7))}
        episodes = runner.sample(module, num_env_steps=640)
    steps = 0
    for episode in episodes:
        for agent_episode in episode.agent_episodes_with_steps().values():
            masks = agent_episode.extra_model_outputs["action_mask"]
            assert masks[np.arange(len(agent_episode)), agent_episode.actions].all()
            # The mask is the one of the observation acted on: full columns are illegal.
            full = agent_episode.observations[:-1, 0, :, :].sum(-1) > 0
            np.testing.assert_array_equal(masks.astype(bool), ~full)
            steps += len(agent_episode)
        if episode.is_done:
            # An illegal move would end the game with -1 for the mover and 0 for the other.
            assert sorted(episode.agent_returns().values()) in ([-1.0, 1.0], [0.0, 0.0])
    assert steps >= 10_000


def test_masked_actions_get_zero_probability_when_sampling_and_acting_greedily() -> None:
    # connect four's masks come from the board; a module that prefers column 0 above all must
    # still never play it once it is full.
    bias = [50.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    module = Fixed(BOARD, gym.spaces.Discrete(7), bias)
    with MultiAgentEnvRunner("pettingzoo.classic.connect_four_v3", num_envs=2, seed=0) as runner:
        for explore in (True, False):
            for episode in runner.sample_episodes(module, num_episodes=2, explore=explore):
                for agent_episode in episode.agent_episodes_with_steps().values():
                    masks, actions = agent_episode.extra_model_outputs["action_mask"], agent_episode.actions
                    assert masks[np.arange(len(actions)), actions].all()
                    assert (actions != 0).any()  # column 0 filled up: other columns were played
                    logits = agent_episode.extra_model_outputs[Columns.ACTION_DIST_INPUTS]
                    assert (logits[masks == 0] == np.finfo(np.float32).min).all()


# ----------------------------------------------------------------------------------------
# Policy mapping
# ----------------------------------------------------------------------------------------


def test_policy_mapping_is_called_once_per_agent_per_episode() -> None:
    calls: Counter[tuple[str, str]] = Counter()

    def mapping(agent_id: str, episode: MultiAgentEpisode) -> str:
        calls[(agent_id, episode.id_)] += 1
        return DEFAULT_MODULE_ID

    module = Fixed(OBS, gym.spaces.Discrete(3), [0.0, 0.0, 0.0])
    with MultiAgentEnvRunner(TurnGame, num_envs=2, policy_mapping_fn=mapping, seed=0) as runner:
        calls.clear()  # the constructor probed each agent once to find the module spaces
        chunks = [chunk for _ in range(6) for chunk in runner.sample(module, num_env_steps=2)]
    episode_ids = {chunk.id_ for chunk in chunks}
    assert len(episode_ids) >= 4 and set(calls.values()) == {1}
    assert {episode_id for _, episode_id in calls} >= episode_ids


def test_built_in_mappings_by_name_and_an_unknown_name_is_an_error() -> None:
    assert resolve_policy_mapping_fn("shared") is shared_policy
    assert resolve_policy_mapping_fn("per_agent") is policy_per_agent
    assert shared_policy("x", MultiAgentEpisode()) == DEFAULT_MODULE_ID and policy_per_agent("x", None) == "x"
    with pytest.raises(ValueError, match="'per_agent', 'shared'"):
        resolve_policy_mapping_fn("os.system")
    with pytest.raises(TypeError, match="callable"):
        resolve_policy_mapping_fn(3)


def test_agents_with_different_spaces_cannot_share_a_module() -> None:
    spaces = {"x": OBS, "y": gym.spaces.Box(0, 1, (3,), np.float32)}
    action = gym.spaces.Discrete(2)
    with pytest.raises(ValueError, match="'x' and 'y' both map to module 'default_policy'"):
        module_spaces(["x", "y"], spaces.__getitem__, lambda agent: action, shared_policy)
    assert module_spaces(["x", "y"], spaces.__getitem__, lambda agent: action, policy_per_agent) == {
        "x": (OBS, action),
        "y": (spaces["y"], action),
    }


class MixedSpaces(JoinLeave):
    def observation_space(self, agent: str) -> gym.Space:
        return OBS if agent == "a" else gym.spaces.Box(0, 1, (3,), np.float32)


class TupleSpaces(JoinLeave):
    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Tuple((OBS, OBS))


def test_a_runner_refuses_spaces_it_cannot_batch_or_share_before_sampling() -> None:
    with pytest.raises(ValueError, match="'a' and 'b' both map to module 'default_policy'"):
        MultiAgentEnvRunner(MixedSpaces, num_envs=2)
    with MultiAgentEnvRunner(MixedSpaces, policy_mapping_fn="per_agent") as runner:
        assert runner.module_spaces()["b"][0].shape == (3,)
    with pytest.raises(ValueError, match="agent 'a' has the observation space Tuple"):
        MultiAgentEnvRunner(TupleSpaces)


def test_evaluation_episodes_use_the_mapping_override_and_leave_training_counters_alone() -> None:
    modules = MultiRLModule({name: Fixed(OBS, gym.spaces.Discrete(3), [0.0, 0.0, 0.0]) for name in ("main", "rival")})
    with MultiAgentEnvRunner(TurnGame, num_envs=2, seed=0) as runner:
        episodes = runner.sample_episodes(
            modules, num_episodes=3, policy_mapping_fn=lambda agent, episode: "main" if agent == "x" else "rival"
        )
        assert runner.get_metrics()["num_episodes_lifetime"] == 0 and runner.num_env_steps_sampled_lifetime == 0
    assert len(episodes) == 3 and all(episode.is_done and episode.env_t_started == 0 for episode in episodes)
    assert all((episode.module_for("x"), episode.module_for("y")) == ("main", "rival") for episode in episodes)
    assert modules["main"].batch_sizes and modules["rival"].batch_sizes


# ----------------------------------------------------------------------------------------
# State, seeds and env construction
# ----------------------------------------------------------------------------------------


def test_state_round_trips_counters_and_the_statistics_window() -> None:
    module = Fixed(OBS, gym.spaces.Discrete(2), [0.0, 0.0])
    with MultiAgentEnvRunner(JoinLeave, num_envs=2, seed=0) as runner:
        runner.sample(module, num_env_steps=6)
        state = runner.get_state()
        expected = {k: v for k, v in runner.get_metrics().items() if "return" in k or "len" in k}
    with MultiAgentEnvRunner(JoinLeave, num_envs=2, seed=0) as restored:
        restored.set_state(state)
        assert restored.get_state() == state
        metrics = restored.get_metrics()
        assert {k: metrics[k] for k in expected} == expected
        assert metrics["num_agent_steps_sampled_lifetime"] == state["num_agent_steps_sampled_lifetime"]
        with pytest.raises(ValueError, match="missing keys \\['episodes'\\]"):
            restored.set_state({k: v for k, v in state.items() if k != "episodes"})
        with pytest.raises(ValueError, match="num_full_resets must be an int >= 0"):
            restored.set_state({**state, "num_full_resets": -1})
        with pytest.raises(ValueError, match="malformed"):
            restored.set_state({**state, "episodes": [{"episode_return": 1.0}]})
        assert restored.get_state() == state


def test_copies_are_seeded_with_seed_plus_their_index_at_the_first_reset() -> None:
    def first_observations(seed: int) -> list[np.ndarray]:
        with MultiAgentEnvRunner("mpe2.simple_spread_v3", num_envs=2, seed=seed) as runner:
            ((obs_space, act_space),) = runner.module_spaces().values()
            episodes = runner.sample(Fixed(obs_space, act_space, [0.0] * 5), num_env_steps=1)
        return [episode.agent_episodes["agent_0"].observations[0] for episode in episodes]

    first, again, shifted = first_observations(0), first_observations(0), first_observations(1)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], shifted[0])  # copy 1 of seed 0 is copy 0 of seed 1
    assert not np.array_equal(first[0], first[1])


def test_episode_ids_are_reproducible_for_a_seed_and_unique() -> None:
    # They were uuid4s: a league's match-ups, drawn from (seed, episode.id_), differed run after run.
    def episode_ids(seed: int | None) -> list[str]:
        module = Fixed(OBS, gym.spaces.Discrete(2), [0.0, 0.0])
        with MultiAgentEnvRunner(JoinLeave, num_envs=2, seed=seed) as runner:
            episodes = runner.sample_episodes(module, num_episodes=6)
        return [episode.id_ for episode in episodes]

    first, again = episode_ids(0), episode_ids(0)
    assert first == again and len(set(first)) == 6
    assert not set(first) & set(episode_ids(1000))
    assert episode_ids(None) != episode_ids(None)  # no seed: nothing to repeat
    assert all(len(episode_id) == 32 and int(episode_id, 16) >= 0 for episode_id in first)


def test_pettingzoo_env_paths_resolve_or_fail_naming_the_path() -> None:
    from mpe2 import simple_spread_v3
    from pettingzoo.classic import connect_four_v3

    assert check_pettingzoo_env_name("mpe2.simple_spread_v3") is simple_spread_v3.parallel_env
    assert check_pettingzoo_env_name("pettingzoo.classic.connect_four_v3") is connect_four_v3.env
    assert check_pettingzoo_env_name("test_multi_agent_runner.JoinLeave") is JoinLeave
    with pytest.raises(ValueError, match="'no_such_package.env'"):
        check_pettingzoo_env_name("no_such_package.env")
    with pytest.raises(ValueError, match="'mpe2.no_such_env'.*no 'no_such_env'"):
        check_pettingzoo_env_name("mpe2.no_such_env")
    with pytest.raises(ValueError, match="neither parallel_env\\(\\) nor env\\(\\)"):
        check_pettingzoo_env_name("gymnasium.spaces")
    with pytest.raises(ValueError, match="import path"):
        check_pettingzoo_env_name("CartPole-v1")
    with pytest.raises(ValueError, match="did you mean \\['classic/connect_four-v3'"):
        check_pettingzoo_env_name("classic/connect_fuor-v3")
    registered = make_pettingzoo_env("classic/connect_four-v3")
    assert type(registered.unwrapped).__name__ == "raw_env" and registered.possible_agents == ["player_0", "player_1"]
    with pytest.raises(TypeError, match="built a dict"):
        make_pettingzoo_env(dict)
    with pytest.raises(ValueError, match="num_envs must be an int >= 1"):
        MultiAgentEnvRunner(JoinLeave, num_envs=0)
