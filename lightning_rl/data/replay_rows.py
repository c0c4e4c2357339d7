"""How episodes become the rows of a replay buffer's ring.

A replay buffer stores one row per env step in ``capacity`` preallocated rows per column.
This module holds the steps from an episode to those rows: the episode's fields as arrays,
the check that they fit the columns already allocated, the allocation itself, the block of
rows (with their terminated/truncated flags and links) one ``add_episodes`` call writes,
and the slices that wrap that block around the end of the ring.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lightning_rl.core.columns import Columns
from lightning_rl.env.episode import SingleAgentEpisode

STORED_COLUMNS = (
    Columns.OBS,
    Columns.NEXT_OBS,
    Columns.ACTIONS,
    Columns.REWARDS,
    Columns.TERMINATEDS,
    Columns.TRUNCATEDS,
)
"""The columns a replay buffer stores. ``new_obs`` is stored per row (not looked up from the
next row), so the last row of a truncated episode keeps its true final observation."""

ColumnSpecs = Mapping[str, tuple[np.dtype, tuple[int, ...]]]
"""``{obs or actions column: (dtype, shape of one step)}``: what the stored columns hold."""

EpisodeArrays = tuple[SingleAgentEpisode, np.ndarray, np.ndarray, np.ndarray]
"""``(episode, observations [L + 1, ...], actions [L, ...], rewards float32 [L])``."""


def episode_arrays(episode: SingleAgentEpisode) -> EpisodeArrays | None:
    """Return an episode's fields as arrays, or None for an episode without observations.

    A zero-step episode's actions are a float32 placeholder of length 0.
    """
    if not len(episode.observations):
        return None
    obs = np.asarray(episode.observations)
    if len(episode):
        actions = np.asarray(episode.actions)
    else:
        actions = np.zeros((0,), dtype=np.float32)
    rewards = np.asarray(episode.rewards, dtype=np.float32)
    return episode, obs, actions, rewards


def specs_of(part: EpisodeArrays) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Return the observation and action dtypes and per-step shapes of an episode with steps."""
    _, obs, actions, _ = part
    return {Columns.OBS: (obs.dtype, obs.shape[1:]), Columns.ACTIONS: (actions.dtype, actions.shape[1:])}


def check_episode_arrays(part: EpisodeArrays, specs: ColumnSpecs) -> None:
    """Raise ValueError, naming the episode, if its observations or actions do not fit ``specs``.

    The actions of a zero-step episode are a placeholder and not checked.
    """
    episode, obs, actions, _ = part
    checks = [(Columns.OBS, "observations", obs)]
    if len(actions):
        checks.append((Columns.ACTIONS, "actions", actions))
    for column, field, values in checks:
        dtype, shape = specs[column]
        if values.dtype != dtype or values.shape[1:] != shape:
            raise ValueError(
                f"episode {episode.id_} has {field} of dtype {values.dtype} and shape {values.shape[1:]} per "
                f"step; the replay buffer holds {dtype} {shape}"
            )


def allocate_columns(capacity: int, specs: ColumnSpecs) -> dict[str, np.ndarray]:
    """Return the ``STORED_COLUMNS``, ``capacity`` rows each, shaped and typed after ``specs``."""
    obs_dtype, obs_shape = specs[Columns.OBS]
    act_dtype, act_shape = specs[Columns.ACTIONS]
    # np.empty: the pages of a large buffer are only touched once rows are written.
    return {
        Columns.OBS: np.empty((capacity, *obs_shape), dtype=obs_dtype),
        Columns.NEXT_OBS: np.empty((capacity, *obs_shape), dtype=obs_dtype),
        Columns.ACTIONS: np.empty((capacity, *act_shape), dtype=act_dtype),
        Columns.REWARDS: np.empty(capacity, dtype=np.float32),
        Columns.TERMINATEDS: np.zeros(capacity, dtype=np.bool_),
        Columns.TRUNCATEDS: np.zeros(capacity, dtype=np.bool_),
    }


def rows_of(
    parts: list[EpisodeArrays], start: int, total: int, ends: list[int]
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Return the ``total`` rows of one ``add_episodes`` call and each row's successor link.

    Args:
        parts: The call's episodes as arrays; those without steps add no row.
        start: The absolute index of the call's first row.
        total: How many rows the episodes with steps hold together.
        ends: Per episode with steps, the offset (in this call's rows) of its last row.

    Returns:
        ``(block, next_abs)``: ``{column: array[total, ...]}`` for every stored column, and
        the absolute index of each row's successor: the next row within an episode, -1
        after an episode's last row (the episode ended, or its next chunk links in when it
        arrives).
    """
    steps = [part for part in parts if len(part[1]) > 1]
    if len(steps) == 1:
        # The common case (one chunk per call, as SAC adds each env step): no concatenation.
        episode, obs, actions, rewards = steps[0]
        block = {
            Columns.OBS: obs[:-1],
            Columns.NEXT_OBS: obs[1:],
            Columns.ACTIONS: actions,
            Columns.REWARDS: rewards,
        }
    else:
        block = {
            Columns.OBS: np.concatenate([obs[:-1] for _, obs, _, _ in steps]),
            Columns.NEXT_OBS: np.concatenate([obs[1:] for _, obs, _, _ in steps]),
            Columns.ACTIONS: np.concatenate([actions for _, _, actions, _ in steps]),
            Columns.REWARDS: np.concatenate([rewards for _, _, _, rewards in steps]),
        }
    terminateds = np.zeros(total, dtype=np.bool_)
    truncateds = np.zeros(total, dtype=np.bool_)
    next_abs = np.arange(start + 1, start + total + 1, dtype=np.int64)
    end_offsets = np.asarray(ends, dtype=np.int64)
    terminateds[end_offsets] = [episode.is_terminated for episode, _, _, _ in steps]
    truncateds[end_offsets] = [episode.is_truncated for episode, _, _, _ in steps]
    next_abs[end_offsets] = -1
    block[Columns.TERMINATEDS] = terminateds
    block[Columns.TRUNCATEDS] = truncateds
    return block, next_abs


def ring_slices(position: int, count: int, capacity: int) -> list[tuple[slice, slice]]:
    """Return (ring slice, block slice) pairs covering ``count`` rows from ``position`` on."""
    first = min(count, capacity - position)
    pairs = [(slice(position, position + first), slice(0, first))]
    if first < count:
        pairs.append((slice(0, count - first), slice(first, count)))
    return pairs
