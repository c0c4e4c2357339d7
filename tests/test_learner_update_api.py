"""RLlib's current update API: ``Learner.update(...)`` and ``Learner.update_from_iterator(...)``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _helpers import assert_same_tensors, bc_spec, loader_of, make_trainer, random_batch, weights
from ranks import run_on_ranks
from torch.utils.data import DataLoader, Dataset

from lightning_rl import ALL_MODULES, Columns, TrainingData, TrainItem
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.learner.result_keys import (
    DATASET_NUM_ITERS_TRAINED,
    DATASET_NUM_ITERS_TRAINED_LIFETIME,
    WEIGHTS_SEQ_NO,
)


class CountingBCLearner(BCLearner):
    """BC that counts its before/after-update hooks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hook_calls: list[str] = []

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().before_gradient_based_update(timesteps=timesteps)
        self.hook_calls.append("before")

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        self.hook_calls.append("after")


def _learner(**kwargs: Any) -> CountingBCLearner:
    torch.manual_seed(0)
    learner = CountingBCLearner(bc_spec(), **kwargs)
    learner.build()
    return learner


class _Rows(Dataset):
    """The rows of one batch, for a torch DataLoader."""

    def __init__(self, batch: dict[str, np.ndarray]) -> None:
        self.batch = batch

    def __len__(self) -> int:
        return len(self.batch[Columns.OBS])

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {column: values[index] for column, values in self.batch.items()}


def _batches(count: int, rows: int = 16) -> list[dict[str, np.ndarray]]:
    return [random_batch(rows, seed=seed) for seed in range(count)]


# ---------------------------------------------------------------------------------------
# update(...)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        lambda b: dict(batch=b),
        lambda b: dict(training_data=TrainingData(batch=b)),
        lambda b: dict(batches=[{k: v[:24] for k, v in b.items()}, {k: v[24:] for k, v in b.items()}]),
    ],
    ids=["batch", "training_data", "batches"],
)
def test_update_trains_exactly_as_update_from_batch(source):
    batch = random_batch(64)
    by_seed_api, by_update = _learner(), _learner()
    expected = by_seed_api.update_from_batch(batch, num_epochs=2, minibatch_size=16)
    results = by_update.update(**source(batch), num_epochs=2, minibatch_size=16)
    assert_same_tensors(weights(by_update), weights(by_seed_api))
    assert results[ALL_MODULES][WEIGHTS_SEQ_NO] == expected[ALL_MODULES][WEIGHTS_SEQ_NO] == 8


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch=random_batch(4), episodes=[object()]), "at most one source"),
        (dict(batch=random_batch(4), training_data=TrainingData()), "training_data alone"),
        (dict(training_data={"batch": random_batch(4)}), "must be a TrainingData"),
        (dict(data_iterators=[[random_batch(4)], [random_batch(4)]]), "LearnerGroup"),
        (dict(data_iterators=[[random_batch(4)]], num_epochs=2), "num_epochs=2 cannot be used with data_iterators"),
    ],
    ids=["two_sources", "training_data_and_batch", "untyped_training_data", "two_iterators", "num_epochs"],
)
def test_update_refuses_unclear_data_naming_the_problem(kwargs, message):
    learner = _learner()
    before = weights(learner)
    with pytest.raises(ValueError, match=message):
        learner.update(**kwargs)
    assert_same_tensors(weights(learner), before)


def test_update_without_data_runs_the_hooks_and_moves_the_schedules_but_trains_nothing():
    learner = _learner(lr=[[0, 1e-2], [100, 1e-4]])
    before = weights(learner)
    results = learner.update(timesteps={"num_env_steps_sampled_lifetime": 100})
    assert learner.hook_calls == ["before", "after"]
    assert_same_tensors(weights(learner), before)
    assert learner.weights_seq_no == 0
    assert results["default_policy"]["default_optimizer_learning_rate"] == pytest.approx(1e-4)
    assert learner.get_optimizer().param_groups[0]["lr"] == pytest.approx(1e-4)
    assert results[ALL_MODULES]["num_env_steps_sampled_lifetime"] == 100


# ---------------------------------------------------------------------------------------
# update_from_iterator(...)
# ---------------------------------------------------------------------------------------


def test_one_pass_over_a_dataloader_is_one_gradient_step_per_batch_as_update_from_batch_takes_them():
    batch = random_batch(48)
    loader = DataLoader(_Rows(batch), batch_size=16, shuffle=False)
    by_iterator, by_batches = _learner(), _learner()
    results = by_iterator.update_from_iterator(loader)
    for start in (0, 16, 32):
        by_batches.update_from_batch({k: v[start : start + 16] for k, v in batch.items()})
    assert_same_tensors(weights(by_iterator), weights(by_batches))
    assert results[ALL_MODULES][DATASET_NUM_ITERS_TRAINED] == 3
    assert results[ALL_MODULES][WEIGHTS_SEQ_NO] == 3
    assert by_iterator.hook_calls == ["before", "after"]  # once around the whole call


def test_a_generator_is_trained_on_once_and_then_has_run_dry():
    learner = _learner()
    generator = (batch for batch in _batches(4))
    assert learner.update_from_iterator(generator)[ALL_MODULES][DATASET_NUM_ITERS_TRAINED] == 4
    before = weights(learner)
    assert learner.update_from_iterator(generator)[ALL_MODULES][DATASET_NUM_ITERS_TRAINED] == 0
    assert_same_tensors(weights(learner), before)


@pytest.mark.parametrize("num_iters", [2, 7])
def test_num_iters_shorter_or_longer_than_one_pass_draws_that_many_batches(num_iters):
    learner = _learner()
    results = learner.update_from_iterator(_batches(4), num_iters=num_iters)
    assert results[ALL_MODULES][DATASET_NUM_ITERS_TRAINED] == num_iters
    assert learner.weights_seq_no == num_iters


def test_num_iters_beyond_a_one_shot_generator_ends_the_update_when_it_runs_dry():
    learner = _learner()
    results = learner.update_from_iterator(iter(_batches(3)), num_iters=5)
    assert results[ALL_MODULES][DATASET_NUM_ITERS_TRAINED] == 3


def test_minibatch_size_cuts_each_drawn_batch_into_steps():
    learner = _learner()
    results = learner.update_from_iterator(_batches(2, rows=32), minibatch_size=8)
    assert results[ALL_MODULES][DATASET_NUM_ITERS_TRAINED] == 2
    assert learner.weights_seq_no == 8


def test_the_lifetime_counter_sums_the_iterations_of_every_call():
    learner = _learner()
    learner.update_from_iterator(_batches(3))
    results = learner.update_from_iterator(_batches(2))
    assert results[ALL_MODULES][DATASET_NUM_ITERS_TRAINED] == 2
    assert results[ALL_MODULES][DATASET_NUM_ITERS_TRAINED_LIFETIME] == 5


def test_update_with_one_data_iterator_runs_update_from_iterator():
    learner = _learner()
    results = learner.update(data_iterators=[_batches(3)], minibatch_size=8)
    assert results[ALL_MODULES][DATASET_NUM_ITERS_TRAINED] == 3
    assert learner.weights_seq_no == 6


def test_training_step_trains_a_train_item_of_a_data_iterator():
    learner = _learner()
    output = learner.training_step(TrainItem(TrainingData(data_iterators=[_batches(3)])))
    assert output["results"][ALL_MODULES][DATASET_NUM_ITERS_TRAINED] == 3


@pytest.mark.parametrize(
    "iterator, kwargs, message",
    [
        (random_batch(4), {}, "iterable of batches"),
        (42, {}, "iterable of batches"),
        ([random_batch(4)], dict(num_iters=0), "num_iters must be an int >= 1"),
        ([random_batch(4)], dict(minibatch_size=0), "minibatch_size must be an int >= 1"),
        ([{Columns.ACTIONS: np.zeros(4, dtype=np.int64)}], {}, "lacks column"),
    ],
    ids=["a_batch", "not_iterable", "num_iters", "minibatch_size", "bad_batch"],
)
def test_update_from_iterator_refuses_bad_arguments_naming_them(iterator, kwargs, message):
    learner = _learner()
    with pytest.raises(ValueError, match=message):
        learner.update_from_iterator(iterator, **kwargs)


def _uneven_iterators_main(rank: int, world_size: int, tmp_path: str) -> dict[str, Any]:
    learner = BCLearner(bc_spec())
    # One pass over each rank's own iterator: rank 0 has 3 batches, rank 1 only 1.
    iterator = (batch for batch in _batches(3 if rank == 0 else 1, rows=8))
    item = TrainItem(TrainingData(data_iterators=[iterator]))
    trainer = make_trainer(tmp_path, strategy="ddp", devices=world_size, use_distributed_sampler=False)
    trainer.fit(learner, train_dataloaders=loader_of([item]))
    state = {name: value.detach().numpy().copy() for name, value in learner.module.state_dict().items()}
    return {"weights": state, "seq_no": learner.weights_seq_no}


def test_ddp_ranks_with_iterators_of_different_lengths_take_the_same_steps_and_stay_in_sync(tmp_path):
    rank0, rank1 = run_on_ranks(_uneven_iterators_main, str(tmp_path), timeout=60)
    # Rank 1 runs dry after one batch and takes part in rank 0's other two steps with zero gradients.
    assert rank0["seq_no"] == rank1["seq_no"] == 3
    for name in rank0["weights"]:
        np.testing.assert_array_equal(rank0["weights"][name], rank1["weights"][name], err_msg=name)
