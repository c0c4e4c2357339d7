"""``ConnectorV2``: RLlib's base class name for a Learner connector piece, with its episode helpers.

An RLlib piece subclasses ``ConnectorV2``, takes ``input_observation_space`` and
``input_action_space`` in ``__init__``, and implements ``__call__(*, rl_module, batch,
episodes, explore=None, shared_data=None, metrics=None, **kwargs)``. Written that way it runs
here unchanged as one of a Learner's ``learner_connector_pieces``, with one difference: it
runs after ``AddColumnsFromEpisodes``, so ``batch`` already holds each module's columns
(``{module_id: {column: Tensor}}``), and ``add_n_batch_items`` appends rows to a module's
column rather than to RLlib's per-episode lists.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lightning_rl.connectors.pipeline import ConnectorPiece, TrainBatch
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode

if TYPE_CHECKING:
    import gymnasium as gym

    from lightning_rl.core.metrics import MetricsLogger
    from lightning_rl.core.rl_modules import MultiRLModule


class ConnectorV2(ConnectorPiece):
    """A connector piece under RLlib's name and constructor.

    Args:
        input_observation_space: Kept as ``input_observation_space`` and ``observation_space``
            (a Learner piece here does not change spaces).
        input_action_space: Kept as ``input_action_space`` and ``action_space``.
        **kwargs: Accepted and ignored, as RLlib's base does.
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        **kwargs: Any,
    ) -> None:
        self.input_observation_space = input_observation_space
        self.input_action_space = input_action_space
        self._module_of_episode: dict[int, str] = {}

    @property
    def observation_space(self) -> gym.Space | None:
        """The observation space after this piece: its input space."""
        return self.input_observation_space

    @property
    def action_space(self) -> gym.Space | None:
        """The action space after this piece: its input space."""
        return self.input_action_space

    @abstractmethod
    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        batch: TrainBatch,
        episodes: Sequence[Any],
        explore: bool | None = None,
        shared_data: dict[str, Any] | None = None,
        metrics: MetricsLogger | None = None,
        **kwargs: Any,
    ) -> TrainBatch:
        """Change ``batch`` (or the episodes) and return the batch; see ``ConnectorPiece.__call__``."""

    def single_agent_episode_iterator(
        self,
        episodes: Sequence[Any],
        agents_that_stepped_only: bool = True,
        zip_with_batch_column: Any = None,
    ) -> Iterator[SingleAgentEpisode]:
        """Each single-agent episode, and each agent's episode of a multi-agent one, in the order of the batch's rows.

        Args:
            episodes: The update's episodes.
            agents_that_stepped_only: Whether to leave out agents without a step in a chunk
                (they have no rows, so this is the only value that lines up with the batch).
            zip_with_batch_column: Not supported here (RLlib's per-episode lists do not exist):
                read ``batch[module_id][column]`` instead.

        Raises:
            ValueError: For ``zip_with_batch_column``, or ``agents_that_stepped_only=False``.
        """
        if zip_with_batch_column is not None:
            raise ValueError(
                "single_agent_episode_iterator(zip_with_batch_column=...) is not supported: a Learner piece here sees "
                "the batch as {module_id: {column: Tensor}}, rows in the iterator's episode order"
            )
        if not agents_that_stepped_only:
            raise ValueError(
                "single_agent_episode_iterator(agents_that_stepped_only=False) is not supported: agents without a "
                "step have no rows in a Learner batch"
            )
        self._module_of_episode = {}
        for episode in episodes:
            if isinstance(episode, MultiAgentEpisode):
                for agent_id, agent_episode in episode.agent_episodes.items():
                    if len(agent_episode) == 0:
                        continue
                    self._module_of_episode[id(agent_episode)] = episode.module_for(agent_id)
                    yield agent_episode
            else:
                yield episode

    def add_batch_item(
        self, batch: TrainBatch, column: str, item_to_add: Any, single_agent_episode: SingleAgentEpisode | None = None
    ) -> None:
        """Add one row to ``column`` of the episode's module; see :meth:`add_n_batch_items`."""
        self.add_n_batch_items(batch, column, [item_to_add], 1, single_agent_episode)

    def add_n_batch_items(
        self,
        batch: TrainBatch,
        column: str,
        items_to_add: Any,
        num_items: int,
        single_agent_episode: SingleAgentEpisode | None = None,
    ) -> None:
        """Append ``num_items`` rows to ``batch[module_id][column]``, the module being the episode's.

        Call it once per episode, in :meth:`single_agent_episode_iterator`'s order, with one
        item per step: the column then lines up with the module's other columns.

        Args:
            batch: The batch being built.
            column: The column to append to (created at the first call).
            items_to_add: ``num_items`` values (a list, array or tensor).
            num_items: How many.
            single_agent_episode: The episode the rows belong to (from the iterator); ``None``
                when the batch has one module.

        Raises:
            ValueError: If the number of items differs from ``num_items``, or the module
                cannot be told (several modules and an episode not from the iterator).
        """
        module_id = self._module_id(batch, single_agent_episode)
        if module_id not in batch:
            return  # a module without rows in this update (not trained now)
        module_batch = batch[module_id]
        device = next((v.device for v in module_batch.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
        items = items_to_add if isinstance(items_to_add, torch.Tensor) else torch.as_tensor(np.asarray(items_to_add))
        items = items.to(device)
        if items.ndim == 0 or len(items) != num_items:
            raise ValueError(
                f"add_n_batch_items: num_items={num_items}, but {len(items) if items.ndim else 1} items given"
            )
        if column in module_batch:
            module_batch[column] = torch.cat([module_batch[column], items.to(module_batch[column].dtype)])
        else:
            module_batch[column] = items

    def _module_id(self, batch: TrainBatch, episode: SingleAgentEpisode | None) -> str:
        if episode is not None and id(episode) in self._module_of_episode:
            return self._module_of_episode[id(episode)]
        if len(batch) == 1:
            return next(iter(batch))
        raise ValueError(
            f"add_n_batch_items: the batch has modules {sorted(batch)}; pass an episode from "
            "self.single_agent_episode_iterator(episodes), which knows its module"
        )
