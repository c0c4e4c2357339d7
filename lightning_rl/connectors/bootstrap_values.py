"""The value of each step's next observation, as a Learner connector piece (IMPALA's and APPO's).

V-trace (:mod:`lightning_rl.core.vtrace`) runs on sequences of consecutive steps and needs,
after each sequence's last step, the value of the observation that followed. The Learner
may cut a sequence anywhere (a minibatch's end, ``max_seq_len``), so this piece gives every
row that value, ``values_bootstrapped``, and marks the rows where an episode chunk ends,
``last_in_chunk``: the loss cuts its rows into sequences there and bootstraps each from its
last row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from lightning_rl.connectors.add_columns import module_episodes
from lightning_rl.connectors.episodes import next_step_values, values_of_chunks
from lightning_rl.connectors.gae import compute_values_of
from lightning_rl.connectors.pipeline import ConnectorPiece, TrainBatch
from lightning_rl.core.columns import Columns

if TYPE_CHECKING:
    from lightning_rl.core.metrics import MetricsLogger
    from lightning_rl.core.rl_modules import MultiRLModule


class AddNextValues(ConnectorPiece):
    """Adds ``values_bootstrapped`` (``V(x_{t+1})``, 0 after a terminating step) and ``last_in_chunk`` to every module's rows.

    The values come from the module's ``compute_values`` with its current weights, without
    gradients, in one forward pass per module over every step and every chunk's last
    observation, as :class:`~lightning_rl.connectors.gae.GeneralAdvantageEstimation` computes
    them (a stateful module's along each chunk from the state stored for its first step:
    :func:`~lightning_rl.connectors.episodes.values_of_chunks`). A step that truncated its
    episode, or ended a chunk cut by the rollout length, is bootstrapped from the value of
    the observation after it; a step that terminated it, with 0.

    Runs after :class:`~lightning_rl.connectors.add_columns.AddColumnsFromEpisodes`, whose
    record of which episodes became which module's rows it reads; the rows of a chunk are
    consecutive there. A stateful module's rows become sequences later (the Learner ends its
    pipeline with :class:`~lightning_rl.connectors.time_axis.AddTimeDimToBatchAndZeroPad`),
    and both columns ride along.
    """

    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        batch: TrainBatch,
        episodes: Sequence[Any],
        shared_data: dict[str, Any],
        metrics: MetricsLogger,
    ) -> TrainBatch:
        """Add the two columns for every module in ``shared_data[MODULE_EPISODES]``.

        Raises:
            ValueError: If no piece before this one recorded the module episodes.
            TypeError: If a module has no ``compute_values``.
        """
        for module_id, chunks in module_episodes(shared_data, type(self).__name__).items():
            module = rl_module[module_id]
            rows = batch[module_id]
            compute_values = compute_values_of(module, module_id, type(self).__name__)
            values, last_values = values_of_chunks(rows, chunks, compute_values, module.get_initial_state())
            lengths = torch.tensor([len(chunk) for chunk in chunks], device=values.device)
            next_values = next_step_values(values, last_values, lengths)
            terminated = rows[Columns.TERMINATEDS].bool()
            rows[Columns.VALUES_BOOTSTRAPPED] = torch.where(terminated, torch.zeros_like(next_values), next_values)
            last_in_chunk = torch.zeros(len(values), dtype=torch.bool, device=values.device)
            last_in_chunk[torch.cumsum(lengths, 0) - 1] = True
            rows[Columns.LAST_IN_CHUNK] = last_in_chunk
        return batch

    def __repr__(self) -> str:
        return "AddNextValues()"
