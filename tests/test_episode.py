"""SingleAgentEpisode: building, numpy conversion, slicing, concatenating chunks, validation."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_rl.env import SingleAgentEpisode


def built_episode(steps: int = 5, *, terminated: bool = False, infos: bool = False) -> SingleAgentEpisode:
    """Observation t is [t, 10 t]; action t is t % 2; reward t is t + 1."""
    episode = SingleAgentEpisode("ep")
    episode.add_env_reset(np.array([0.0, 0.0], np.float32), infos={"t": 0} if infos else None)
    for t in range(steps):
        episode.add_env_step(
            np.array([t + 1.0, 10.0 * (t + 1)], np.float32),
            t % 2,
            float(t + 1),
            infos={"t": t + 1} if infos else None,
            terminated=terminated and t == steps - 1,
            extra_model_outputs={"action_logp": -0.5 * t, "vf_preds": float(t)},
        )
    return episode


def test_append_len_return_and_flags() -> None:
    episode = built_episode(4, terminated=True)
    assert len(episode) == 4
    assert episode.get_return() == 1 + 2 + 3 + 4
    assert episode.is_terminated and not episode.is_truncated and episode.is_done
    assert episode.t_started == 0 and episode.t == 4
    assert not episode.is_numpy
    assert len(episode.observations) == 5
    with pytest.raises(ValueError, match="already done"):
        episode.add_env_step(np.zeros(2, np.float32), 0, 0.0)
    assert "len=4" in repr(episode) and "terminated" in repr(episode)


def test_to_numpy_stacks_once_and_is_idempotent() -> None:
    episode = built_episode(3, infos=True)
    assert episode.to_numpy() is episode
    assert episode.is_numpy
    assert episode.observations.shape == (4, 2) and episode.observations.dtype == np.float32
    assert episode.actions.tolist() == [0, 1, 0]
    assert episode.rewards.dtype == np.float32 and episode.rewards.tolist() == [1, 2, 3]
    assert episode.extra_model_outputs["vf_preds"].tolist() == [0, 1, 2]
    assert [info["t"] for info in episode.infos] == [0, 1, 2, 3]
    observations = episode.observations
    episode.to_numpy()
    assert episode.observations is observations


def test_appending_to_a_numpy_episode_converts_back_to_lists() -> None:
    episode = built_episode(2).to_numpy()
    episode.add_env_step(np.array([3.0, 30.0], np.float32), 1, 3.0, extra_model_outputs={"action_logp": 0.0, "vf_preds": 2.0})
    assert not episode.is_numpy and len(episode) == 3
    assert episode.to_numpy().observations[-1].tolist() == [3.0, 30.0]


def test_extra_model_output_keys_must_not_change() -> None:
    episode = built_episode(1)
    with pytest.raises(ValueError, match="extra_model_outputs keys"):
        episode.add_env_step(np.zeros(2, np.float32), 0, 0.0, extra_model_outputs={"action_logp": 0.0})


def test_step_before_reset_and_double_reset_fail() -> None:
    episode = SingleAgentEpisode()
    assert len(episode.id_) == 32  # uuid4 hex
    with pytest.raises(ValueError, match="add_env_reset"):
        episode.add_env_step(np.zeros(2), 0, 0.0)
    episode.add_env_reset(np.zeros(2))
    with pytest.raises(ValueError, match="already started"):
        episode.add_env_reset(np.zeros(2))


@pytest.mark.parametrize("numpy", [False, True])
def test_slice(numpy: bool) -> None:
    episode = built_episode(6, terminated=True, infos=True)
    if numpy:
        episode.to_numpy()
    part = episode[2:4]
    assert part.id_ == episode.id_ and part.t_started == 2 and len(part) == 2
    assert np.asarray(part.observations)[:, 0].tolist() == [2, 3, 4]  # both ends included
    assert list(part.actions) == [0, 1] and list(part.rewards) == [3, 4]
    assert list(part.extra_model_outputs["vf_preds"]) == [2, 3]
    assert [info["t"] for info in part.infos] == [2, 3, 4]
    assert not part.is_done  # the final step is not in the slice
    tail = episode[4:]
    assert tail.is_terminated and tail.t_started == 4 and tail.t == 6
    assert len(episode[-2:]) == 2 and episode[-2:].is_terminated
    assert len(episode[5:2]) == 0
    with pytest.raises(ValueError, match="step 1"):
        episode[::2]
    with pytest.raises(TypeError, match="slices"):
        episode[1]


@pytest.mark.parametrize("numpy", [False, True])
def test_concat_chunks_gives_the_whole_episode(numpy: bool) -> None:
    whole = built_episode(7, terminated=True, infos=True).to_numpy()
    first, second, third = whole[0:3], whole[3:5], whole[5:7]
    if not numpy:
        first = built_episode(7, terminated=True, infos=True)[0:3]  # a list-backed chunk
    first.concat_episode(second)
    first.concat_episode(third)
    assert len(first) == 7 and first.is_terminated and first.t_started == 0
    np.testing.assert_array_equal(np.asarray(first.observations), whole.observations)
    np.testing.assert_array_equal(np.asarray(first.actions), whole.actions)
    np.testing.assert_array_equal(np.asarray(first.rewards), whole.rewards)
    np.testing.assert_array_equal(np.asarray(first.extra_model_outputs["action_logp"]), whole.extra_model_outputs["action_logp"])
    assert [info["t"] for info in first.infos] == list(range(8))
    assert first.get_return() == whole.get_return()


def test_concat_keeps_the_action_dtype_after_an_empty_chunk() -> None:
    start = SingleAgentEpisode("e", observations=np.zeros((1, 2), np.float32))
    step = SingleAgentEpisode(
        "e", observations=np.zeros((2, 2), np.float32), actions=np.array([1]), rewards=[1.0],
        extra_model_outputs={
            "action_logp": np.array([-0.5], np.float32),
            "action_dist_inputs": np.array([[0.1, 0.2]], np.float32),
            "action_mask": np.array([[1, 0]], np.int8),
        },
    )
    start.concat_episode(step)
    assert start.actions.dtype == step.actions.dtype and start.actions.tolist() == [1]
    # Outputs of several dimensions and integer ones come through as the chunk has them
    # (a turn-based agent's chunk is often empty: it was waiting for its turn when the chunk was cut).
    for key, values in step.extra_model_outputs.items():
        assert start.extra_model_outputs[key].dtype == values.dtype, key
        np.testing.assert_array_equal(start.extra_model_outputs[key], values)


def test_concat_fills_missing_infos() -> None:
    first = built_episode(4).to_numpy()[0:2]
    second = built_episode(4, infos=True).to_numpy()[2:4]
    first.concat_episode(second)
    assert first.infos == [{}, {}, {}, {"t": 3}, {"t": 4}]


def test_concat_errors_name_the_mismatch() -> None:
    whole = built_episode(6).to_numpy()
    with pytest.raises(ValueError, match="ids differ"):
        whole[0:2].concat_episode(SingleAgentEpisode("other", observations=whole.observations[2:3]))
    with pytest.raises(ValueError, match="t_started=3.*ends at t=2"):
        whole[0:2].concat_episode(whole[3:5])
    late = whole[2:4]
    late.observations = late.observations + 1.0
    first = whole[0:2]
    with pytest.raises(ValueError, match="first observation differs"):
        first.concat_episode(late)
    assert len(first) == 2  # unchanged
    done = built_episode(2, terminated=True).to_numpy()
    with pytest.raises(ValueError, match="already done"):
        done.concat_episode(SingleAgentEpisode("ep", observations=done.observations[-1:], t_started=2))


def test_constructor_validates_lengths() -> None:
    obs = np.zeros((4, 2), np.float32)
    with pytest.raises(ValueError, match=r"observations must have len\(actions\) \+ 1 = 4 entries.*got 3"):
        SingleAgentEpisode(observations=obs[:3], actions=np.zeros(3), rewards=np.zeros(3))
    with pytest.raises(ValueError, match=r"rewards must have len\(actions\) = 3 entries, got 2"):
        SingleAgentEpisode(observations=obs, actions=np.zeros(3), rewards=np.zeros(2))
    with pytest.raises(ValueError, match=r"extra_model_outputs\['vf_preds'\] must have .* 3 entries, got 4"):
        SingleAgentEpisode(observations=obs, actions=np.zeros(3), rewards=np.zeros(3), extra_model_outputs={"vf_preds": np.zeros(4)})
    with pytest.raises(ValueError, match="infos must be empty or have len\\(observations\\) = 4"):
        SingleAgentEpisode(observations=obs, actions=np.zeros(3), rewards=np.zeros(3), infos=[{}])
    with pytest.raises(ValueError, match="without observations"):
        SingleAgentEpisode(actions=[1], rewards=[1.0])
    with pytest.raises(ValueError, match="t_started"):
        SingleAgentEpisode(t_started=-1)
    episode = SingleAgentEpisode("x", observations=obs, actions=np.arange(3), rewards=np.ones(3), truncated=True, t_started=5)
    assert episode.is_numpy and episode.is_truncated and episode.t == 8 and episode.get_return() == 3.0
