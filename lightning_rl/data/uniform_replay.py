"""``ReplayBuffer``: uniform replay of single-agent transitions for off-policy learners.

The buffer stores single-agent transitions in a flat ring of ``capacity`` rows. Every row
is one env step: ``obs``, ``actions``, ``rewards``, ``terminateds``, ``truncateds`` and
``new_obs`` (the observation after the step). Rows are numbered by an absolute index, a
counter of every transition ever added; a row lives at ring position ``abs % capacity``
until ``capacity`` newer rows overwrite it.

n-step returns are computed when sampling (see :mod:`lightning_rl.data.replay_n_step`), so
a chunk of a running episode (the :class:`~lightning_rl.env.env_runner.EnvRunner` returns
one per env and ``sample()`` call) is linked to its continuation when that arrives under
the same ``id_``. How episodes become rows lives in :mod:`lightning_rl.data.replay_rows`,
how a saved state is checked in :mod:`lightning_rl.data.replay_state`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_rl.core.arguments import check_int, is_int, is_real
from lightning_rl.core.columns import Columns
from lightning_rl.data.replay_checks import validated_updates
from lightning_rl.data.replay_n_step import BATCH_INDEXES, WEIGHTS, n_step_batch
from lightning_rl.data.replay_rows import (
    EpisodeArrays,
    allocate_columns,
    check_episode_arrays,
    episode_arrays,
    ring_slices,
    rows_of,
    specs_of,
)
from lightning_rl.data.replay_state import STATE_KEYS, restore_ring
from lightning_rl.env.episode import SingleAgentEpisode


@dataclass
class _RowPlan:
    """Where one ``add_episodes`` call's rows go, decided before anything is written.

    Args:
        total: How many rows the call adds.
        ends: Per episode with steps, the offset (in this call's rows) of its last row.
        links: ``(predecessor abs, successor abs)`` for chunks continuing an earlier one.
        late_ends: ``(abs, terminated, truncated)`` for an earlier chunk's last row whose
            episode a zero-step chunk of this call ends.
    """

    total: int = 0
    ends: list[int] = field(default_factory=list)
    links: list[tuple[int, int]] = field(default_factory=list)
    late_ends: list[tuple[int, bool, bool]] = field(default_factory=list)


class ReplayBuffer:
    """Uniform replay of single-agent transitions, with n-step returns computed at sample time.

    Add episodes (or chunks of them) with :meth:`add_episodes`; draw training batches with
    :meth:`sample`. The observation and action dtypes and shapes are taken from the first
    episode added; every later episode must match them.

    Args:
        capacity: How many transitions (env steps) the buffer holds; the oldest are
            overwritten first.
        seed: Seed of the buffer's random generator; ``None`` seeds it from the OS.

    Raises:
        ValueError: If ``capacity`` is not an int >= 1, or ``seed`` is neither an int nor None.
    """

    def __init__(self, capacity: int, *, seed: int | None = None) -> None:
        check_int("capacity", capacity)
        if seed is not None and not is_int(seed):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        self.capacity = int(capacity)
        self._rng = np.random.default_rng(None if seed is None else int(seed))
        self._num_added = 0
        # Allocated on the first add, from the first episode's dtypes and shapes.
        self._columns: dict[str, np.ndarray] | None = None
        self._next_abs = np.full(self.capacity, -1, dtype=np.int64)
        # id_ -> absolute index of the last row of an episode that is not done yet, so its
        # next chunk can be linked to it. Insertion order is the order of those indices
        # (every insert is the newest row), which lets _prune_pending stop at the first
        # entry still in the ring.
        self._pending: OrderedDict[str, int] = OrderedDict()

    # ------------------------------------------------------------------------------------
    # Size
    # ------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return min(self._num_added, self.capacity)

    @property
    def num_added_lifetime(self) -> int:
        """How many transitions were ever added (overwritten ones included)."""
        return self._num_added

    # ------------------------------------------------------------------------------------
    # Adding
    # ------------------------------------------------------------------------------------

    def add_episodes(self, episodes: Sequence[SingleAgentEpisode]) -> None:
        """Append the transitions of ``episodes``, overwriting the oldest rows when full.

        An episode (or chunk) of length ``L`` adds ``L`` rows: row ``t`` holds observation
        ``t``, action ``t``, reward ``t`` and observation ``t + 1``; the last row is marked
        terminated or truncated when the episode is. A chunk of an episode that is not done
        is linked to the next chunk with the same ``id_`` when that is added (in this call
        or a later one), so n-step returns run across the chunk boundary. Episodes of length
        0 add nothing; one that ends the episode marks the previous chunk's last row as
        terminated or truncated. Infos and extra model outputs are not stored.

        Args:
            episodes: Numpy or list-backed episodes, in the order they were sampled (a
                continuation after the chunk it continues).

        Raises:
            TypeError: If ``episodes`` is a single episode rather than a sequence of them.
            ValueError: Naming the episode, if its observations or actions differ in dtype or
                shape from the ones the buffer holds (or from the first episode of the
                call, for an empty buffer). Nothing is added then.
        """
        if isinstance(episodes, SingleAgentEpisode):
            raise TypeError("add_episodes takes a sequence of episodes; wrap a single episode in a list")
        parts = [part for part in map(episode_arrays, episodes) if part is not None]
        specs = self._column_specs()
        if specs is None:
            # The first chunk with steps sets the dtypes and shapes (a zero-step chunk's
            # actions are a placeholder); with none, an empty buffer has nothing to do.
            with_steps = next((part for part in parts if len(part[1]) > 1), None)
            if with_steps is None:
                return
            specs = specs_of(with_steps)
        for part in parts:
            check_episode_arrays(part, specs)
        if self._columns is None:
            self._columns = allocate_columns(self.capacity, specs)

        # Links into rows of this call are applied after the write.
        start = self._num_added
        plan = self._plan_rows(parts, start)
        if plan.total:
            self._write(parts, start, plan.total, plan.ends)
        self._num_added = start + plan.total
        self._apply_links(plan)

    def _column_specs(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]] | None:
        if self._columns is None:
            return None
        return {
            Columns.OBS: (self._columns[Columns.OBS].dtype, self._columns[Columns.OBS].shape[1:]),
            Columns.ACTIONS: (self._columns[Columns.ACTIONS].dtype, self._columns[Columns.ACTIONS].shape[1:]),
        }

    def _plan_rows(self, parts: list[EpisodeArrays], start: int) -> _RowPlan:
        """Number the rows of ``parts`` from ``start``, link chunks of one episode, find the ends.

        Updates the running episodes (``_pending``): a continued or ended episode leaves
        it, a chunk that does not end its episode enters it with its last row.
        """
        plan = _RowPlan()
        for episode, obs, _, _ in parts:
            length = len(obs) - 1
            previous = self._pending.get(episode.id_)
            if length == 0:
                # A zero-step chunk can only carry the news that the episode ended.
                if previous is not None and episode.is_done:
                    plan.late_ends.append((previous, episode.is_terminated, episode.is_truncated))
                    del self._pending[episode.id_]
                continue
            first = start + plan.total
            plan.total += length
            plan.ends.append(plan.total - 1)
            if previous is not None:
                plan.links.append((previous, first))
                del self._pending[episode.id_]
            if not episode.is_done:
                # Inserted last, as the newest row: the order _prune_pending relies on.
                self._pending[episode.id_] = start + plan.total - 1
        return plan

    def _write(self, parts: list[EpisodeArrays], start: int, total: int, ends: list[int]) -> None:
        """Write this call's ``total`` rows (absolute indices ``start ..``) into the ring."""
        assert self._columns is not None
        block, next_abs = rows_of(parts, start, total, ends)
        # Rows that would be overwritten within this very call are not written at all.
        skip = max(0, total - self.capacity)
        first_abs = start + skip
        for dst, src in ring_slices(first_abs % self.capacity, total - skip, self.capacity):
            src = slice(src.start + skip, src.stop + skip)
            for name, values in block.items():
                self._columns[name][dst] = values[src]
            self._next_abs[dst] = next_abs[src]
        self._on_rows_written(first_abs, total - skip)

    def _on_rows_written(self, first_abs: int, count: int) -> None:
        """Hook for subclasses: rows ``first_abs .. first_abs + count - 1`` were (re)written."""

    def _apply_links(self, plan: _RowPlan) -> None:
        """Link earlier chunks to their continuations and mark late episode ends, in the ring."""
        oldest = self._num_added - len(self)
        for previous, successor in plan.links:
            # A successor is newer than its predecessor, so it is in the ring if that is.
            if previous >= oldest:
                self._next_abs[previous % self.capacity] = successor
        for previous, terminated, truncated in plan.late_ends:
            if previous >= oldest:
                assert self._columns is not None
                self._columns[Columns.TERMINATEDS][previous % self.capacity] = terminated
                self._columns[Columns.TRUNCATEDS][previous % self.capacity] = truncated
        self._prune_pending(oldest)

    def _prune_pending(self, oldest: int) -> None:
        # Episodes abandoned while running (e.g. the env runner was reset) never send a
        # continuation; forget them once their last row has left the ring.
        pending = self._pending
        while pending:
            episode_id = next(iter(pending))
            if pending[episode_id] >= oldest:
                break
            del pending[episode_id]

    # ------------------------------------------------------------------------------------
    # Sampling
    # ------------------------------------------------------------------------------------

    def sample(self, batch_size: int, *, n_step: int = 1, gamma: float = 0.99) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` rows with replacement and their n-step returns.

        From each sampled row ``t`` the walk follows the episode for up to ``n_step`` rows,
        stopping after a row that terminated or was truncated, or before a row not added
        yet. With ``m`` the number of rows summed, ``rewards`` is ``sum_{k<m} gamma**k r_{t+k}``
        and ``new_obs`` the observation after the last row summed, so the learner's target
        is ``rewards + gamma**m * (1 - terminateds) * V(new_obs)``.

        Args:
            batch_size: How many rows to draw.
            n_step: The most steps an n-step return sums.
            gamma: The discount factor.

        Returns:
            ``{column: array[batch_size, ...]}`` with ``obs``, ``actions`` (of the sampled
            row), ``rewards`` (the n-step return, float32), ``new_obs``, ``terminateds`` and
            ``truncateds`` (of the last row summed), ``n_step`` (int64, ``m``), ``weights``
            (float32 importance-sampling weights; ones for uniform replay) and
            ``batch_indexes`` (int64 absolute row indices, for :meth:`update_priorities`).

        Raises:
            ValueError: If nothing has been added yet, ``batch_size`` or ``n_step`` is not an
                int >= 1, or ``gamma`` is not in [0, 1].
        """
        check_int("batch_size", batch_size)
        check_int("n_step", n_step)
        if not is_real(gamma) or not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be a float in [0, 1], got {gamma!r}")
        if self._columns is None or self._num_added == 0:
            raise ValueError("cannot sample from an empty replay buffer: nothing has been added yet")
        positions, weights = self._sample_positions(int(batch_size))
        batch = n_step_batch(self._columns, self._next_abs, positions, int(n_step), float(gamma))
        batch[WEIGHTS] = weights
        batch[BATCH_INDEXES] = self._abs_of(positions)
        return batch

    def _sample_positions(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Return ring positions to replay and their importance-sampling weights."""
        positions = self._rng.integers(0, len(self), size=batch_size, dtype=np.int64)
        # Before the ring is full, rows 0 .. len-1 are stored; once full, every position is.
        return positions, np.ones(batch_size, dtype=np.float32)

    def _abs_of(self, positions: np.ndarray) -> np.ndarray:
        oldest = self._num_added - len(self)
        return oldest + (positions - oldest) % self.capacity

    # ------------------------------------------------------------------------------------
    # Priorities
    # ------------------------------------------------------------------------------------

    def update_priorities(self, batch_indexes: np.ndarray, td_errors: np.ndarray) -> None:
        """Set the priorities of sampled rows from their TD errors; a no-op for uniform replay.

        The arguments are checked here too, so a learner that feeds wrong shapes fails the
        same way with either buffer.

        Args:
            batch_indexes: The ``batch_indexes`` column of a sample (absolute row indices).
            td_errors: One TD error per index.

        Raises:
            ValueError: If the shapes differ, an index is negative or was never added, or a
                TD error is not finite.
        """
        validated_updates(batch_indexes, td_errors, self._num_added)

    # ------------------------------------------------------------------------------------
    # State
    # ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Return everything needed to restore the buffer, as numpy arrays and Python values.

        The arrays are views of the buffer's own storage, not copies, so saving a large
        buffer needs no second copy of it. They change when the buffer does: save them (or
        copy them) before the next :meth:`add_episodes` or :meth:`update_priorities`.

        Returns:
            A dict that ``torch.save`` can store (load it with ``weights_only=False``): the
            stored rows of every column, the links, the counters, the running episodes'
            last rows, and the random generator's state, so a restored buffer samples what
            this one would.
        """
        size = len(self)
        return {
            "buffer_type": type(self).__name__,
            "capacity": self.capacity,
            "num_added_lifetime": self._num_added,
            # Positions 0 .. size-1 hold every stored row, before and after the ring is full.
            "columns": None
            if self._columns is None
            else {name: values[:size] for name, values in self._columns.items()},
            "next_abs": self._next_abs[:size],
            "pending": dict(self._pending),
            "rng_state": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping[str, Any], *, consume: bool = False) -> None:
        """Restore the buffer from :meth:`state_dict`'s output.

        Args:
            state: A state from a buffer of the same class and capacity.
            consume: Whether the buffer may take the state's arrays over: it keeps a full
                buffer's arrays as its own storage instead of copying them, and removes
                each column from ``state["columns"]`` once it has its rows, so that no
                second full copy is held. Only for a state nobody reads afterwards (one
                just loaded from a checkpoint); by default ``state`` is left as it is.

        Raises:
            ValueError: If a key is missing, the state is from the other buffer type or a
                different capacity, or its arrays do not fit together.
        """
        # Everything is checked and built aside first, so a bad state changes nothing.
        ring = restore_ring(
            state, buffer_type=type(self).__name__, capacity=self.capacity, keys=self._state_keys(), consume=consume
        )
        self._check_extra_state(state, min(ring.num_added, self.capacity))

        self._columns = ring.columns
        self._num_added = ring.num_added
        self._next_abs = ring.next_abs
        self._pending = ring.pending
        self._rng = ring.rng
        self._load_extra_state(state)

    def _check_extra_state(self, state: Mapping[str, Any], size: int) -> None:
        """Hook for subclasses: raise ValueError if their part of ``state`` is bad."""

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        """Hook for subclasses: restore their part of ``state`` (already checked)."""

    def _state_keys(self) -> tuple[str, ...]:
        return STATE_KEYS

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self.capacity}, len={len(self)}, "
            f"num_added_lifetime={self._num_added})"
        )
