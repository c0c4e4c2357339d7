"""Which module acts for which agent: policy mapping functions and the module spaces they imply.

A policy mapping function ``(agent_id, episode) -> module_id`` is called once per agent per
episode, at the agent's first observation (:meth:`MultiAgentEpisode.module_for`), so a mapping
may change between episodes (self-play match-ups) but never within one. A config file names the
built-ins by string: ``"shared"`` (every agent acts with ``DEFAULT_MODULE_ID``) and
``"per_agent"`` (each agent with a module of its own, under the agent's id).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import gymnasium as gym

from lightning_rl.core.columns import DEFAULT_MODULE_ID
from lightning_rl.env.multi_agent_episode import AgentID, ModuleID, MultiAgentEpisode

PolicyMappingFn = Callable[[AgentID, MultiAgentEpisode], ModuleID]


def shared_policy(agent_id: AgentID, episode: MultiAgentEpisode) -> ModuleID:
    """Map every agent to ``DEFAULT_MODULE_ID``: all agents share one module (parameter sharing)."""
    return DEFAULT_MODULE_ID


def policy_per_agent(agent_id: AgentID, episode: MultiAgentEpisode) -> ModuleID:
    """Map each agent to a module of its own, whose id is the agent's id."""
    return agent_id


BUILT_IN_MAPPINGS: dict[str, PolicyMappingFn] = {"shared": shared_policy, "per_agent": policy_per_agent}
"""The mappings a config file names by string."""


def resolve_policy_mapping_fn(value: str | PolicyMappingFn) -> PolicyMappingFn:
    """Return the mapping function ``value`` names, or ``value`` itself when it is callable.

    Args:
        value: ``"shared"``, ``"per_agent"``, or a callable ``(agent_id, episode) -> module_id``.
            No other string is imported.

    Raises:
        ValueError: For any other string, listing the two names.
        TypeError: For anything that is neither a string nor a callable.
    """
    if isinstance(value, str):
        if value not in BUILT_IN_MAPPINGS:
            raise ValueError(
                f"unknown policy_mapping_fn {value!r}; a string names one of {sorted(BUILT_IN_MAPPINGS)} "
                "(pass a callable (agent_id, episode) -> module_id for any other mapping)"
            )
        return BUILT_IN_MAPPINGS[value]
    if not callable(value):
        raise TypeError(f"policy_mapping_fn must be 'shared', 'per_agent' or a callable, got {value!r}")
    return value


def module_spaces(
    possible_agents: Iterable[AgentID],
    observation_space_fn: Callable[[AgentID], gym.Space],
    action_space_fn: Callable[[AgentID], gym.Space],
    mapping: PolicyMappingFn,
) -> dict[ModuleID, tuple[gym.Space, gym.Space]]:
    """Return ``{module_id: (observation_space, action_space)}`` of the modules ``mapping`` maps agents to.

    Each possible agent is mapped once with a probe episode (an empty ``MultiAgentEpisode``);
    a mapping that picks modules at random reports only the modules it picked here.

    Args:
        possible_agents: Every agent the env may have (PettingZoo's ``possible_agents``).
        observation_space_fn: ``agent_id -> observation space`` (``env.observation_space``).
        action_space_fn: ``agent_id -> action space`` (``env.action_space``).
        mapping: The policy mapping function.

    Raises:
        ValueError: Naming the module and both agents, if two agents mapped to one module have
            different observation or action spaces.
    """
    probe = MultiAgentEpisode(agent_to_module_mapping_fn=mapping)
    spaces: dict[ModuleID, tuple[gym.Space, gym.Space]] = {}
    first_agent: dict[ModuleID, AgentID] = {}
    for agent_id in possible_agents:
        module_id = probe.module_for(agent_id)
        agent_spaces = (observation_space_fn(agent_id), action_space_fn(agent_id))
        if module_id not in spaces:
            spaces[module_id], first_agent[module_id] = agent_spaces, agent_id
        elif spaces[module_id] != agent_spaces:
            other = first_agent[module_id]
            raise ValueError(
                f"agents {other!r} and {agent_id!r} both map to module {module_id!r} but have different spaces: "
                f"{spaces[module_id]} and {agent_spaces} (observation, action); map them to different modules"
            )
    return spaces
