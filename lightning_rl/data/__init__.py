"""Data: the environment data module, replay buffers and the Learner connectors."""

from lightning_rl.data.episode_datamodule import EpisodeDataModule
from lightning_rl.data.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer

__all__ = ["EpisodeDataModule", "PrioritizedReplayBuffer", "ReplayBuffer"]
