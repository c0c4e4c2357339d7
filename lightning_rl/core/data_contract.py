"""The data contract: what a data source offers a Learner, and what a Learner requires of its data.

A Learner and a data module meet under ``Trainer.fit`` and never import each other (layers:
``learner | data``). They talk through the two declarations here, and nothing else:

- ``DataOffer``: what a data source offers the Learner: the spaces of the modules it samples
  for (one pair for any module, or a pair per module id), the rows of one train item, the
  ``TrainingData`` sources its train items hold, and what its step count counts (the name
  checkpoint files carry it under).
- ``DataRequirements``: what a Learner requires of its data: the sources it trains from, the
  rows of its minibatches, the columns of each module's batch, the discount ``gamma``
  and ``n_step`` that rows carrying returns must be computed with, and which modules are
  stateful (train on sequences of ``max_seq_len`` steps rather than rows).

A data module that implements ``DataSource`` (every lightning_rl data module does) hands its
offer to the Learner (``data_offer``) and receives the Learner's requirements in return
(``accept_requirements``). ``Learner.setup`` does both, once, and ``check_data_fits`` checks
the two against each other there (and in the CLI, before anything is built): one error naming
the Learner class and the data module class. A data module that is not a ``DataSource`` (a
plain ``LightningDataModule`` yielding batch dicts) offers nothing: the Learner's spec must
carry its spaces, and nothing about it is checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

import gymnasium as gym

from lightning_rl.core.train_item import TrainingData

#: ``(observation_space, action_space)`` of one module.
SpacePair = tuple[gym.Space, gym.Space]

#: ``DataOffer.step_name`` of data sampled from envs: the count is env steps sampled (RLlib's
#: ``num_env_steps_sampled_lifetime``).
ENV_STEPS = "env_steps"
#: ``DataOffer.step_name`` of an offline dataset: the count is dataset rows (recorded env steps) trained on.
DATASET_ROWS = "dataset_rows"

#: The names of the sources a train item's ``TrainingData`` may hold.
TRAINING_DATA_SOURCES: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(TrainingData))


def _check_sources(sources: frozenset[str], owner: str) -> None:
    """Raise unless ``sources`` is a frozenset of ``TrainingData`` field names."""
    if not isinstance(sources, frozenset):
        raise ValueError(f"{owner}.sources must be a frozenset of {list(TRAINING_DATA_SOURCES)}, got {sources!r}")
    unknown = sorted(sources - set(TRAINING_DATA_SOURCES))
    if unknown:
        raise ValueError(
            f"{owner}.sources names {unknown}, which are not TrainingData sources {list(TRAINING_DATA_SOURCES)}"
        )


@dataclasses.dataclass(frozen=True)
class DataOffer:
    """What a data source offers the Learner; its ``data_offer()`` returns it.

    Reading the offer is cheap (the CLI checks it before any env is built); the spaces are
    read only when the Learner builds its modules, since reading them may build the envs.

    Args:
        sources: The ``TrainingData`` fields its train items set (``"episodes"``,
            ``"replay"``, ``"batch"``, ``"batches"``, ``"data_iterators"``). Items that set none
            (an update without data, to run the hooks) may come from any source.
        train_batch_size: The rows (env steps) one train item brings on one rank for the
            Learner to cut into minibatches; ``None`` when its items bring none to cut (a replay
            buffer the Learner samples, iterators of ready minibatches) or their size varies.
        spaces: Single-agent data: returns the one ``(observation_space, action_space)`` pair
            that every module whose spec lacks a space takes.
        module_spaces: Multi-agent data: returns ``{module_id: (observation_space,
            action_space)}``, a pair per module its agents map to (see
            ``learner.lightning_hooks.specs_for_module_spaces`` for how a spec takes them).
            At most one of ``spaces`` and ``module_spaces``; neither when the source knows no
            spaces.
        step_name: What the ``num_env_steps_sampled_lifetime`` of its train items' ``timesteps``
            counts, as a name (a Python identifier): ``ENV_STEPS`` (``"env_steps"``) for data
            sampled from envs, ``DATASET_ROWS`` (``"dataset_rows"``) for an offline dataset. That
            count is the loggers' step (the x-axis), and ``ModelCheckpoint`` files without a
            ``filename`` of their own are named ``epoch={epoch}-{step_name}={count}.ckpt``
            (``learner.checkpoint_names``). ``None`` (a source that does not say): Lightning's
            names, ``epoch=...-step=....ckpt``.

    Raises:
        ValueError: For sources that are not ``TrainingData`` fields, a ``train_batch_size``
            that is not an int >= 1, both kinds of spaces, or a ``step_name`` that is not an identifier.
    """

    sources: frozenset[str]
    train_batch_size: int | None = None
    spaces: Callable[[], SpacePair] | None = None
    module_spaces: Callable[[], Mapping[str, SpacePair]] | None = None
    step_name: str | None = None

    def __post_init__(self) -> None:
        _check_sources(self.sources, "DataOffer")
        if self.step_name is not None and not (isinstance(self.step_name, str) and self.step_name.isidentifier()):
            raise ValueError(f"DataOffer.step_name must be a name such as {ENV_STEPS!r}, got {self.step_name!r}")
        size = self.train_batch_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"DataOffer.train_batch_size must be an int >= 1 or None, got {size!r}")
        if self.spaces is not None and self.module_spaces is not None:
            raise ValueError("a DataOffer offers spaces for any module or module_spaces per module id, not both")

    def single_spaces(self) -> tuple[gym.Space | None, gym.Space | None]:
        """The one pair ``spaces`` offers for any module, read now; ``(None, None)`` if it offers none."""
        return self.spaces() if self.spaces is not None else (None, None)


@dataclasses.dataclass(frozen=True)
class SampleReuse:
    """How a Learner trained by asynchronous samplers (IMPALA, APPO) wants its data, under RLlib's names.

    The samplers act with weights that lag the Learner's; the data source keeps the last
    ``circular_buffer_num_batches`` rollouts and hands each to the Learner up to
    ``circular_buffer_iterations_per_batch`` times, so the Learner does not wait for envs
    while there is data to reuse.

    Args:
        circular_buffer_num_batches: Rollouts kept for reuse; the oldest is dropped when a new one arrives.
        circular_buffer_iterations_per_batch: Updates one rollout may feed at most.
        broadcast_interval: Updates between two sendings of the Learner's weights to the samplers.

    Raises:
        ValueError: Naming the setting, for a value that is not an int >= 1.
    """

    circular_buffer_num_batches: int = 1
    circular_buffer_iterations_per_batch: int = 1
    broadcast_interval: int = 1

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field.name} must be an int >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class DataRequirements:
    """What a Learner requires of its data; its ``data_requirements()`` returns it.

    Args:
        learner: The Learner's class name, for errors on either side.
        sources: The ``TrainingData`` fields it trains from.
        minibatch_size: Rows per gradient step that it cuts from a train item's rows;
            ``None`` when it trains on each item's rows whole.
        columns: ``{module_id: columns}``: what each module's batch must hold (the Learner's
            ``required_batch_columns``), for sources that deliver columns as they are stored
            (an offline dataset).
        gamma: The discount that returns in the rows (``value_targets``) must be computed
            with; ``None`` if the Learner has none.
        n_step: The steps summed into each return before bootstrapping; ``None`` if the
            Learner does not bootstrap from n-step rows.
        suggestion: What to use instead, appended to a mismatch error
            (``"use lightning_rl.data.OffPolicyDataModule"``).
        max_seq_lens: ``{module_id: max_seq_len}`` of each stateful (recurrent) module: it
            trains on sequences of that many steps (``[S, T, ...]`` columns, ``loss_mask``,
            ``state_in``; see ``lightning_rl.core.sequences``), not on rows. A module not
            named here is feed-forward.
        sample_reuse: For a data source whose samplers run apart from the Learner
            (``AsyncSamplingDataModule``): how often it sends the Learner's weights to them and
            how many times it may train on one rollout (``SampleReuse``); ``None`` for the
            source's own defaults (weights after every update, each rollout once). Sources
            that sample with the current weights ignore it.

    Raises:
        ValueError: For sources that are not ``TrainingData`` fields.
    """

    learner: str
    sources: frozenset[str]
    minibatch_size: int | None = None
    columns: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    gamma: float | None = None
    n_step: int | None = None
    suggestion: str = ""
    max_seq_lens: Mapping[str, int] = dataclasses.field(default_factory=dict)
    sample_reuse: SampleReuse | None = None

    def __post_init__(self) -> None:
        _check_sources(self.sources, "DataRequirements")


@runtime_checkable
class DataSource(Protocol):
    """A data module that declares what it offers the Learner and takes the Learner's requirements.

    ``Learner.setup`` (under ``Trainer.fit``, after the data module's own ``setup``) calls
    ``data_offer`` to fill its specs' missing spaces and check the offer against its
    requirements, builds its modules, then calls ``accept_requirements``. The CLI calls
    ``data_offer`` once more before the run, to fail before anything is built.
    """

    def data_offer(self) -> DataOffer:
        """What this data source offers the Learner (cheap; spaces are read lazily)."""
        ...

    def accept_requirements(self, requirements: DataRequirements) -> None:
        """Receive the Learner's requirements, after the Learner was built and before the first train item.

        Args:
            requirements: What the Learner requires; a source that computes rows for the
                Learner (an offline dataset's returns) settles its columns, ``gamma`` and
                ``n_step`` from it. Raise a ``ValueError`` naming ``requirements.learner``
                if it cannot meet them.
        """
        ...


def data_offer_of(datamodule: object) -> DataOffer | None:
    """``datamodule``'s offer, or ``None`` if it is not a ``DataSource`` (or there is none)."""
    return datamodule.data_offer() if isinstance(datamodule, DataSource) else None


def check_data_fits(requirements: DataRequirements, offer: DataOffer | None, data_name: str) -> None:
    """Check a data source's offer against a Learner's requirements: the one check of the contract.

    Called by ``Learner.check_fits_data``: at ``Learner.setup`` under ``Trainer.fit``, and by
    the CLI once the Learner and the data module exist. Nothing offered (``offer=None``, a data
    module that is not a ``DataSource``) is never refused.

    Args:
        requirements: The Learner's ``data_requirements()``.
        offer: The data module's ``data_offer()``, or ``None``.
        data_name: The data module's class name, for the error.

    Raises:
        ValueError: One line naming the Learner class and ``data_name``: if the data's train
            items hold a source the Learner does not train from, or if the Learner's
            ``minibatch_size`` is larger than the rows one train item brings.
    """
    if offer is None:
        return
    refused = sorted(offer.sources - requirements.sources)
    if refused:
        suggestion = f": {requirements.suggestion}" if requirements.suggestion else ""
        raise ValueError(
            f"{requirements.learner} trains from {sorted(requirements.sources)}, but the data module {data_name} "
            f"yields train items of {refused}{suggestion}"
        )
    minibatch_size, train_batch_size = requirements.minibatch_size, offer.train_batch_size
    if minibatch_size is not None and train_batch_size is not None and minibatch_size > train_batch_size:
        raise ValueError(
            f"{requirements.learner}: minibatch_size={minibatch_size} is larger than the data module's train batch of "
            f"{train_batch_size} env steps ({data_name}.train_batch_size); lower minibatch_size or sample more steps "
            "per train item"
        )
