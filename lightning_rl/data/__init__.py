"""Data: the environment data module and the Learner connectors."""

from lightning_rl.data.episode_datamodule import EpisodeDataModule

__all__ = ["EpisodeDataModule"]
