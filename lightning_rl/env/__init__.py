"""Environments: single-agent episodes and the runner that samples them from gymnasium envs."""

from lightning_rl.env.env_runner import EnvRunner
from lightning_rl.env.episode import SingleAgentEpisode

__all__ = ["EnvRunner", "SingleAgentEpisode"]
