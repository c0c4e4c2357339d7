"""``PrioritizedReplayBuffer``: proportional prioritized replay (Schaul et al. 2016).

Rows are sampled in proportion to ``priority ** alpha``, with the sum and min trees of
:mod:`lightning_rl.data.priority_tree` over the ring positions; adding, n-step sampling and
state are :class:`~lightning_rl.data.uniform_replay.ReplayBuffer`'s, extended through its hooks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from lightning_rl.core.arguments import is_real
from lightning_rl.data.priority_tree import PriorityTree, priority_masses
from lightning_rl.data.replay_checks import validated_updates
from lightning_rl.data.replay_state import STATE_KEYS
from lightning_rl.data.uniform_replay import ReplayBuffer


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
        if not is_real(alpha) or not 0.0 <= alpha < np.inf:
            raise ValueError(f"alpha must be a finite float >= 0, got {alpha!r}")
        if not is_real(epsilon) or not 0.0 < epsilon < np.inf:
            raise ValueError(f"epsilon must be a finite float > 0, got {epsilon!r}")
        self.alpha = float(alpha)
        self.epsilon = float(epsilon)
        self.beta = beta
        self._max_priority = 1.0
        # Raw priorities per ring position: the trees hold priority ** alpha, and keeping
        # the raw ones lets a restored buffer use another alpha.
        self._priorities = np.zeros(self.capacity, dtype=np.float64)
        self._tree = PriorityTree(self.capacity)

    @property
    def beta(self) -> float:
        """The importance-sampling exponent of the next samples (>= 0)."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        if not is_real(value) or not 0.0 <= value < np.inf:
            raise ValueError(f"beta must be a finite float >= 0, got {value!r}")
        self._beta = float(value)

    def _set_priorities(self, positions: np.ndarray, priorities: np.ndarray) -> None:
        """Set the raw priorities at unique ring ``positions``, and their masses in the tree."""
        self._priorities[positions] = priorities
        self._tree.set(positions, priority_masses(priorities, self.alpha))

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
        """Set the priorities of sampled rows to ``|td_error| + epsilon`` (arguments and errors: ``ReplayBuffer``'s).

        Rows that have left the ring since they were sampled are skipped; for an index
        given twice the last TD error wins.
        """
        indexes, errors = validated_updates(batch_indexes, td_errors, self._num_added)
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
            As :meth:`ReplayBuffer.state_dict` (views of the buffer's storage), with
            ``priorities`` (raw, per stored row) and ``max_priority``.
            :meth:`load_state_dict` rebuilds the trees from them with this buffer's
            ``alpha``, and also raises ValueError if they do not fit the stored rows or are
            not finite and positive.
        """
        state = super().state_dict()
        state["priorities"] = self._priorities[: len(self)]  # a view, as the columns are
        state["max_priority"] = self._max_priority
        return state

    def _check_extra_state(self, state: Mapping[str, Any], size: int) -> None:
        priorities = np.asarray(state["priorities"], dtype=np.float64)
        if priorities.shape != (size,) or not np.all(np.isfinite(priorities)) or (size and priorities.min() <= 0):
            raise ValueError(
                f"replay buffer state must hold {size} finite positive priorities, got shape {priorities.shape}"
            )
        max_priority = state["max_priority"]
        if not is_real(max_priority) or not 0.0 < max_priority < np.inf:
            raise ValueError(f"replay buffer state's max_priority must be a finite float > 0, got {max_priority!r}")

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        size = len(self)
        self._priorities[:] = 0.0
        self._priorities[:size] = np.asarray(state["priorities"], dtype=np.float64)
        self._max_priority = float(state["max_priority"])
        self._tree.rebuild(priority_masses(self._priorities[:size], self.alpha))

    def _state_keys(self) -> tuple[str, ...]:
        return (*STATE_KEYS, "priorities", "max_priority")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self.capacity}, len={len(self)}, "
            f"num_added_lifetime={self._num_added}, alpha={self.alpha}, beta={self._beta})"
        )
