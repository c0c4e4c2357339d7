"""Main's win rates against its opponents in training games: scoring the games, and a running estimate per opponent.

The self-play league (:mod:`~lightning_rl.callbacks.self_play`) draws training opponents by
these estimates (prioritized fictitious self-play, AlphaStar's PFSP):

- :class:`TrainingGameScorer` adds up each training game's returns over the chunks the
  rollouts cut it into and, once the game is over, scores it for main against its opponent
  module (a win is main's best return strictly above every other agent's; a draw is no win,
  as :func:`~lightning_rl.env.matches.result_of_returns` scores it).
- :class:`OpponentWinRates` keeps, per opponent, counts of main's wins and games that decay
  by ``1 - 1 / window`` per newer game against that opponent (so they span about the last
  ``window`` games), and estimates main's win rate as ``(wins + 1) / (games + 2)``: the mean
  under a uniform prior, 0.5 for an opponent not met yet and never exactly 0 or 1, so no PFSP
  weight vanishes for good after a few games.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lightning_rl.core.arguments import check_int, check_number, is_real
from lightning_rl.env.matches import result_of_returns
from lightning_rl.env.multi_agent_episode import AgentID, ModuleID, MultiAgentEpisode

Tally = dict[ModuleID, list[float]]
"""``{opponent module id: [main's wins, games]}``."""


class TrainingGameScorer:
    """Scores the finished training games of ``main_module_id`` against one opponent module each.

    Args:
        main_module_id: The module whose wins are counted.
    """

    def __init__(self, main_module_id: ModuleID) -> None:
        self.main_module_id = main_module_id
        # Returns so far of the games still running at the end of the last rollout, by episode id.
        self._running: dict[str, dict[AgentID, float]] = {}

    def score(self, episodes: Iterable[MultiAgentEpisode]) -> Tally:
        """Add one rollout's chunks to their games' returns; return the tally of the games that ended.

        A game of main against itself counts under ``main_module_id`` with no wins (it has no
        opponent to score, but is a game played); a game without main or with several
        opponent modules is not counted. Games running at the end of the rollout are carried
        to the next call; one that does not appear in it (an env copy restarted) is forgotten.
        """
        tally: Tally = {}
        running: dict[str, dict[AgentID, float]] = {}
        for chunk in episodes:
            returns = dict(self._running.get(chunk.id_, {}))
            for agent_id, value in chunk.agent_returns().items():
                returns[agent_id] = returns.get(agent_id, 0.0) + value
            if not chunk.is_done:
                running[chunk.id_] = returns
                continue
            result = self._result(chunk, returns)
            if result is not None:
                opponent, won = result
                counts = tally.setdefault(opponent, [0.0, 0.0])
                counts[0] += won
                counts[1] += 1.0
        self._running = running
        return tally

    def _result(self, episode: MultiAgentEpisode, returns: Mapping[AgentID, float]) -> tuple[ModuleID, float] | None:
        """``(opponent, 1.0 for main's win else 0.0)`` of a finished game, ``None`` when it does not count."""
        mapping = episode.agent_to_module_mapping
        opponents = {module_id for module_id in mapping.values() if module_id != self.main_module_id}
        if self.main_module_id not in mapping.values() or len(opponents) > 1:
            return None
        if not opponents:
            return self.main_module_id, 0.0
        won = result_of_returns(returns, mapping.get, self.main_module_id) == "win"
        return opponents.pop(), float(won)


class OpponentWinRates:
    """Main's running win rate against each opponent (see the module docstring).

    Args:
        window: About how many of the latest games against an opponent its estimate spans.

    Raises:
        ValueError: For a window that is not an int >= 1.
    """

    def __init__(self, window: int) -> None:
        check_int("win_rate_window", window, where="SelfPlayLeague")
        self.decay = 1.0 - 1.0 / window
        #: ``{opponent: [decayed wins, decayed games]}``.
        self.counts: Tally = {}

    def record(self, tally: Mapping[ModuleID, Sequence[float]]) -> None:
        """Add the newest games: ``{opponent: (wins, games)}``; older counts decay by ``decay ** games``."""
        for opponent, (wins, games) in tally.items():
            if games <= 0:
                continue
            old_wins, old_games = self.counts.get(opponent, (0.0, 0.0))
            # The new games' own decay among themselves is left out: they count in full.
            factor = self.decay**games
            self.counts[opponent] = [old_wins * factor + wins, old_games * factor + games]

    def estimate(self, opponent: ModuleID) -> float:
        """Main's estimated win rate against ``opponent``: ``(wins + 1) / (games + 2)``; 0.5 before any game."""
        wins, games = self.counts.get(opponent, (0.0, 0.0))
        return (wins + 1.0) / (games + 2.0)

    def pfsp_weights(self, opponents: Sequence[ModuleID], exponent: float) -> list[float]:
        """AlphaStar's PFSP weights ``(1 - p) ** exponent`` of ``opponents``, ``p`` main's estimated win rate.

        ``exponent`` 2 is AlphaStar's ``f_hard``: the opponents main beats least are drawn most;
        0 weighs every opponent alike.
        """
        return [(1.0 - self.estimate(opponent)) ** exponent for opponent in opponents]

    def forget(self, opponent: ModuleID) -> None:
        """Drop an opponent's counts (it left the Learner)."""
        self.counts.pop(opponent, None)

    def state_dict(self) -> dict[str, list[float]]:
        """The counts, as plain data."""
        return {opponent: list(counts) for opponent, counts in self.counts.items()}

    def load_state_dict(self, state: Any) -> None:
        """Restore :meth:`state_dict`'s counts.

        Raises:
            ValueError: For anything but ``{str: [wins, games]}`` with ``0 <= wins <= games``.
        """
        if not isinstance(state, Mapping) or not all(
            isinstance(opponent, str) and _is_count_pair(counts) for opponent, counts in state.items()
        ):
            raise ValueError(
                "SelfPlayLeague: a checkpoint's win_rates must map opponent module ids to [wins, games] "
                f"(0 <= wins <= games), got {state!r}"
            )
        self.counts = {opponent: [float(counts[0]), float(counts[1])] for opponent, counts in state.items()}


def check_pfsp_exponent(value: Any) -> None:
    """Raise unless ``value`` is a finite number >= 0 (``pfsp_exponent``)."""
    check_number("pfsp_exponent", value, low=0, finite=True, where="SelfPlayLeague")


def _is_count_pair(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(is_real(number) for number in value)
        and 0 <= value[0] <= value[1]
    )
