"""The typed train item: what every data module yields and ``Learner.training_step`` takes.

``TrainingData`` says what one update trains on (RLlib's type of that name, plus the replay
source of off-policy learning); ``TrainItem`` adds what a data module knows about it: the
lifetime counters that drive schedules and the sampling statistics to log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

# The update settings an item may set for its own update (``LearnerGroup`` does).
UPDATE_SETTINGS = ("num_epochs", "minibatch_size", "shuffle_batch_per_epoch")


@dataclasses.dataclass
class TrainingData:
    """What one update trains on: at most one of these sources.

    With none of them set, the update takes no gradient step but still runs its hooks
    (``before/after_gradient_based_update``), so schedules move: an off-policy data module
    yields such items until its replay buffer holds ``learning_starts`` env steps.

    Args:
        batch: ``{column: array}`` for a single-module Learner, or ``{module_id: {column: array}}``.
        batches: Several such batches, concatenated row-wise into one before the update.
        episodes: Episodes (or chunks of them), which the Learner's connector pipeline turns
            into a train batch.
        data_iterators: Iterables of batches (a torch ``DataLoader``, a generator): one gradient
            step per batch drawn (``Learner.update_from_iterator``). Only the first is used by a
            single Learner; a ``LearnerGroup`` hands one to each of its learners.
        replay: A replay buffer that off-policy Learners sample their minibatches from.
    """

    batch: Mapping[str, Any] | None = None
    batches: Sequence[Mapping[str, Any]] | None = None
    episodes: Sequence[Any] | None = None
    data_iterators: Sequence[Iterable[Any]] | None = None
    replay: Any | None = None

    def __post_init__(self) -> None:
        given = self.sources()
        if len(given) > 1:
            raise ValueError(f"TrainingData takes one source of data, got {given}")

    def sources(self) -> list[str]:
        """The names of the sources that are set (none or one)."""
        return [field.name for field in dataclasses.fields(self) if getattr(self, field.name) is not None]

    @property
    def source(self) -> str | None:
        """The name of the one source that is set, or ``None`` for an update without data."""
        given = self.sources()
        return given[0] if given else None


def given_sources(
    batch: Any = None,
    batches: Any = None,
    episodes: Any = None,
    data_iterators: Any = None,
    training_data: TrainingData | None = None,
) -> dict[str, Any]:
    """The data sources among RLlib's ``update(...)`` arguments, by name (``training_data`` unpacked).

    ``Learner.update`` and ``LearnerGroup.update`` take the same arguments and each then says
    how many sources it accepts.

    Raises:
        ValueError: For ``training_data`` beside another source, or one that is not a ``TrainingData``.
    """
    given = dict(batch=batch, batches=batches, episodes=episodes, data_iterators=data_iterators)
    given = {name: value for name, value in given.items() if value is not None}
    if training_data is None:
        return given
    if given:
        raise ValueError(
            f"pass training_data alone or one of batch/batches/episodes/data_iterators, not both; got {sorted(given)} too"
        )
    if not isinstance(training_data, TrainingData):
        raise ValueError(f"training_data must be a TrainingData, got {type(training_data).__name__}")
    return {name: getattr(training_data, name) for name in training_data.sources()}


def only_iterator(data_iterators: Any, *, who: str, hint: str) -> Iterable[Any]:
    """The single iterable of ``data_iterators`` (a list of one), for one learner to draw from.

    Args:
        data_iterators: The ``data_iterators`` argument of an update.
        who: Who trains, for the error (``"a single Learner trains"``).
        hint: What to do instead, appended to the error.

    Raises:
        ValueError: If it is not a list, or holds other than one iterable.
    """
    if isinstance(data_iterators, (Mapping, str, bytes)) or not isinstance(data_iterators, Sequence):
        raise ValueError(f"data_iterators must be a list of iterables, got {type(data_iterators).__name__}")
    if len(data_iterators) != 1:
        raise ValueError(f"{who} on one data iterator, got {len(data_iterators)}{hint}")
    return data_iterators[0]


@dataclasses.dataclass
class TrainItem:
    """One train step's worth of data, as a data module yields it to ``Learner.training_step``.

    Args:
        data: What the update trains on.
        timesteps: Lifetime counters, e.g. ``{"num_env_steps_sampled_lifetime": 4000}``
            (summed over all ranks); they drive the Learner's schedules.
        env_runners: Sampling statistics, logged as ``env_runners/{key}``.
        update_settings: ``num_epochs``, ``minibatch_size`` or ``shuffle_batch_per_epoch`` for
            this update alone, instead of the Learner's own.
        next_cycle: For an item of several sampling cycles (``OffPolicyDataModule(cycles_per_item=k)``):
            called after the update on this item's data, it samples the next cycle with the
            weights that update left and returns it as an item of its own (with its own
            ``next_cycle``), or ``None`` when the item has no more cycles. ``training_step``
            takes one update per cycle, in order, so Lightning's loop, logging and callbacks
            are paid once per item. ``None`` (the default): the item is one cycle.
    """

    data: TrainingData = dataclasses.field(default_factory=TrainingData)
    timesteps: Mapping[str, float] = dataclasses.field(default_factory=dict)
    env_runners: Mapping[str, float] = dataclasses.field(default_factory=dict)
    update_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    next_cycle: Callable[[], TrainItem | None] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.data, TrainingData):
            raise ValueError(f"TrainItem.data must be a TrainingData, got {type(self.data).__name__}")
        unknown = sorted(set(self.update_settings) - set(UPDATE_SETTINGS))
        if unknown:
            raise ValueError(f"TrainItem.update_settings: unknown settings {unknown}; allowed: {list(UPDATE_SETTINGS)}")

    def to(self, device: Any, **kwargs: Any) -> TrainItem:
        """Lightning's device transfer of a train item: the item stays where it is.

        Called by Lightning before each training step (``move_data_to_device`` treats an object
        with ``to`` as one piece, so it does not walk the episodes, replay buffer and counters
        inside, which cost about as much as a small network's gradient step per item). The
        Learner moves what it trains on to its device itself.
        """
        return self
