"""Dataset rows served as endless, deterministic streams: rows for feed-forward modules, sequences for stateful ones.

``RowStream`` is an endless, deterministic stream of rows: pass after pass over the
dataset, each pass in its own order (a generator seeded with ``(seed, pass)``). Any stretch
``[start, stop)`` of global stream positions can be asked for, so data-parallel ranks take
disjoint slices of the same stream, and a resumed fit continues from a saved position.
A small dataset is one window, read into memory once; a large one is read a window of
episodes at a time (``EpisodeWindows``: episodes in a per-pass random order, rows shuffled
within the window), so memory holds at most two windows.

``SequenceStream`` is the same for a stateful (recurrent) module, in units of sequences:
each episode cut into sequences of ``max_seq_len`` steps (``SequenceIndex``, ``core.sequences``),
held in memory or read a window of whole episodes at a time. A recurrent value network values
the final observation from a state, so a sequence's ``bootstrap_obs`` is the last chunk of its
episode, ending in the final observation (``Columns.BOOTSTRAP_STEPS``).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lightning_rl.core.columns import Columns
from lightning_rl.core.sequences import sequence_layout
from lightning_rl.data.dataset_rows import DISCOUNTED_COLUMNS, DatasetEpisodes, EpisodeRows

# Window caches hold the window being read and the one before it (a minibatch may straddle both).
_CACHED_WINDOWS = 2


class EpisodeWindows:
    """How a streamed pass reads a dataset: windows of consecutive episodes, in the pass's episode order.

    Pass ``p`` orders the episodes with a generator seeded with ``(seed, p)`` (the dataset's order
    without ``shuffle``) and cuts them into windows of about ``window_items`` items (rows, or
    sequences): an episode belongs to the window in which its last item falls, so no window splits
    an episode (one longer than a window is a window alone). Only the episodes' sizes are needed:
    nothing is read.

    Args:
        items_per_episode: ``[E]``, each episode's items.
        window_items: About how many items a window holds.
        seed: Seeds each pass's episode order.
        shuffle: Whether passes order the episodes at random.
    """

    def __init__(self, items_per_episode: np.ndarray, window_items: int, *, seed: int, shuffle: bool) -> None:
        self.items_per_episode = np.asarray(items_per_episode, dtype=np.int64)
        self.window_items = window_items
        self.seed = seed
        self.shuffle = shuffle
        self._layouts: collections.OrderedDict[int, tuple[list[np.ndarray], np.ndarray]] = collections.OrderedDict()

    def locate(self, pass_index: int, offset: int) -> tuple[int, int]:
        """(window index, the window's first item within the pass) of the pass's item ``offset``."""
        _, starts = self._layout(pass_index)
        window_index = int(np.searchsorted(starts, offset, side="right")) - 1
        return window_index, int(starts[window_index])

    def episodes(self, pass_index: int, window_index: int) -> np.ndarray:
        """The episodes (positions in ``items_per_episode``) of a pass's window, in the pass's order."""
        return self._layout(pass_index)[0][window_index]

    def _layout(self, pass_index: int) -> tuple[list[np.ndarray], np.ndarray]:
        """The episodes of each window of a pass, and each window's first item within it (cached: two passes)."""
        if pass_index not in self._layouts:
            num_episodes = len(self.items_per_episode)
            episodes = (
                _generator(self.seed, pass_index).permutation(num_episodes) if self.shuffle else np.arange(num_episodes)
            )
            ends = np.cumsum(self.items_per_episode[episodes])
            _, window_of_episode = np.unique((ends - 1) // self.window_items, return_inverse=True)
            boundaries = np.flatnonzero(np.diff(window_of_episode)) + 1
            windows = np.split(episodes, boundaries)
            starts = np.concatenate([[0], ends[boundaries - 1]])
            self._layouts[pass_index] = (windows, starts)
            while len(self._layouts) > _CACHED_WINDOWS:
                self._layouts.popitem(last=False)
        return self._layouts[pass_index]


class _EpisodeStream:
    """What both streams share: the dataset's episodes, the settings, and how a pass reads them.

    Args:
        dataset, dataset_id, episodes, columns, seed, shuffle, replacement, window_rows, gamma:
            As ``RowStream`` takes them.
        items_per_episode: ``[E]``, the stream's items (rows, or sequences) in each episode.
        window_items: ``None`` to hold the dataset in memory; else about how many items a
            streamed window holds (``EpisodeWindows``).
    """

    def __init__(
        self,
        dataset: Any,
        dataset_id: str,
        episodes: DatasetEpisodes,
        *,
        columns: Sequence[str],
        seed: int,
        shuffle: bool,
        replacement: bool,
        window_rows: int | None,
        gamma: float | None,
        items_per_episode: np.ndarray,
        window_items: int | None,
    ) -> None:
        self.dataset = dataset
        self.dataset_id = dataset_id
        self.episode_indices = episodes.indices
        self.lengths = episodes.lengths
        self.columns = list(columns)
        self.seed = seed
        self.shuffle = shuffle
        self.replacement = replacement
        self.window_rows = window_rows
        self.gamma = gamma if DISCOUNTED_COLUMNS & set(self.columns) else None
        self._plan = None
        if window_items is not None:
            self._plan = EpisodeWindows(items_per_episode, window_items, seed=seed, shuffle=shuffle)
        #: Windows read from disk so far (streaming only); tests and logs read it.
        self.num_windows_read = 0

    @property
    def in_memory(self) -> bool:
        """Whether the whole dataset is held in memory."""
        return self._plan is None

    def _locate(self, pass_index: int, offset: int) -> tuple[int, int]:
        """(window index, the window's first item within the pass) of the pass's item ``offset``."""
        return (0, 0) if self._plan is None else self._plan.locate(pass_index, offset)

    def _read(self, pass_index: int, window_index: int) -> EpisodeRows:
        """The rows of a pass's window (counted in ``num_windows_read``); of every episode in memory."""
        if self._plan is None:
            return EpisodeRows(self.dataset, self.dataset_id, self.episode_indices, gamma=self.gamma)
        episodes = self.episode_indices[self._plan.episodes(pass_index, window_index)]
        self.num_windows_read += 1
        return EpisodeRows(self.dataset, self.dataset_id, episodes, gamma=self.gamma)


class RowStream(_EpisodeStream):
    """An endless, deterministic stream of dataset rows: pass after pass, each shuffled anew.

    Stream position ``g`` is row ``g % R`` of pass ``g // R`` (``R`` rows per pass), so the
    rows at any position are a function of ``(seed, g)`` alone, whoever asks and whenever.

    Args:
        dataset: The Minari dataset.
        dataset_id: Its id, for errors.
        episodes: The episodes it serves (``screen_episodes``' choice).
        columns: The columns ``rows`` returns.
        seed: Seeds each pass's order (``(seed, pass)``) and each window's (``(seed, pass, window)``).
        shuffle: Whether passes are shuffled; without it rows come in the dataset's order.
        replacement: Draw each pass's rows uniformly at random with replacement instead of
            visiting every row once (``visit_order``); needs ``shuffle``.
        window_rows: ``None`` to hold the whole dataset in memory (one window, read on first
            use); otherwise read windows of consecutive episodes (in the pass's episode order,
            ``EpisodeWindows``) of about this many rows each, shuffling (or, with
            ``replacement``, drawing) rows within a window.
        gamma: The discount of ``value_targets`` and ``bootstrap_discount`` (needed only when
            ``columns`` holds them).
    """

    def __init__(
        self,
        dataset: Any,
        dataset_id: str,
        episodes: DatasetEpisodes,
        *,
        columns: Sequence[str],
        seed: int,
        shuffle: bool,
        replacement: bool,
        window_rows: int | None,
        gamma: float | None,
    ) -> None:
        super().__init__(
            dataset, dataset_id, episodes, columns=columns, seed=seed, shuffle=shuffle, replacement=replacement,
            window_rows=window_rows, gamma=gamma, items_per_episode=episodes.lengths, window_items=window_rows,
        )  # fmt: skip
        self.num_rows = int(self.lengths.sum())
        self._resident: EpisodeRows | None = None  # the whole dataset, when held in memory
        self._windows: collections.OrderedDict[tuple[int, int], tuple[EpisodeRows, torch.Tensor]] = (
            collections.OrderedDict()
        )

    def preload(self, position: int) -> None:
        """Read the window that holds stream position ``position`` now (the whole dataset, in memory).

        Called before training, so that reading costs no train step and a dataset whose
        episodes cannot be read fails before the first gradient step.
        """
        pass_index, offset = divmod(position, self.num_rows)
        self._window(pass_index, self._locate(pass_index, offset)[0])

    def rows(self, start: int, stop: int) -> dict[str, torch.Tensor]:
        """The rows at stream positions ``[start, stop)``, as ``{column: Tensor[stop - start, ...]}``."""
        if not 0 <= start < stop:
            raise ValueError(f"a stretch of the row stream must have 0 <= start < stop, got [{start}, {stop})")
        pieces = []
        position = start
        while position < stop:
            pass_index, offset = divmod(position, self.num_rows)
            window_index, window_start = self._locate(pass_index, offset)
            rows, order = self._window(pass_index, window_index)
            first = offset - window_start
            take = min(stop - position, len(order) - first)
            pieces.append(rows.take(order[first : first + take], self.columns))
            position += take
        return _joined(pieces)

    def _window(self, pass_index: int, window_index: int) -> tuple[EpisodeRows, torch.Tensor]:
        """A window's rows and the order the pass visits them in (cached: the current and previous ones)."""
        key = (pass_index, window_index)
        if key not in self._windows:
            if self._plan is None:
                if self._resident is None:
                    self._resident = self._read(pass_index, window_index)
                rows, generator = self._resident, _generator(self.seed, pass_index)
            else:
                rows, generator = self._read(pass_index, window_index), _generator(self.seed, pass_index, window_index)
            order = visit_order(generator, len(rows), shuffle=self.shuffle, replacement=self.replacement)
            self._windows[key] = (rows, torch.from_numpy(order))
            while len(self._windows) > _CACHED_WINDOWS:
                self._windows.popitem(last=False)
        self._windows.move_to_end(key)
        return self._windows[key]


class SequenceIndex:
    """The sequences of some episodes laid end to end (their rows in ``EpisodeRows``' order): an index, no data.

    Each episode is cut into sequences of ``max_seq_len`` steps (the last one of an episode
    shorter, zero-padded; ``core.sequences.sequence_layout``); a sequence never spans two
    episodes. Per sequence it knows its first row and real steps, and its episode's bootstrap
    chunk (``gather``).

    Args:
        lengths: ``[E]``, the episodes' steps, in the rows' order.
        max_seq_len: ``T``, the steps of a sequence.
    """

    def __init__(self, lengths: np.ndarray, max_seq_len: int) -> None:
        self.max_seq_len = max_seq_len
        episode_steps = torch.from_numpy(np.asarray(lengths, dtype=np.int64))
        layout = sequence_layout(episode_steps, max_seq_len)
        self.num_sequences = layout.num_sequences
        self._first_row = layout.first_row
        #: The real (unpadded) steps of each sequence, ``[S]``.
        self.steps_per_sequence = torch.bincount(layout.sequence_of_row, minlength=layout.num_sequences)
        episode_starts = torch.cumsum(episode_steps, 0) - episode_steps
        # Each sequence's episode: its first row (no step before it) and the bootstrap chunk's
        # (steps of the episode, its final observation one step more, cut every max_seq_len steps).
        self._episode_of_sequence = torch.repeat_interleave(torch.arange(len(episode_steps)), episode_steps)[
            layout.first_row
        ]
        steps = episode_steps[self._episode_of_sequence]
        self._episode_first_row = episode_starts[self._episode_of_sequence]
        self._bootstrap_steps = steps % max_seq_len + 1
        self._bootstrap_first_row = self._episode_first_row + steps - steps % max_seq_len

    def gather(self, rows: EpisodeRows, ids: torch.Tensor, columns: Sequence[str]) -> dict[str, torch.Tensor]:
        """Sequences ``ids`` of ``rows``, zero-padded to ``max_seq_len`` steps.

        Returns:
            ``{column: Tensor[k, T, ...]}`` for ``columns``, plus ``loss_mask [k, T]`` (true on
            real steps), ``prev_actions [k, T, ...]`` and ``prev_rewards [k, T]`` (the action and
            reward of the episode's previous step; zeros at its first step), ``k = len(ids)``.
            With ``bootstrap_obs`` among ``columns``, that column is each sequence's bootstrap
            chunk (``_bootstrap_chunks``), beside ``bootstrap_steps [k]``,
            ``bootstrap_prev_actions`` and ``bootstrap_prev_rewards``.
        """
        count, steps = len(ids), self.max_seq_len
        offsets = torch.arange(steps)
        real = offsets < self.steps_per_sequence[ids, None]
        # Padding reads row 0 and is zeroed after: one gather per column, no Python loop per step.
        row_ids = torch.where(real, self._first_row[ids, None] + offsets, 0).reshape(-1)
        taken = rows.take(row_ids, [column for column in columns if column != Columns.BOOTSTRAP_OBS])
        out = {
            column: _zero_where_not(values.reshape(count, steps, *values.shape[1:]), real)
            for column, values in taken.items()
        }
        out[Columns.PREV_ACTIONS], out[Columns.PREV_REWARDS] = self._previous_steps(
            rows, ids, row_ids.reshape(count, steps), real
        )
        out[Columns.LOSS_MASK] = real
        if Columns.BOOTSTRAP_OBS in columns:
            out.update(self._bootstrap_chunks(rows, ids))
        return out

    def _bootstrap_chunks(self, rows: EpisodeRows, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The chunk of each sequence's episode that holds its final observation, zero-padded.

        The episode's ``T`` steps with the final observation as step ``T``, cut every
        ``max_seq_len = L`` steps as the training sequences are: the chunk of steps
        ``[L * floor(T / L), T]``. Run from the initial state, as every sequence is, its last
        output is the value of the final observation that RLlib's MARWIL computes when it adds
        one time step to each episode.

        Returns:
            ``bootstrap_obs [k, L, ...]``, ``bootstrap_steps [k]`` (real steps, 1 to ``L``) and
            ``bootstrap_prev_actions`` / ``bootstrap_prev_rewards`` (the previous step's; zeros
            at the episode's first step).
        """
        count, offsets = len(ids), torch.arange(self.max_seq_len)
        real = offsets < self._bootstrap_steps[ids, None]
        # Step t of episode e is row (e's first row + t), and observation (that row + e): each
        # episode stores one observation more than it has rows.
        chunk_rows = self._bootstrap_first_row[ids, None] + offsets
        observations = torch.where(real, chunk_rows + self._episode_of_sequence[ids, None], 0).reshape(-1)
        obs = torch.index_select(rows.observations, 0, observations)
        out = {
            Columns.BOOTSTRAP_OBS: _zero_where_not(obs.reshape(count, self.max_seq_len, *obs.shape[1:]), real),
            Columns.BOOTSTRAP_STEPS: self._bootstrap_steps[ids].clone(),
        }
        out[Columns.BOOTSTRAP_PREV_ACTIONS], out[Columns.BOOTSTRAP_PREV_REWARDS] = self._previous_steps(
            rows, ids, chunk_rows, real
        )
        return out

    def _previous_steps(
        self, rows: EpisodeRows, ids: torch.Tensor, step_rows: torch.Tensor, real: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The action and reward of the step before each step of sequences ``ids``, ``[k, T, ...]`` and ``[k, T]``.

        Args:
            rows: The rows the sequences are cut from.
            ids: The sequences.
            step_rows: ``[k, T]``, each step's row (a final observation's: one past its episode's last).
            real: ``[k, T]``, which steps are real; padding and an episode's first step get zeros.
        """
        has_previous = real & (step_rows > self._episode_first_row[ids, None])
        previous_rows = torch.where(has_previous, step_rows - 1, 0).reshape(-1)
        previous = rows.take(previous_rows, [Columns.ACTIONS, Columns.REWARDS])
        actions, rewards = (
            _zero_where_not(values.reshape(*step_rows.shape, *values.shape[1:]), has_previous)
            for values in (previous[Columns.ACTIONS], previous[Columns.REWARDS])
        )
        return actions, rewards


class SequenceStream(_EpisodeStream):
    """An endless, deterministic stream of episode sequences for a stateful module: pass after pass, each shuffled anew.

    Each episode is cut into sequences of ``max_seq_len`` steps (``SequenceIndex``). Stream
    position ``g`` is sequence ``g % S`` of pass ``p = g // S`` (``S`` sequences per pass), so the
    sequences at any position are a function of ``(seed, g)`` alone, as ``RowStream``'s rows
    are. Held in memory, a pass visits all sequences in an order seeded with ``(seed, p)``;
    streamed, it reads windows of whole episodes (``EpisodeWindows``, about ``window_rows /
    max_seq_len`` sequences each) and visits each window's sequences in an order seeded with
    ``(seed, p, window)``.

    Args:
        dataset: The Minari dataset.
        dataset_id: Its id, for errors.
        episodes: The episodes it serves (``screen_episodes``' choice).
        columns: The dataset columns ``sequences`` returns (``DATASET_COLUMNS``).
        seed: Seeds each pass's order.
        shuffle: Whether passes are shuffled; without it sequences come in the dataset's order.
        replacement: Draw each pass's (or window's) sequences uniformly at random with replacement
            instead of visiting every sequence once (``visit_order``); needs ``shuffle``.
        max_seq_len: ``T``, the steps of a sequence.
        window_rows: ``None`` to hold the whole dataset in memory (read on first use); otherwise
            read windows of consecutive episodes of about this many rows each.
        gamma: The discount of ``value_targets`` and ``bootstrap_discount`` (needed only when
            ``columns`` holds them).
    """

    def __init__(
        self,
        dataset: Any,
        dataset_id: str,
        episodes: DatasetEpisodes,
        *,
        columns: Sequence[str],
        seed: int,
        shuffle: bool,
        replacement: bool,
        max_seq_len: int,
        window_rows: int | None,
        gamma: float | None,
    ) -> None:
        sequences_per_episode = -(-np.asarray(episodes.lengths, dtype=np.int64) // max_seq_len)
        super().__init__(
            dataset, dataset_id, episodes, columns=columns, seed=seed, shuffle=shuffle, replacement=replacement,
            window_rows=window_rows, gamma=gamma, items_per_episode=sequences_per_episode,
            window_items=None if window_rows is None else max(1, window_rows // max_seq_len),
        )  # fmt: skip
        self.max_seq_len = max_seq_len
        self.num_sequences = int(sequences_per_episode.sum())
        self._resident: EpisodeRows | None = None  # the whole dataset, when held in memory
        self._resident_index: SequenceIndex | None = None  # its sequences (from the lengths alone)
        self._orders: collections.OrderedDict[tuple[int, int], tuple[SequenceIndex, torch.Tensor]] = (
            collections.OrderedDict()
        )
        self._window_rows: collections.OrderedDict[tuple[int, int], EpisodeRows] = collections.OrderedDict()

    def preload(self, position: int) -> None:
        """Read the dataset (or the window holding stream position ``position``) now.

        Called before training, so that reading costs no train step and a dataset whose
        episodes cannot be read fails before the first gradient step.
        """
        pass_index, offset = divmod(position, self.num_sequences)
        self._rows(pass_index, self._locate(pass_index, offset)[0])

    def sequences(self, start: int, stop: int) -> dict[str, torch.Tensor]:
        """The sequences at stream positions ``[start, stop)``, zero-padded to ``max_seq_len`` steps.

        Returns:
            ``{column: Tensor[k, T, ...]}`` for ``columns`` and the columns ``SequenceIndex.gather``
            adds (``loss_mask``, ``prev_actions``, ...), ``k = stop - start``.
        """
        if not 0 <= start < stop:
            raise ValueError(f"a stretch of the sequence stream must have 0 <= start < stop, got [{start}, {stop})")
        pieces = [
            index.gather(self._rows(*window), ids, self.columns) for window, index, ids in self._pieces(start, stop)
        ]
        return _joined(pieces)

    def steps(self, start: int, stop: int) -> int:
        """The real (unpadded) env steps of the sequences at stream positions ``[start, stop)`` (reads no data)."""
        if stop <= start:
            return 0
        return sum(int(index.steps_per_sequence[ids].sum()) for _, index, ids in self._pieces(start, stop))

    def _pieces(self, start: int, stop: int) -> list[tuple[tuple[int, int], SequenceIndex, torch.Tensor]]:
        """Stream positions ``[start, stop)`` as runs within one window each: ``(window, its index, sequence ids)``."""
        pieces = []
        position = start
        while position < stop:
            pass_index, offset = divmod(position, self.num_sequences)
            window_index, window_start = self._locate(pass_index, offset)
            index, order = self._order(pass_index, window_index)
            first = offset - window_start
            take = min(stop - position, len(order) - first)
            pieces.append(((pass_index, window_index), index, order[first : first + take]))
            position += take
        return pieces

    def _order(self, pass_index: int, window_index: int) -> tuple[SequenceIndex, torch.Tensor]:
        """A window's sequence index and the order the pass visits its sequences in (cached: two windows).

        Needs only the episodes' lengths: counting a stretch's steps reads no data.
        """
        key = (pass_index, window_index)
        if key not in self._orders:
            if self._plan is None:
                if self._resident_index is None:
                    self._resident_index = SequenceIndex(self.lengths, self.max_seq_len)
                index, generator = self._resident_index, _generator(self.seed, pass_index)
            else:
                episodes = self._plan.episodes(pass_index, window_index)
                index = SequenceIndex(self.lengths[episodes], self.max_seq_len)
                generator = _generator(self.seed, pass_index, window_index)
            order = visit_order(generator, index.num_sequences, shuffle=self.shuffle, replacement=self.replacement)
            self._orders[key] = (index, torch.from_numpy(order))
            while len(self._orders) > _CACHED_WINDOWS:
                self._orders.popitem(last=False)
        self._orders.move_to_end(key)
        return self._orders[key]

    def _rows(self, pass_index: int, window_index: int) -> EpisodeRows:
        """A window's rows, read on first use (cached: two windows); the whole dataset in memory."""
        if self._plan is None:
            if self._resident is None:
                self._resident = self._read(pass_index, window_index)
            return self._resident
        key = (pass_index, window_index)
        if key not in self._window_rows:
            self._window_rows[key] = self._read(pass_index, window_index)
            while len(self._window_rows) > _CACHED_WINDOWS:
                self._window_rows.popitem(last=False)
        self._window_rows.move_to_end(key)
        return self._window_rows[key]


def _generator(*keys: int) -> np.random.Generator:
    """The generator of a pass's (``(seed, pass)``) or window's (``(seed, pass, window)``) order."""
    return np.random.default_rng(list(keys))


def _joined(pieces: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stretches of a stream, each ``{column: Tensor[n, ...]}``, as one."""
    if len(pieces) == 1:
        return pieces[0]
    return {column: torch.cat([piece[column] for piece in pieces]) for column in pieces[0]}


def visit_order(generator: np.random.Generator, count: int, *, shuffle: bool, replacement: bool) -> np.ndarray:
    """The items (rows or sequences, ``[0, count)``) one pass of a stream visits, in order.

    Args:
        generator: The pass's (or window's) seeded generator.
        count: Items in the pass.
        shuffle: Visit every item once in a random order; without it, in the dataset's order.
        replacement: Instead draw ``count`` items uniformly at random with replacement, each draw
            independent of the others (d3rlpy's and most offline RL code's sampling): some items
            come twice in a pass, about ``1/e`` of them not at all.

    Raises:
        ValueError: For ``replacement`` without ``shuffle`` (random draws have no dataset order).
    """
    if replacement:
        if not shuffle:
            raise ValueError("drawing with replacement is random: it cannot keep the dataset's order (shuffle=False)")
        return generator.integers(0, count, size=count)
    return generator.permutation(count) if shuffle else np.arange(count)


def _zero_where_not(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``values [k, T, ...]`` with zeros wherever ``keep [k, T]`` is false."""
    keep = keep.reshape(*keep.shape, *([1] * (values.dim() - keep.dim())))
    return torch.where(keep, values, torch.zeros((), dtype=values.dtype))
