"""An update's episodes on their way to the learner processes: nested dicts of numpy arrays, rebuilt there.

A learner process runs the Learner connector on the episodes it is dealt, so it needs the
episodes themselves, not a batch. They travel as a batch's shard does: ``episodes_to_wire``
turns a shard of episodes into nested dicts whose leaves are numpy arrays (each field of
each agent's timeline, one array) and a few scalars, so the driver's shared-memory transport
(``_shared``) carries the arrays and only the small rest is pickled, never one Python object
per step. ``episodes_from_wire`` rebuilds the episodes in the learner process.

A multi-agent episode's policy mapping function stays in the driver (it is often a lambda or
a closure over a league's state, which plain pickling refuses): the learners receive the
module of each agent in the episode, the only part of the mapping the connector reads.
Infos, when an episode recorded them, are dicts of any Python objects and travel pickled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode

# Wire keys: the shard's kind, and its episodes by position (the shared-memory transport walks
# nested dicts only, so the list of episodes travels as {"0": ..., "1": ...}).
_MULTI_AGENT = "multi_agent"
_EPISODES = "episodes"


def check_episode_kinds(episodes: Sequence[Any]) -> None:
    """Refuse a list that is not all ``SingleAgentEpisode`` or all ``MultiAgentEpisode``.

    Raises:
        ValueError: Naming the first episode of another type, or the first of the other kind.
    """
    for index, episode in enumerate(episodes):
        if not isinstance(episode, (SingleAgentEpisode, MultiAgentEpisode)):
            raise ValueError(
                f"episodes must be SingleAgentEpisodes or MultiAgentEpisodes, got a {type(episode).__name__} at "
                f"index {index}"
            )
    kinds = [isinstance(episode, MultiAgentEpisode) for episode in episodes]
    if any(kinds) and not all(kinds):
        first_single = kinds.index(False)
        first_multi = kinds.index(True)
        raise ValueError(
            f"one update takes all single-agent or all multi-agent episodes, not a mix: episode {first_multi} is a "
            f"MultiAgentEpisode, episode {first_single} a SingleAgentEpisode"
        )


def episodes_to_wire(episodes: Sequence[SingleAgentEpisode | MultiAgentEpisode]) -> dict[str, Any]:
    """One shard of episodes (all of one kind, see ``check_episode_kinds``) as nested dicts of arrays.

    Returns:
        ``{}`` for no episodes (a learner dealt none still takes part in the update).
    """
    if not episodes:
        return {}
    multi_agent = isinstance(episodes[0], MultiAgentEpisode)
    encode = _multi_agent_to_wire if multi_agent else _single_agent_to_wire
    return {_MULTI_AGENT: multi_agent, _EPISODES: {str(i): encode(episode) for i, episode in enumerate(episodes)}}


def episodes_from_wire(wire: Mapping[str, Any]) -> list[SingleAgentEpisode] | list[MultiAgentEpisode]:
    """The episodes ``episodes_to_wire`` encoded (arrays as they arrive: on shared memory, no copy)."""
    if not wire:
        return []
    decode = _multi_agent_from_wire if wire[_MULTI_AGENT] else _single_agent_from_wire
    return [decode(fields) for fields in wire[_EPISODES].values()]


def _single_agent_to_wire(episode: SingleAgentEpisode) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "id": episode.id_,
        "t_started": episode.t_started,
        "terminated": episode.is_terminated,
        "truncated": episode.is_truncated,
        "observations": _stacked(episode.observations),
        "actions": _stacked(episode.actions),
        "rewards": np.asarray(episode.rewards, dtype=np.float32),
        "extra_model_outputs": {key: _stacked(values) for key, values in episode.extra_model_outputs.items()},
    }
    if episode.infos:
        fields["infos"] = list(episode.infos)
    return fields


def _single_agent_from_wire(fields: Mapping[str, Any]) -> SingleAgentEpisode:
    return SingleAgentEpisode(
        fields["id"],
        observations=fields["observations"],
        actions=fields["actions"],
        rewards=fields["rewards"],
        infos=fields.get("infos"),
        terminated=fields["terminated"],
        truncated=fields["truncated"],
        extra_model_outputs=fields["extra_model_outputs"],
        t_started=fields["t_started"],
    )


def _multi_agent_to_wire(episode: MultiAgentEpisode) -> dict[str, Any]:
    return {
        "id": episode.id_,
        "env_t_started": episode.env_t_started,
        "env_t": episode.env_t,
        "terminated": episode.is_terminated,
        "truncated": episode.is_truncated,
        # Agent order is kept (dicts keep it): the connector's rows follow it.
        "agents": {
            agent_id: {"module_id": episode.module_for(agent_id), "episode": _single_agent_to_wire(agent_episode)}
            for agent_id, agent_episode in episode.agent_episodes.items()
        },
    }


def _multi_agent_from_wire(fields: Mapping[str, Any]) -> MultiAgentEpisode:
    agents = fields["agents"]
    mapping = _AgentModules({agent_id: agent["module_id"] for agent_id, agent in agents.items()})
    episode = MultiAgentEpisode(fields["id"], agent_to_module_mapping_fn=mapping, env_t_started=fields["env_t_started"])
    episode.env_t = int(fields["env_t"])
    episode.is_terminated, episode.is_truncated = bool(fields["terminated"]), bool(fields["truncated"])
    for agent_id, agent in agents.items():
        episode.agent_episodes[agent_id] = _single_agent_from_wire(agent["episode"])
        episode.module_for(agent_id)  # fixed now, as the driver's episode had it
    return episode


class _AgentModules(dict):
    """The policy mapping of a rebuilt episode: the module the driver's episode mapped each of its agents to."""

    def __call__(self, agent_id: str, episode: MultiAgentEpisode) -> str:
        return self[agent_id]


def _stacked(values: Any) -> np.ndarray:
    """A field as one array: numpy episodes' fields as they are, a list-backed episode's stacked (time first)."""
    if isinstance(values, np.ndarray):
        return values
    return np.stack(values) if len(values) else np.zeros((0,), np.float32)
