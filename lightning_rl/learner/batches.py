"""What a Learner accepts to train on, checked at the boundary.

``prepare_batch`` turns a user's batch (flat ``{column: array}`` for a one-module Learner,
or ``{module_id: {column: array}}``) into tensors on the Learner's device, checking module
ids, required columns, row counts and observation/action shapes before anything trains.
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
            observation space's against its flat layout, ``[B, flatdim]``).
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
        lengths = {column: _num_rows(values) for column, values in columns.items()}
        if data_parallel and set(lengths.values()) == {0}:
            continue  # no rows of this module on this rank
        if len(set(lengths.values())) != 1 or 0 in lengths.values():
            raise ValueError(
                f"module {module_id!r}: columns must have the same, non-zero number of rows; got {lengths}"
            )
        rl_module = module[module_id]
        # A stateful module's rows are sequences: each step is checked as a row is.
        steps = _sequence_steps(module_id, columns) if rl_module.is_stateful() else columns
        obs_space = observation_part(rl_module.observation_space)
        # A Dict or Tuple observation is stored flat: its obs column holds gymnasium's flatten layout.
        stored = stored_observation_space(obs_space)
        described = None if stored is obs_space else f"the flat layout (gym.spaces.flatten) of the {obs_space}"
        check_column_shape(module_id, Columns.OBS, steps.get(Columns.OBS), stored, "observation", described=described)
        check_column_shape(module_id, Columns.ACTIONS, steps.get(Columns.ACTIONS), rl_module.action_space, "action")
        check_action_mask_column(module_id, steps, rl_module.observation_space)
        prepared[module_id] = columns
    return prepared


def _to_tensors(values: Any, device: torch.device) -> Any:
    # A sequence batch's state_in is {name: array[S, ...]}.
    if isinstance(values, Mapping):
        return {name: to_tensor(value, device) for name, value in values.items()}
    return to_tensor(values, device)


def _num_rows(values: Any) -> int:
    if isinstance(values, Mapping):
        return len(next(iter(values.values()))) if values else 0
    return len(values) if values.dim() > 0 else 0


def _sequence_steps(module_id: str, columns: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A stateful module's sequence batch, checked, with every ``[S, T, ...]`` column as steps ``[S * T, ...]``.

    Raises:
        ValueError: Without ``loss_mask [S, T]`` or a ``state_in`` dict.
    """
    loss_mask = columns.get(Columns.LOSS_MASK)
    if loss_mask is None or loss_mask.dim() != 2 or not isinstance(columns.get(Columns.STATE_IN), Mapping):
        raise ValueError(
            f"module {module_id!r} is stateful (recurrent): its batch must be sequences, every column [S, T, ...] "
            f"with {Columns.LOSS_MASK!r} [S, T] and {Columns.STATE_IN!r} {{name: Tensor[S, ...]}}, as the Learner "
            "connector's AddTimeDimToBatchAndZeroPad makes them from episodes (update(episodes=...)); got columns "
            f"{sorted(columns)}"
        )
    return {
        column: values.reshape(-1, *values.shape[2:])
        for column, values in columns.items()
        if column != Columns.STATE_IN and values.dim() >= 2
    }


# Allocates a joined column: ``empty(shape, dtype)`` -> an uninitialized CPU tensor.
EmptyTensor = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]


def concat_batches(batches: Sequence[Mapping[str, Any]], *, empty: EmptyTensor | None = None) -> dict[str, Any]:
    """Join batches row-wise: all ``{column: array}`` or all ``{module_id: {column: array}}``.

    In nested batches a module may be missing from some; its rows are those of the batches
    that hold it. Tensors stay tensors when every part is one; anything else becomes numpy.

    Args:
        batches: The batches to join.
        empty: Where to write each joined column (e.g. a tensor in shared memory): the column is
            then that tensor, written in place, whatever the parts are. A column it cannot hold
            (parts on another device, of a dtype torch lacks, of no rows dimension) is joined
            as without it.

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
        return _concat_columns(batches, "batches", empty)
    joined: dict[str, Any] = {}
    for module_id in dict.fromkeys(module_id for batch in batches for module_id in batch):
        parts = [batch[module_id] for batch in batches if module_id in batch]
        joined[module_id] = _concat_columns(parts, f"module {module_id!r} of batches", empty)
    return joined


def _layout(batch: Any, index: int) -> str:
    if not isinstance(batch, Mapping) or not batch:
        raise ValueError(f"batches[{index}] must be a non-empty dict, got {type(batch).__name__}")
    nested = {isinstance(value, Mapping) for value in batch.values()}
    if len(nested) > 1:
        raise ValueError(f"batches[{index}] maps both columns to arrays and module ids to column dicts")
    return "modules" if nested == {True} else "columns"


def _concat_columns(parts: Sequence[Mapping[str, Any]], where: str, empty: EmptyTensor | None) -> dict[str, Any]:
    columns = list(parts[0])
    for part in parts[1:]:
        if set(part) != set(columns):
            raise ValueError(f"{where}: every batch must have the same columns, got {sorted(columns)} and {sorted(part)}")
    return {column: _concat([part[column] for part in parts], empty) for column in columns}


def _concat(arrays: list[Any], empty: EmptyTensor | None) -> Any:
    if all(isinstance(array, torch.Tensor) for array in arrays):
        if empty is None or any(array.device.type != "cpu" or array.dim() == 0 for array in arrays):
            return torch.cat(arrays)
        dtype = arrays[0].dtype
        for array in arrays[1:]:
            dtype = torch.promote_types(dtype, array.dtype)  # what torch.cat would return
        return torch.cat(arrays, out=empty(_joined_shape(arrays), dtype))
    parts = [array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array) for array in arrays]
    dtype = np.result_type(*parts)  # what np.concatenate would return
    if empty is None or any(part.ndim == 0 for part in parts) or dtype.hasobject:
        return np.concatenate(parts)
    try:
        torch_dtype = torch.from_numpy(np.empty(0, dtype)).dtype
    except TypeError:  # a dtype torch lacks (strings, dates)
        return np.concatenate(parts)
    joined = empty(_joined_shape(parts), torch_dtype)
    np.concatenate(parts, out=joined.numpy())
    return joined


def _joined_shape(arrays: list[Any]) -> tuple[int, ...]:
    """The shape of ``arrays`` joined along their first dimension (a mismatch is left for the join to refuse)."""
    return (sum(int(array.shape[0]) for array in arrays), *arrays[0].shape[1:])


def _module_batches(batch: Mapping[str, Any], module: MultiRLModule) -> dict[str, Mapping[str, Any]]:
    """``batch`` as ``{module_id: module_batch}``; a flat batch goes to the only module."""
    nested = [isinstance(value, Mapping) for value in batch.values()]
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
    module_id: str, column: str, values: torch.Tensor | None, space: Any, kind: str, *, described: str | None = None
) -> None:
    """Raise if a column's per-row shape does not match its gymnasium space.

    Args:
        module_id: The module the column belongs to (named in the error).
        column: The column's name.
        values: The column, ``[B, ...]``; ``None`` when the batch does not hold it.
        space: The module's space for the column; one without a flat shape (Dict, Tuple) is not checked.
        kind: ``"observation"`` or ``"action"``, for the error message.
        described: What the error calls ``space``; ``None`` for ``"the {kind} space {space}"``.
    """
    expected = getattr(space, "shape", None)
    if values is None or expected is None:
        return
    if tuple(values.shape[1:]) != tuple(expected):
        what = described or f"the {kind} space {space}"
        raise ValueError(
            f"module {module_id!r}: column {column!r} has shape {tuple(values.shape)}, but {what} "
            f"expects [batch, {', '.join(map(str, expected))}]".replace("[batch, ]", "[batch]")
        )


def check_action_mask_column(module_id: str, columns: Mapping[str, torch.Tensor], observation_space: Any) -> None:
    """Raise if a module on a masked observation space lacks a fitting ``action_mask`` column.

    Args:
        module_id: The module the columns belong to (named in the error).
        columns: The module's batch, ``{column: Tensor[B, ...]}``.
        observation_space: The module's observation space; only a masked one
            (:func:`~lightning_rl.core.action_masks.is_action_masked_space`) is checked.
    """
    if not is_action_masked_space(observation_space):
        return
    mask = columns.get(Columns.ACTION_MASK)
    if mask is None:
        raise ValueError(
            f"module {module_id!r} is built on a masked observation space, so its batch needs the column "
            f"{Columns.ACTION_MASK!r} (which actions were legal at each row); it has {sorted(columns)}"
        )
    check_column_shape(module_id, Columns.ACTION_MASK, mask, observation_space[Columns.ACTION_MASK], "action mask")


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
