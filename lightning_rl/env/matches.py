"""Matches between two modules: who sits in which seat, and how often a module wins.

An evaluation plays a module against an opponent over complete episodes:
:func:`seat_mapping` is the policy mapping that seats them (each seat in turn for the module,
so neither the first-move advantage nor a seat's asymmetry favours it), and :func:`win_rate`
scores the episodes played (:func:`match_result` each one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from lightning_rl.env.multi_agent_episode import AgentID, ModuleID, MultiAgentEpisode


class SeatMapping:
    """A policy mapping ``(agent_id, episode) -> module_id`` for matches of two modules; see :func:`seat_mapping`."""

    def __init__(self, main_module_id: ModuleID, opponent_module_id: ModuleID, agents: Sequence[AgentID]) -> None:
        agents = list(agents)
        for name, value in (("main_module_id", main_module_id), ("opponent_module_id", opponent_module_id)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"seat_mapping: {name} must be a non-empty module id, got {value!r}")
        if main_module_id == opponent_module_id:
            raise ValueError(
                f"seat_mapping: main and opponent are both {main_module_id!r}; a match needs two different modules"
            )
        if len(agents) < 2 or len(set(agents)) != len(agents):
            raise ValueError(f"seat_mapping needs at least two distinct agents (the seats), got {agents}")
        self.main_module_id = main_module_id
        self.opponent_module_id = opponent_module_id
        self.agents = agents
        # The seat main takes in each episode seen, by episode id (all chunks of one episode share it).
        self._main_seats: dict[str, int] = {}

    def __call__(self, agent_id: AgentID, episode: MultiAgentEpisode) -> ModuleID:
        """Return the module that plays ``agent_id`` in ``episode``.

        Raises:
            ValueError: For an agent that is not one of the seats.
        """
        if agent_id not in self.agents:
            raise ValueError(f"seat_mapping: agent {agent_id!r} is not one of the seats {self.agents}")
        seat = self._main_seats.setdefault(episode.id_, len(self._main_seats) % len(self.agents))
        return self.main_module_id if agent_id == self.agents[seat] else self.opponent_module_id


def seat_mapping(main_module_id: ModuleID, opponent_module_id: ModuleID, agents: Sequence[AgentID]) -> SeatMapping:
    """A mapping that seats main in seat ``k % len(agents)`` in the k-th episode it maps, the opponent elsewhere.

    So over ``m * len(agents)`` episodes main plays every seat ``m`` times. Use a new mapping
    for each match: it remembers the episodes it has seated.

    Args:
        main_module_id: The module being evaluated.
        opponent_module_id: The module in every other seat.
        agents: The seats, in order (the env's ``possible_agents``).

    Raises:
        ValueError: For empty or equal module ids, or fewer than two distinct agents.
    """
    return SeatMapping(main_module_id, opponent_module_id, agents)


def win_rate(episodes: Sequence[MultiAgentEpisode], module_id: ModuleID) -> float:
    """The fraction of ``episodes`` that ``module_id`` won.

    An episode is a win when the best return of ``module_id``'s agents is strictly larger than
    every other agent's return; a draw is not a win. The episodes should be complete (a chunk
    holds only part of the returns).

    Args:
        episodes: Episodes in which ``module_id`` played against other modules.
        module_id: The module whose wins are counted.

    Raises:
        ValueError: For no episodes, or an episode in which ``module_id`` had no agent or no opponent.
    """
    if not episodes:
        raise ValueError(f"win_rate of {module_id!r}: no episodes to score")
    return sum(match_result(episode, module_id) == "win" for episode in episodes) / len(episodes)


def match_result(episode: MultiAgentEpisode, module_id: ModuleID) -> str:
    """``"win"``, ``"draw"`` or ``"loss"`` of ``module_id`` in one complete episode (see :func:`result_of_returns`).

    Raises:
        ValueError: If ``module_id`` had no agent or no opponent in the episode.
    """
    returns = episode.agent_returns()
    result = result_of_returns(returns, episode.module_for, module_id)
    if result is None:
        modules = {agent_id: episode.module_for(agent_id) for agent_id in returns}
        missing = "opponent" if module_id in modules.values() else "agent"
        raise ValueError(
            f"win_rate of {module_id!r}: episode {episode.id_} has no {missing} of it to score (agents -> modules: "
            f"{modules})"
        )
    return result


def result_of_returns(
    returns: Mapping[AgentID, float], module_of: Callable[[AgentID], ModuleID | None], module_id: ModuleID
) -> str | None:
    """``"win"``, ``"draw"`` or ``"loss"`` of ``module_id`` in a game whose agents ended with ``returns``.

    A win: the best return of ``module_id``'s agents is strictly larger than every other
    agent's return; a loss: some other agent's return is strictly larger; else a draw.
    ``None`` if ``module_id`` had no agent or no opponent in the game.

    Args:
        returns: ``{agent_id: return}`` over the whole game.
        module_of: The module that played an agent.
        module_id: The module whose result it is.
    """
    own = [value for agent_id, value in returns.items() if module_of(agent_id) == module_id]
    others = [value for agent_id, value in returns.items() if module_of(agent_id) != module_id]
    if not own or not others:
        return None
    if max(own) == max(others):
        return "draw"
    return "win" if max(own) > max(others) else "loss"
