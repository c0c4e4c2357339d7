"""Offline datasets are checked once, before training: actions in the action space, finite rewards and observations.

A bad value used to surface late or never: an out-of-range action crashed BC steps later with an
index error, one NaN reward made every MARWIL step NaN, an inf observation trained silently. Each
is now one error, when the dataset is first used, naming the dataset, the episode and the step;
or, with ``on_nonfinite="drop_episode"``, a non-finite (or implausibly large) value's episode is
left out of the rows, named in a warning and counted.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from test_offline_datamodule import (
    HAND_ACT_SPACE,
    HAND_OBS_SPACE,
    RecordItems,
    bc_learner,
    hand_episode,
    offline_trainer,
    row_ids,
    stream_of,
)

from lightning_rl.core.columns import Columns
from lightning_rl.data import OfflineDataModule

minari = pytest.importorskip("minari")
from minari.data_collector import EpisodeBuffer


@pytest.fixture(autouse=True)
def minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


def make_dataset(
    dataset_id: str,
    episodes: list,
    action_space: gym.Space = HAND_ACT_SPACE,
    observation_space: gym.Space = HAND_OBS_SPACE,
) -> None:
    minari.create_dataset_from_buffers(
        dataset_id, episodes, observation_space=observation_space, action_space=action_space
    )


def spoiled(index: int, column: str, step: int, value: float) -> EpisodeBuffer:
    episode = hand_episode(index, 6, terminated=True)
    values = np.array(getattr(episode, column), dtype=np.float64 if column == "rewards" else None)
    values[step] = value
    return dataclasses.replace(episode, **{column: values})


@pytest.mark.parametrize(
    ("column", "step", "value", "message"),
    [
        (
            "actions",
            3,
            7,
            r"episode 1, step 3: action 7 is outside the action space \(the action space is Discrete\(3\)\)",
        ),
        ("actions", 2, -1, r"episode 1, step 2: action -1 is outside the action space"),
        ("rewards", 4, np.nan, r"episode 1, step 4: the reward is nan; rewards must be finite"),
        ("observations", 2, np.inf, r"episode 1, step 2: the observation holds inf at flat index 0"),
        ("observations", 6, -np.inf, r"episode 1, step 6: its final observation holds -inf"),
    ],
)
@pytest.mark.parametrize("window_rows", [None, 4])  # in memory, opened at once; streamed a window at a time
def test_a_bad_value_is_one_error_naming_the_episode_and_step(column, step, value, message, window_rows):
    make_dataset("test/bad-v0", [hand_episode(0, 5, terminated=True), spoiled(1, column, step, value)])
    with pytest.raises(ValueError, match=r"the Minari dataset 'test/bad-v0', " + message):
        stream_of("test/bad-v0", [Columns.OBS, Columns.ACTIONS], window_rows=window_rows).rows(0, 11)


def test_box_actions_must_be_finite_but_may_pass_the_bounds():
    box = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    good = [
        dataclasses.replace(hand_episode(i, 4, terminated=True), actions=np.full((4, 1), 1.5, np.float32))
        for i in range(2)
    ]
    make_dataset("test/box-v0", good, action_space=box)  # unclipped actions, as training episodes store them
    assert stream_of("test/box-v0", [Columns.ACTIONS]).rows(0, 8)[Columns.ACTIONS].max() == 1.5
    bad = [good[0], dataclasses.replace(good[1], actions=np.array([[0.0], [np.nan], [0.0], [0.0]], np.float32))]
    make_dataset("test/box-nan-v0", bad, action_space=box)
    with pytest.raises(
        ValueError, match=r"episode 1, step 1: action \[nan\] is outside the action space \(actions must be finite\)"
    ):
        stream_of("test/box-nan-v0", [Columns.ACTIONS]).rows(0, 8)


# ----------------------------------------------------------------------------------------
# on_nonfinite="drop_episode", and observations far outside their space
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("window_rows", [None, 4])  # in memory; streamed a window of episodes at a time
def test_drop_episode_leaves_the_episode_out_names_it_and_counts_it(tmp_path, window_rows):
    episodes = [hand_episode(0, 4, terminated=True), spoiled(1, "rewards", 4, np.nan), hand_episode(2, 4, terminated=True)]
    make_dataset("test/drop-v0", episodes)
    data = OfflineDataModule(
        "test/drop-v0", batch_size=4, updates_per_epoch=2, seed=0, on_nonfinite="drop_episode",
        in_memory=window_rows is None, stream_window_rows=window_rows or 100_000,
    )  # fmt: skip
    with pytest.warns(UserWarning, match=r"left 1 of 3 episodes \(6 of 14 steps\).*episode 1, step 4: the reward is nan"):
        assert data.num_rows == 8
    assert data.num_nonfinite_episodes_dropped == 1
    record = RecordItems()
    trainer = offline_trainer(tmp_path, callbacks=[record], limit_val_batches=0)
    trainer.fit(bc_learner(), datamodule=data)
    rows = [row for batch in record.obs for row in row_ids(batch)]
    assert sorted(rows) == [(e, t) for e in (0, 2) for t in range(4)]  # one pass over the two episodes kept
    assert trainer.callback_metrics["env_runners/num_nonfinite_episodes_dropped"] == 1


def test_drop_episode_with_no_episode_left_is_an_error():
    make_dataset("test/all-bad-v0", [spoiled(0, "observations", 1, np.nan), spoiled(1, "rewards", 0, np.inf)])
    data = OfflineDataModule("test/all-bad-v0", on_nonfinite="drop_episode")
    with pytest.raises(ValueError, match=r"every episode of the Minari dataset 'test/all-bad-v0' holds a non-finite .*"
                       r"episode 0, step 1: the observation holds nan"):  # fmt: skip
        data.num_rows


def test_drop_episode_still_raises_for_an_action_outside_a_discrete_space():
    make_dataset("test/bad-action-v0", [hand_episode(0, 5, terminated=True), spoiled(1, "actions", 3, 7)])
    with pytest.raises(ValueError, match=r"episode 1, step 3: action 7 is outside the action space"):
        OfflineDataModule("test/bad-action-v0", on_nonfinite="drop_episode").num_rows


@pytest.mark.parametrize(
    ("space", "bad_step", "value", "message"),
    [
        (gym.spaces.Discrete(5), 2, 7, r"step 2: the observation 7 is outside the observation space \(the observation "
         r"space is Discrete\(5\)\)"),
        (gym.spaces.Discrete(5, start=1), 6, 0, r"step 6: its final observation 0 is outside the observation space"),
        (gym.spaces.MultiDiscrete([3, 4]), 3, [1, 4], r"step 3: the observation \[1, 4\] is outside the observation"),
        (gym.spaces.MultiBinary(2), 0, [0, 2], r"step 0: the observation \[0, 2\] is outside the observation space"),
    ],
)  # fmt: skip
def test_an_observation_outside_a_discrete_observation_space_is_an_error(space, bad_step, value, message):
    good, bad = (hand_episode(index, steps, terminated=True) for index, steps in ((0, 5), (1, 6)))
    inside = np.zeros_like(space.sample()) + getattr(space, "start", 0)  # the space's lowest value

    def observations(episode: EpisodeBuffer) -> np.ndarray:
        return np.stack([inside] * len(episode.observations))

    spoilt = observations(bad)
    spoilt[bad_step] = value
    episodes = [
        dataclasses.replace(good, observations=observations(good)),
        dataclasses.replace(bad, observations=spoilt),
    ]
    make_dataset("test/discrete-obs-v0", episodes, observation_space=space)
    with pytest.raises(ValueError, match=r"'test/discrete-obs-v0', episode 1, " + message):
        OfflineDataModule("test/discrete-obs-v0").num_rows
    with pytest.raises(ValueError, match=message):  # not the non-finite case: never dropped
        OfflineDataModule("test/discrete-obs-v0", on_nonfinite="drop_episode").num_rows
    make_dataset("test/discrete-obs-good-v0", episodes[:1], observation_space=space)
    assert OfflineDataModule("test/discrete-obs-good-v0").num_rows == 5


def test_on_nonfinite_must_be_raise_or_drop_episode():
    make_dataset("test/fine-v0", [hand_episode(0, 5, terminated=True)])
    with pytest.raises(ValueError, match=r"on_nonfinite must be one of \['raise', 'drop_episode'\], got 'skip'"):
        OfflineDataModule("test/fine-v0", on_nonfinite="skip")


@pytest.mark.parametrize(
    ("space", "value", "message"),
    [
        # Past a finite bound by more than the bounds' width ([-1, 1]: plausible within [-3, 3]).
        (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), 1e30, r"holds 1e\+30 at flat index 1, outside its plausible range \[-3, 3\]"),
        (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), -3.5, r"holds -3.5 at flat index 1, outside its plausible range"),
        # Unbounded: at most 1e10 in magnitude.
        (HAND_OBS_SPACE, -1e12, r"holds -1e\+12 at flat index 1, outside its plausible range \[-1e\+10, 1e\+10\]"),
    ],
)
def test_an_observation_far_outside_its_space_is_the_nonfinite_case(space, value, message):
    good, bad = (hand_episode(index, steps, terminated=True) for index, steps in ((0, 5), (1, 6)))
    observations = np.zeros_like(bad.observations)  # within any of these spaces but for one value
    observations[2, 1] = value
    episodes = [dataclasses.replace(good, observations=np.zeros_like(good.observations))]
    make_dataset("test/far-v0", [*episodes, dataclasses.replace(bad, observations=observations)], observation_space=space)
    with pytest.raises(ValueError, match=r"'test/far-v0', episode 1, step 2: the observation " + message):
        OfflineDataModule("test/far-v0").num_rows
    with pytest.warns(UserWarning, match=r"episode 1, step 2: the observation " + message):
        assert OfflineDataModule("test/far-v0", on_nonfinite="drop_episode").num_rows == 5


def test_an_observation_a_little_past_its_bounds_is_kept():
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    episode = hand_episode(0, 5, terminated=True)
    observations = np.full_like(episode.observations, 1.5)  # past the bound, within its width
    make_dataset("test/near-v0", [dataclasses.replace(episode, observations=observations)], observation_space=space)
    assert OfflineDataModule("test/near-v0").num_rows == 5
