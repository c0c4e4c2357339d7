"""MultiAgentEpisode: per-agent timelines, pending steps, late joins and early exits, chunks and their errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from lightning_rl.core.columns import DEFAULT_MODULE_ID
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode


def obs(value: float) -> np.ndarray:
    return np.array([value], np.float32)


# A turn-based game of 6 env steps: x acts at even steps, y at odd ones. After each step the
# next player observes with the reward it collected since it last acted; at the end both
# observe their final observation, terminated.
TURNS: list[dict[str, Any]] = [
    {"actions": {"x": 0}, "observations": {"y": obs(1)}, "rewards": {"y": 0.0}},
    {"actions": {"y": 1}, "observations": {"x": obs(2)}, "rewards": {"x": 0.5}},
    {"actions": {"x": 2}, "observations": {"y": obs(3)}, "rewards": {"y": -1.0}},
    {"actions": {"y": 3}, "observations": {"x": obs(4)}, "rewards": {"x": 0.25}},
    {"actions": {"x": 4}, "observations": {"y": obs(5)}, "rewards": {"y": 2.0}},
    {
        "actions": {"y": 5},
        "observations": {"x": obs(6), "y": obs(7)},
        "rewards": {"x": 1.0, "y": -3.0},
        "terminateds": {"x": True, "y": True, "__all__": True},
    },
]


def play(turns: list[dict[str, Any]], cut_after: tuple[int, ...] = (), mapping=None) -> list[MultiAgentEpisode]:
    """Play ``turns`` from x's reset observation; return the chunks (cut after the given step counts)."""
    episode = MultiAgentEpisode("game", agent_to_module_mapping_fn=mapping)
    episode.add_env_reset({"x": obs(0)})
    chunks = []
    for t, turn in enumerate(turns):
        extra = {agent: {"vf_preds": float(10 * t)} for agent in turn["actions"]}
        episode.add_env_step(
            turn["observations"], turn["actions"], turn["rewards"],
            terminateds=turn.get("terminateds"), truncateds=turn.get("truncateds"), extra_model_outputs=extra,
        )  # fmt: skip
        if t + 1 in cut_after:
            chunks.append(episode)
            episode = episode.cut()
    return [*chunks, episode]


def joined(chunks: list[MultiAgentEpisode]) -> dict[str, SingleAgentEpisode]:
    whole: dict[str, SingleAgentEpisode] = {}
    for chunk in chunks:
        for agent_id, episode in chunk.agent_episodes.items():
            if agent_id in whole:
                whole[agent_id].concat_episode(episode)
            else:
                whole[agent_id] = episode
    return whole


def test_turn_based_agents_hold_only_their_own_turns_with_rewards_summed_between_them() -> None:
    (episode,) = play(TURNS)
    x, y = episode.agent_episodes["x"], episode.agent_episodes["y"]
    assert episode.agent_ids == ["x", "y"]
    assert [float(o[0]) for o in x.observations] == [0, 2, 4, 6]
    assert x.actions == [0, 2, 4] and x.rewards == [0.5, 0.25, 1.0]
    assert x.extra_model_outputs["vf_preds"] == [0.0, 20.0, 40.0]
    # y's first observation came with a reward of 0 before it ever acted: it is not a step.
    assert [float(o[0]) for o in y.observations] == [1, 3, 5, 7]
    assert y.actions == [1, 3, 5] and y.rewards == [-1.0, 2.0, -3.0]
    assert x.is_terminated and y.is_terminated and not x.is_truncated
    assert episode.is_terminated and episode.is_done and not episode.is_truncated
    assert episode.env_steps() == len(episode) == 6 and episode.agent_steps() == 6
    assert episode.agent_returns() == {"x": 1.75, "y": -2.0} and episode.get_return() == -0.25
    assert episode.get_actions() == {"x": 4, "y": 5}
    assert episode.get_rewards() == {"x": 1.0, "y": -3.0}
    assert {agent: float(o[0]) for agent, o in episode.get_observations().items()} == {"x": 6.0, "y": 7.0}


def test_rewards_between_an_action_and_the_next_observation_are_summed() -> None:
    episode = MultiAgentEpisode()
    episode.add_env_reset({"a": obs(0)})
    episode.add_env_step({}, {"a": 1}, {"a": 1.0})
    episode.add_env_step({}, {}, {"a": 2.0, "never_seen": 5.0})
    episode.add_env_step({"a": obs(1)}, {}, {"a": 4.0})
    assert episode.agent_episodes["a"].rewards == [7.0]
    assert episode.env_steps() == 3 and episode.agent_steps() == 1
    assert "never_seen" not in episode.agent_episodes


def test_agents_join_late_and_leave_early_while_the_episode_goes_on() -> None:
    episode = MultiAgentEpisode()
    episode.add_env_reset({"a": obs(0)})
    episode.add_env_step({"a": obs(1)}, {"a": 0}, {"a": 1.0})
    episode.add_env_step({"a": obs(2), "b": obs(20)}, {"a": 0}, {"a": 1.0, "b": 9.0})  # b joins at step 2
    episode.add_env_step({"a": obs(3), "b": obs(21)}, {"a": 1, "b": 1}, {"a": 1.0, "b": 2.0}, terminateds={"a": True})
    episode.add_env_step({"b": obs(22)}, {"b": 0}, {"b": 2.0})
    assert not episode.is_done
    episode.add_env_step({"b": obs(23)}, {"b": 0}, {"b": 2.0}, truncateds={"b": True, "__all__": True})
    a, b = episode.agent_episodes["a"], episode.agent_episodes["b"]
    assert episode.agent_ids == ["a", "b"]
    assert len(a) == 3 and a.is_terminated and a.rewards == [1.0, 1.0, 1.0]
    assert len(b) == 3 and b.is_truncated and not b.is_terminated and b.rewards == [2.0, 2.0, 2.0]
    assert [float(o[0]) for o in b.observations] == [20, 21, 22, 23]
    assert episode.is_truncated and not episode.is_terminated
    assert episode.env_steps() == 5 and episode.agent_steps() == 6


@pytest.mark.parametrize("cut_after", [(1,), (2,), (3, 4), (1, 2, 3, 4, 5)])
def test_chunks_concatenate_back_to_the_whole_episode(cut_after: tuple[int, ...]) -> None:
    (whole,) = play(TURNS)
    chunks = play(TURNS, cut_after)
    assert len(chunks) == len(cut_after) + 1
    assert {chunk.id_ for chunk in chunks} == {"game"}
    assert sum(chunk.env_steps() for chunk in chunks) == whole.env_steps()
    assert sum(chunk.agent_steps() for chunk in chunks) == whole.agent_steps()
    assert [chunk.env_t_started for chunk in chunks] == [0, *cut_after]
    rebuilt = joined(chunks)
    for agent_id, episode in whole.agent_episodes.items():
        part = rebuilt[agent_id]
        assert part.id_ == episode.id_ and part.t_started == 0
        np.testing.assert_array_equal(np.stack(part.observations), np.stack(episode.observations))
        assert part.actions == episode.actions and part.rewards == episode.rewards
        assert part.extra_model_outputs == episode.extra_model_outputs
        assert part.is_terminated == episode.is_terminated
    assert chunks[-1].is_terminated and not any(chunk.is_done for chunk in chunks[:-1])


def test_a_pending_action_moves_into_the_successor_chunk() -> None:
    # Cut after step 1: y acted (action 1) but has not observed again; its step belongs to chunk 2.
    first, second = play(TURNS, cut_after=(2,))
    assert first.agent_episodes["y"].actions == [] and len(first.agent_episodes["y"].observations) == 1
    assert first.agent_episodes_with_steps().keys() == {"x"}
    assert second.agent_episodes["y"].actions == [1, 3, 5]
    assert second.agent_episodes["y"].extra_model_outputs["vf_preds"] == [10.0, 30.0, 50.0]
    assert second.agent_episodes["y"].t_started == 0 and second.agent_episodes["x"].t_started == 1
    assert first.agent_steps() == 1 and second.agent_steps() == 5


def test_policy_mapping_is_called_once_per_agent_per_episode_across_chunks() -> None:
    calls: list[tuple[str, str]] = []

    def mapping(agent_id: str, episode: MultiAgentEpisode) -> str:
        calls.append((agent_id, episode.id_))
        return f"module_{agent_id}"

    chunks = play(TURNS, cut_after=(1, 3), mapping=mapping)
    assert calls == [("x", "game"), ("y", "game")]
    assert all(chunk.module_for("x") == "module_x" for chunk in chunks)
    assert chunks[-1].module_for("y") == "module_y"
    assert MultiAgentEpisode().module_for("anyone") == DEFAULT_MODULE_ID


def test_mapping_that_returns_no_string_is_an_error() -> None:
    episode = MultiAgentEpisode(agent_to_module_mapping_fn=lambda agent_id, episode: 3)
    with pytest.raises(TypeError, match="module id"):
        episode.add_env_reset({"a": obs(0)})


def test_ending_the_episode_ends_running_agents_and_drops_their_pending_step() -> None:
    episode = MultiAgentEpisode()
    episode.add_env_reset({"a": obs(0), "b": obs(10)})
    episode.add_env_step({"a": obs(1)}, {"a": 0, "b": 1}, {"a": 1.0, "b": 1.0}, truncateds={"__all__": True})
    a, b = episode.agent_episodes["a"], episode.agent_episodes["b"]
    assert len(a) == 1 and a.is_truncated
    assert len(b) == 0 and b.is_truncated  # b's action never had an outcome: no step
    assert episode.is_truncated and episode.agent_steps() == 1
    with pytest.raises(ValueError, match="already done"):
        episode.add_env_step({}, {}, {})
    with pytest.raises(ValueError, match="is done"):
        episode.cut()


def test_acting_or_observing_out_of_turn_is_an_error_naming_the_agent() -> None:
    episode = MultiAgentEpisode()
    episode.add_env_reset({"a": obs(0)})
    with pytest.raises(ValueError, match="'b'.*no observation"):
        episode.add_env_step({}, {"b": 0}, {})
    with pytest.raises(ValueError, match="'a' observes twice"):
        episode.add_env_step({"a": obs(1)}, {}, {})
    episode.add_env_step({}, {"a": 0}, {})
    with pytest.raises(ValueError, match="'a' acts twice"):
        episode.add_env_step({}, {"a": 0}, {})
    with pytest.raises(ValueError, match="already started"):
        episode.add_env_reset({"a": obs(0)})
    with pytest.raises(ValueError, match="env_t_started"):
        MultiAgentEpisode(env_t_started=-1)


def test_an_agent_that_ended_in_an_earlier_chunk_cannot_come_back() -> None:
    episode = MultiAgentEpisode()
    episode.add_env_reset({"a": obs(0), "b": obs(0)})
    episode.add_env_step({"a": obs(1), "b": obs(1)}, {"a": 0, "b": 0}, {}, terminateds={"a": True})
    successor = episode.cut()
    assert successor.agent_ids == ["b"]
    with pytest.raises(ValueError, match="'a'.*has ended"):
        successor.add_env_step({}, {"a": 0}, {})
    with pytest.raises(ValueError, match="'a' observes .* after it ended"):
        successor.add_env_step({"a": obs(2)}, {}, {})


def test_to_numpy_stacks_every_agent_episode() -> None:
    (episode,) = play(TURNS)
    assert episode.to_numpy() is episode
    x = episode.agent_episodes["x"]
    assert x.is_numpy and x.observations.shape == (4, 1) and x.actions.tolist() == [0, 2, 4]
    assert x.extra_model_outputs["vf_preds"].shape == (3,)
    assert "terminated" in repr(episode) and "['x', 'y']" in repr(episode)
