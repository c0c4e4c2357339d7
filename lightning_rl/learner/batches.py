"""What a Learner accepts to train on, checked at the boundary.

``prepare_batch`` turns a user's batch (flat ``{column: array}`` for a one-module Learner,
or ``{module_id: {column: array}}``) into tensors on the Learner's device, checking module
ids, required columns, row counts and observation/action shapes before anything trains.
A stateful (recurrent) module's batch is sequences: its rows are ``[T, ...]`` per sequence,
with ``loss_mask [S, T]`` and ``state_in {name: [S, ...]}`` (:mod:`lightning_rl.core.sequences`).
``concat_batches`` joins several batches row-wise (``update(batches=...)``);
``as_train_item`` turns what a data loader yields into the typed ``TrainItem``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lightning_rl.core.action_masks import is_action_masked_space, observation_part
from lightning_rl.core.batch import MultiModuleBatch, to_tensor
from lightning_rl.core.columns import Columns
from lightning_rl.core.observation_layout import stored_observation_space
from lightning_rl.core.rl_modules import MultiRLModule
from lightning_rl.core.train_item import TrainingData, TrainItem


def prepare_batch(
    batch: Mapping[str, Any],
    module: MultiRLModule,
    *,
    device: torch.device,
    required_columns: Callable[[str], list[str]],
    data_parallel: bool,
) -> MultiModuleBatch:
    """Convert a user batch to ``{module_id: {column: Tensor}}`` on ``device``, checked.

    Args:
        batch: ``{column: array}`` (one-module Learners) or ``{module_id: {column: array}}``;
            numpy arrays or tensors.
        module: The Learner's modules, for their ids and spaces.
        device: Where the tensors go.
        required_columns: ``Learner.required_batch_columns``, asked per module.
        data_parallel: Whether this is one of several DDP ranks; such a rank may hold no
            rows (``{}``) or none of some module, and still takes part in the update.

    Raises:
        ValueError: For anything but a non-empty dict, unknown module ids, a mix of columns
            and module batches, a flat batch for several modules, missing columns, columns
            of unequal or zero length, observations or actions of the wrong shape, and a
            module on a masked observation space without a fitting ``action_mask`` column
            (its ``obs`` are checked against the observation part; a Dict or Tuple
            observation space's against its flat layout, ``[B, flatdim]``); for a stateful
            module, a batch that is not sequences (``loss_mask`` and a ``state_in`` dict, and
            columns ``[S, T, ...]``).
    """
    if not isinstance(batch, Mapping) or (not batch and not data_parallel):
        raise ValueError(
            f"a batch must be a non-empty dict of columns or of module batches, got {type(batch).__name__}"
        )
    if not batch:
        return {}  # this data-parallel rank has no rows this time; it still takes its steps
    prepared: MultiModuleBatch = {}
    for module_id, module_batch in _module_batches(batch, module).items():
        missing = [c for c in required_columns(module_id) if c not in module_batch]
        if missing:
            raise ValueError(
                f"module {module_id!r}: the batch lacks column(s) {missing}; it has {sorted(module_batch)}"
            )
        columns = {column: _to_tensors(values, device) for column, values in module_batch.items()}
        lengths = {column: _length(values) for column, values in columns.items()}
        if data_parallel and set(lengths.values()) == {0}:
            continue  # no rows of this module on this rank
        if len(set(lengths.values())) != 1 or 0 in lengths.values():
            raise ValueError(
                f"module {module_id!r}: columns must have the same, non-zero number of rows; got {lengths}"
            )
        rl_module = module[module_id]
        # A stateful module trains on sequences: each of its rows is [T, ...], one step per time index.
        time_axes = 1 if rl_module.is_stateful() else 0
        if time_axes:
            check_sequence_batch(module_id, columns)
        obs_space = observation_part(rl_module.observation_space)
        # A Dict or Tuple observation is stored flat: its obs column holds gymnasium's flatten layout.
        stored = stored_observation_space(obs_space)
        described = None if stored is obs_space else f"the flat layout (gym.spaces.flatten) of the {obs_space}"
        check_column_shape(
            module_id, Columns.OBS, columns.get(Columns.OBS), stored, "observation", described=described, time_axes=time_axes
        )
        check_column_shape(
            module_id, Columns.ACTIONS, columns.get(Columns.ACTIONS), rl_module.action_space, "action", time_axes=time_axes
        )
        check_action_mask_column(module_id, columns, rl_module.observation_space, time_axes=time_axes)
        prepared[module_id] = columns
    return prepared


def concat_batches(batches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Join batches row-wise: all ``{column: array}`` or all ``{module_id: {column: array}}``.

    In nested batches a module may be missing from some; its rows are those of the batches
    that hold it. Tensors stay tensors when every part is one; anything else becomes numpy.

    Raises:
        ValueError: For an empty list, a batch that is not a dict, mixed layouts, or a module
            whose batches have different columns.
    """
    if isinstance(batches, Mapping) or not isinstance(batches, Sequence) or not batches:
        raise ValueError(f"batches must be a non-empty list of batches, got {type(batches).__name__}")
    layouts = {_layout(batch, index) for index, batch in enumerate(batches)}
    if len(layouts) > 1:
        raise ValueError("batches must all map columns to arrays, or all map module ids to column dicts, not a mix")
    if layouts == {"columns"}:
        return _concat_columns(batches, "batches")
    joined: dict[str, Any] = {}
    for module_id in dict.fromkeys(module_id for batch in batches for module_id in batch):
        parts = [batch[module_id] for batch in batches if module_id in batch]
        joined[module_id] = _concat_columns(parts, f"module {module_id!r} of batches")
    return joined


def _layout(batch: Any, index: int) -> str:
    if not isinstance(batch, Mapping) or not batch:
        raise ValueError(f"batches[{index}] must be a non-empty dict, got {type(batch).__name__}")
    nested = {isinstance(value, Mapping) for value in batch.values()}
    if len(nested) > 1:
        raise ValueError(f"batches[{index}] maps both columns to arrays and module ids to column dicts")
    return "modules" if nested == {True} else "columns"


def _concat_columns(parts: Sequence[Mapping[str, Any]], where: str) -> dict[str, Any]:
    columns = list(parts[0])
    for part in parts[1:]:
        if set(part) != set(columns):
            raise ValueError(f"{where}: every batch must have the same columns, got {sorted(columns)} and {sorted(part)}")
    return {column: _concat([part[column] for part in parts]) for column in columns}


def _concat(arrays: list[Any]) -> Any:
    if all(isinstance(array, torch.Tensor) for array in arrays):
        return torch.cat(arrays)
    return np.concatenate([array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array) for array in arrays])


def _module_batches(batch: Mapping[str, Any], module: MultiRLModule) -> dict[str, Mapping[str, Any]]:
    """``batch`` as ``{module_id: module_batch}``; a flat batch goes to the only module."""
    # ``state_in`` is a column even though its value is a dict (a recurrent module's {name: Tensor}).
    nested = [isinstance(value, Mapping) and key != Columns.STATE_IN for key, value in batch.items()]
    if all(nested):
        unknown = sorted(set(batch) - set(module.keys()))
        if unknown:
            raise ValueError(
                f"the batch holds module ids {unknown} that this Learner does not have; "
                f"its modules are {sorted(module.keys())}"
            )
        return dict(batch)
    if any(nested):
        raise ValueError("a batch must map either columns to arrays or module ids to column dicts, not both")
    if len(module) == 1:
        return {next(iter(module.keys())): batch}
    raise ValueError(
        f"a flat {{column: array}} batch is ambiguous for a Learner with modules {sorted(module.keys())}: "
        "pass {module_id: {column: array}}"
    )


def check_column_shape(
    module_id: str,
    column: str,
    values: torch.Tensor | None,
    space: Any,
    kind: str,
    *,
    described: str | None = None,
    time_axes: int = 0,
) -> None:
    """Raise if a column's per-row shape does not match its gymnasium space.

    Args:
        module_id: The module the column belongs to (named in the error).
        column: The column's name.
        values: The column, ``[B, ...]`` (``[S, T, ...]`` with a time axis); ``None`` when the batch does not hold it.
        space: The module's space for the column; one without a flat shape (Dict, Tuple) is not checked.
        kind: ``"observation"`` or ``"action"``, for the error message.
        described: What the error calls ``space``; ``None`` for ``"the {kind} space {space}"``.
        time_axes: 1 for a stateful module's sequences (rows ``[T, ...]``), 0 for plain rows.
    """
    expected = getattr(space, "shape", None)
    if values is None or expected is None:
        return
    if tuple(values.shape[1 + time_axes :]) != tuple(expected) or values.dim() < 1 + time_axes:
        what = described or f"the {kind} space {space}"
        leading = "batch, time" if time_axes else "batch"
        raise ValueError(
            f"module {module_id!r}: column {column!r} has shape {tuple(values.shape)}, but {what} "
            f"expects [{leading}, {', '.join(map(str, expected))}]".replace(", ]", "]")
        )


def check_sequence_batch(module_id: str, columns: Mapping[str, Any]) -> None:
    """Raise unless a stateful module's batch is sequences: ``loss_mask [S, T]`` and a ``state_in`` dict.

    Args:
        module_id: The module the columns belong to (named in the error).
        columns: The module's batch, tensors.
    """
    mask, state_in = columns.get(Columns.LOSS_MASK), columns.get(Columns.STATE_IN)
    if not isinstance(state_in, Mapping) or not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError(
            f"module {module_id!r} is stateful (recurrent): its batch must be sequences, every column [S, T, ...] "
            f"with {Columns.LOSS_MASK!r} [S, T] and {Columns.STATE_IN!r} {{name: [S, ...]}} "
            f"(core.sequences: sequence_layout/to_sequences); it has {sorted(columns)}"
        )


def check_action_mask_column(
    module_id: str, columns: Mapping[str, torch.Tensor], observation_space: Any, *, time_axes: int = 0
) -> None:
    """Raise if a module on a masked observation space lacks a fitting ``action_mask`` column.

    Args:
        module_id: The module the columns belong to (named in the error).
        columns: The module's batch, ``{column: Tensor[B, ...]}``.
        observation_space: The module's observation space; only a masked one
            (:func:`~lightning_rl.core.action_masks.is_action_masked_space`) is checked.
        time_axes: 1 for a stateful module's sequences, 0 for plain rows (``check_column_shape``).
    """
    if not is_action_masked_space(observation_space):
        return
    mask = columns.get(Columns.ACTION_MASK)
    if mask is None:
        raise ValueError(
            f"module {module_id!r} is built on a masked observation space, so its batch needs the column "
            f"{Columns.ACTION_MASK!r} (which actions were legal at each row); it has {sorted(columns)}"
        )
    check_column_shape(
        module_id, Columns.ACTION_MASK, mask, observation_space[Columns.ACTION_MASK], "action mask", time_axes=time_axes
    )


def _to_tensors(values: Any, device: torch.device) -> Any:
    """A column as a tensor on ``device``; a dict-valued column (``state_in``) as a dict of them."""
    if isinstance(values, Mapping):
        return {name: to_tensor(value, device) for name, value in values.items()}
    return to_tensor(values, device)


def _length(values: Any) -> int:
    """A column's rows (0 for a scalar); a dict-valued column's are its first tensor's."""
    if isinstance(values, Mapping):
        return _length(next(iter(values.values()))) if values else 0
    return len(values) if values.dim() > 0 else 0


def as_train_item(train_item: TrainItem | Mapping[str, Any]) -> TrainItem:
    """A ``TrainItem`` as it is; a plain batch wrapped in one; an untyped item refused by name."""
    if isinstance(train_item, TrainItem):
        return train_item
    if isinstance(train_item, Mapping):
        if {"episodes", "replay", "batch"} & set(train_item):
            raise ValueError(
                f"training_step got a dict train item with keys {sorted(train_item)}; train items are "
                "lightning_rl.core.train_item.TrainItem(TrainingData(episodes=...), timesteps=..., env_runners=...)"
            )
        return TrainItem(TrainingData(batch=train_item))
    raise ValueError(f"training_step takes a TrainItem or a batch dict, got {type(train_item).__name__}")
