"""Environments: single-agent episodes, the runner that samples them from gymnasium envs, and its env-fault errors.

Importing this package registers the env ids of :mod:`lightning_rl.env.wrappers`
(``lightning_rl/CartPoleNoVel-v1``), so a config can name them like any gymnasium id.
"""

from lightning_rl.env.env_errors import EnvFaultError, NonFiniteEnvError, SampleTimeoutError, SubEnvError
from lightning_rl.env.env_runner import EnvRunner
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode
from lightning_rl.env.multi_agent_runner import MultiAgentEnvRunner
from lightning_rl.env.opponents import OPPONENTS, ConnectFourHeuristicModule, RandomLegalModule
from lightning_rl.env.wrappers import CARTPOLE_NO_VEL_ID, CartPoleNoVelocity

__all__ = [
    "CARTPOLE_NO_VEL_ID",
    "OPPONENTS",
    "CartPoleNoVelocity",
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
