"""Train batches: conversion to tensors and iteration over epochs of minibatches.

A multi-module batch is ``{module_id: {column: Tensor[B_m, ...]}}``; every module may have
its own number of rows ``B_m``. A stateful (recurrent) module's batch is in the sequence
layout (:mod:`lightning_rl.core.sequences`): its rows are sequences, every column
``[S, T, ...]``, with ``loss_mask [S, T]`` and ``state_in``, a dict ``{name: Tensor[S, ...]}``
(the state at each sequence's first step); minibatches then take whole sequences.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

MultiModuleBatch = dict[str, dict[str, Any]]
"""``{module_id: {column: Tensor}}``; a column may also be a dict of tensors with the same rows (``state_in``)."""


def to_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """Turn a column (numpy array, list or tensor) into a tensor on ``device``.

    64-bit floats become 32-bit (the dtype of the module's weights); numpy arrays are
    shared, not copied, when they already sit on the CPU.
    """
    if isinstance(value, np.ndarray):
        tensor = torch.from_numpy(np.ascontiguousarray(value))
    elif isinstance(value, torch.Tensor):
        tensor = value
    else:
        tensor = torch.as_tensor(np.asarray(value))
    if tensor.dtype == torch.float64:
        tensor = tensor.float()
    return tensor.to(device, non_blocking=True)


def masked_mean(values: torch.Tensor, loss_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The mean of ``values`` over the real steps: all of them without a mask, else where ``loss_mask`` is true.

    A recurrent module's batch is zero-padded sequences ``[S, T]`` with ``loss_mask [S, T]``;
    its losses average over the real steps only, so padding contributes neither to the loss
    nor to any gradient.

    Args:
        values: Per-step values, ``[B]`` or ``[S, T]``.
        loss_mask: Same shape as ``values``, true on real steps; ``None`` for none.
    """
    if loss_mask is None:
        return values.mean()
    mask = loss_mask.to(values.dtype)
    # Where the mask is false, 0 * value would still be NaN for an infinite value: pick zeros instead.
    return torch.where(loss_mask.bool(), values, torch.zeros_like(values)).sum() / mask.sum().clamp(min=1.0)


def num_rows(module_batch: Mapping[str, Any]) -> int:
    """The number of rows of one module's batch (its columns agree): sequences for a sequence batch."""
    return len(_first_tensor(module_batch))


def num_env_steps(module_batch: Mapping[str, Any]) -> int:
    """The env steps one module's batch holds: its rows, or a sequence batch's real (unpadded) steps."""
    loss_mask = module_batch.get("loss_mask")
    return num_rows(module_batch) if loss_mask is None else int(loss_mask.sum())


def iterate_minibatches(
    batch: MultiModuleBatch,
    *,
    num_epochs: int,
    minibatch_size: int | None,
    shuffle: bool,
    num_rows_per_pass: int | None = None,
) -> Iterator[MultiModuleBatch]:
    """Yield ``num_epochs`` passes over ``batch``, each cut into minibatches.

    Every minibatch holds every module, so each step trains all modules together. A pass
    has ``ceil(B_max / minibatch_size)`` steps, where ``B_max`` is the largest module's
    number of env steps; the last step of a pass may be smaller. Modules with fewer steps
    cycle through theirs (as RLlib's cyclic minibatch iterator does). Without a minibatch
    size, each epoch is one step over the whole batch.

    A module batch of sequences (a stateful module's, with ``loss_mask [S, T]``) counts its
    real (unpadded) steps and is cut between whole sequences: in each pass's order, a
    sequence goes to the minibatch in whose stretch of ``minibatch_size`` real steps it starts,
    as RLlib counts a recurrent minibatch's size in timesteps. ``minibatch_size`` must then be
    at least ``T``, so that every stretch holds a sequence's start.

    Args:
        batch: The train batch, already tensors on the learner's device. May be empty (a
            data-parallel rank without rows still takes its steps, with empty minibatches).
        num_epochs: Passes over the batch.
        minibatch_size: Env steps per step of the largest module; ``None`` for the whole batch.
        shuffle: Whether each pass visits rows (sequences) in a fresh random order (torch's global RNG).
        num_rows_per_pass: The ``B_max`` that sets the number of steps; ``None`` for the
            largest module of ``batch``. Data-parallel ranks pass the largest over all
            ranks, so that every rank takes the same number of steps.

    Raises:
        ValueError: For a sequence batch and a ``minibatch_size`` below its ``T``.
    """
    steps_of = {module_id: num_env_steps(module_batch) for module_id, module_batch in batch.items()}
    largest = max(steps_of.values(), default=0) if num_rows_per_pass is None else num_rows_per_pass
    if minibatch_size is None or minibatch_size >= largest:
        for _ in range(num_epochs):
            yield batch
        return

    for module_id, module_batch in batch.items():
        _check_fits_a_sequence(module_id, module_batch, minibatch_size)
    num_steps = math.ceil(largest / minibatch_size)
    for _ in range(num_epochs):
        orders = {
            module_id: torch.randperm(num_rows(module_batch), device=_device_of(module_batch)) if shuffle else None
            for module_id, module_batch in batch.items()
        }
        groups = {
            module_id: _sequence_groups(module_batch, orders[module_id], minibatch_size)
            for module_id, module_batch in batch.items()
            if _is_sequence_batch(module_batch)
        }
        for step in range(num_steps):
            start, stop = step * minibatch_size, min((step + 1) * minibatch_size, largest)
            yield {
                module_id: (
                    _index_rows(module_batch, groups[module_id][step % len(groups[module_id])])
                    if module_id in groups
                    else _take_rows(module_batch, start, stop, steps_of[module_id], orders[module_id])
                )
                for module_id, module_batch in batch.items()
            }


def _is_sequence_batch(module_batch: Mapping[str, Any]) -> bool:
    loss_mask = module_batch.get("loss_mask")
    return loss_mask is not None and loss_mask.dim() == 2


def _check_fits_a_sequence(module_id: str, module_batch: Mapping[str, Any], minibatch_size: int) -> None:
    if _is_sequence_batch(module_batch) and minibatch_size < module_batch["loss_mask"].shape[1]:
        raise ValueError(
            f"module {module_id!r} trains on sequences of {module_batch['loss_mask'].shape[1]} steps (max_seq_len), "
            f"more than minibatch_size={minibatch_size}: a minibatch holds whole sequences, so make minibatch_size "
            "at least max_seq_len"
        )


def _sequence_groups(module_batch: Mapping[str, Any], order: torch.Tensor | None, minibatch_size: int) -> list[torch.Tensor]:
    """The sequence indices of each minibatch of one pass: sequences by the stretch of real steps they start in."""
    real_steps = module_batch["loss_mask"].sum(dim=1)
    if order is None:
        order = torch.arange(len(real_steps), device=real_steps.device)
    lengths = real_steps[order]
    starts = torch.cumsum(lengths, 0) - lengths
    group_of = torch.div(starts, minibatch_size, rounding_mode="floor")
    # Each sequence holds at most minibatch_size real steps, so no stretch is without a start.
    return [order[group_of == group] for group in range(int(group_of.max()) + 1)]


def _take_rows(
    module_batch: dict[str, Any], start: int, stop: int, count: int, order: torch.Tensor | None
) -> dict[str, Any]:
    if stop <= count:
        if order is None:  # contiguous rows: views, no copy
            return _index_rows(module_batch, slice(start, stop))
        index = order[start:stop]
    else:  # a smaller module cycles through its rows
        positions = torch.arange(start, stop, device=_device_of(module_batch)) % count
        index = positions if order is None else order[positions]
    return _index_rows(module_batch, index)


def _index_rows(columns: Mapping[str, Any], index: slice | torch.Tensor) -> dict[str, Any]:
    """Every column's rows ``index``; a dict-valued column (``state_in``) has each of its tensors indexed alike."""
    return {
        column: _index_rows(values, index) if isinstance(values, Mapping) else values[index]
        for column, values in columns.items()
    }


def _first_tensor(columns: Mapping[str, Any]) -> torch.Tensor:
    """The first tensor of a module batch, looking inside dict-valued columns."""
    first = next(iter(columns.values()))
    return _first_tensor(first) if isinstance(first, Mapping) else first


def _device_of(module_batch: Mapping[str, Any]) -> torch.device:
    return _first_tensor(module_batch).device
