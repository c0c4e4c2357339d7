"""The time axis: rows of episodes laid end to end, cut into zero-padded sequences and back.

A stateful (recurrent) module trains on sequences, RLlib's ``max_seq_len`` layout: each
episode (or chunk of one) of ``L`` steps becomes ``ceil(L / max_seq_len)`` sequences of
``max_seq_len`` steps, the last one zero-padded; ``loss_mask [S, T]`` is true on real steps.
A sequence never spans two episodes, and starts from the state stored for its first step.

:func:`sequence_layout` computes where every row goes once; :func:`to_sequences` and
:func:`from_sequences` move a column between the row layout ``[N, ...]`` and the sequence
layout ``[S, T, ...]`` with one indexing operation each (no Python loop per step).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class SequenceLayout:
    """Where each row of episodes laid end to end sits in the padded sequences.

    Args:
        sequence_of_row: ``[N]``, the sequence each row belongs to.
        position_of_row: ``[N]``, its step within that sequence (``0 <= p < max_seq_len``).
        first_row: ``[S]``, the row of each sequence's first step.
        num_sequences: ``S``.
        max_seq_len: ``T``, the padded length.
    """

    sequence_of_row: Tensor
    position_of_row: Tensor
    first_row: Tensor
    num_sequences: int
    max_seq_len: int

    @property
    def num_rows(self) -> int:
        """``N``, the real steps."""
        return len(self.sequence_of_row)

    def loss_mask(self) -> Tensor:
        """``[S, T]`` bool: true on real steps, false on padding."""
        mask = torch.zeros(self.num_sequences, self.max_seq_len, dtype=torch.bool, device=self.first_row.device)
        mask[self.sequence_of_row, self.position_of_row] = True
        return mask


def sequence_layout(lengths: Tensor, max_seq_len: int) -> SequenceLayout:
    """The layout of episodes of ``lengths`` steps, laid end to end, cut every ``max_seq_len`` steps.

    Args:
        lengths: ``[E]`` steps per episode, each >= 1.
        max_seq_len: The sequences' length ``T``, >= 1.

    Raises:
        ValueError: For ``max_seq_len < 1`` or an episode without steps.
    """
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
    lengths = lengths.long()
    if len(lengths) and int(lengths.min()) < 1:
        raise ValueError(f"every episode needs at least one step to be cut into sequences; got lengths {lengths.tolist()}")
    device = lengths.device
    sequences_per_episode = (lengths + max_seq_len - 1) // max_seq_len
    first_sequence = torch.cumsum(sequences_per_episode, 0) - sequences_per_episode
    episode_of_row = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    episode_start = torch.cumsum(lengths, 0) - lengths
    step_in_episode = torch.arange(int(lengths.sum()), device=device) - episode_start[episode_of_row]
    sequence_of_row = first_sequence[episode_of_row] + step_in_episode // max_seq_len
    position_of_row = step_in_episode % max_seq_len
    num_sequences = int(sequences_per_episode.sum())
    first_row = torch.empty(num_sequences, dtype=torch.long, device=device)
    starts = position_of_row == 0
    first_row[sequence_of_row[starts]] = torch.nonzero(starts).reshape(-1)
    return SequenceLayout(sequence_of_row, position_of_row, first_row, num_sequences, max_seq_len)


def to_sequences(column: Tensor, layout: SequenceLayout) -> Tensor:
    """A row column ``[N, ...]`` as zero-padded sequences ``[S, T, ...]``."""
    if len(column) != layout.num_rows:
        raise ValueError(f"a column of {len(column)} rows does not fit a layout of {layout.num_rows} rows")
    padded = column.new_zeros((layout.num_sequences, layout.max_seq_len, *column.shape[1:]))
    padded[layout.sequence_of_row, layout.position_of_row] = column
    return padded


def from_sequences(sequences: Tensor, layout: SequenceLayout) -> Tensor:
    """Sequences ``[S, T, ...]`` back as the row column ``[N, ...]`` (padding dropped)."""
    return sequences[layout.sequence_of_row, layout.position_of_row]
