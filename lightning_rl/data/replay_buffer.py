"""Replay buffers for off-policy learners: uniform and proportional prioritized replay.

The buffer stores single-agent transitions in a flat ring of ``capacity`` rows. Every row
is one env step: ``obs``, ``actions``, ``rewards``, ``terminateds``, ``truncateds`` and
``new_obs`` (the observation after the step). Rows are numbered by an absolute index, a
counter of every transition ever added; a row lives at ring position ``abs % capacity``
until ``capacity`` newer rows overwrite it.

n-step returns are computed when sampling, not when adding: each row records the absolute
index of the same episode's next row (``-1`` when the episode ended at this row, or its next
row has not been added yet), and :meth:`ReplayBuffer.sample` walks up to ``n_step`` rows
along these links. So one buffer serves any ``n_step``, and a chunk of a running episode
(the :class:`~lightning_rl.env.env_runner.EnvRunner` returns one per env and ``sample()``
call) is linked to its continuation when that arrives under the same ``id_``. A successor
is always added after its predecessor, so it is still in the ring whenever the
predecessor is: a walk never reads an overwritten row.

:class:`PrioritizedReplayBuffer` samples rows in proportion to ``priority ** alpha`` (Schaul
et al. 2016, "Prioritized Experience Replay"), with a sum tree and a min tree over the ring
positions, both updated and searched a whole batch at a time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lightning_rl.core.columns import Columns
from lightning_rl.env.episode import SingleAgentEpisode

N_STEP = "n_step"
"""Sample column: how many steps the n-step return of a row sums (``1 .. n_step``)."""

WEIGHTS = "weights"
"""Sample column: the importance-sampling weight of a row (all ones for uniform replay)."""

BATCH_INDEXES = "batch_indexes"
"""Sample column: the absolute index of each sampled row, for ``update_priorities``."""

# The stored columns; new_obs is stored per row (not looked up from the next row), so the
# last row of a truncated episode keeps its true final observation.
_COLUMNS = (
    Columns.OBS,
    Columns.NEXT_OBS,
    Columns.ACTIONS,
    Columns.REWARDS,
    Columns.TERMINATEDS,
    Columns.TRUNCATEDS,
)
_STATE_KEYS = ("buffer_type", "capacity", "num_added_lifetime", "columns", "next_abs", "pending", "rng_state")


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
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
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
        parts = [_episode_arrays(episode) for episode in episodes]
        parts = [part for part in parts if part is not None]
        specs = self._column_specs()
        if specs is None:
            # The first chunk with steps sets the dtypes and shapes (a zero-step chunk's
            # actions are a placeholder); with none, an empty buffer has nothing to do.
            with_steps = next((part for part in parts if len(part[1]) > 1), None)
            if with_steps is None:
                return
            specs = _specs_of(with_steps)
        for part in parts:
            _check_part(part, specs)
        if self._columns is None:
            self._columns = _allocate(self.capacity, specs)

        # Number the rows, link chunks of one episode, and find the episode ends, before
        # writing anything: links into rows of this call are applied after the write.
        start = self._num_added
        total = 0
        ends: list[int] = []  # offsets (in this call's rows) of the last row of each chunk
        links: list[tuple[int, int]] = []  # (predecessor abs, successor abs)
        late_ends: list[tuple[int, bool, bool]] = []  # (abs, terminated, truncated)
        for episode, obs, _, _ in parts:
            length = len(obs) - 1
            previous = self._pending.get(episode.id_)
            if length == 0:
                # A zero-step chunk can only carry the news that the episode ended.
                if previous is not None and episode.is_done:
                    late_ends.append((previous, episode.is_terminated, episode.is_truncated))
                    del self._pending[episode.id_]
                continue
            first = start + total
            total += length
            ends.append(total - 1)
            if previous is not None:
                links.append((previous, first))
                del self._pending[episode.id_]
            if not episode.is_done:
                # Inserted last, as the newest row: the order _prune_pending relies on.
                self._pending[episode.id_] = start + total - 1
        if total:
            self._write(parts, start, total, ends)
        self._num_added = start + total

        oldest = self._num_added - len(self)
        for previous, successor in links:
            # A successor is newer than its predecessor, so it is in the ring if that is.
            if previous >= oldest:
                self._next_abs[previous % self.capacity] = successor
        for previous, terminated, truncated in late_ends:
            if previous >= oldest:
                assert self._columns is not None
                self._columns[Columns.TERMINATEDS][previous % self.capacity] = terminated
                self._columns[Columns.TRUNCATEDS][previous % self.capacity] = truncated
        self._prune_pending(oldest)

    def _column_specs(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]] | None:
        if self._columns is None:
            return None
        return {
            Columns.OBS: (self._columns[Columns.OBS].dtype, self._columns[Columns.OBS].shape[1:]),
            Columns.ACTIONS: (self._columns[Columns.ACTIONS].dtype, self._columns[Columns.ACTIONS].shape[1:]),
        }

    def _write(self, parts: list[_Part], start: int, total: int, ends: list[int]) -> None:
        """Write this call's ``total`` rows (absolute indices ``start ..``) into the ring."""
        assert self._columns is not None
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
            done_flags = [(episode.is_terminated, episode.is_truncated)]
        else:
            block = {
                Columns.OBS: np.concatenate([obs[:-1] for _, obs, _, _ in steps]),
                Columns.NEXT_OBS: np.concatenate([obs[1:] for _, obs, _, _ in steps]),
                Columns.ACTIONS: np.concatenate([actions for _, _, actions, _ in steps]),
                Columns.REWARDS: np.concatenate([rewards for _, _, _, rewards in steps]),
            }
            done_flags = [(episode.is_terminated, episode.is_truncated) for episode, _, _, _ in steps]
        terminateds = np.zeros(total, dtype=np.bool_)
        truncateds = np.zeros(total, dtype=np.bool_)
        next_abs = np.arange(start + 1, start + total + 1, dtype=np.int64)
        end_offsets = np.asarray(ends, dtype=np.int64)
        terminateds[end_offsets] = [terminated for terminated, _ in done_flags]
        truncateds[end_offsets] = [truncated for _, truncated in done_flags]
        # A chunk's last row has no successor yet: the episode ended, or its next chunk
        # links in when it arrives.
        next_abs[end_offsets] = -1
        block[Columns.TERMINATEDS] = terminateds
        block[Columns.TRUNCATEDS] = truncateds

        # Rows that would be overwritten within this very call are not written at all.
        skip = max(0, total - self.capacity)
        first_abs = start + skip
        for dst, src in _ring_slices(first_abs % self.capacity, total - skip, self.capacity):
            src = slice(src.start + skip, src.stop + skip)
            for name, values in block.items():
                self._columns[name][dst] = values[src]
            self._next_abs[dst] = next_abs[src]
        self._on_rows_written(first_abs, total - skip)

    def _on_rows_written(self, first_abs: int, count: int) -> None:
        """Hook for subclasses: rows ``first_abs .. first_abs + count - 1`` were (re)written."""

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
            row), ``rewards`` (float32, the n-step return), ``new_obs``, ``terminateds`` and
            ``truncateds`` (of the last row summed), ``n_step`` (int64, ``m``), ``weights``
            (float32 importance-sampling weights; ones for uniform replay) and
            ``batch_indexes`` (int64 absolute row indices, for :meth:`update_priorities`).

        Raises:
            ValueError: If nothing has been added yet, ``batch_size`` or ``n_step`` is not an
                int >= 1, or ``gamma`` is not in [0, 1].
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if isinstance(n_step, bool) or not isinstance(n_step, (int, np.integer)) or n_step < 1:
            raise ValueError(f"n_step must be an int >= 1, got {n_step!r}")
        if not _is_real(gamma) or not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be a float in [0, 1], got {gamma!r}")
        if self._columns is None or self._num_added == 0:
            raise ValueError("cannot sample from an empty replay buffer: nothing has been added yet")
        positions, weights = self._sample_positions(int(batch_size))
        batch = self._n_step_batch(positions, int(n_step), float(gamma))
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

    def _n_step_batch(self, positions: np.ndarray, n_step: int, gamma: float) -> dict[str, np.ndarray]:
        assert self._columns is not None
        columns = self._columns
        rewards, next_abs = columns[Columns.REWARDS], self._next_abs
        last = positions.copy()
        # Sum in float64 so a long return loses nothing before the float32 result.
        returns = rewards.take(positions).astype(np.float64)
        steps = np.ones(len(positions), dtype=np.int64)
        # The walk needs no terminated/truncated checks: a row that ended its episode has
        # no successor (-1), like the last row added of a running episode.
        successor = next_abs.take(positions)
        discount = 1.0
        for _ in range(1, n_step):
            walking = np.flatnonzero(successor >= 0)
            if not len(walking):
                break
            discount *= gamma
            rows = successor[walking] % self.capacity
            last[walking] = rows
            returns[walking] += discount * rewards.take(rows)
            steps[walking] += 1
            successor[walking] = next_abs.take(rows)
        # take() along axis 0 copies rows faster than fancy indexing does.
        return {
            Columns.OBS: columns[Columns.OBS].take(positions, axis=0),
            Columns.ACTIONS: columns[Columns.ACTIONS].take(positions, axis=0),
            Columns.REWARDS: returns.astype(np.float32),
            Columns.NEXT_OBS: columns[Columns.NEXT_OBS].take(last, axis=0),
            Columns.TERMINATEDS: columns[Columns.TERMINATEDS].take(last),
            Columns.TRUNCATEDS: columns[Columns.TRUNCATEDS].take(last),
            N_STEP: steps,
        }

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
        _validated_updates(batch_indexes, td_errors, self._num_added)

    # ------------------------------------------------------------------------------------
    # State
    # ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Return everything needed to restore the buffer, as numpy arrays and Python values.

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
            else {name: values[:size].copy() for name, values in self._columns.items()},
            "next_abs": self._next_abs[:size].copy(),
            "pending": dict(self._pending),
            "rng_state": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the buffer from :meth:`state_dict`'s output.

        Args:
            state: A state from a buffer of the same class and capacity.

        Raises:
            ValueError: If a key is missing, the state is from the other buffer type or a
                different capacity, or its arrays do not fit together.
        """
        # The type first: the other type's state also lacks (or has extra) keys.
        buffer_type = state.get("buffer_type")
        if buffer_type != type(self).__name__:
            raise ValueError(f"cannot load the state of a {buffer_type} into a {type(self).__name__}")
        missing = [key for key in self._state_keys() if key not in state]
        if missing:
            raise ValueError(f"replay buffer state is missing {missing}")
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"cannot load the state of a buffer with capacity {state['capacity']} into one with "
                f"capacity {self.capacity}"
            )
        # Everything is checked and built aside first, so a bad state changes nothing.
        num_added = int(state["num_added_lifetime"])
        size = min(num_added, self.capacity)
        links = np.asarray(state["next_abs"], dtype=np.int64)
        saved = state["columns"]
        if num_added < 0 or len(links) != size or (saved is None) != (size == 0):
            raise ValueError(
                f"replay buffer state holds {len(links)} links and "
                f"{'no' if saved is None else 'some'} columns for {size} stored rows "
                f"(num_added_lifetime={num_added}, capacity={self.capacity})"
            )
        columns: dict[str, np.ndarray] | None = None
        if saved is not None:
            if set(saved) != set(_COLUMNS) or any(len(saved[name]) != size for name in _COLUMNS):
                raise ValueError(
                    f"replay buffer state columns must be {list(_COLUMNS)} with {size} rows each, got "
                    f"{ {name: len(values) for name, values in saved.items()} }"
                )
            obs, actions = np.asarray(saved[Columns.OBS]), np.asarray(saved[Columns.ACTIONS])
            columns = _allocate(
                self.capacity,
                {Columns.OBS: (obs.dtype, obs.shape[1:]), Columns.ACTIONS: (actions.dtype, actions.shape[1:])},
            )
            for name in _COLUMNS:
                columns[name][:size] = saved[name]
        next_abs = np.full(self.capacity, -1, dtype=np.int64)
        next_abs[:size] = links
        # Sorted by row: the order _prune_pending relies on.
        pending = OrderedDict(sorted(((str(k), int(v)) for k, v in state["pending"].items()), key=lambda kv: kv[1]))
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng_state"]
        self._check_extra_state(state, size)

        self._columns = columns
        self._num_added = num_added
        self._next_abs = next_abs
        self._pending = pending
        self._rng = rng
        self._load_extra_state(state)

    def _check_extra_state(self, state: Mapping[str, Any], size: int) -> None:
        """Hook for subclasses: raise ValueError if their part of ``state`` is bad."""

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        """Hook for subclasses: restore their part of ``state`` (already checked)."""

    def _state_keys(self) -> tuple[str, ...]:
        return _STATE_KEYS

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self.capacity}, len={len(self)}, "
            f"num_added_lifetime={self._num_added})"
        )


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016).

    Row ``i`` is drawn with probability ``P(i) = p_i**alpha / sum_j p_j**alpha``, where
    ``p_i = |td_error_i| + epsilon`` after :meth:`update_priorities`, and new rows get the
    largest priority seen so far (1.0 at first), so each is likely replayed at least once.
    Sampling is stratified: the total mass is split into ``batch_size`` equal segments and
    one row drawn from each. The weights ``(N * P(i)) ** -beta / max_j (N * P(j)) ** -beta``
    (the max over every stored row, ``N = len(buffer)``) correct the bias of the
    non-uniform replay.

    Args:
        capacity: How many transitions the buffer holds.
        alpha: How strongly priorities skew sampling; 0 is uniform.
        beta: The importance-sampling exponent; 0 gives all-one weights, 1 fully corrects
            the bias. A public attribute: schedules anneal it towards 1.
        epsilon: Added to ``|td_error|`` so no row's priority is 0.
        seed: Seed of the buffer's random generator.

    Raises:
        ValueError: Naming the argument, as :class:`ReplayBuffer`, or for ``alpha`` or
            ``beta`` below 0 or ``epsilon`` not above 0.
    """

    def __init__(
        self,
        capacity: int,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        epsilon: float = 1e-6,
        seed: int | None = None,
    ) -> None:
        super().__init__(capacity, seed=seed)
        if not _is_real(alpha) or not 0.0 <= alpha < np.inf:
            raise ValueError(f"alpha must be a finite float >= 0, got {alpha!r}")
        if not _is_real(epsilon) or not 0.0 < epsilon < np.inf:
            raise ValueError(f"epsilon must be a finite float > 0, got {epsilon!r}")
        self.alpha = float(alpha)
        self.epsilon = float(epsilon)
        self.beta = beta
        self._max_priority = 1.0
        # Raw priorities per ring position: the trees hold priority ** alpha, and keeping
        # the raw ones lets a restored buffer use another alpha.
        self._priorities = np.zeros(self.capacity, dtype=np.float64)
        self._tree = _PriorityTree(self.capacity)

    @property
    def beta(self) -> float:
        """The importance-sampling exponent of the next samples (>= 0)."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        if not _is_real(value) or not 0.0 <= value < np.inf:
            raise ValueError(f"beta must be a finite float >= 0, got {value!r}")
        self._beta = float(value)

    def _set_priorities(self, positions: np.ndarray, priorities: np.ndarray) -> None:
        """Set the raw priorities at unique ring ``positions``, and their masses in the tree."""
        self._priorities[positions] = priorities
        self._tree.set(positions, _masses(priorities, self.alpha))

    def _on_rows_written(self, first_abs: int, count: int) -> None:
        positions = (first_abs + np.arange(count, dtype=np.int64)) % self.capacity
        self._set_priorities(positions, np.full(count, self._max_priority))

    # ------------------------------------------------------------------------------------
    # Sampling and priorities
    # ------------------------------------------------------------------------------------

    def _sample_positions(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        tree = self._tree
        # Stratified: one uniform draw in each of batch_size equal segments of the mass.
        targets = (np.arange(batch_size) + self._rng.random(batch_size)) * (tree.total / batch_size)
        # The strata come out ordered by ring position; shuffled, any slice of the batch (a
        # minibatch) is a fair sample too.
        positions = tree.find(targets[self._rng.permutation(batch_size)])
        # (N P(i))^-beta / max_j (N P(j))^-beta = (mass_i / min_j mass_j)^-beta: N and the
        # total mass cancel, and the max weight belongs to the smallest stored mass.
        weights = (tree.masses(positions) / tree.min) ** -self._beta
        return positions, weights.astype(np.float32)

    def update_priorities(self, batch_indexes: np.ndarray, td_errors: np.ndarray) -> None:
        """Set the priorities of sampled rows to ``|td_error| + epsilon``.

        Rows that have left the ring since they were sampled are skipped; for an index
        given twice the last TD error wins.

        Args:
            batch_indexes: The ``batch_indexes`` column of a sample (absolute row indices).
            td_errors: One TD error per index.

        Raises:
            ValueError: If the shapes differ, an index is negative or was never added, or a
                TD error is not finite.
        """
        indexes, errors = _validated_updates(batch_indexes, td_errors, self._num_added)
        keep = indexes >= self._num_added - len(self)
        indexes, errors = indexes[keep], errors[keep]
        if not len(indexes):
            return
        positions = indexes % self.capacity
        # Last one wins: the first occurrence in the reversed order is the last one.
        _, first_in_reversed = np.unique(positions[::-1], return_index=True)
        chosen = len(positions) - 1 - first_in_reversed
        priorities = np.abs(errors[chosen]) + self.epsilon
        self._set_priorities(positions[chosen], priorities)
        self._max_priority = max(self._max_priority, float(priorities.max()))

    # ------------------------------------------------------------------------------------
    # State
    # ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Return the uniform buffer's state plus the priorities and the max priority.

        Returns:
            As :meth:`ReplayBuffer.state_dict`, with ``priorities`` (raw, per stored row) and
            ``max_priority``. :meth:`load_state_dict` rebuilds the trees from them with
            this buffer's ``alpha``, and also raises ValueError if they do not fit the
            stored rows or are not finite and positive.
        """
        state = super().state_dict()
        state["priorities"] = self._priorities[: len(self)].copy()
        state["max_priority"] = self._max_priority
        return state

    def _check_extra_state(self, state: Mapping[str, Any], size: int) -> None:
        priorities = np.asarray(state["priorities"], dtype=np.float64)
        if priorities.shape != (size,) or not np.all(np.isfinite(priorities)) or (size and priorities.min() <= 0):
            raise ValueError(
                f"replay buffer state must hold {size} finite positive priorities, got shape {priorities.shape}"
            )
        max_priority = state["max_priority"]
        if not _is_real(max_priority) or not 0.0 < max_priority < np.inf:
            raise ValueError(f"replay buffer state's max_priority must be a finite float > 0, got {max_priority!r}")

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        size = len(self)
        self._priorities[:] = 0.0
        self._priorities[:size] = np.asarray(state["priorities"], dtype=np.float64)
        self._max_priority = float(state["max_priority"])
        self._tree.rebuild(_masses(self._priorities[:size], self.alpha))

    def _state_keys(self) -> tuple[str, ...]:
        return (*_STATE_KEYS, "priorities", "max_priority")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self.capacity}, len={len(self)}, "
            f"num_added_lifetime={self._num_added}, alpha={self.alpha}, beta={self._beta})"
        )


class _PriorityTree:
    """A sum tree and a min tree over ``num_leaves`` masses, updated and searched in batches.

    Binary trees in heap layout: the root is node 1, the children of node ``i`` are ``2 i``
    and ``2 i + 1``, and the leaves are nodes ``size .. 2 size - 1`` for the smallest power
    of two ``size >= num_leaves``. Padding leaves hold mass 0 (sum) and inf (min), so they
    are never drawn nor the minimum. Batch operations loop over the levels (about 20 for a
    million leaves) with a few numpy calls each, over the whole batch at once.

    Args:
        num_leaves: How many masses the tree holds (the ring's capacity).
    """

    def __init__(self, num_leaves: int) -> None:
        self.num_leaves = num_leaves
        self._size = 1 << max(0, (num_leaves - 1).bit_length())
        self._sums = np.zeros(2 * self._size, dtype=np.float64)
        self._mins = np.full(2 * self._size, np.inf, dtype=np.float64)

    @property
    def total(self) -> float:
        """The sum of all masses."""
        return float(self._sums[1])

    @property
    def min(self) -> float:
        """The smallest mass set (inf while none is)."""
        return float(self._mins[1])

    def masses(self, positions: np.ndarray) -> np.ndarray:
        """Return the masses at leaf ``positions``."""
        return self._sums[positions + self._size]

    def set(self, positions: np.ndarray, masses: np.ndarray) -> None:
        """Set the masses at unique leaf ``positions`` and repair the nodes above them.

        Every node on the way up is recomputed from its two children, not shifted by the
        change, so no rounding error accumulates, and a node above several positions is
        just written several times with the same value.
        """
        sums, mins = self._sums, self._mins
        nodes = positions + self._size
        sums[nodes] = masses
        mins[nodes] = masses
        if len(nodes) <= 6:
            # Python scalars beat numpy calls on arrays this short (measured: up to about 8
            # leaves), and adding a transition per env step for a few envs is the common case.
            for node in nodes.tolist():
                node >>= 1
                while node:
                    left = 2 * node
                    sums[node] = sums[left] + sums[left + 1]
                    mins[node] = min(mins[left], mins[left + 1])
                    node >>= 1
            return
        while nodes[0] > 1:
            nodes = nodes >> 1
            left = nodes << 1
            right = left + 1
            sums[nodes] = sums.take(left) + sums.take(right)
            mins[nodes] = np.minimum(mins.take(left), mins.take(right))

    def rebuild(self, masses: np.ndarray) -> None:
        """Set leaves ``0 .. len(masses) - 1`` to ``masses``, clear the rest, recompute every node."""
        size, sums, mins = self._size, self._sums, self._mins
        sums[size:] = 0.0
        mins[size:] = np.inf
        sums[size : size + len(masses)] = masses
        mins[size : size + len(masses)] = masses
        width = size // 2
        while width:
            # Nodes width .. 2 width - 1 from their children 2 width .. 4 width - 1; the same
            # per-node sums as set(), so a rebuilt tree equals an updated one bit for bit.
            sums[width : 2 * width] = sums[2 * width : 4 * width : 2] + sums[2 * width + 1 : 4 * width : 2]
            mins[width : 2 * width] = np.minimum(mins[2 * width : 4 * width : 2], mins[2 * width + 1 : 4 * width : 2])
            width //= 2

    def find(self, targets: np.ndarray) -> np.ndarray:
        """Return, per target in ``[0, total)``, the leaf whose prefix-sum interval holds it.

        Only leaves of positive mass are returned.
        """
        positions = self._descend(targets, careful=False)
        # Rounding can carry a target past the mass of the subtree it went into (or a
        # target can round to the total itself), and the lean walk then ends on a leaf
        # of no mass (padding, or a row not stored yet). Rare: walk those again with care.
        stray = np.flatnonzero(self._sums[positions + self._size] <= 0.0)
        if len(stray):
            positions[stray] = self._descend(targets[stray], careful=True)
        return positions

    def _descend(self, targets: np.ndarray, *, careful: bool) -> np.ndarray:
        sums = self._sums
        targets = targets.astype(np.float64, copy=True)
        nodes = np.ones(len(targets), dtype=np.int64)
        for _ in range(self._size.bit_length() - 1):
            nodes <<= 1
            left_mass = sums.take(nodes)
            go_right = targets >= left_mass
            if careful:
                go_right &= sums.take(nodes + 1) > 0.0
            targets -= left_mass * go_right
            nodes += go_right
        return nodes - self._size


def _masses(priorities: np.ndarray, alpha: float) -> np.ndarray:
    # At least the smallest normal float: a mass that underflowed to 0 could never be drawn
    # and would make the smallest mass, which the weights divide by, 0.
    return np.maximum(priorities**alpha, np.finfo(np.float64).tiny)


# (episode, observations [L + 1, ...], actions [L, ...], rewards float32 [L])
_Part = tuple[SingleAgentEpisode, np.ndarray, np.ndarray, np.ndarray]


def _episode_arrays(episode: SingleAgentEpisode) -> _Part | None:
    """Return an episode's fields as arrays, or None for an episode without observations."""
    if not len(episode.observations):
        return None
    obs = np.asarray(episode.observations)
    if len(episode):
        actions = np.asarray(episode.actions)
    else:
        actions = np.zeros((0,), dtype=np.float32)
    rewards = np.asarray(episode.rewards, dtype=np.float32)
    return episode, obs, actions, rewards


def _allocate(capacity: int, specs: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> dict[str, np.ndarray]:
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


def _specs_of(part: _Part) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    _, obs, actions, _ = part
    return {Columns.OBS: (obs.dtype, obs.shape[1:]), Columns.ACTIONS: (actions.dtype, actions.shape[1:])}


def _check_part(part: _Part, specs: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> None:
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


def _ring_slices(position: int, count: int, capacity: int) -> list[tuple[slice, slice]]:
    """Return (ring slice, block slice) pairs covering ``count`` rows from ``position`` on."""
    first = min(count, capacity - position)
    pairs = [(slice(position, position + first), slice(0, first))]
    if first < count:
        pairs.append((slice(0, count - first), slice(first, count)))
    return pairs


def _validated_updates(batch_indexes: Any, td_errors: Any, num_added: int) -> tuple[np.ndarray, np.ndarray]:
    indexes = np.asarray(batch_indexes)
    errors = np.asarray(td_errors, dtype=np.float64)
    if indexes.shape != errors.shape:
        raise ValueError(
            f"batch_indexes and td_errors must have the same shape, got {indexes.shape} and {errors.shape}"
        )
    if indexes.size and indexes.dtype.kind not in "iu":
        raise ValueError(f"batch_indexes must be integers (a sample's batch_indexes), got dtype {indexes.dtype}")
    indexes = indexes.astype(np.int64, copy=False).ravel()
    errors = errors.ravel()
    if not np.all(np.isfinite(errors)):
        raise ValueError(f"td_errors must be finite, got {errors[~np.isfinite(errors)][:5]} among them")
    if indexes.size and (indexes.min() < 0 or indexes.max() >= num_added):
        raise ValueError(
            f"batch_indexes must be rows added so far (0 .. {num_added - 1}), got values from "
            f"{indexes.min()} to {indexes.max()}"
        )
    return indexes, errors


def _is_real(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))
