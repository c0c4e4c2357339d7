"""Checking a saved replay buffer state and rebuilding the ring it describes.

``ReplayBuffer.state_dict`` saves the stored rows of every column, the successor links, the
counters, the running episodes' last rows and the random generator's state.
:func:`restore_ring` checks such a state against the buffer that loads it and builds the
new ring aside, so a bad state raises before the buffer changes at all. Given a state to
consume (one just read from a checkpoint), it takes the arrays of a full buffer over as the
ring itself and lets go of each saved column once copied, so that loading never holds two
full copies of the buffer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_rl.core.columns import Columns
from lightning_rl.data.replay_rows import STORED_COLUMNS, allocate_columns

STATE_KEYS = ("buffer_type", "capacity", "num_added_lifetime", "columns", "next_abs", "pending", "rng_state")
"""The keys of a uniform ``ReplayBuffer``'s state; subclasses add their own."""


@dataclass
class RestoredRing:
    """A ring rebuilt from a saved state, ready to replace a buffer's own.

    Args:
        columns: The stored columns (``capacity`` rows each), or None if no row was stored.
        num_added: How many rows were ever added.
        next_abs: Per ring position, the absolute index of the row's successor (-1 for none).
        pending: Running episodes' ``id_`` -> absolute index of their last row, oldest first.
        rng: The buffer's random generator, in the saved state.
    """

    columns: dict[str, np.ndarray] | None
    num_added: int
    next_abs: np.ndarray
    pending: OrderedDict[str, int]
    rng: np.random.Generator


def restore_ring(
    state: Mapping[str, Any], *, buffer_type: str, capacity: int, keys: tuple[str, ...], consume: bool = False
) -> RestoredRing:
    """Check ``state`` against the loading buffer and rebuild its ring.

    Args:
        state: A replay buffer's ``state_dict()``.
        buffer_type: The loading buffer's class name; the state must come from the same class.
        capacity: The loading buffer's capacity; the state must come from the same capacity.
        keys: Every key the state must hold.
        consume: Whether the ring may keep the state's arrays (when they are a full ring's,
            of a usable layout) and take each column out of ``state["columns"]`` once its
            rows are copied; see ``ReplayBuffer.load_state_dict``.

    Raises:
        ValueError: If the state is from another buffer type or capacity, a key is missing,
            or its arrays do not fit together.
    """
    # The type first: the other type's state also lacks (or has extra) keys.
    if state.get("buffer_type") != buffer_type:
        raise ValueError(f"cannot load the state of a {state.get('buffer_type')} into a {buffer_type}")
    missing = [key for key in keys if key not in state]
    if missing:
        raise ValueError(f"replay buffer state is missing {missing}")
    if int(state["capacity"]) != capacity:
        raise ValueError(
            f"cannot load the state of a buffer with capacity {state['capacity']} into one with capacity {capacity}"
        )
    num_added = int(state["num_added_lifetime"])
    size = min(num_added, capacity)
    saved_links = state["next_abs"]
    saved = state["columns"]
    if num_added < 0 or len(saved_links) != size or (saved is None) != (size == 0):
        raise ValueError(
            f"replay buffer state holds {len(saved_links)} links and "
            f"{'no' if saved is None else 'some'} columns for {size} stored rows "
            f"(num_added_lifetime={num_added}, capacity={capacity})"
        )
    columns = None if saved is None else _restored_columns(saved, size, capacity, consume=consume)
    links = np.asarray(saved_links)
    if consume and _usable_as_ring(links, (capacity,), np.dtype(np.int64)):
        next_abs = links
    else:
        next_abs = np.full(capacity, -1, dtype=np.int64)
        next_abs[:size] = links
    # Sorted by row: the order ReplayBuffer._prune_pending relies on.
    pending = OrderedDict(sorted(((str(k), int(v)) for k, v in state["pending"].items()), key=lambda kv: kv[1]))
    rng = np.random.default_rng()
    rng.bit_generator.state = state["rng_state"]
    return RestoredRing(columns=columns, num_added=num_added, next_abs=next_abs, pending=pending, rng=rng)


def _restored_columns(saved: dict[str, Any], size: int, capacity: int, *, consume: bool) -> dict[str, np.ndarray]:
    """The ring's columns, with the ``size`` saved rows of each at positions ``0 .. size-1``.

    The ring's own arrays are ``np.empty``: their pages only count once rows are copied in,
    so with ``consume`` (each saved column dropped after its copy) the peak is about one
    copy of the buffer plus one column, and a full ring keeps the saved arrays themselves.
    """
    if set(saved) != set(STORED_COLUMNS) or any(len(saved[name]) != size for name in STORED_COLUMNS):
        raise ValueError(
            f"replay buffer state columns must be {list(STORED_COLUMNS)} with {size} rows each, got "
            f"{ {name: len(values) for name, values in saved.items()} }"
        )
    obs, actions = np.asarray(saved[Columns.OBS]), np.asarray(saved[Columns.ACTIONS])
    columns = allocate_columns(
        capacity,
        {Columns.OBS: (obs.dtype, obs.shape[1:]), Columns.ACTIONS: (actions.dtype, actions.shape[1:])},
    )
    del obs, actions  # so that consuming a column frees it
    for name in STORED_COLUMNS:
        values = np.asarray(saved.pop(name) if consume else saved[name])
        if consume and _usable_as_ring(values, columns[name].shape, columns[name].dtype):
            columns[name] = values
        else:
            columns[name][:size] = values
    return columns


def _usable_as_ring(values: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """Whether a saved array can be a ring array as it is: full, of its shape and dtype, writable, contiguous."""
    return (
        values.shape == shape
        and values.dtype == dtype
        and values.flags.writeable
        and values.flags.c_contiguous
    )
