"""Multi-agent episodes: one :class:`SingleAgentEpisode` per agent, on the agent's own timeline.

A :class:`MultiAgentEpisode` is one episode of one env copy, or a chunk of it. Each agent's
:class:`~lightning_rl.env.episode.SingleAgentEpisode` holds only the steps at which that
agent acted: the observation it acted on, its action, the reward summed over every env step
until it observed again, and that next observation. So in a turn-based (AEC) game an agent's
timeline skips the other players' turns, and an agent that joins late or leaves early simply
has a shorter timeline.

The episode is built with RLlib's two calls, whatever the env's API:

- :meth:`MultiAgentEpisode.add_env_reset` with the agents that observe after ``reset()``;
- :meth:`MultiAgentEpisode.add_env_step` once per env step, with the actions taken in it and
  what the agents observed (and were rewarded) after it.

Between an agent's action and its next observation the step is *pending*: the action, its
model outputs and the reward so far wait in the episode. :meth:`MultiAgentEpisode.cut`
carries a pending step into the successor chunk, so every stored transition is whole.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_rl.core.columns import DEFAULT_MODULE_ID
from lightning_rl.env.episode import SingleAgentEpisode

AgentID = str
ModuleID = str

ALL_AGENTS = "__all__"
"""The key of ``terminateds`` / ``truncateds`` that ends the whole episode (RLlib's)."""


@dataclass
class _PendingStep:
    """What an agent did since its last observation: the step completes when it observes again."""

    action: Any = None
    has_action: bool = False
    extra_model_outputs: dict[str, Any] = field(default_factory=dict)
    reward: float = 0.0


class MultiAgentEpisode:
    """One episode of a multi-agent env (or a chunk of it): one ``SingleAgentEpisode`` per agent.

    Args:
        id_: The episode's id; all chunks of one episode share it. A new uuid4 hex when None.
        agent_to_module_mapping_fn: ``(agent_id, episode) -> module_id``, called once per agent,
            when it first observes in this episode (see :meth:`module_for`). ``None`` maps
            every agent to ``DEFAULT_MODULE_ID``.
        env_t_started: The env step at which this chunk starts (0 for a new episode).

    Raises:
        ValueError: If ``env_t_started`` is negative.
    """

    def __init__(
        self,
        id_: str | None = None,
        *,
        agent_to_module_mapping_fn: Callable[[AgentID, MultiAgentEpisode], ModuleID] | None = None,
        env_t_started: int = 0,
    ) -> None:
        if int(env_t_started) < 0:
            raise ValueError(f"env_t_started must be >= 0, got {env_t_started}")
        self.id_ = uuid.uuid4().hex if id_ is None else str(id_)
        self.agent_to_module_mapping_fn = agent_to_module_mapping_fn
        self.env_t_started = int(env_t_started)
        self.env_t = self.env_t_started
        #: ``{agent_id: SingleAgentEpisode}`` in the order the agents first observed in this chunk;
        #: an agent's episode has the id ``f"{id_}/{agent_id}"`` in every chunk.
        self.agent_episodes: dict[AgentID, SingleAgentEpisode] = {}
        self.is_terminated = False
        self.is_truncated = False
        self._agent_to_module: dict[AgentID, ModuleID] = {}
        self._pending: dict[AgentID, _PendingStep] = {}
        # Agents that ended in an earlier chunk: they may not observe again.
        self._ended_before: set[AgentID] = set()

    # ------------------------------------------------------------------------------------
    # Building
    # ------------------------------------------------------------------------------------

    def add_env_reset(
        self, observations: Mapping[AgentID, Any], infos: Mapping[AgentID, dict[str, Any]] | None = None
    ) -> None:
        """Start the episode with the observations ``env.reset()`` returned.

        Args:
            observations: ``{agent_id: observation}`` of every agent that observes at the
                reset (in an AEC env, only the first agent to act).
            infos: ``{agent_id: info}``; agents with an info here record infos from now on.

        Raises:
            ValueError: If the episode already has agents or env steps.
        """
        if self.agent_episodes or self.env_t != self.env_t_started:
            raise ValueError(f"episode {self.id_} already started; add_env_reset starts a new episode only")
        for agent_id, observation in observations.items():
            self._join(agent_id, observation, None if infos is None else infos.get(agent_id))

    def add_env_step(
        self,
        observations: Mapping[AgentID, Any],
        actions: Mapping[AgentID, Any],
        rewards: Mapping[AgentID, float],
        *,
        terminateds: Mapping[AgentID, bool] | None = None,
        truncateds: Mapping[AgentID, bool] | None = None,
        infos: Mapping[AgentID, dict[str, Any]] | None = None,
        extra_model_outputs: Mapping[AgentID, Mapping[str, Any]] | None = None,
    ) -> None:
        """Record one env step: the actions taken in it, then what the agents got back.

        In this order: each agent in ``actions`` acts on its last observation (its step is now
        pending); each reward is added to its agent's pending step (rewards of agents that have
        not observed yet in this episode are dropped); each agent in ``observations`` either
        joins the episode (its first observation) or completes its pending step with the
        reward summed since it acted. An agent in ``terminateds`` / ``truncateds`` ends with
        that observation. ``terminateds["__all__"]`` / ``truncateds["__all__"]`` end the whole
        episode: agents still running then end too, and a step still pending (an action whose
        outcome the agent never observed) is dropped.

        Args:
            observations: ``{agent_id: observation}`` after the step.
            actions: ``{agent_id: action}`` taken in this step.
            rewards: ``{agent_id: reward}`` received in this step (AEC envs: the reward each
                observing agent collected since it last acted).
            terminateds: ``{agent_id: bool}`` for observing agents, and ``"__all__"``.
            truncateds: ``{agent_id: bool}`` for observing agents, and ``"__all__"``.
            infos: ``{agent_id: info}`` of observing agents (kept by agents that record infos).
            extra_model_outputs: ``{agent_id: {key: value}}`` of acting agents, e.g.
                ``action_logp``, ``vf_preds`` or ``action_mask``.

        Raises:
            ValueError: Naming the agent, if the episode is done, an agent acts without a
                current observation (or while a step is pending, or after it ended), or an
                agent observes again without having acted.
        """
        if self.is_done:
            raise ValueError(f"episode {self.id_} is already done at env_t={self.env_t}; start a new episode")
        terminateds, truncateds = terminateds or {}, truncateds or {}
        extra_model_outputs = extra_model_outputs or {}
        for agent_id, action in actions.items():
            self._act(agent_id, action, extra_model_outputs.get(agent_id, {}))
        for agent_id, reward in rewards.items():
            if agent_id in self._pending:
                self._pending[agent_id].reward += float(reward)
        for agent_id, observation in observations.items():
            info = None if infos is None else infos.get(agent_id)
            terminated, truncated = bool(terminateds.get(agent_id, False)), bool(truncateds.get(agent_id, False))
            self._observe(agent_id, observation, info, terminated, truncated)
        self.env_t += 1
        if terminateds.get(ALL_AGENTS) or truncateds.get(ALL_AGENTS):
            self._end(terminated=bool(terminateds.get(ALL_AGENTS)))

    def _join(self, agent_id: AgentID, observation: Any, info: dict[str, Any] | None) -> None:
        # One id per (episode, agent), so an agent's chunks share it and no two agents do.
        episode = SingleAgentEpisode(f"{self.id_}/{agent_id}")
        episode.add_env_reset(observation, info)
        self.agent_episodes[agent_id] = episode
        self._pending[agent_id] = _PendingStep()
        self.module_for(agent_id)  # the mapping is fixed at the agent's first observation

    def _act(self, agent_id: AgentID, action: Any, extra: Mapping[str, Any]) -> None:
        pending = self._pending.get(agent_id)
        if pending is None:
            joined = agent_id in self.agent_episodes or agent_id in self._ended_before
            state = "has ended" if joined else "has no observation in this episode yet"
            raise ValueError(f"agent {agent_id!r} cannot act in episode {self.id_}: it {state}")
        if pending.has_action:
            raise ValueError(f"agent {agent_id!r} acts twice in episode {self.id_} without observing in between")
        pending.action, pending.has_action, pending.extra_model_outputs = action, True, dict(extra)

    def _observe(
        self, agent_id: AgentID, observation: Any, info: dict[str, Any] | None, terminated: bool, truncated: bool
    ) -> None:
        if agent_id not in self.agent_episodes and agent_id not in self._ended_before:
            self._join(agent_id, observation, info)
        else:
            pending = self._pending.get(agent_id)
            if pending is None:
                raise ValueError(f"agent {agent_id!r} observes in episode {self.id_} after it ended")
            if not pending.has_action:
                raise ValueError(f"agent {agent_id!r} observes twice in episode {self.id_} without acting in between")
            self.agent_episodes[agent_id].add_env_step(
                observation, pending.action, pending.reward, infos=info,
                extra_model_outputs=pending.extra_model_outputs,
            )  # fmt: skip
            self._pending[agent_id] = _PendingStep()
        if terminated or truncated:
            episode = self.agent_episodes[agent_id]
            episode.is_terminated, episode.is_truncated = terminated, truncated and not terminated
            del self._pending[agent_id]

    def _end(self, *, terminated: bool) -> None:
        # Agents still running when the env ends the episode end with it, at their last observation.
        for agent_id in list(self._pending):
            episode = self.agent_episodes[agent_id]
            episode.is_terminated, episode.is_truncated = terminated, not terminated
            del self._pending[agent_id]
        self.is_terminated, self.is_truncated = terminated, not terminated

    def cut(self) -> MultiAgentEpisode:
        """Return the successor chunk: the episode continues there in the next rollout.

        The successor has the same ``id_`` and mapping, starts at ``env_t_started =
        self.env_t``, and holds one agent episode (same agent-episode id) per agent still
        running, starting from its last observation; a pending step moves into it. Agents that
        ended here are not in it; agents that have not joined yet join there.

        Raises:
            ValueError: If this episode is done.
        """
        if self.is_done:
            raise ValueError(f"episode {self.id_} is done; only a running episode has a successor")
        successor = MultiAgentEpisode(
            self.id_, agent_to_module_mapping_fn=self.agent_to_module_mapping_fn, env_t_started=self.env_t
        )
        successor._agent_to_module = dict(self._agent_to_module)
        successor._ended_before = self._ended_before | {a for a in self.agent_episodes if a not in self._pending}
        for agent_id, pending in self._pending.items():
            episode = self.agent_episodes[agent_id]
            chunk = SingleAgentEpisode(episode.id_, t_started=episode.t)
            chunk.add_env_reset(episode.observations[-1], episode.infos[-1] if episode.infos else None)
            successor.agent_episodes[agent_id] = chunk
            successor._pending[agent_id] = pending
        self._pending = {}
        return successor

    def to_numpy(self) -> MultiAgentEpisode:
        """Stack each agent episode's fields into numpy arrays (see ``SingleAgentEpisode.to_numpy``).

        Returns:
            ``self``.
        """
        for episode in self.agent_episodes.values():
            episode.to_numpy()
        return self

    # ------------------------------------------------------------------------------------
    # Reading
    # ------------------------------------------------------------------------------------

    def module_for(self, agent_id: AgentID) -> ModuleID:
        """Return the module id that acts for ``agent_id`` in this episode.

        The mapping function is called the first time an agent is asked about (normally at its
        first observation) and its answer is kept for the rest of the episode, successor
        chunks included.

        Raises:
            TypeError: If the mapping function returns something other than a string.
        """
        module_id = self._agent_to_module.get(agent_id)
        if module_id is None:
            fn = self.agent_to_module_mapping_fn
            module_id = DEFAULT_MODULE_ID if fn is None else fn(agent_id, self)
            if not isinstance(module_id, str):
                raise TypeError(
                    f"the policy mapping function must return a module id (str) for agent {agent_id!r}, "
                    f"got {module_id!r}"
                )
            self._agent_to_module[agent_id] = module_id
        return module_id

    @property
    def agent_to_module_mapping(self) -> dict[AgentID, ModuleID]:
        """``{agent_id: module_id}`` of every agent mapped so far in this episode (earlier chunks included); a copy."""
        return dict(self._agent_to_module)

    @property
    def agent_ids(self) -> list[AgentID]:
        """The agents with an episode in this chunk, in the order they first observed."""
        return list(self.agent_episodes)

    def agent_episodes_with_steps(self) -> dict[AgentID, SingleAgentEpisode]:
        """Return ``{agent_id: SingleAgentEpisode}`` of the agents that took a step in this chunk."""
        return {agent_id: episode for agent_id, episode in self.agent_episodes.items() if len(episode)}

    @property
    def is_done(self) -> bool:
        """Whether the whole episode ended (every agent is done)."""
        return self.is_terminated or self.is_truncated

    def env_steps(self) -> int:
        """Env steps in this chunk (an AEC env steps once per agent turn)."""
        return self.env_t - self.env_t_started

    def agent_steps(self) -> int:
        """Actions taken by all agents in this chunk whose outcome the agent observed in it."""
        return sum(len(episode) for episode in self.agent_episodes.values())

    def __len__(self) -> int:
        return self.env_steps()

    def get_observations(self) -> dict[AgentID, Any]:
        """Return ``{agent_id: last observation}`` of every agent in this chunk."""
        return {agent_id: episode.observations[-1] for agent_id, episode in self.agent_episodes.items()}

    def get_actions(self) -> dict[AgentID, Any]:
        """Return ``{agent_id: last action}`` of every agent that took a step in this chunk."""
        return {agent_id: episode.actions[-1] for agent_id, episode in self.agent_episodes_with_steps().items()}

    def get_rewards(self) -> dict[AgentID, float]:
        """Return ``{agent_id: last reward}`` of every agent that took a step in this chunk."""
        return {agent_id: float(episode.rewards[-1]) for agent_id, episode in self.agent_episodes_with_steps().items()}

    def agent_returns(self) -> dict[AgentID, float]:
        """Return ``{agent_id: sum of its rewards in this chunk}``."""
        return {agent_id: episode.get_return() for agent_id, episode in self.agent_episodes.items()}

    def get_return(self) -> float:
        """Return the sum of every agent's rewards in this chunk."""
        return float(sum(self.agent_returns().values()))

    def __repr__(self) -> str:
        state = "terminated" if self.is_terminated else "truncated" if self.is_truncated else "running"
        return (
            f"MultiAgentEpisode(id_={self.id_[:8]}, env_t_started={self.env_t_started}, env_steps={len(self)}, "
            f"agents={self.agent_ids}, return={self.get_return():.4g}, {state})"
        )
