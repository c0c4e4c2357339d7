"""What a replay sample holds beyond the stored columns, and the n-step walk that builds it.

n-step returns are computed when sampling, not when adding: each stored row records the
absolute index of the same episode's next row (``-1`` when the episode ended at this row,
or its next row has not been added yet), and :func:`n_step_batch` walks up to ``n_step``
rows along these links. So one buffer serves any ``n_step``. A successor is always added
after its predecessor, so it is still in the ring whenever the predecessor is: a walk
never reads an overwritten row.
"""

from __future__ import annotations

import numpy as np

from lightning_rl.core.columns import Columns

N_STEP = "n_step"
"""Sample column: how many steps the n-step return of a row sums (``1`` to ``n_step``)."""

WEIGHTS = "weights"
"""Sample column: the importance-sampling weight of a row (all ones for uniform replay)."""

BATCH_INDEXES = "batch_indexes"
"""Sample column: the absolute index of each sampled row, for ``update_priorities``."""


def n_step_batch(
    columns: dict[str, np.ndarray], next_abs: np.ndarray, positions: np.ndarray, n_step: int, gamma: float
) -> dict[str, np.ndarray]:
    """Return the sampled rows at ring ``positions`` with their n-step returns.

    Args:
        columns: The ring's stored columns, ``capacity`` rows each.
        next_abs: Per ring position, the absolute index of the row's successor (-1 for none).
        positions: The ring positions sampled.
        n_step: The most rows a return sums.
        gamma: The discount factor.

    Returns:
        ``obs`` and ``actions`` of the sampled rows; ``rewards``, the float32 discounted sum
        of up to ``n_step`` rewards along the links; ``new_obs``, ``terminateds`` and
        ``truncateds`` of the last row summed; ``n_step``, how many rows were summed (int64).
    """
    capacity = len(next_abs)
    rewards = columns[Columns.REWARDS]
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
        rows = successor[walking] % capacity
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
