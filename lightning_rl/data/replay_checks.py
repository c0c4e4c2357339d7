"""The check of ``update_priorities``' arguments the replay buffers share, so both fail the same way.

Each check raises ``ValueError`` naming the argument, what was expected and what was given.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def validated_updates(batch_indexes: Any, td_errors: Any, num_added: int) -> tuple[np.ndarray, np.ndarray]:
    """Check the arguments of ``update_priorities`` and return them as flat arrays.

    Args:
        batch_indexes: The ``batch_indexes`` column of a sample (absolute row indices).
        td_errors: One TD error per index.
        num_added: How many rows the buffer was ever given; every index must be below it.

    Returns:
        ``(indexes, errors)``: int64 and float64 arrays of one dimension.

    Raises:
        ValueError: If the shapes differ, the indexes are not integers, an index is negative
            or was never added, or a TD error is not finite.
    """
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
