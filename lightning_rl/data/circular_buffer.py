"""``CircularBuffer``: RLlib's reuse of rollouts for asynchronous Learners (IMPALA, APPO).

It keeps the last ``num_batches`` rollouts; each may be handed out at most
``iterations_per_batch`` times. A new rollout goes in at the end and drops the oldest when the
buffer is full. ``next`` hands out the rollout used least so far (the newest among equals, so
fresh data goes first), or ``None`` when every rollout is used up: then the data module waits
for a new one.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from lightning_rl.core.arguments import check_int


class CircularBuffer:
    """The last ``num_batches`` rollouts, each handed out at most ``iterations_per_batch`` times.

    Args:
        num_batches: Rollouts kept (RLlib's ``circular_buffer_num_batches``).
        iterations_per_batch: Times one rollout may be handed out (``circular_buffer_iterations_per_batch``).

    Raises:
        ValueError: Naming the argument, for a value that is not an int >= 1.
    """

    def __init__(self, num_batches: int, iterations_per_batch: int) -> None:
        check_int("circular_buffer_num_batches", num_batches)
        check_int("circular_buffer_iterations_per_batch", iterations_per_batch)
        self.iterations_per_batch = iterations_per_batch
        # [item, times handed out], oldest first
        self._entries: deque[list] = deque(maxlen=num_batches)
        #: Items dropped to make room (each had been handed out at least once).
        self.num_dropped = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, item: Any) -> None:
        """Keep ``item`` (not handed out yet), dropping the oldest if the buffer is full."""
        if len(self._entries) == self._entries.maxlen:
            self.num_dropped += 1
        self._entries.append([item, 0])

    def next(self) -> tuple[Any, int] | None:
        """The item handed out least so far (newest among equals) and its uses, this one included.

        Returns:
            ``(item, uses)``, or ``None`` if every item is used up (or there is none).
        """
        candidates = [entry for entry in self._entries if entry[1] < self.iterations_per_batch]
        if not candidates:
            return None
        entry = min(reversed(candidates), key=lambda entry: entry[1])
        entry[1] += 1
        return entry[0], entry[1]

    def clear(self) -> None:
        """Forget every item."""
        self._entries.clear()
