"""Data: the environment data modules (on-policy rollouts, asynchronous samplers, off-policy replay, multi-agent rollouts), the offline one (Minari datasets) and replay buffers."""

from lightning_rl.data.async_sampling import AsyncSamplingDataModule
from lightning_rl.data.env_datamodule import EnvDataModule
from lightning_rl.data.episode_datamodule import EpisodeDataModule
from lightning_rl.data.multi_agent import MultiAgentDataModule
from lightning_rl.data.off_policy import OffPolicyDataModule
from lightning_rl.data.offline import OfflineDataModule
from lightning_rl.data.on_policy import OnPolicyDataModule
from lightning_rl.data.prioritized_replay import PrioritizedReplayBuffer
from lightning_rl.data.uniform_replay import ReplayBuffer

__all__ = [
    "AsyncSamplingDataModule",
    "EnvDataModule",
    "EpisodeDataModule",
    "MultiAgentDataModule",
    "OffPolicyDataModule",
    "OfflineDataModule",
    "OnPolicyDataModule",
    "PrioritizedReplayBuffer",
    "ReplayBuffer",
]
