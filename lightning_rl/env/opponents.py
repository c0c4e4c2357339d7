"""Fixed opponents for turn-based games: uniform random over legal moves, and a connect-four heuristic.

Both are :class:`~lightning_rl.core.rl_modules.RLModule` s without parameters, so an env
runner acts with them as with any module: their forward passes return ``actions`` directly
(``compute_actions`` then skips the distribution). They are never trained.

A batch holds ``obs`` (the observation part of PettingZoo's masked Dict observation,
``[B, ...]``) and, for a masked space, ``action_mask`` (``[B, n]``, bool or 0/1). Random
choices come from the module's own ``torch.Generator`` when the ``seed`` key of
``model_config`` is an int, so an evaluation can be repeated; with ``None`` they come from
torch's global generator, as a trained module's sampled actions do: in training that is the
data module's per-rank sampling stream, which checkpoints save, so a resumed fit goes on
drawing where it stopped and each DDP rank's opponent draws its own moves.

PettingZoo's ``connect_four_v3`` observation, which :class:`ConnectFourHeuristicModule`
reads: ``observation`` is ``[6, 7, 2]``, plane 0 the acting player's pieces, plane 1 the
opponent's, row 0 the top of the board and row 5 the bottom (pieces land on the lowest empty
row of a column).
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_rl.core.action_masks import ACTION_MASK, observation_part
from lightning_rl.core.columns import Columns
from lightning_rl.core.module_checks import ModelConfigKey
from lightning_rl.core.rl_modules import RLModule

_ROWS, _COLUMNS = 6, 7
# One kernel per direction a line of four can run in; a board convolved with one of them
# reaches 4 exactly where four of its pieces line up.
_LINE_KERNELS = (
    torch.ones(1, 1, 1, 4),  # horizontal
    torch.ones(1, 1, 4, 1),  # vertical
    torch.eye(4).view(1, 1, 4, 4),  # diagonal, down to the right
    torch.eye(4).flip(1).view(1, 1, 4, 4),  # diagonal, down to the left
)


def _is_seed(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


class _FixedOpponent(RLModule):
    """What both opponents share: a Discrete action space, the random source, the legal-move mask.

    Subclasses implement :meth:`_choose_actions`.
    """

    model_config_keys: ClassVar[dict[str, ModelConfigKey]] = {
        "seed": ModelConfigKey(
            None, "an int >= 0 (a generator of its own), or None (torch's global generator)", _is_seed
        ),
    }

    def setup(self) -> None:
        """Check the action space and make the generator from ``model_config["seed"]`` (none for ``None``).

        Raises:
            ValueError: For an action space that is not ``Discrete`` starting at 0.
        """
        if not isinstance(self.action_space, gym.spaces.Discrete) or self.action_space.start != 0:
            raise ValueError(
                f"{type(self).__name__} chooses among n discrete actions: its action space must be "
                f"Discrete(n) starting at 0, got {self.action_space}"
            )
        seed = self.resolved_model_config()["seed"]
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        return {Columns.ACTIONS: self._choose_actions(obs, self._legal_actions(batch, obs))}

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError(
            f"{type(self).__name__} is a fixed opponent without parameters; it acts but is never trained. "
            "Leave its module id out of policies_to_train."
        )

    def _choose_actions(self, obs: Tensor, legal: Tensor) -> Tensor:
        """Return the actions ``[B]`` (int64) for observations ``obs`` and legal moves ``legal`` ``[B, n]``."""
        raise NotImplementedError

    def _legal_actions(self, batch: dict[str, Any], obs: Tensor) -> Tensor:
        """The batch's ``action_mask`` as bool ``[B, n]``; every action when the batch has none.

        Raises:
            ValueError: For a mask of the wrong shape, or a row that allows no action.
        """
        rows, n = obs.shape[0], int(self.action_space.n)
        mask = batch.get(ACTION_MASK)
        if mask is None:
            return torch.ones(rows, n, dtype=torch.bool, device=obs.device)
        if tuple(mask.shape) != (rows, n):
            raise ValueError(
                f"{type(self).__name__}: the batch's {ACTION_MASK!r} has shape {tuple(mask.shape)}, expected "
                f"({rows}, {n}) (one row per observation, one value per action)"
            )
        legal = mask.to(device=obs.device).bool()
        if not bool(legal.any(dim=1).all()):
            raise ValueError(f"{type(self).__name__}: a row of the batch's {ACTION_MASK!r} allows no action")
        return legal

    def _uniform_choice(self, candidates: Tensor) -> Tensor:
        """One action per row, uniform over the row's ``True`` entries (each row has at least one)."""
        noise = torch.rand(candidates.shape, generator=self.generator).to(candidates.device)
        return torch.where(candidates, noise, torch.full_like(noise, -1.0)).argmax(dim=1)


class RandomLegalModule(_FixedOpponent):
    """Uniform random over the legal actions (over all actions when the batch has no mask).

    Args:
        observation_space: Any space (a masked Dict included).
        action_space: ``Discrete(n)``.
        model_config: ``{"seed": int | None}`` (see the module docstring).
        inference_only: Accepted for the spec API; there is nothing to leave out.
    """

    def _choose_actions(self, obs: Tensor, legal: Tensor) -> Tensor:
        return self._uniform_choice(legal)


class ConnectFourHeuristicModule(_FixedOpponent):
    """Connect four by rule: win now if a legal column wins, else block the opponent's immediate win, else random.

    Vectorized over the batch: every legal column is tried for both players at once. Ties
    (two winning columns, two threats to block, or no rule applying) are broken uniformly at
    random among the columns the rule allows.

    Args:
        observation_space: PettingZoo's ``connect_four_v3`` space: the masked Dict, or its
            ``observation`` part alone (``[6, 7, 2]``).
        action_space: ``Discrete(7)``.
        model_config: ``{"seed": int | None}`` (see the module docstring).
        inference_only: Accepted for the spec API; there is nothing to leave out.

    Raises:
        ValueError: For spaces of another shape.
    """

    def setup(self) -> None:
        super().setup()
        shape = observation_part(self.observation_space).shape
        if tuple(shape or ()) != (_ROWS, _COLUMNS, 2) or self.action_space.n != _COLUMNS:
            raise ValueError(
                f"ConnectFourHeuristicModule reads PettingZoo's connect_four board: an observation of shape "
                f"({_ROWS}, {_COLUMNS}, 2) and Discrete({_COLUMNS}) actions, got {shape} and {self.action_space}"
            )

    def _choose_actions(self, obs: Tensor, legal: Tensor) -> Tensor:
        board = obs.float()
        own, opponent = board[..., 0], board[..., 1]
        empty_per_column = (own + opponent == 0).sum(dim=1)  # [B, 7]
        legal = legal & (empty_per_column > 0)
        placed = _placed_pieces(empty_per_column)
        wins = _completes_four(own.unsqueeze(1) + placed) & legal
        blocks = _completes_four(opponent.unsqueeze(1) + placed) & legal
        candidates = torch.where(
            wins.any(dim=1, keepdim=True), wins, torch.where(blocks.any(dim=1, keepdim=True), blocks, legal)
        )
        return self._uniform_choice(candidates)


def _placed_pieces(empty_per_column: Tensor) -> Tensor:
    """``[B, 7, 6, 7]``: for each batch row and column c, a board holding one piece where a piece dropped in c lands.

    The empty cells of a column are its top ones, so the piece lands on row ``empty - 1``;
    a full column gets no piece (it is not legal anyway).
    """
    landing_row = (empty_per_column - 1).view(*empty_per_column.shape, 1, 1)
    device = empty_per_column.device
    rows = torch.arange(_ROWS, device=device).view(1, 1, _ROWS, 1)
    columns = torch.arange(_COLUMNS, device=device).view(1, 1, 1, _COLUMNS)
    dropped_in = torch.arange(_COLUMNS, device=device).view(1, _COLUMNS, 1, 1)
    return ((rows == landing_row) & (columns == dropped_in)).float()


def _completes_four(boards: Tensor) -> Tensor:
    """``[B, 7]``: whether each of the boards ``[B, 7, 6, 7]`` (one player's pieces) holds four in a row."""
    flat = boards.reshape(-1, 1, _ROWS, _COLUMNS)
    found = torch.zeros(flat.shape[0], dtype=torch.bool, device=boards.device)
    for kernel in _LINE_KERNELS:
        counts = F.conv2d(flat, kernel.to(boards.device))
        found |= counts.flatten(1).amax(dim=1) >= 4
    return found.view(boards.shape[:2])


OPPONENTS: dict[str, type[RLModule]] = {
    "random": RandomLegalModule,
    "heuristic": ConnectFourHeuristicModule,
}
"""The fixed opponents an evaluation can name: ``{name: RLModule class}``. The names are the
suffixes of the win rates logged against them (``eval/win_rate_vs_heuristic``)."""
