"""The data of one LearnerGroup update: its one source, batches joined, shards for N learners.

``LearnerGroup.update`` takes RLlib's data arguments; ``update_source`` reduces them to one
batch (``batches`` joined, for learner processes in shared memory, where they read it), one
list of episodes or (for a local learner) one iterator, and ``update_settings``
checks the epoch and minibatch settings. With N learner processes, ``split_batch`` cuts a batch into N
contiguous near-equal shards of rows and ``split_episodes`` deals episodes out in N groups of
about equal env steps (an episode is never split).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lightning_rl.core.train_item import TrainingData, given_sources, only_iterator
from lightning_rl.learner.batches import concat_batches
from lightning_rl.learner.group._episodes import check_episode_kinds
from lightning_rl.learner.group._protocol import to_numpy
from lightning_rl.learner.group._shared import can_build_in_place, has_room, shared_empty


def update_source(
    *,
    batch: Mapping[str, Any] | None,
    batches: Sequence[Mapping[str, Any]] | None,
    episodes: Sequence[Any] | None,
    data_iterators: Sequence[Any] | None,
    training_data: TrainingData | None,
    num_learners: int,
    join_in_shared_memory: bool,
) -> tuple[str, Any]:
    """The one data source of an update, as ``("batch", batch)``, ``("episodes", list)`` or ``("iterator", it)``.

    ``batches`` are concatenated row-wise into one batch; ``training_data`` is unpacked.
    ``num_learners`` is the group's (0: one learner in this process, the only one that can
    draw from an iterator the caller holds). ``join_in_shared_memory``: whether the learners read
    a batch in torch's shared memory where it is (learner processes that can open the driver's
    files), so ``batches`` are joined there when the sharing strategy and ``/dev/shm`` allow.

    Raises:
        ValueError: For no source or several, a replay source (not supported by a
            LearnerGroup), ``data_iterators`` for learner processes or other than one of
            them for a local learner, an empty list of batches or episodes, or batches that
            do not concatenate (different modules' layouts or columns).
    """
    given = given_sources(batch, batches, episodes, data_iterators, training_data)
    if len(given) != 1:
        raise ValueError(
            f"an update takes exactly one source of data: batch=, batches=, episodes= or training_data= holding "
            f"one of them; got {sorted(given) or 'none'}"
        )
    source, value = next(iter(given.items()))
    if source == "batches":
        return _joined_batches(value, join_in_shared_memory)
    return _PREPARE_SOURCE[source](source, value, num_learners)


def _as_batch(source: str, batch: Any, num_learners: int) -> tuple[str, Any]:
    return "batch", batch


def _joined_batches(batches: Any, in_shared_memory: bool) -> tuple[str, Any]:
    # Learner processes read a batch in shared memory where it is: the group's own join is
    # written there, so the update holds the caller's batches and the join (2x), not also a copy.
    in_place = in_shared_memory and can_build_in_place() and has_room(_nbytes(batches))
    return "batch", concat_batches(batches, empty=shared_empty if in_place else None)


def _nbytes(value: Any) -> int:
    """The bytes of the arrays and tensors in nested dicts and lists (0 for anything else)."""
    if isinstance(value, Mapping):
        return sum(_nbytes(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(item) for item in value)
    return int(value.nbytes) if isinstance(value, (np.ndarray, torch.Tensor)) else 0


def _episode_list(source: str, episodes: Any, num_learners: int) -> tuple[str, Any]:
    if isinstance(episodes, (str, bytes, Mapping)) or not isinstance(episodes, Sequence) or not episodes:
        raise ValueError(f"episodes must be a non-empty list of episodes, got {type(episodes).__name__}")
    check_episode_kinds(episodes)
    return "episodes", list(episodes)


def _local_iterator(source: str, data_iterators: Any, num_learners: int) -> tuple[str, Any]:
    if num_learners == 0:
        return "iterator", _the_local_iterator(data_iterators)
    return _refused(source, data_iterators, num_learners)


def _refused(source: str, value: Any, num_learners: int) -> tuple[str, Any]:
    raise ValueError(
        f"LearnerGroup cannot train from {source} (its learners would each need their own, in their own "
        "process); it trains on batch=, batches= (concatenated) or episodes=. Draw the batches yourself and "
        "pass them as batch= or batches="
    )


# How a LearnerGroup prepares each source of data but ``batches`` (``_joined_batches``), by
# ``TrainingData``'s field names: which ``update_from_*`` its learners run ("batch", "episodes"
# or, for a local learner, "iterator"), and on what. A replay buffer, or iterators for learner
# processes, are refused.
_PREPARE_SOURCE = {
    "batch": _as_batch,
    "episodes": _episode_list,
    "data_iterators": _local_iterator,
    "replay": _refused,
}


def _the_local_iterator(data_iterators: Any) -> Any:
    """The one iterator a group's local learner (``num_learners=0``) trains on."""
    return only_iterator(
        data_iterators,
        who="a LearnerGroup with num_learners=0 trains its one learner",
        hint="; pass data_iterators=[iterator], or draw the batches yourself and pass them as batch= or batches=",
    )


def update_settings(
    timesteps: Mapping[str, float] | None, num_epochs: int, minibatch_size: int | None, shuffle_batch_per_epoch: bool
) -> dict[str, Any]:
    """The keyword arguments of ``Learner.update_from_*``, checked here so bad ones never reach a learner."""
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1, got {num_epochs!r}")
    if minibatch_size is not None and (
        isinstance(minibatch_size, bool) or not isinstance(minibatch_size, int) or minibatch_size < 1
    ):
        raise ValueError(f"minibatch_size must be >= 1 or None, got {minibatch_size!r}")
    if timesteps is not None and not isinstance(timesteps, Mapping):
        raise ValueError(f"timesteps must be a dict of counters, got {type(timesteps).__name__}")
    return dict(
        timesteps=None if timesteps is None else {key: float(value) for key, value in timesteps.items()},
        num_epochs=num_epochs,
        minibatch_size=minibatch_size,
        shuffle_batch_per_epoch=bool(shuffle_batch_per_epoch),
    )


def iterator_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """``update_settings`` as ``Learner.update_from_iterator`` takes them: no epochs (RLlib refuses them too)."""
    if settings["num_epochs"] != 1:
        raise ValueError(
            f"num_epochs={settings['num_epochs']} cannot be used with data_iterators (as in RLlib): an iterator is "
            "trained on by steps, one per batch drawn"
        )
    return dict(timesteps=settings["timesteps"], minibatch_size=settings["minibatch_size"])


def split_batch(batch: Any, n: int) -> list[dict[str, Any]]:
    """Cut every module's rows into ``n`` contiguous near-equal shards (numpy); empty ones are left out."""
    if not isinstance(batch, Mapping) or not batch:
        raise ValueError(
            f"a batch must be a non-empty dict of columns or of module batches, got {type(batch).__name__}"
        )
    nested = [isinstance(value, Mapping) for value in batch.values()]
    if any(nested) and not all(nested):
        raise ValueError("a batch must map either columns to arrays or module ids to column dicts, not both")
    if not all(nested):
        return [part or {} for part in _split_columns(batch, n, "the batch")]
    shards: list[dict[str, Any]] = [{} for _ in range(n)]
    for module_id, module_batch in batch.items():
        for shard, part in zip(shards, _split_columns(module_batch, n, f"module {module_id!r}")):
            if part:
                shard[module_id] = part
    return shards


def _split_columns(columns: Mapping[str, Any], n: int, where: str) -> list[dict[str, np.ndarray] | None]:
    if not columns:
        raise ValueError(f"{where} has no columns")
    arrays = {column: to_numpy(values) for column, values in columns.items()}
    lengths = {column: (len(values) if values.ndim > 0 else 0) for column, values in arrays.items()}
    if len(set(lengths.values())) != 1 or 0 in lengths.values():
        raise ValueError(f"{where}: columns must have the same, non-zero number of rows; got {lengths}")
    bounds = _even_bounds(next(iter(lengths.values())), n)
    return [
        {column: values[start:stop] for column, values in arrays.items()} if stop > start else None
        for start, stop in itertools.pairwise(bounds)
    ]


def split_episodes(episodes: list[Any], n: int) -> list[list[Any]]:
    """Deal ``episodes`` out in ``n`` contiguous groups of about equal env steps; an episode is never split.

    A multi-agent episode counts its env steps (``len``), as RLlib shards them: its agents'
    steps stay together, so each module's rows on a learner come from whole episodes.
    """
    lengths = [max(len(episode), 0) for episode in episodes]
    if all(length == 1 for length in lengths) or sum(lengths) == 0:
        bounds = _even_bounds(len(episodes), n)
    else:
        bounds = _weighted_bounds(lengths, n)
    return [episodes[start:stop] for start, stop in itertools.pairwise(bounds)]


def _even_bounds(count: int, n: int) -> list[int]:
    """``n + 1`` cut points that split ``count`` items into contiguous parts, the first ``count % n`` one longer.

    As ``np.array_split``, from the count alone: a batch's rows are never listed one by one (a
    list of a million rows' weights held 8 bytes per row in the driver, kept by the allocator
    past the update).
    """
    sizes = [count // n + (1 if part < count % n else 0) for part in range(n)]
    return [0, *np.cumsum(sizes).tolist()]


def _weighted_bounds(weights: list[int], n: int) -> list[int]:
    """``n + 1`` cut points that split items of these weights into contiguous, near-equal parts.

    Each item goes to the part that contains its middle.
    """
    total = float(sum(weights))
    parts, before = [], 0.0
    for weight in weights:
        parts.append(min(n - 1, int(n * (before + weight / 2) / total)))
        before += weight
    return [0, *[int(np.searchsorted(parts, part, side="right")) for part in range(n)]]
