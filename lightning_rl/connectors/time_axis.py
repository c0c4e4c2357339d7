"""The last piece of a Learner connector with stateful modules: rows become zero-padded sequences."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightning_rl.connectors.add_columns import module_episodes
from lightning_rl.connectors.episodes import check_stored_states
from lightning_rl.connectors.pipeline import ConnectorPiece, TrainBatch
from lightning_rl.core.columns import Columns
from lightning_rl.core.recurrent import max_seq_len_of, unpack_state
from lightning_rl.core.sequences import sequence_layout, to_sequences

if TYPE_CHECKING:
    from lightning_rl.core.metrics import MetricsLogger
    from lightning_rl.core.rl_modules import MultiRLModule, RLModule


class AddTimeDimToBatchAndZeroPad(ConnectorPiece):
    """Cuts each stateful module's rows into sequences of its ``max_seq_len`` (RLlib's piece of that name).

    Each episode chunk of ``L`` rows becomes ``ceil(L / max_seq_len)`` sequences, the last
    one zero-padded: every column becomes ``[S, T, ...]``, ``loss_mask [S, T]`` (true on real
    steps) is added, and ``state_in`` (stored packed per step by the actor) becomes the
    module's state dict at each sequence's first step, ``{name: Tensor[S, ...]}``. A sequence
    never spans two chunks. Feed-forward modules' rows pass untouched, so one batch may hold
    both (``core.batch.iterate_minibatches`` cuts each module's minibatches in its own layout).

    The Learner appends this piece last (after user pieces), so every piece before it sees
    rows, as for a feed-forward module (GAE, ``log_vf_explained_var``).
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
        """Replace every stateful module's rows in ``batch`` by its sequences.

        Raises:
            ValueError: If no piece before recorded the module episodes, or a stateful
                module's rows lack the ``state_in`` its episodes should carry.
        """
        stateful = [module_id for module_id in batch if rl_module[module_id].is_stateful()]
        if not stateful:
            return batch
        episodes_by_module = module_episodes(shared_data, type(self).__name__)
        for module_id in stateful:
            lengths = [len(episode) for episode in episodes_by_module[module_id]]
            batch[module_id] = rows_to_sequences(batch[module_id], lengths, rl_module[module_id], module_id)
        return batch

    def __repr__(self) -> str:
        return "AddTimeDimToBatchAndZeroPad()"


def rows_to_sequences(
    columns: Mapping[str, Tensor], lengths: Sequence[int], module: RLModule, module_id: str
) -> dict[str, Any]:
    """One stateful module's rows (episode chunks laid end to end) as its sequence batch.

    Args:
        columns: ``{column: Tensor[N, ...]}``, with ``state_in`` packed ``[N, S]``.
        lengths: Rows per episode chunk, in row order (summing to ``N``).
        module: The stateful module: its ``max_seq_len`` and ``get_initial_state()`` (the state's names and shapes).
        module_id: Named in errors.

    Returns:
        Every column ``[S, T, ...]``, ``loss_mask [S, T]``, and ``state_in {name: Tensor[S, ...]}``.

    Raises:
        ValueError: Without a ``state_in`` column.
    """
    check_stored_states(columns, f"module {module_id!r}")
    device = columns[Columns.STATE_IN].device
    layout = sequence_layout(torch.tensor(lengths, dtype=torch.long, device=device), max_seq_len_of(module))
    sequences: dict[str, Any] = {
        name: to_sequences(values, layout) for name, values in columns.items() if name != Columns.STATE_IN
    }
    # Each sequence starts from the state stored for its first step (the actor's state there).
    sequences[Columns.STATE_IN] = unpack_state(columns[Columns.STATE_IN][layout.first_row], module.get_initial_state())
    sequences[Columns.LOSS_MASK] = layout.loss_mask()
    return sequences
