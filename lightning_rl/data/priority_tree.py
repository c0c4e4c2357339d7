"""A sum tree and a min tree over a ring's priority masses, for proportional prioritized replay.

:class:`~lightning_rl.data.prioritized_replay.PrioritizedReplayBuffer` keeps one mass
``priority ** alpha`` per ring position here: the sum tree draws positions in proportion to
their mass, the min tree gives the smallest mass the importance-sampling weights are
normalised by. Both are updated and searched a whole batch at a time.
"""

from __future__ import annotations

import numpy as np


class PriorityTree:
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


def priority_masses(priorities: np.ndarray, alpha: float) -> np.ndarray:
    """Return the tree masses of raw ``priorities``: ``priorities ** alpha``, never below the smallest normal float."""
    # At least the smallest normal float: a mass that underflowed to 0 could never be drawn
    # and would make the smallest mass, which the weights divide by, 0.
    return np.maximum(priorities**alpha, np.finfo(np.float64).tiny)
