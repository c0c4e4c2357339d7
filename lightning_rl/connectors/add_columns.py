"""The first piece of every Learner connector: the episodes' steps as columns, per module."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from lightning_rl.connectors.episodes import episodes_to_batch
from lightning_rl.connectors.pipeline import ConnectorPiece, TrainBatch
from lightning_rl.env.episode import SingleAgentEpisode

if TYPE_CHECKING:
    from lightning_rl.core.metrics import MetricsLogger
    from lightning_rl.core.rl_modules import MultiRLModule

MODULE_EPISODES = "module_episodes"
"""``shared_data`` key: ``{module_id: [episodes]}``, the episodes whose steps are that
module's rows, in row order. Written by :class:`AddColumnsFromEpisodes`; pieces that compute
per-episode columns after it (GAE) read it."""


class AddColumnsFromEpisodes(ConnectorPiece):
    """Concatenates the steps of the episodes into columns, one batch per module.

    Each module gets ``obs``, ``actions``, ``rewards``, ``terminateds``, ``truncateds`` and
    the model outputs recorded while sampling (``action_logp``, ``action_dist_inputs``, ...),
    one row per step (see :func:`~lightning_rl.connectors.episodes.episodes_to_batch`).
    Which episodes feed which module is :meth:`episodes_per_module`'s choice, so several
    modules' rows can come from the same episodes.

    Args:
        module_id: The module single-agent episodes train. ``None``: the only module of the
            Learner (an error if it has several).
        device: Where the columns go. ``None``: the device of the module's weights, read at
            every call (so it follows the Learner when a Trainer moves it).
    """

    def __init__(self, module_id: str | None = None, device: torch.device | str | None = None) -> None:
        if module_id is not None and not isinstance(module_id, str):
            raise TypeError(f"module_id must be a str or None, got {type(module_id).__name__} {module_id!r}")
        self.module_id = module_id
        self.device = None if device is None else torch.device(device)

    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        batch: TrainBatch,
        episodes: Sequence[Any],
        shared_data: dict[str, Any],
        metrics: MetricsLogger,
    ) -> TrainBatch:
        """Add each module's columns to ``batch`` and its episodes to ``shared_data[MODULE_EPISODES]``."""
        module_episodes = self.episodes_per_module(rl_module, episodes)
        shared_data[MODULE_EPISODES] = module_episodes
        for module_id, its_episodes in module_episodes.items():
            device = self.device if self.device is not None else _weights_device(rl_module, module_id)
            batch.setdefault(module_id, {}).update(episodes_to_batch(its_episodes, device))
        return batch

    def episodes_per_module(self, rl_module: MultiRLModule, episodes: Sequence[Any]) -> dict[str, list[Any]]:
        """Which episodes become which module's rows; called once per call, before any column.

        The default sends single-agent episodes to one module (``module_id``, or the only
        module). Override it to split multi-agent episodes into each agent's single-agent
        episodes and map the agents to modules; every value must be a list of
        ``SingleAgentEpisode``.

        Raises:
            ValueError: For a module id the Learner does not have, or no ``module_id`` and a
                Learner with several modules.
            TypeError: For an episode that is not a ``SingleAgentEpisode``.
        """
        for index, episode in enumerate(episodes):
            if not isinstance(episode, SingleAgentEpisode):
                raise TypeError(
                    f"episode {index} is a {type(episode).__name__}; AddColumnsFromEpisodes maps SingleAgentEpisodes "
                    "to one module (override episodes_per_module for other episode types)"
                )
        return {self._target_module_id(rl_module): list(episodes)}

    def _target_module_id(self, rl_module: MultiRLModule) -> str:
        module_ids = sorted(rl_module.keys())
        if self.module_id is None:
            if len(module_ids) != 1:
                raise ValueError(
                    "single-agent episodes need one module to train: this Learner has modules "
                    f"{module_ids}; pass AddColumnsFromEpisodes(module_id=...) to choose one"
                )
            return module_ids[0]
        if self.module_id not in module_ids:
            raise ValueError(
                f"AddColumnsFromEpisodes(module_id={self.module_id!r}): the Learner has no such module; "
                f"it has {module_ids}"
            )
        return self.module_id

    def __repr__(self) -> str:
        settings = []
        if self.module_id is not None:
            settings.append(f"module_id={self.module_id!r}")
        if self.device is not None:
            settings.append(f"device={str(self.device)!r}")
        return f"AddColumnsFromEpisodes({', '.join(settings)})"


def _weights_device(rl_module: MultiRLModule, module_id: str) -> torch.device:
    # A module without parameters or buffers (a fixed policy) has no device of its own.
    module = rl_module[module_id]
    tensor = next(module.parameters(), None)
    if tensor is None:
        tensor = next(module.buffers(), None)
    return torch.device("cpu") if tensor is None else tensor.device
