"""A two-player, turn-based PettingZoo game as a single-agent gymnasium env: the learner against a fixed opponent.

Single-agent learners (DQN, and anything the single-agent data modules feed) then train on a
board game such as connect four::

    data:
      class_path: lightning_rl.data.OffPolicyDataModule
      init_args:
        env: lightning_rl.env.against_opponent.AgainstOpponentEnv
        env_kwargs: {opponent: random}

Each ``step`` plays the learner's move, then the opponent's moves until it is the learner's
turn again or the game is over. The observation is the learner's PettingZoo observation, the
masked Dict ``{"action_mask", "observation"}`` (the mask is all zeros once the game is over);
the reward is what the game gave the learner during the step (connect four: +1 for a win, -1
for a loss, 0 otherwise). The opponent is one of :data:`~lightning_rl.env.opponents.OPPONENTS`
(``"random"``: uniform over the legal moves; ``"heuristic"``: connect four's win-else-block rule).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.core.action_masks import ACTION_MASK, OBSERVATION, is_action_masked_space
from lightning_rl.core.columns import Columns
from lightning_rl.env.opponents import OPPONENTS
from lightning_rl.env.pettingzoo_env import is_parallel_env, make_pettingzoo_env

SEATS = ("alternate", "random", "first", "second")
"""Where the learner sits: ``"alternate"`` (first in the env's 1st, 3rd, ... episode, second in
the others), ``"random"`` (drawn per episode from the env's seeded generator), or always
``"first"`` or ``"second"``."""

DEFAULT_GAME = "classic/connect_four-v3"
"""PettingZoo's connect four (its registry id, which builds the AEC env without a deprecation warning)."""


class AgainstOpponentEnv(gym.Env):
    """The learner's seat of a two-player PettingZoo AEC game, the other seat played by a fixed opponent.

    Seeding: ``reset(seed=s)`` seeds the env's generator, which seeds the game and the opponent's
    random choices at every reset, so a run from the same seed replays the same games for the
    same moves. ``info["seat"]`` says where the learner sits (0 moves first).

    Args:
        opponent: A name of :data:`~lightning_rl.env.opponents.OPPONENTS` (``"random"``, ``"heuristic"``).
        seat: One of :data:`SEATS`.
        game: The PettingZoo game, as :func:`~lightning_rl.env.pettingzoo_env.make_pettingzoo_env`
            takes it: an AEC env of two agents whose observations are the masked Dict
            (``{"action_mask", "observation"}``) and whose actions are ``Discrete``.
        game_kwargs: Keyword arguments for the game (``render_mode`` is passed on by this env).
        render_mode: The game's render mode (``"rgb_array"`` for videos), or ``None``.

    Raises:
        ValueError: For an unknown ``opponent`` or ``seat``, or a game that is not a two-agent
            AEC env with masked observations, naming what it got.
    """

    metadata = {"render_modes": ["human", "rgb_array"], "render_fps": 2}  # connect four's own

    def __init__(
        self,
        opponent: str = "random",
        *,
        seat: str = "alternate",
        game: str = DEFAULT_GAME,
        game_kwargs: dict[str, Any] | None = None,
        render_mode: str | None = None,
    ) -> None:
        if opponent not in OPPONENTS:
            raise ValueError(f"opponent must be one of {sorted(OPPONENTS)}, got {opponent!r}")
        if seat not in SEATS:
            raise ValueError(f"seat must be one of {list(SEATS)}, got {seat!r}")
        kwargs = dict(game_kwargs or {})
        if render_mode is not None:
            kwargs["render_mode"] = render_mode
        self.game = make_pettingzoo_env(game, kwargs)
        self.render_mode = render_mode
        self.metadata = {**self.metadata, **getattr(self.game, "metadata", {})}
        agents = list(self.game.possible_agents)
        if is_parallel_env(self.game) or len(agents) != 2:
            raise ValueError(
                f"game {game!r} must be a turn-based (AEC) PettingZoo env of two agents, got a "
                f"{type(self.game).__name__} with agents {agents}"
            )
        self.observation_space = self.game.observation_space(agents[0])
        self.action_space = self.game.action_space(agents[0])
        if not is_action_masked_space(self.observation_space) or not isinstance(self.action_space, gym.spaces.Discrete):
            raise ValueError(
                f"game {game!r} must give masked Dict observations ('action_mask', 'observation') and Discrete "
                f"actions, got {self.observation_space} and {self.action_space}"
            )
        self.seat = seat
        # A generator of its own, reseeded from the env's at every reset (the seed here is a placeholder).
        self.opponent = OPPONENTS[opponent](self.observation_space, self.action_space, {"seed": 0})
        self._agents = agents
        self._learner = agents[0]
        self._num_episodes = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Start a game, let the opponent move if it sits first, and return the learner's observation.

        Raises:
            RuntimeError: If the game ends before the learner's first move.
        """
        super().reset(seed=seed)
        self.game.reset(seed=int(self.np_random.integers(2**31)))
        self.opponent.generator.manual_seed(int(self.np_random.integers(2**63 - 1)))
        seat = self._next_seat()
        self._learner = self._agents[seat]
        self._num_episodes += 1
        self._play_opponent()
        if self._game_over():
            raise RuntimeError(f"the game ended before the learner ({self._learner!r}) could move")
        return self._observe(), {"seat": seat}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Play the learner's move, then the opponent's, and return what the learner sees.

        Returns:
            The learner's observation, its reward over the step, and whether the game ended
            (terminated) or was cut short (truncated).
        """
        self.game.step(int(action))
        reward = float(self.game.rewards[self._learner])
        reward += self._play_opponent()
        terminated = bool(self.game.terminations[self._learner])
        truncated = bool(self.game.truncations[self._learner]) and not terminated
        return self._observe(), reward, terminated, truncated, {"seat": self._agents.index(self._learner)}

    def render(self) -> Any:
        """The game's rendering (``render_mode`` given at construction)."""
        return self.game.render()

    def close(self) -> None:
        self.game.close()

    def _next_seat(self) -> int:
        if self.seat == "first":
            return 0
        if self.seat == "second":
            return 1
        if self.seat == "random":
            return int(self.np_random.integers(2))
        return self._num_episodes % 2

    def _observe(self) -> dict[str, Any]:
        """The learner's observation; once the game is over no move is legal (the game's own mask may say otherwise)."""
        observation = dict(self.game.observe(self._learner))
        if self._game_over():
            observation[ACTION_MASK] = np.zeros_like(observation[ACTION_MASK])
        return observation

    def _game_over(self) -> bool:
        return bool(self.game.terminations[self._learner] or self.game.truncations[self._learner])

    def _play_opponent(self) -> float:
        """The opponent's moves until the learner's turn or the game's end; the learner's rewards meanwhile."""
        reward = 0.0
        while not self._game_over() and self.game.agent_selection != self._learner:
            observation = self.game.observe(self.game.agent_selection)
            batch = {
                Columns.OBS: torch.as_tensor(np.asarray(observation[OBSERVATION]))[None],
                Columns.ACTION_MASK: torch.as_tensor(np.asarray(observation[ACTION_MASK]))[None],
            }
            with torch.no_grad():
                action = self.opponent.forward_inference(batch)[Columns.ACTIONS]
            self.game.step(int(action[0]))
            reward += float(self.game.rewards[self._learner])
        return reward
