"""Screening a Minari dataset once, before training: every value checked, the episodes to train on chosen.

A bad value used to surface late or never: an out-of-range action crashed BC steps later with
an index error, one NaN reward made every MARWIL step NaN, an inf observation trained silently.
``screen_episodes`` reads the dataset through once, an episode at a time (numpy over each
episode's arrays), and finds in each episode the first step that holds:

- an action outside a Discrete, MultiDiscrete or MultiBinary action space, or an observation
  outside such an observation space (always an error: the data does not belong to its space;
  an encoder would fail on it steps later, or read it as another value);
- a reward that is NaN or infinite;
- a Box action that is NaN or infinite (values past the bounds are kept: training episodes
  store the actions the policy chose, before they were clipped to the bounds for the env);
- an observation value that is NaN or infinite, or implausible for a Box observation space:
  outside ``[low - width, high + width]`` (``width = high - low``, the bounds' width, per
  element) or of magnitude above ``OBSERVATION_MAGNITUDE_LIMIT`` (1e10). A value a little
  past the declared bounds is kept: Minari only warns about such observations when it
  records them, and many gymnasium envs step slightly past their bounds; a 1e30 in a space
  bounded by 1, or a 1e12 in an unbounded one, is a corrupt value that would swamp training.

The last three are the non-finite case, which ``on_nonfinite`` decides as the env data
modules' setting of that name does: ``"raise"`` an error naming the dataset, the episode, the
step and the value; or ``"drop_episode"``: leave the episode out of the rows (one warning names
every dropped episode, its step and value), and fail only if no episode is left.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np

from lightning_rl.data.dataset_rows import DatasetEpisodes, check_episode_shape, unreadable_dataset
from lightning_rl.env.nonfinite import OnNonFinite

#: Observation values of larger magnitude are corrupt, whatever the observation space's bounds.
OBSERVATION_MAGNITUDE_LIMIT = 1e10

# Spaces of integer values in a range: a value outside is not of the space at all.
_DISCRETE_SPACES = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


@dataclasses.dataclass(frozen=True)
class BadValue:
    """The first bad value of one episode.

    Attributes:
        episode: The Minari episode id.
        step: The step (for an observation, ``T`` is the episode's final one).
        problem: What is wrong, e.g. ``"the reward is nan; rewards must be finite"``.
        nonfinite: Whether it is the non-finite case (``on_nonfinite`` decides), rather than an
            action outside a discrete action space (always an error).
    """

    episode: int
    step: int
    problem: str
    nonfinite: bool


@dataclasses.dataclass(frozen=True)
class Screening:
    """What ``screen_episodes`` found.

    Attributes:
        episodes: The episodes to train on, in the dataset's order.
        dropped: The first bad value of each episode left out (``on_nonfinite="drop_episode"``).
    """

    episodes: DatasetEpisodes
    dropped: tuple[BadValue, ...]


def screen_episodes(dataset: Any, dataset_id: str, lengths: np.ndarray, *, on_nonfinite: OnNonFinite) -> Screening:
    """Read every episode of ``dataset`` once; keep those without bad values (see the module docstring).

    Args:
        dataset: The Minari dataset.
        dataset_id: Its id, for errors and warnings.
        lengths: ``episode_lengths(dataset)``: the steps of ``dataset.episode_indices``.
        on_nonfinite: ``"raise"`` or ``"drop_episode"``, for the non-finite case.

    Raises:
        ValueError: Naming the dataset, the episode, the step and the value: for an action
            outside a discrete action space; for the non-finite case under ``"raise"``; under
            ``"drop_episode"``, if every episode was dropped; and if an episode cannot be read.
    """
    indices = np.asarray(dataset.episode_indices, dtype=np.int64)
    limits = _observation_limits(dataset.observation_space)
    keep = np.ones(len(indices), dtype=bool)
    dropped: list[BadValue] = []
    for position, episode in enumerate(_read_episodes(dataset, dataset_id, indices)):
        check_episode_shape(episode, dataset_id)
        bad = first_bad_value(episode, dataset.action_space, dataset.observation_space, limits)
        if bad is None:
            continue
        if not bad.nonfinite or on_nonfinite == "raise":
            hint = "; OfflineDataModule(on_nonfinite='drop_episode') leaves such episodes out" if bad.nonfinite else ""
            raise ValueError(f"{_where(dataset_id, bad)}: {bad.problem}{hint}")
        keep[position] = False
        dropped.append(bad)
    if not keep.any():
        raise ValueError(
            f"every episode of the Minari dataset {dataset_id!r} holds a non-finite or implausible value (the first: "
            f"{_where(dataset_id, dropped[0])}: {dropped[0].problem}), so on_nonfinite='drop_episode' leaves nothing "
            "to train on"
        )
    if dropped:
        warnings.warn(
            f"on_nonfinite='drop_episode' left {len(dropped)} of {len(indices)} episodes "
            f"({int(lengths[~keep].sum())} of {int(lengths.sum())} steps) of the Minari dataset {dataset_id!r} out: "
            + "; ".join(f"episode {bad.episode}, step {bad.step}: {bad.problem}" for bad in dropped),
            stacklevel=3,
        )
    return Screening(DatasetEpisodes(indices[keep], lengths[keep]), tuple(dropped))


def first_bad_value(
    episode: Any,
    action_space: gym.Space,
    observation_space: gym.Space,
    limits: tuple[np.ndarray, np.ndarray] | None,
) -> BadValue | None:
    """The first bad value of ``episode``; ``None`` if none.

    The errors come first (discrete actions, then discrete observations), then the non-finite
    case (rewards, Box actions, Box observations), so that ``on_nonfinite="drop_episode"`` never
    leaves out an episode that holds an error.

    Args:
        episode: A Minari episode, of a checked shape (``check_episode_shape``).
        action_space: The dataset's action space.
        observation_space: The dataset's observation space (a Discrete, MultiDiscrete or
            MultiBinary one is range-checked; others through ``limits``).
        limits: ``_observation_limits`` of the observation space; ``None`` checks no Box observations.
    """
    actions = np.asarray(episode.actions)
    rewards = np.asarray(episode.rewards, dtype=np.float64)
    if isinstance(action_space, _DISCRETE_SPACES):
        step = _first_step_where(_outside_discrete(actions, action_space))
        if step is not None:
            problem = (
                f"action {actions[step].tolist()} is outside the action space (the action space is {action_space})"
            )
            return BadValue(int(episode.id), step, problem, nonfinite=False)
    if isinstance(observation_space, _DISCRETE_SPACES):
        observations = np.asarray(episode.observations)
        step = _first_step_where(_outside_discrete(observations, observation_space))
        if step is not None:
            which = "its final observation" if step == len(rewards) else "the observation"
            problem = (
                f"{which} {observations[step].tolist()} is outside the observation space (the observation space is "
                f"{observation_space})"
            )
            return BadValue(int(episode.id), step, problem, nonfinite=False)
    step = _first_step_where(~np.isfinite(rewards))
    if step is not None:
        return BadValue(int(episode.id), step, f"the reward is {rewards[step]}; rewards must be finite", nonfinite=True)
    if isinstance(action_space, gym.spaces.Box) and np.issubdtype(actions.dtype, np.floating):
        step = _first_step_where(~np.isfinite(actions))
        if step is not None:
            problem = f"action {actions[step].tolist()} is outside the action space (actions must be finite)"
            return BadValue(int(episode.id), step, problem, nonfinite=True)
    if limits is not None:
        observations = np.asarray(episode.observations)
        low, high = limits
        with np.errstate(invalid="ignore"):
            outside = ~((observations >= low) & (observations <= high))  # NaN compares false: outside
        step = _first_step_where(outside)
        if step is not None:
            which = "its final observation" if step == len(rewards) else "the observation"
            problem = f"{which} {_observation_problem(observations[step], outside[step], limits)}"
            return BadValue(int(episode.id), step, problem, nonfinite=True)
    return None


def _read_episodes(dataset: Any, dataset_id: str, indices: np.ndarray) -> Iterator[Any]:
    """The episodes ``indices``, read one at a time; any error reading them is ``unreadable_dataset``'s."""
    try:
        episodes = iter(dataset.iterate_episodes(indices.tolist()))
    except Exception as error:
        raise unreadable_dataset(dataset_id, error) from error
    while True:
        try:
            episode = next(episodes)
        except StopIteration:
            return
        except Exception as error:  # h5py and decoding errors alike: the dataset is unusable
            raise unreadable_dataset(dataset_id, error) from error
        yield episode


def _observation_limits(space: gym.Space) -> tuple[np.ndarray, np.ndarray] | None:
    """``(low, high)`` of the plausible values of a Box observation, per element; ``None`` for other spaces.

    ``None`` too for an integer Box whose dtype cannot hold an implausible value (images:
    uint8 in [0, 255]), so that the largest datasets are not compared element by element.
    """
    if not isinstance(space, gym.spaces.Box):
        return None
    low, high = np.asarray(space.low, dtype=np.float64), np.asarray(space.high, dtype=np.float64)
    width = high - low  # inf where either bound is
    low = np.maximum(low - width, -OBSERVATION_MAGNITUDE_LIMIT)
    high = np.minimum(high + width, OBSERVATION_MAGNITUDE_LIMIT)
    if np.issubdtype(space.dtype, np.integer):
        info = np.iinfo(space.dtype)
        if low.max() <= info.min and high.min() >= info.max:
            return None
    return low, high


def _observation_problem(observation: np.ndarray, outside: np.ndarray, limits: tuple[np.ndarray, np.ndarray]) -> str:
    """What is wrong with an observation: its first bad value, where, and why."""
    index = int(np.argmax(outside.reshape(-1)))
    value = observation.reshape(-1)[index]
    if not np.isfinite(value):
        return f"holds {value:.6g} at flat index {index}; observations must be finite"
    low, high = (np.broadcast_to(bound, observation.shape).reshape(-1)[index] for bound in limits)
    return (
        f"holds {value:.6g} at flat index {index}, outside its plausible range [{low:g}, {high:g}] (the observation "
        f"space's bounds widened by their width, and at most {OBSERVATION_MAGNITUDE_LIMIT:g} in magnitude)"
    )


def _outside_discrete(actions: np.ndarray, action_space: gym.Space) -> np.ndarray:
    """Where ``actions`` lie outside a Discrete, MultiDiscrete or MultiBinary space (not integers, or out of range)."""
    if isinstance(action_space, gym.spaces.Discrete):
        low, high = int(action_space.start), int(action_space.start + action_space.n - 1)
    elif isinstance(action_space, gym.spaces.MultiDiscrete):
        low, high = action_space.start, action_space.start + action_space.nvec - 1
    else:  # MultiBinary
        low, high = 0, 1
    with np.errstate(invalid="ignore"):
        return (actions < low) | (actions > high) | (actions != np.round(actions))


def _first_step_where(bad: np.ndarray) -> int | None:
    """The first step (leading axis) where ``bad`` holds anywhere; ``None`` if nowhere."""
    per_step = bad.reshape(len(bad), -1).any(axis=1) if bad.ndim > 1 else bad
    return int(np.argmax(per_step)) if per_step.any() else None


def _where(dataset_id: str, bad: BadValue) -> str:
    return f"the Minari dataset {dataset_id!r}, episode {bad.episode}, step {bad.step}"
