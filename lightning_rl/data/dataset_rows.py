"""Rows of a local Minari dataset: opened with clear errors, read per episode.

A Minari episode of ``T`` steps stores ``T + 1`` observations (the last is the final one),
``T`` actions, rewards, terminations and truncations. Row ``t`` of an episode becomes
``obs = observations[t]``, ``new_obs = observations[t + 1]`` (so the last row's ``new_obs``
is the episode's final observation), ``actions``, ``rewards``, ``terminateds``,
``truncateds`` and, on request, ``value_targets``: the discounted return-to-go within the
episode. Rows hold no value function, so the value of what comes after an episode that did
not terminate (a truncated one) is left to the Learner: on request a row also has
``bootstrap_obs``, its episode's final observation, and ``bootstrap_discount``,
``gamma^(T - t)`` (0 if the episode terminated), and ``value_targets + bootstrap_discount *
V(bootstrap_obs)`` is RLlib's MARWIL target.

``dataset_streams`` serves these rows to a Learner as endless, shuffled streams.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.connectors.episodes import segmented_discounted_sum
from lightning_rl.core.columns import Columns
from lightning_rl.core.observation_layout import ARRAY_SPACES
from lightning_rl.data.minari_io import datasets_root, recover_interrupted_writes, require_minari

#: The columns a dataset row can have (the discounted ones only when a discount is given).
DATASET_COLUMNS = (
    Columns.OBS,
    Columns.ACTIONS,
    Columns.REWARDS,
    Columns.NEXT_OBS,
    Columns.TERMINATEDS,
    Columns.TRUNCATEDS,
    Columns.VALUE_TARGETS,
    Columns.BOOTSTRAP_OBS,
    Columns.BOOTSTRAP_DISCOUNT,
)
#: The columns computed with a discount ``gamma``.
DISCOUNTED_COLUMNS = frozenset({Columns.VALUE_TARGETS, Columns.BOOTSTRAP_DISCOUNT})
# How to make a dataset, for the error about a missing one.
RECORD_HINT = (
    "record one with `lightning-rl record --config <config.yaml> --ckpt_path <checkpoint> --num_episodes N "
    "--dataset_id <id>` (or a recording callback during a fit), or put a Minari dataset under $MINARI_DATASETS_PATH "
    "(the offline example configs' datasets: `python examples/make_offline_datasets.py` in the repository)"
)


def open_dataset(dataset_id: str) -> Any:
    """The local Minari dataset ``dataset_id`` (``minari.load_dataset``, never downloading).

    Raises:
        ImportError: If Minari is not installed (``require_minari``).
        ValueError: Naming the id, if no such dataset is stored locally (listing the local
            ids and how to make one), or if its metadata or data file cannot be read.
    """
    minari = require_minari()
    recover_interrupted_writes(datasets_root())  # a replacement killed between its renames
    _check_spaces_are_stored(dataset_id)
    try:
        return minari.load_dataset(dataset_id, download=False)
    except FileNotFoundError:
        with warnings.catch_warnings():  # a misconfigured neighbour warns; it is not this error
            warnings.simplefilter("ignore")
            local = sorted(minari.list_local_datasets())
        raise ValueError(
            f"dataset_id {dataset_id!r} is not a local Minari dataset (looked under {datasets_root()}); local "
            f"datasets: {local or 'none'}. Nothing is downloaded: {RECORD_HINT}"
        ) from None
    except Exception as error:  # json, h5py, space and version errors alike: the dataset is unusable
        raise unreadable_dataset(dataset_id, error) from error


def recorded_env(dataset: Any, env_kwargs: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]] | None:
    """The id and keyword arguments of the env ``dataset`` was recorded in; ``None`` if gymnasium lacks it.

    The dataset's env spec is data: only its id, when gymnasium has it registered, and its
    keyword arguments are used (``render_mode`` dropped, a ``max_episode_steps`` other than the
    registered one kept); its entry point is never imported.

    Args:
        dataset: An open Minari dataset (``open_dataset``).
        env_kwargs: Keyword arguments over the spec's (``OfflineDataModule``'s
            ``evaluation_env_kwargs``).
    """
    spec = dataset.env_spec
    if spec is None or ":" in spec.id or spec.id not in gym.registry:
        return None
    kwargs = {key: value for key, value in (spec.kwargs or {}).items() if key != "render_mode"}
    registered = gym.registry[spec.id]
    if spec.max_episode_steps is not None and spec.max_episode_steps != registered.max_episode_steps:
        kwargs["max_episode_steps"] = spec.max_episode_steps
    return spec.id, {**kwargs, **(env_kwargs or {})}


def _check_spaces_are_stored(dataset_id: str) -> None:
    """Refuse a dataset whose metadata lacks its observation or action space, before Minari opens it.

    For such a dataset ``minari.load_dataset`` builds the env named by the stored env spec to
    learn its spaces, which imports and calls the spec's entry point: code named in the data.
    Datasets written by Minari's own tools and by this package store both spaces. A missing
    metadata file is left to ``load_dataset`` (the "not a local dataset" error).

    Raises:
        ValueError: Naming the id and the missing space, or if the metadata is not JSON.
    """
    path = datasets_root() / dataset_id / "data" / "metadata.json"
    if not path.is_file():
        return
    try:
        metadata = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise unreadable_dataset(dataset_id, error) from error
    missing = [key for key in ("observation_space", "action_space") if not isinstance(metadata.get(key), str)]
    if missing:
        raise ValueError(
            f"the Minari dataset {dataset_id!r} stores no {' or '.join(missing)} in its metadata; Minari would "
            "build the env its metadata names to find them, which runs code named in the dataset, and this "
            "package never does that: record the dataset again with its spaces (Minari's create_dataset_* "
            "functions store them when given an env or the spaces)"
        )


def episode_lengths(dataset: Any, dataset_id: str) -> np.ndarray:
    """Steps of every episode of ``dataset``, ``[num_episodes]`` int64, from its episode metadata.

    Raises:
        ValueError: Naming the id, if the data file cannot be read (a truncated HDF5 file), an
            episode has no step count, or the counts do not add up to the dataset's total.
    """
    try:
        metadata = list(dataset.storage.get_episode_metadata(dataset.episode_indices))
        lengths = np.asarray([int(m["total_steps"]) for m in metadata], dtype=np.int64)
        total = int(dataset.total_steps)
    except Exception as error:
        raise unreadable_dataset(dataset_id, error) from error
    if len(lengths) == 0 or lengths.sum() == 0:
        raise ValueError(f"the Minari dataset {dataset_id!r} holds no steps; expected at least one recorded episode")
    if int(lengths.sum()) != total:
        mismatch = ValueError(f"its episodes hold {int(lengths.sum())} steps, its metadata {total}")
        raise unreadable_dataset(dataset_id, mismatch)
    return lengths


def check_row_space(space: gym.Space, what: str, dataset_id: str) -> None:
    """Raise unless ``space`` is one whose values are plain arrays (Box, Discrete, MultiDiscrete, MultiBinary).

    Raises:
        ValueError: Naming the space, for Dict, Tuple, Text and other structured spaces.
    """
    if not isinstance(space, ARRAY_SPACES):
        raise ValueError(
            f"the Minari dataset {dataset_id!r} has {what} space {space}; OfflineDataModule reads Box, Discrete, "
            "MultiDiscrete and MultiBinary spaces (flatten structured spaces when recording)"
        )


@dataclasses.dataclass(frozen=True)
class DatasetEpisodes:
    """The episodes a stream serves, in the dataset's order.

    Attributes:
        indices: Their Minari episode ids, ``[E]`` int64.
        lengths: Their steps, ``[E]`` int64 (``episode_lengths``' entries for them).
    """

    indices: np.ndarray
    lengths: np.ndarray


def check_episode_shape(episode: Any, dataset_id: str) -> None:
    """Raise unless ``episode`` holds one more observation than steps, and one action, termination, truncation per step.

    Raises:
        ValueError: Naming the dataset and the episode's counts (``unreadable_dataset``).
    """
    steps = len(episode.rewards)
    lengths = (len(episode.observations), len(episode.actions), len(episode.terminations), len(episode.truncations))
    if lengths != (steps + 1, steps, steps, steps):
        raise unreadable_dataset(
            dataset_id,
            ValueError(
                f"episode {episode.id} has {lengths[0]} observations, {lengths[1]} actions, {steps} rewards, "
                f"{lengths[2]} terminations and {lengths[3]} truncations; expected one more observation "
                "than steps and one of each other per step"
            ),
        )


class EpisodeRows:
    """Rows of some episodes, as tensors, with observations stored once per step.

    ``observations`` holds each episode's ``T + 1`` observations back to back; row ``i``'s
    ``obs`` is ``observations[obs_index[i]]``, its ``new_obs`` the next one and its
    ``bootstrap_obs`` ``observations[final_obs_index[i]]``, its episode's last. Rows are in
    episode order, episode after episode. Their values were checked when the dataset was
    screened (``dataset_screen.screen_episodes``, which also chose the episodes).

    Args:
        dataset: The Minari dataset.
        dataset_id: Its id, for errors.
        episode_indices: Which episodes (Minari episode ids), in this order.
        gamma: The discount of ``value_targets`` and ``bootstrap_discount``; ``None`` computes neither.
    """

    def __init__(self, dataset: Any, dataset_id: str, episode_indices: Sequence[int], *, gamma: float | None) -> None:
        observation_space, action_space = dataset.observation_space, dataset.action_space
        observations, actions, rewards, terminateds, truncateds = [], [], [], [], []
        try:
            episodes = list(dataset.iterate_episodes([int(i) for i in episode_indices]))
        except Exception as error:
            raise unreadable_dataset(dataset_id, error) from error
        for episode in episodes:
            check_episode_shape(episode, dataset_id)
            observations.append(np.asarray(episode.observations))
            actions.append(np.asarray(episode.actions))
            rewards.append(np.asarray(episode.rewards, dtype=np.float32))
            terminateds.append(np.asarray(episode.terminations, dtype=bool))
            truncateds.append(np.asarray(episode.truncations, dtype=bool))
        steps_per_episode = np.asarray([len(r) for r in rewards], dtype=np.int64)
        # Episode e's observations start at (steps before e) + e: each episode has one more.
        first_obs = np.concatenate([[0], np.cumsum(steps_per_episode + 1)[:-1]])
        self.obs_index = torch.from_numpy(
            np.concatenate([first + np.arange(steps) for first, steps in zip(first_obs, steps_per_episode)])
        )
        self.final_obs_index = torch.from_numpy(np.repeat(first_obs + steps_per_episode, steps_per_episode))
        self.observations = _as_tensor(np.concatenate(observations), observation_space)
        self.columns: dict[str, torch.Tensor] = {
            Columns.ACTIONS: _as_tensor(np.concatenate(actions), action_space),
            Columns.REWARDS: torch.from_numpy(np.concatenate(rewards)),
            Columns.TERMINATEDS: torch.from_numpy(np.concatenate(terminateds)),
            Columns.TRUNCATEDS: torch.from_numpy(np.concatenate(truncateds)),
        }
        if gamma is not None:
            returns = segmented_discounted_sum(
                self.columns[Columns.REWARDS].double(), torch.from_numpy(steps_per_episode), gamma
            )
            self.columns[Columns.VALUE_TARGETS] = returns.float()
            # Steps from each row to its episode's end, T - t; no bootstrap after a termination.
            steps_left = (self.final_obs_index - self.obs_index).double()
            terminated = torch.from_numpy(np.repeat([bool(t[-1:].any()) for t in terminateds], steps_per_episode))
            discount = torch.where(terminated, 0.0, torch.pow(gamma, steps_left))
            self.columns[Columns.BOOTSTRAP_DISCOUNT] = discount.float()

    def __len__(self) -> int:
        return len(self.obs_index)

    def take(self, rows: torch.Tensor, columns: Sequence[str]) -> dict[str, torch.Tensor]:
        """``columns`` of ``rows`` (an int64 index tensor), gathered with one ``index_select`` each.

        ``index_select`` costs about half of ``tensor[rows]`` for minibatch-sized gathers, and
        this runs once per gradient step.
        """
        out: dict[str, torch.Tensor] = {}
        index = None
        if Columns.OBS in columns or Columns.NEXT_OBS in columns:
            index = torch.index_select(self.obs_index, 0, rows)
        for column in columns:
            if column == Columns.OBS:
                out[column] = torch.index_select(self.observations, 0, index)
            elif column == Columns.NEXT_OBS:
                out[column] = torch.index_select(self.observations, 0, index + 1)
            elif column == Columns.BOOTSTRAP_OBS:
                final = torch.index_select(self.final_obs_index, 0, rows)
                out[column] = torch.index_select(self.observations, 0, final)
            else:
                out[column] = torch.index_select(self.columns[column], 0, rows)
        return out


def _as_tensor(values: np.ndarray, space: gym.Space) -> torch.Tensor:
    """``values`` in the dtype of ``space`` (int64 for discrete spaces), as a tensor."""
    if isinstance(space, gym.spaces.Box):
        dtype = space.dtype
    elif isinstance(space, gym.spaces.MultiBinary):
        dtype = np.int8
    else:
        dtype = np.int64
    return torch.from_numpy(np.ascontiguousarray(values, dtype=dtype))


def unreadable_dataset(dataset_id: str, error: BaseException) -> ValueError:
    """The error for a dataset whose files cannot be read: naming it, the cause, and how to make it anew."""
    return ValueError(
        f"the Minari dataset {dataset_id!r} cannot be read ({type(error).__name__}: {error}); its files under "
        f"{datasets_root()} may be incomplete or corrupt: delete it and record it again ({RECORD_HINT})"
    )
