"""RLlib's update API: ``Learner.update(...)`` and every ``update_from_*``.

``UpdateApiMixin`` is one part of ``Learner``, which inherits it; it holds no state. ``update``
takes at most one source of data (RLlib's ``batch`` / ``batches`` / ``episodes`` /
``data_iterators``, the replay source of off-policy Learners, or a ``TrainingData`` holding one
of them) and hands it, through one table (``_UPDATE_FROM_SOURCE``), to ``update_from_batch`` /
``update_from_episodes`` / ``update_from_replay`` / ``update_from_iterator``; with no data at
all it runs an update without gradient steps, so the hooks still see the timesteps and
schedules keep moving. Every update runs the same way: ``before_gradient_based_update``, the
minibatch steps (``learner.step_runner``), the steps-trained results, ``after_gradient_based_update``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from lightning_rl.connectors.add_columns import MODULES_TO_TRAIN
from lightning_rl.core.arguments import check_int
from lightning_rl.core.batch import MultiModuleBatch
from lightning_rl.core.columns import ALL_MODULES
from lightning_rl.core.sharding import gathered
from lightning_rl.core.train_item import (
    UPDATE_SETTINGS,
    TrainingData,
    given_sources,
    only_iterator,
)
from lightning_rl.learner.batches import concat_batches, prepare_batch
from lightning_rl.learner.result_keys import (
    DATASET_NUM_ITERS_TRAINED,
    DATASET_NUM_ITERS_TRAINED_LIFETIME,
)
from lightning_rl.learner.step_runner import StepsTrained, log_steps_trained

if TYPE_CHECKING:
    from lightning_rl.env.episode import SingleAgentEpisode
    from lightning_rl.env.multi_agent_episode import MultiAgentEpisode

Results = dict[str, dict[str, float]]

# The epoch and minibatch settings each source of data trains with (``None``: the Learner's own
# settings, which no caller replaces: a replay source samples its own minibatches, and an
# update without data takes no step). An iterator is trained on by draws, so one epoch.
SETTINGS_OF_SOURCE: dict[str | None, tuple[str, ...] | None] = {
    "batch": UPDATE_SETTINGS,
    "batches": UPDATE_SETTINGS,
    "episodes": UPDATE_SETTINGS,
    "data_iterators": ("minibatch_size",),
    "replay": None,
    None: None,
}


class UpdateApiMixin:
    """``update`` and every ``update_from_*`` (a part of ``Learner``)."""

    def update(
        self,
        batch: Mapping[str, Any] | None = None,
        batches: Sequence[Mapping[str, Any]] | None = None,
        episodes: Sequence[Any] | None = None,
        data_iterators: Sequence[Iterable[Any]] | None = None,
        training_data: TrainingData | None = None,
        *,
        timesteps: Mapping[str, float] | None = None,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
    ) -> Results:
        """One update on at most one source of data (RLlib's ``Learner.update``); return the results.

        Args:
            batch: A batch, as ``update_from_batch`` takes it.
            batches: Several batches, concatenated row-wise (per module) into one first.
            episodes: Episodes, as ``update_from_episodes`` takes them.
            data_iterators: Iterables of batches; a single Learner trains on the first
                (``update_from_iterator``) and refuses more than one.
            training_data: A ``TrainingData`` holding one source instead (its ``replay`` goes
                to ``update_from_replay``).
            timesteps: Lifetime counters that drive the schedules, as in ``update_from_batch``.
            num_epochs: Passes over a batch or episodes; must be 1 for ``data_iterators``.
            minibatch_size: Rows (env steps) per gradient step; ``None`` for the whole batch (or
                each drawn batch of an iterator). Stateful modules take whole sequences,
                ``max(1, minibatch_size // max_seq_len)`` of them.
            shuffle_batch_per_epoch: Whether each pass visits rows in a new random order.

        With no source at all, the update takes no gradient step but runs its hooks
        (``before/after_gradient_based_update``), moves the schedules and logs the counters;
        off-policy Learners take such updates until learning starts. A replay source and the
        update without data train with the Learner's own settings, not these three.

        Returns:
            ``{module_id: {key: float}}`` plus ``ALL_MODULES``, as ``update_from_batch`` returns them.

        Raises:
            ValueError: For several sources, ``training_data`` beside another source, more than
                one data iterator, ``num_epochs`` other than 1 with ``data_iterators``, or
                anything the chosen ``update_from_*`` refuses.
        """
        data = _one_source(batch, batches, episodes, data_iterators, training_data)
        settings = dict(num_epochs=num_epochs, minibatch_size=minibatch_size, shuffle_batch_per_epoch=shuffle_batch_per_epoch)
        return _UPDATE_FROM_SOURCE[data.source](self, data, timesteps, settings)

    def update_from_batch(
        self,
        batch: Mapping[str, Any],
        *,
        timesteps: Mapping[str, float] | None = None,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
    ) -> dict[str, dict[str, float]]:
        """Train on ``batch`` for ``num_epochs`` passes of minibatches; return the results.

        Args:
            batch: ``{column: array}`` for a single-module Learner, or
                ``{module_id: {column: array}}``; numpy arrays or tensors. A stateful module's
                batch is sequences (every column ``[S, T, ...]``, ``loss_mask [S, T]``, ``state_in``
                ``{name: array[S, ...]}``), as ``episodes_to_train_batch`` makes it.
            timesteps: Lifetime counters, e.g. ``{"num_env_steps_sampled_lifetime": 4000}``;
                they drive the learning-rate schedules. Left out, the last ones are kept.
            num_epochs: Passes over the batch.
            minibatch_size: Rows (env steps) per gradient step; ``None`` for the whole batch.
                Stateful modules take whole sequences, ``max(1, minibatch_size // max_seq_len)`` of them.
            shuffle_batch_per_epoch: Whether each pass visits rows in a new random order.

        Under a Trainer on several DDP ranks, every rank calls this with its own shard: the
        ranks agree on the modules trained (those with rows on any rank) and on the number
        of minibatch steps (set by the largest shard), so all take the same steps, and a
        rank whose shard lacks a module, or is empty (``{}``), still takes part with zero
        gradients. DDP averages the gradients of every step, each rank's module losses
        weighted by its share of that module's rows, so that a module's gradient is that of
        its mean loss over all ranks' rows (``agree_with_other_ranks``); the results are
        reduced over the ranks. ``num_epochs`` and ``minibatch_size`` must be the same on every rank.

        Returns:
            ``{module_id: {key: float}}`` plus ``ALL_MODULES``: losses, learning rates,
            gradient norms, steps trained (this update and lifetime), ``weights_seq_no``.

        Raises:
            ValueError: for unknown module ids, missing columns, columns of unequal length or
                observations/actions of the wrong shape. Nothing is updated then. On several
                ranks, also (on every rank alike) for ranks given different ``num_epochs``
                or ``minibatch_size``.
        """
        self.built_module  # raises if not built
        if num_epochs < 1:
            raise ValueError(f"num_epochs must be >= 1, got {num_epochs}")
        if minibatch_size is not None and minibatch_size < 1:
            raise ValueError(f"minibatch_size must be >= 1 or None, got {minibatch_size}")
        self._update(
            self._prepare_batch(batch),
            timesteps=dict(timesteps or {}),
            num_epochs=num_epochs,
            minibatch_size=minibatch_size,
            shuffle_batch_per_epoch=shuffle_batch_per_epoch,
        )
        return self.metrics.reduce()


    def update_from_episodes(
        self,
        episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode],
        *,
        timesteps: Mapping[str, float] | None = None,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
    ) -> dict[str, dict[str, float]]:
        """Turn ``episodes`` into a train batch (``episodes_to_train_batch``), then ``update_from_batch``.

        Args:
            episodes: Single-agent episodes (or chunks of them) for this Learner's one module,
                or multi-agent ones, whose agents' steps train the modules their episode maps
                them to (modules not in ``policies_to_train`` get no rows); sampled by the
                current weights for on-policy algorithms.
            timesteps: As in ``update_from_batch``.
            num_epochs: As in ``update_from_batch``.
            minibatch_size: As in ``update_from_batch``.
            shuffle_batch_per_epoch: As in ``update_from_batch``.

        Returns:
            The results of ``update_from_batch``.

        Raises:
            ValueError: For an empty list, an episode without steps, single-agent episodes and
                a Learner with more than one module (they cannot say which module they are
                for), or a multi-agent episode mapping an agent to a module the Learner lacks.
        """
        self.built_module  # raises if not built
        return self.update_from_batch(
            self.episodes_to_train_batch(episodes),
            timesteps=timesteps,
            num_epochs=num_epochs,
            minibatch_size=minibatch_size,
            shuffle_batch_per_epoch=shuffle_batch_per_epoch,
        )


    def update_from_replay(
        self, replay: Any, *, timesteps: Mapping[str, float] | None = None
    ) -> dict[str, dict[str, float]]:
        """Train on minibatches sampled from a replay buffer (off-policy Learners implement it).

        ``OffPolicyDataModule`` hands the Learner its replay buffer with every train item
        (``None`` until learning starts). See ``OffPolicyLearner``.

        Raises:
            NotImplementedError: This Learner learns on-policy, from episodes or batches.
        """
        raise NotImplementedError(
            f"{type(self).__name__} learns on-policy and cannot train from a replay buffer; use an off-policy "
            "Learner (DQNLearner, SACLearner) with lightning_rl.data.OffPolicyDataModule; on-policy Learners use "
            "OnPolicyDataModule"
        )


    def update_from_iterator(
        self,
        iterator: Iterable[Mapping[str, Any]],
        *,
        timesteps: Mapping[str, float] | None = None,
        minibatch_size: int | None = None,
        num_iters: int | None = None,
    ) -> Results:
        """Train on batches drawn from ``iterator``, one iteration per batch drawn; return the results.

        Each drawn batch (what ``update_from_batch`` takes) is one gradient step, or, with
        ``minibatch_size``, one step per ``minibatch_size`` rows of it. The hooks
        (``before/after_gradient_based_update``) run once around the whole call.

        Args:
            iterator: Any iterable of batches: a torch ``DataLoader``, a list, a generator.
            timesteps: Lifetime counters, as in ``update_from_batch``.
            minibatch_size: Rows per gradient step within a drawn batch; ``None`` for the whole batch.
            num_iters: Batches to draw; when one pass over ``iterator`` has fewer, it is
                started again (a ``DataLoader`` reshuffles), and a one-shot iterator (a
                generator) that runs dry ends the update early. ``None`` for one pass.

        Under several DDP ranks, each rank draws from its own iterator; the ranks agree every
        iteration (one all-reduce) and stop together when all have run dry, a rank without a
        batch taking part with zero gradients. ``dataset_num_iters_trained`` (and its
        ``_lifetime`` sum) under ``ALL_MODULES`` count the iterations.

        Returns:
            The results, as ``update_from_batch`` returns them.

        Raises:
            ValueError: For a non-iterable ``iterator``, a bad ``minibatch_size`` or
                ``num_iters``, or a drawn batch that ``update_from_batch`` would refuse.
        """
        self.built_module  # raises if not built
        if isinstance(iterator, (Mapping, str, bytes)) or not isinstance(iterator, Iterable):
            raise ValueError(
                f"update_from_iterator takes an iterable of batches (a DataLoader, a generator), got "
                f"{type(iterator).__name__}; pass a single batch to update_from_batch"
            )
        check_int("minibatch_size", minibatch_size, optional=True)
        check_int("num_iters", num_iters, optional=True)
        timesteps = dict(timesteps or {})
        self.before_gradient_based_update(timesteps=timesteps)
        self.step_runner.attach_trainer()
        trained, num_iters_trained = StepsTrained(), 0
        for batch in _draws(iterator, num_iters):
            prepared = self._prepare_batch(batch) if batch is not None else {}
            if not prepared and not self.step_runner.is_data_parallel():
                break
            step = self._gradient_steps(
                prepared, num_epochs=1, minibatch_size=minibatch_size, shuffle_batch_per_epoch=False
            )
            if step.num_steps == 0:
                break  # every rank has run dry
            trained += step
            num_iters_trained += 1
        log_steps_trained(self.metrics, trained, self.weights_seq_no, self.timesteps)
        log = self.metrics.log_value
        log((ALL_MODULES, DATASET_NUM_ITERS_TRAINED), num_iters_trained, reduce="sum", clear_on_reduce=True)
        log((ALL_MODULES, DATASET_NUM_ITERS_TRAINED_LIFETIME), num_iters_trained, reduce="sum", clear_on_reduce=False)
        self.after_gradient_based_update(timesteps=timesteps)
        return self.metrics.reduce()



    def _update_without_data(self, *, timesteps: Mapping[str, float] | None = None) -> Results:
        """An update that takes no gradient step: hooks, schedules and counters only; return the results.

        Under several DDP ranks every rank calls it at the same point, as any update (the
        ranks still agree that none of them trains).

        Args:
            timesteps: Lifetime counters, as in ``update_from_batch``.
        """
        self.built_module  # raises if not built
        self._update({}, timesteps=dict(timesteps or {}), num_epochs=1, minibatch_size=None, shuffle_batch_per_epoch=False)
        return self.metrics.reduce()

    def episodes_to_train_batch(
        self, episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode]
    ) -> dict[str, dict[str, torch.Tensor]]:
        """Run the Learner connector (``learner_connector``) on ``episodes``: ``{module_id: {column: Tensor}}``.

        The pieces share ``shared_data``, which starts with ``"modules_to_train"``: the ids
        ``should_module_be_updated`` says yes to, so multi-agent episodes give no rows (and
        cost no value predictions) to frozen modules. To add columns, add connector pieces
        (``learner_connector_pieces`` or an override of ``build_learner_connector``) rather
        than overriding this.
        """
        module = self.built_module
        modules_to_train = {mid for mid in module.keys() if self.should_module_be_updated(mid)}
        # Pieces may run the modules (GAE's value predictions): sharded ones are gathered whole meanwhile.
        with gathered(module):
            return self.learner_connector(
                rl_module=module,
                batch={},
                episodes=list(episodes),
                shared_data={MODULES_TO_TRAIN: modules_to_train},
                metrics=self.metrics,
            )


    def _prepare_batch(self, batch: Mapping[str, Any]) -> MultiModuleBatch:
        """A user batch as ``{module_id: {column: Tensor}}`` on our device, checked (``batches.prepare_batch``)."""
        return prepare_batch(
            batch,
            self.module,
            device=self.device,
            required_columns=self.required_batch_columns,
            data_parallel=self.step_runner.is_data_parallel(),
        )

    def _update(
        self,
        batch: MultiModuleBatch,
        *,
        timesteps: dict[str, Any],
        num_epochs: int,
        minibatch_size: int | None,
        shuffle_batch_per_epoch: bool,
    ) -> None:
        """One update on a prepared batch, hooks included; the results stay in ``self.metrics``.

        ``update_from_batch`` reduces them after each call; an update from replay takes
        several of these (one per gradient step) and reduces once. An empty batch (``{}``)
        takes no gradient step but runs the hooks and logs the counters (an update
        without data, see ``update``).
        """
        self.before_gradient_based_update(timesteps=timesteps)
        self.step_runner.attach_trainer()
        trained = self._gradient_steps(
            batch, num_epochs=num_epochs, minibatch_size=minibatch_size, shuffle_batch_per_epoch=shuffle_batch_per_epoch
        )
        log_steps_trained(self.metrics, trained, self.weights_seq_no, self.timesteps)
        self.after_gradient_based_update(timesteps=timesteps)

    def _gradient_steps(
        self, batch: MultiModuleBatch, *, num_epochs: int, minibatch_size: int | None, shuffle_batch_per_epoch: bool
    ) -> StepsTrained:
        """The minibatch steps of ``num_epochs`` passes over the rows of the modules to train (``StepRunner.run``)."""
        # Modules frozen by policies_to_train sit out; so does one a before-update hook removed.
        module = self.module
        batch = {mid: b for mid, b in batch.items() if mid in module and self.should_module_be_updated(mid, batch)}
        return self.step_runner.run(
            batch,
            num_epochs=num_epochs,
            minibatch_size=minibatch_size,
            shuffle=shuffle_batch_per_epoch,
            device=self.device,
        )


def _from_batch(learner: Any, data: TrainingData, timesteps: Any, settings: dict[str, Any]) -> Results:
    return learner.update_from_batch(data.batch, timesteps=timesteps, **settings)


def _from_batches(learner: Any, data: TrainingData, timesteps: Any, settings: dict[str, Any]) -> Results:
    return learner.update_from_batch(concat_batches(data.batches), timesteps=timesteps, **settings)


def _from_episodes(learner: Any, data: TrainingData, timesteps: Any, settings: dict[str, Any]) -> Results:
    return learner.update_from_episodes(data.episodes, timesteps=timesteps, **settings)


def _from_replay(learner: Any, data: TrainingData, timesteps: Any, settings: dict[str, Any]) -> Results:
    # A replay source trains with the Learner's own settings (it samples its own minibatches).
    return learner.update_from_replay(data.replay, timesteps=timesteps)


def _from_data_iterators(learner: Any, data: TrainingData, timesteps: Any, settings: dict[str, Any]) -> Results:
    if settings["num_epochs"] != 1:
        raise ValueError(
            f"num_epochs={settings['num_epochs']} cannot be used with data_iterators (as in RLlib): an iterator is "
            "trained on by steps; pass num_iters to update_from_iterator for more steps than one pass"
        )
    iterator = _the_one_iterator(data.data_iterators)
    return learner.update_from_iterator(iterator, timesteps=timesteps, minibatch_size=settings["minibatch_size"])


def _without_data(learner: Any, data: TrainingData, timesteps: Any, settings: dict[str, Any]) -> Results:
    return learner._update_without_data(timesteps=timesteps)


# How ``update`` trains on each source of data (``TrainingData.source``; ``None`` for no data).
_UPDATE_FROM_SOURCE: dict[str | None, Callable[[Any, TrainingData, Any, dict[str, Any]], Results]] = {
    "batch": _from_batch,
    "batches": _from_batches,
    "episodes": _from_episodes,
    "replay": _from_replay,
    "data_iterators": _from_data_iterators,
    None: _without_data,
}


def _one_source(
    batch: Any, batches: Any, episodes: Any, data_iterators: Any, training_data: TrainingData | None
) -> TrainingData:
    """The arguments of ``update`` as one ``TrainingData``, checked (no source is an update without data)."""
    given = given_sources(batch, batches, episodes, data_iterators, training_data)
    if len(given) > 1:
        raise ValueError(
            f"an update takes at most one source of data (batch, batches, episodes, data_iterators); got {sorted(given)}"
        )
    return TrainingData(**given)


def _the_one_iterator(data_iterators: Sequence[Iterable[Any]]) -> Iterable[Any]:
    """The single iterator a single Learner trains on; several are a LearnerGroup's to share out."""
    return only_iterator(
        data_iterators,
        who="a single Learner trains",
        hint=": a LearnerGroup hands one to each of its learners (or pass one iterator to update_from_iterator)",
    )


def _draws(iterable: Iterable[Any], num_iters: int | None) -> Iterator[Any]:
    """``num_iters`` batches from ``iterable`` (started again as needed), or one pass; then ``None`` forever.

    The trailing ``None``\\ s let a data-parallel rank that has run dry keep taking part until
    every rank has; a one-pass caller stops at the first.
    """
    limit = math.inf if num_iters is None else num_iters
    drawn, iterator = 0, iter(iterable)
    while drawn < limit:
        batch = next(iterator, None)
        if batch is None and num_iters is not None and drawn > 0:
            # One pass was shorter than num_iters: start again; a one-shot iterator stays dry.
            iterator = iter(iterable)
            batch = next(iterator, None)
        if batch is None:
            break
        drawn += 1
        yield batch
    while True:
        yield None
