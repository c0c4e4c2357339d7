"""Running statistics of observations, and the normalization they define.

The env runner keeps a :class:`RunningMeanStd` of every observation it sees (over all sub-envs,
merged over all ranks) and stores observations as ``clip((obs - mean) / sqrt(var + epsilon))``,
as Stable-Baselines3's ``VecNormalize`` and RLlib's ``MeanStdFilter`` do. The statistics go into
checkpoints with the data module's state under :data:`OBSERVATION_NORMALIZATION_KEY`, so that a
``Policy`` and an exported graph apply the very normalization the policy was trained with
(:class:`ObservationNormalization`, a ``torch.nn.Module``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

#: Where an env data module's ``state_dict`` holds the observation statistics (``None`` when off).
OBSERVATION_NORMALIZATION_KEY = "observation_normalization"


class RunningMeanStd:
    """Count, mean and variance of every row seen so far, per element of the row's shape.

    Batches and other ranks' statistics are merged exactly (Chan et al.'s parallel formula),
    so merging the same statistics in the same order gives the same numbers on every rank.
    Before any row is seen the mean is 0 and the variance 1 (normalization is the identity).

    Args:
        shape: The shape of one row (an observation's shape; ``()`` for rewards).
    """

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = tuple(shape)
        self.count = 0.0
        self.mean = np.zeros(self.shape, dtype=np.float64)
        self.var = np.ones(self.shape, dtype=np.float64)

    def update(self, rows: np.ndarray) -> None:
        """Add ``rows`` (``[N, *shape]``) to the statistics.

        Raises:
            ValueError: If the rows do not have this statistic's shape.
        """
        rows = np.asarray(rows, dtype=np.float64)
        if rows.shape[1:] != self.shape:
            raise ValueError(f"RunningMeanStd of shape {self.shape} got rows of shape {rows.shape[1:]}")
        if len(rows):
            self.merge(float(len(rows)), rows.mean(axis=0), rows.var(axis=0))

    def merge(self, count: float, mean: np.ndarray, var: np.ndarray) -> None:
        """Merge the statistics of ``count`` other rows (their mean and population variance)."""
        if count <= 0:
            return
        if self.count == 0:
            self.count, self.mean, self.var = float(count), np.array(mean, np.float64), np.array(var, np.float64)
            return
        total = self.count + count
        delta = mean - self.mean
        # np.asarray: arithmetic on 0-d arrays (shape ``()``) returns numpy scalars.
        self.mean = np.asarray(self.mean + delta * (count / total))
        squares = self.var * self.count + var * count + delta**2 * (self.count * count / total)
        self.var = np.asarray(squares / total)
        self.count = total

    def state_dict(self) -> dict[str, Any]:
        """``{"count": float, "mean": float64 tensor, "var": float64 tensor}`` (tensors: checkpoints load them with ``weights_only=True``)."""
        return {
            "count": self.count,
            "mean": torch.from_numpy(self.mean.copy()),
            "var": torch.from_numpy(self.var.copy()),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            ValueError: If the saved statistics have another shape, or a negative count.
        """
        mean = np.asarray(state["mean"], dtype=np.float64)
        var = np.asarray(state["var"], dtype=np.float64)
        if mean.shape != self.shape or var.shape != self.shape:
            raise ValueError(
                f"saved normalization statistics have shape {mean.shape}; this env's observations have {self.shape}"
            )
        count = float(state["count"])
        if not count >= 0:
            raise ValueError(f"saved normalization statistics have count {count}; expected a number >= 0")
        self.count, self.mean, self.var = count, mean.copy(), var.copy()


class ObservationNormalization(nn.Module):
    """``clip((obs - mean) / sqrt(var + epsilon), -clip, clip)`` with fixed statistics, as a module.

    What ``Policy`` applies before the RL module, and what export puts in the graph.

    Args:
        mean: Per-element mean of the observations.
        var: Per-element variance.
        clip: Bound on the normalized values.
        epsilon: Added to the variance.
    """

    def __init__(self, mean: np.ndarray | torch.Tensor, var: np.ndarray | torch.Tensor, clip: float, epsilon: float):
        super().__init__()
        var = torch.as_tensor(var, dtype=torch.float64)
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float64).to(torch.float32))
        self.register_buffer("std", torch.sqrt(var + epsilon).to(torch.float32))
        self.clip = float(clip)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return ((obs.to(torch.float32) - self.mean) / self.std).clamp(-self.clip, self.clip)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ObservationNormalization:
        """Build from the saved form: ``{"count", "mean", "var", "clip", "epsilon"}``."""
        return cls(state["mean"], state["var"], clip=float(state["clip"]), epsilon=float(state["epsilon"]))


def find_observation_normalization(checkpoint: Mapping[str, Any]) -> ObservationNormalization | None:
    """The observation normalization saved in a Lightning checkpoint, or ``None`` if the run used none.

    Lightning saves a data module's ``state_dict`` under the data module's class name; this
    looks for the entry that holds :data:`OBSERVATION_NORMALIZATION_KEY`.

    Raises:
        ValueError: If two entries hold statistics (two data modules saved in one checkpoint).
    """
    found = [
        value[OBSERVATION_NORMALIZATION_KEY]
        for value in checkpoint.values()
        if isinstance(value, Mapping) and value.get(OBSERVATION_NORMALIZATION_KEY) is not None
    ]
    if len(found) > 1:
        raise ValueError("the checkpoint holds observation statistics of more than one data module")
    return ObservationNormalization.from_state(found[0]) if found else None
