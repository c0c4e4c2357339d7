"""Offline datasets are checked as they are read: actions in the action space, finite rewards and observations.

A bad value used to surface late or never: an out-of-range action crashed BC steps later with an
index error, one NaN reward made every MARWIL step NaN, an inf observation trained silently. Each
is now one error, when the dataset is opened (or the window is streamed), naming the dataset,
the episode and the step.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from test_offline_datamodule import HAND_ACT_SPACE, HAND_OBS_SPACE, hand_episode, stream_of

from lightning_rl.core.columns import Columns

minari = pytest.importorskip("minari")
from minari.data_collector import EpisodeBuffer


@pytest.fixture(autouse=True)
def minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


def make_dataset(dataset_id: str, episodes: list, action_space: gym.Space = HAND_ACT_SPACE) -> None:
    minari.create_dataset_from_buffers(
        dataset_id, episodes, observation_space=HAND_OBS_SPACE, action_space=action_space
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
