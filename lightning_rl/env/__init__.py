"""Environments: single-agent episodes, the runner that samples them from gymnasium envs, and its env-fault errors."""

from lightning_rl.env.env_errors import EnvFaultError, NonFiniteEnvError, SampleTimeoutError, SubEnvError
from lightning_rl.env.env_runner import EnvRunner
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode
from lightning_rl.env.multi_agent_runner import MultiAgentEnvRunner
from lightning_rl.env.opponents import OPPONENTS, ConnectFourHeuristicModule, RandomLegalModule

__all__ = [
    "OPPONENTS",
    "ConnectFourHeuristicModule",
    "EnvFaultError",
    "EnvRunner",
    "MultiAgentEnvRunner",
    "MultiAgentEpisode",
    "NonFiniteEnvError",
    "RandomLegalModule",
    "SampleTimeoutError",
    "SingleAgentEpisode",
    "SubEnvError",
]
