"""``SharedWeights``: one copy of a module's weights in shared memory, written by the driver, read by sampler processes.

Sending weights by pickling costs one copy per sampler per update. Here the driver writes the
Learner's weights into tensors in shared memory (``share_memory_()``) once per broadcast, and
each sampler process copies them into its own module when it sees a new version, before its
next rollout. The data module's normalization statistics, when it normalizes, travel with
them (one float64 vector, ``EnvNormalization.statistics_vector``).

The two sides never wait for each other: there is no lock, which a sampler killed while
holding it (``kill -9``) would leave held forever. A version counter is a *seqlock* instead:
the driver makes it odd before writing and even after; a reader that saw an odd version, or a
different version after copying than before, copied a half-written state and copies again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
import torch

# How long a reader waits before looking again at a version that is being written.
_WRITING_WAIT_S = 0.001


class SharedWeights:
    """A module's state dict in shared memory, with a version counter and the weights' sequence number.

    Pass it to a ``multiprocessing`` process as an argument (torch shares the tensors, not copies).

    Args:
        state: The module's ``state_dict()`` (any device); its tensors are copied to shared CPU memory.
        weights_seq_no: The Learner's ``weights_seq_no`` of these weights.
        statistics: The normalization statistics sent with the weights (float64, of a fixed
            length); ``None`` when the data module does not normalize.
    """

    def __init__(
        self, state: Mapping[str, torch.Tensor], weights_seq_no: int, statistics: np.ndarray | None = None
    ) -> None:
        self.tensors = {
            name: tensor.detach().to("cpu", copy=True).contiguous().share_memory_() for name, tensor in state.items()
        }
        self.statistics = None if statistics is None else torch.tensor(statistics, dtype=torch.float64).share_memory_()
        # [version (even: complete, odd: being written), weights_seq_no of the complete version]
        self._meta = torch.tensor([2, int(weights_seq_no)], dtype=torch.int64).share_memory_()

    @property
    def version(self) -> int:
        """The version of the weights (even: complete; it grows by 2 with every ``write``)."""
        return int(self._meta[0])

    def write(
        self, state: Mapping[str, torch.Tensor], weights_seq_no: int, statistics: np.ndarray | None = None
    ) -> None:
        """Replace the shared weights by ``state``, and the statistics by ``statistics`` if given (the driver's side;
        one writer only).

        Raises:
            KeyError: If ``state`` lacks a tensor the shared state has.
        """
        self._meta[0] += 1  # odd: readers now know a copy they make may be torn
        for name, tensor in self.tensors.items():
            tensor.copy_(state[name].detach())
        if statistics is not None and self.statistics is not None:
            self.statistics.copy_(torch.from_numpy(np.asarray(statistics, dtype=np.float64)))
        self._meta[1] = int(weights_seq_no)
        self._meta[0] += 1

    def read_into(self, module: torch.nn.Module, last_version: int) -> tuple[int, int, np.ndarray | None] | None:
        """Copy the weights into ``module`` if they changed since ``last_version`` (a sampler's side).

        Returns:
            ``(version, weights_seq_no, statistics)`` of the weights copied (``statistics``: a
            copy of the shared ones, ``None`` without), or ``None`` if ``last_version`` is current.
        """
        while True:
            before = int(self._meta[0])
            if before == last_version:
                return None
            if before % 2:
                time.sleep(_WRITING_WAIT_S)
                continue
            module.load_state_dict(self.tensors)
            weights_seq_no = int(self._meta[1])
            statistics = None if self.statistics is None else self.statistics.numpy().copy()
            if int(self._meta[0]) == before:
                return before, weights_seq_no, statistics
