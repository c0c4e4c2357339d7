"""Two of RLlib's built-in Learner connector pieces: returns-to-go and next observations, per module.

Each adds one column, computed per episode from the episodes whose steps are the module's
rows (``shared_data[MODULE_EPISODES]``, which :class:`AddColumnsFromEpisodes` writes), so
either piece goes anywhere after that piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lightning_rl.connectors.add_columns import module_episodes
from lightning_rl.connectors.episodes import segmented_discounted_sum
from lightning_rl.connectors.pipeline import ConnectorPiece, TrainBatch
from lightning_rl.core.batch import to_tensor
from lightning_rl.core.columns import Columns

if TYPE_CHECKING:
    from lightning_rl.core.metrics import MetricsLogger
    from lightning_rl.core.rl_modules import MultiRLModule


class ComputeReturnsToGo(ConnectorPiece):
    """Adds ``returns_to_go``: each step's discounted sum of the rewards from it to its episode chunk's end.

    ``G_t = r_t + gamma * r_{t+1} + ... + gamma^(T-1-t) * r_{T-1}`` within each episode (or
    chunk of one), without bootstrapping past its last step, as RLlib's piece of this name.

    Args:
        gamma: The discount factor, in [0, 1].
    """

    def __init__(self, gamma: float) -> None:
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 <= gamma <= 1:
            raise ValueError(f"ComputeReturnsToGo: gamma must be a number in [0, 1], got {gamma!r}")
        self.gamma = float(gamma)

    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        batch: TrainBatch,
        episodes: Sequence[Any],
        shared_data: dict[str, Any] | None = None,
        metrics: MetricsLogger | None = None,
        **kwargs: Any,
    ) -> TrainBatch:
        for module_id, episodes_of_module in module_episodes(shared_data, type(self).__name__).items():
            rewards = batch[module_id][Columns.REWARDS]
            lengths = torch.tensor([len(episode) for episode in episodes_of_module], device=rewards.device)
            batch[module_id][Columns.RETURNS_TO_GO] = segmented_discounted_sum(rewards.float(), lengths, self.gamma)
        return batch

    def __repr__(self) -> str:
        return f"ComputeReturnsToGo(gamma={self.gamma})"


class AddNextObservationsFromEpisodesToTrainBatch(ConnectorPiece):
    """Adds ``new_obs``: the observation after each step (the episode's next one, or its last after its last step)."""

    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        batch: TrainBatch,
        episodes: Sequence[Any],
        shared_data: dict[str, Any] | None = None,
        metrics: MetricsLogger | None = None,
        **kwargs: Any,
    ) -> TrainBatch:
        for module_id, episodes_of_module in module_episodes(shared_data, type(self).__name__).items():
            obs = batch[module_id][Columns.OBS]
            if not isinstance(obs, torch.Tensor):
                raise ValueError(
                    f"AddNextObservationsFromEpisodesToTrainBatch: module {module_id!r}'s observations are "
                    f"{type(obs).__name__}, not one array; Dict and Tuple observations are not supported by this piece"
                )
            next_obs = np.concatenate([np.asarray(episode.observations[1:]) for episode in episodes_of_module])
            batch[module_id][Columns.NEXT_OBS] = to_tensor(next_obs, obs.device).to(obs.dtype)
        return batch

    def __repr__(self) -> str:
        return "AddNextObservationsFromEpisodesToTrainBatch()"
