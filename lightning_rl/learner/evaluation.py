"""The statistics of evaluation episodes, aggregated over an epoch by torchmetrics.

A Learner holds one ``EvaluationMetrics``; its ``validation_step`` updates it with every
evaluation item's episodes and logs the metric objects themselves with ``self.log``. Lightning
then computes each at the end of the validation epoch, over all items and (under DDP) all
ranks, and resets it for the next epoch: a mean is the mean over every episode played, a
minimum the minimum over all of them, however the episodes were split over items and ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn
from torchmetrics import MaxMetric, MeanMetric, Metric, MinMetric, SumMetric

from lightning_rl.learner.result_keys import EPISODE_RETURN_MEAN

if TYPE_CHECKING:
    from lightning_rl.env.episode import SingleAgentEpisode
    from lightning_rl.env.multi_agent_episode import MultiAgentEpisode


class EvaluationMetrics(nn.Module):
    """Episode return mean/min/max, episode length mean and number of episodes of an epoch.

    A module, so that the metrics' states move with the Learner to its device; they are not
    part of its ``state_dict`` (torchmetrics states are not persistent by default).
    """

    def __init__(self) -> None:
        super().__init__()
        self.metrics = nn.ModuleDict(
            {
                EPISODE_RETURN_MEAN: MeanMetric(),
                "episode_return_min": MinMetric(),
                "episode_return_max": MaxMetric(),
                "episode_len_mean": MeanMetric(),
                "num_episodes": SumMetric(),
            }
        )

    def update(self, episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode]) -> None:
        """Add ``episodes`` (complete evaluation episodes) to this epoch's statistics.

        A multi-agent episode's return is the sum over its agents and its length its env steps.

        Raises:
            ValueError: For no episodes (an evaluation item always holds at least one).
        """
        if len(episodes) == 0:
            raise ValueError("an evaluation item holds no episodes; expected at least one complete episode")
        device = self.metrics["num_episodes"].device
        returns = torch.tensor([episode.get_return() for episode in episodes], dtype=torch.float32, device=device)
        lengths = torch.tensor([len(episode) for episode in episodes], dtype=torch.float32, device=device)
        self.metrics[EPISODE_RETURN_MEAN].update(returns)
        self.metrics["episode_return_min"].update(returns)
        self.metrics["episode_return_max"].update(returns)
        self.metrics["episode_len_mean"].update(lengths)
        self.metrics["num_episodes"].update(torch.tensor(float(len(episodes)), device=device))

    def items(self) -> list[tuple[str, Metric]]:
        """``[(key, metric), ...]``: what ``validation_step`` logs as ``eval/{key}``."""
        return list(self.metrics.items())

    @property
    def return_mean(self) -> MeanMetric:
        """The episode-return mean, also shown on the progress bar as ``eval_return``."""
        return self.metrics[EPISODE_RETURN_MEAN]
