"""RLlib's current update API: ``Learner.update(...)`` and ``Learner.update_from_iterator(...)``.

``UpdateApiMixin`` is one part of ``Learner``, which inherits it. ``update`` takes at most one
source of data (RLlib's ``batch`` / ``batches`` / ``episodes`` / ``data_iterators``, the
replay source of off-policy Learners, or a ``TrainingData`` holding one of them) and hands it
to the seed methods ``update_from_batch`` / ``update_from_episodes`` / ``update_from_replay``
or to ``update_from_iterator``; with no data at all it runs an update without gradient steps,
so the hooks still see the timesteps and schedules keep moving.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from lightning_rl.core.batch import MultiModuleBatch
from lightning_rl.core.columns import ALL_MODULES
from lightning_rl.core.train_item import TrainingData, given_sources, only_iterator
from lightning_rl.learner._lightning_private import attached_trainer
from lightning_rl.learner.batches import concat_batches
from lightning_rl.learner.data_parallel import agree_with_other_ranks
from lightning_rl.learner.result_keys import DATASET_NUM_ITERS_TRAINED, DATASET_NUM_ITERS_TRAINED_LIFETIME
from lightning_rl.learner.update_loop import StepsTrained, log_steps_trained, run_minibatch_steps

Results = dict[str, dict[str, float]]


class UpdateApiMixin:
    """``update``, ``update_from_iterator`` and the update every ``update_from_*`` runs (a part of ``Learner``)."""

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
            minibatch_size: Rows per gradient step; ``None`` for the whole batch (or each
                drawn batch of an iterator).
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
        source = data.source
        if source == "batch":
            return self.update_from_batch(data.batch, timesteps=timesteps, **settings)
        if source == "batches":
            return self.update_from_batch(concat_batches(data.batches), timesteps=timesteps, **settings)
        if source == "episodes":
            return self.update_from_episodes(data.episodes, timesteps=timesteps, **settings)
        if source == "replay":
            return self.update_from_replay(data.replay, timesteps=timesteps)
        if source == "data_iterators":
            if num_epochs != 1:
                raise ValueError(
                    f"num_epochs={num_epochs} cannot be used with data_iterators (as in RLlib): an iterator is "
                    "trained on by steps; pass num_iters to update_from_iterator for more steps than one pass"
                )
            return self.update_from_iterator(
                _the_one_iterator(data.data_iterators), timesteps=timesteps, minibatch_size=minibatch_size
            )
        return self._update_without_data(timesteps=timesteps)

    def _update_without_data(self, *, timesteps: Mapping[str, float] | None = None) -> Results:
        """An update that takes no gradient step: hooks, schedules and counters only; return the results.

        Under several DDP ranks every rank calls it at the same point, as any update (the
        ranks still agree that none of them trains).

        Args:
            timesteps: Lifetime counters, as in ``update_from_batch``.
        """
        self._check_is_built()
        self._update({}, timesteps=dict(timesteps or {}), num_epochs=1, minibatch_size=None, shuffle_batch_per_epoch=False)
        return self.metrics.reduce()

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
        self._check_is_built()
        if isinstance(iterator, (Mapping, str, bytes)) or not isinstance(iterator, Iterable):
            raise ValueError(
                f"update_from_iterator takes an iterable of batches (a DataLoader, a generator), got "
                f"{type(iterator).__name__}; pass a single batch to update_from_batch"
            )
        for name, value in (("minibatch_size", minibatch_size), ("num_iters", num_iters)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
        timesteps = dict(timesteps or {})
        self.before_gradient_based_update(timesteps=timesteps)
        self._attach_trainer_step()
        trained, num_iters_trained = StepsTrained({}, 0, 0), 0
        for batch in _draws(iterator, num_iters):
            prepared = self._prepare_batch(batch) if batch is not None else {}
            if not prepared and not self._is_data_parallel():
                break
            step = self._gradient_steps(
                prepared, num_epochs=1, minibatch_size=minibatch_size, shuffle_batch_per_epoch=False
            )
            if step.num_steps == 0:
                break  # every rank has run dry
            trained = _add_steps(trained, step)
            num_iters_trained += 1
        self._log_steps_trained(trained)
        log = self.metrics.log_value
        log((ALL_MODULES, DATASET_NUM_ITERS_TRAINED), num_iters_trained, reduce="sum", clear_on_reduce=True)
        log((ALL_MODULES, DATASET_NUM_ITERS_TRAINED_LIFETIME), num_iters_trained, reduce="sum", clear_on_reduce=False)
        self.after_gradient_based_update(timesteps=timesteps)
        return self.metrics.reduce()


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
        self._attach_trainer_step()
        trained = self._gradient_steps(
            batch, num_epochs=num_epochs, minibatch_size=minibatch_size, shuffle_batch_per_epoch=shuffle_batch_per_epoch
        )
        self._log_steps_trained(trained)
        self.after_gradient_based_update(timesteps=timesteps)

    def _gradient_steps(
        self, batch: MultiModuleBatch, *, num_epochs: int, minibatch_size: int | None, shuffle_batch_per_epoch: bool
    ) -> StepsTrained:
        """The minibatch steps of ``num_epochs`` passes over ``batch``, in step with the other DDP ranks.

        Called between the before/after hooks of an update, with the optimizer wrappers set.
        """
        # Modules frozen by policies_to_train sit out; so does one a before-update hook removed.
        batch = {
            mid: b for mid, b in batch.items() if mid in self._module and self.should_module_be_updated(mid, batch)
        }
        self._modules_in_update, num_rows_per_pass = None, None
        if self._sharding_mesh is not None and not self._is_running_under_trainer():
            # Outside its Trainer the ranks would not agree on their steps, and could wait on each other forever.
            raise ValueError(
                f"{type(self).__name__}'s modules are sharded (FSDP2): it updates only within the Trainer that "
                "sharded them (Trainer.fit, or a LearnerGroup), where the ranks keep in step"
            )
        if self._is_data_parallel():
            self._modules_in_update, num_rows_per_pass = agree_with_other_ranks(
                attached_trainer(self).strategy,
                list(self._module.keys()),
                batch,
                num_epochs=num_epochs,
                minibatch_size=minibatch_size,
                device=self.device,
            )
        trained = StepsTrained({}, 0, 0)
        try:
            if batch or self._modules_in_update:
                trained = run_minibatch_steps(
                    self._minibatch_step_fn,
                    batch,
                    num_epochs=num_epochs,
                    minibatch_size=minibatch_size,
                    shuffle=shuffle_batch_per_epoch,
                    num_rows_per_pass=num_rows_per_pass,
                )
        finally:
            self._modules_in_update = None
        return trained

    def _log_steps_trained(self, trained: StepsTrained) -> None:
        """Count an update's steps into ``weights_seq_no`` and log them (``update_loop.log_steps_trained``).

        Only steps that changed the weights count: one whose optimizers all skipped for
        non-finite gradients does not, so a ``TargetNetworkUpdate`` does not fire on it.
        """
        self._weights_seq_no += trained.num_steps_applied  # counted here to keep the step lean
        log_steps_trained(self.metrics, trained, self._weights_seq_no, self._timesteps)


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


def _add_steps(total: StepsTrained, step: StepsTrained) -> StepsTrained:
    """Two counts of steps trained, summed."""
    rows = dict(total.module_rows)
    for module_id, count in step.module_rows.items():
        rows[module_id] = rows.get(module_id, 0) + count
    return StepsTrained(
        rows,
        total.num_steps + step.num_steps,
        total.env_steps + step.env_steps,
        total.num_steps_applied + step.num_steps_applied,
    )
