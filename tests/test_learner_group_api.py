"""LearnerGroup's RLlib API: ``update`` (one data source, ``return_state``), ``from_checkpoint``, ``is_remote``.

The two-process tests share one group whose Learner class is defined inside the fixture
function, with a lambda ``policies_to_train``: plain pickle refuses both ("Can't pickle local
object"), so every update of that group shows the Learner travelling by value (cloudpickle).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _helpers import bc_spec, random_batch
from test_learner_group import (
    LR,
    STEPS,
    SGDLearner,
    assert_close_arrays,
    assert_ranks_agree,
    assert_same_arrays,
    assert_same_state,
    episode,
    rank_weights,
    running,
)

from lightning_rl import ALL_MODULES, DEFAULT_MODULE_ID, LearnerConfig
from lightning_rl.core.train_item import TrainingData
from lightning_rl.learner.group._data import update_source
from lightning_rl.learner.group.learner_group import LearnerGroup


@pytest.fixture(scope="module")
def local_class_group():
    class HalvedLossLearner(SGDLearner):
        """Defined in a function: only cloudpickle can send it to a learner process."""

        def compute_loss_for_module(self, *, module_id: str, config: LearnerConfig, batch: Any, fwd_out: Any) -> Any:
            return 0.5 * super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)

    learner = HalvedLossLearner(module_spec=bc_spec(), lr=LR, policies_to_train=lambda module_id, batch: True)
    group = LearnerGroup(learner, num_learners=2, num_threads_per_learner=1, timeout_s=60)
    yield group
    group.shutdown()
    assert not running(group.learner_pids)


def test_a_learner_class_defined_in_a_function_trains_in_two_processes(local_class_group):
    group = local_class_group
    assert group.is_remote and not group.is_local
    assert group.foreach_learner(lambda learner: type(learner).__name__) == ["HalvedLossLearner"] * 2
    before = assert_ranks_agree(group)
    results = group.update(batch=random_batch(32), num_epochs=2)
    assert results[ALL_MODULES]["num_env_steps_trained"] == 64
    after = assert_ranks_agree(group)
    assert not np.array_equal(after[DEFAULT_MODULE_ID]["pi.0.weight"], before[DEFAULT_MODULE_ID]["pi.0.weight"])


def test_return_state_gives_the_weights_right_after_the_update(local_class_group):
    group = local_class_group
    results, weights = group.update(batch=random_batch(16), return_state=True)
    assert results[ALL_MODULES]["num_env_steps_trained"] == 16
    assert_same_arrays(weights, group.get_weights())
    # Async: each finished update returns what a sync call would have; the last one's weights are the current ones.
    returned = group.update(batch=random_batch(16, seed=1), async_update=True, return_state=True)
    returned += group.update(batch=random_batch(16, seed=2), async_update=True)  # this one without
    returned += group.collect_async_results()
    assert [type(value) for value in returned] == [tuple, dict]
    first_results, first_weights = returned[0]
    assert returned[1][ALL_MODULES]["weights_seq_no"] == first_results[ALL_MODULES]["weights_seq_no"] + 1
    assert not np.array_equal(
        first_weights[DEFAULT_MODULE_ID]["pi.0.weight"], group.get_weights()[DEFAULT_MODULE_ID]["pi.0.weight"]
    )


def test_every_data_source_trains_on_the_same_rows(local_class_group):
    group = local_class_group
    one, two = random_batch(10, seed=3), random_batch(6, seed=4)
    joined = {column: np.concatenate([one[column], two[column]]) for column in one}
    start = group.get_state()
    expected = group.update(batch=joined)
    for source in (dict(batches=[one, two]), dict(training_data=TrainingData(batches=[one, two]))):
        group.set_state(start)
        assert group.update(**source) == expected, source
    episodes = [episode(10, seed=i) for i in range(2)] + [episode(20, seed=2)]
    via_training_data = group.update(training_data=TrainingData(episodes=episodes))
    assert via_training_data[ALL_MODULES]["num_env_steps_trained"] == 40
    assert_ranks_agree(group)


def test_update_takes_exactly_one_supported_source_and_says_which():
    with LearnerGroup(SGDLearner(module_spec=bc_spec())) as group:
        batch = random_batch(8)
        with pytest.raises(ValueError, match="exactly one source of data.*got none"):
            group.update()
        with pytest.raises(ValueError, match="exactly one source of data.*got \\['batch', 'batches'\\]"):
            group.update(batch=batch, batches=[batch])
        with pytest.raises(ValueError, match="training_data alone"):
            group.update(batch=batch, training_data=TrainingData(batch=batch))
        with pytest.raises(ValueError, match="one data iterator, got 2.*batch= or batches="):
            group.update(data_iterators=[[batch], [batch]])
        with pytest.raises(ValueError, match="cannot train from replay"):
            group.update(training_data=TrainingData(replay=object()))
        with pytest.raises(ValueError, match="non-empty list of batches"):
            group.update(batches=[])
        with pytest.raises(ValueError, match="same columns"):
            group.update(batches=[batch, {"obs": batch["obs"]}])
        with pytest.raises(ValueError, match="not a mix"):
            group.update(batches=[batch, {DEFAULT_MODULE_ID: batch}])


def test_local_update_matches_the_learner_and_returns_its_weights():
    torch.manual_seed(5)
    plain = SGDLearner(module_spec=bc_spec(), lr=LR)
    plain.build()
    torch.manual_seed(5)
    with LearnerGroup(SGDLearner(module_spec=bc_spec(), lr=LR)) as group:
        assert group.is_local and not group.is_remote
        one, two = random_batch(8, seed=1), torch.as_tensor(random_batch(8, seed=2)["obs"])
        batches = [one, {"obs": two, "actions": torch.as_tensor(random_batch(8, seed=2)["actions"])}]
        joined = {column: np.concatenate([one[column], np.asarray(batches[1][column])]) for column in one}
        expected = plain.update_from_batch(joined, timesteps={STEPS: 16})
        results, weights = group.update(batches=batches, timesteps={STEPS: 16}, return_state=True)
        assert results == expected
        assert_same_arrays(weights, group.get_weights())
        assert_same_arrays(weights, rank_weights(plain))
        returned = group.update(batch=one, async_update=True, return_state=True)
        returned += group.collect_async_results()
        assert len(returned) == 1
        assert_same_arrays(returned[0][1], group.get_weights())


def test_from_checkpoint_continues_in_this_process_and_in_a_learner_process(tmp_path):
    with LearnerGroup(SGDLearner(module_spec=bc_spec(), lr=LR)) as saved:
        saved.update(batch=random_batch(32), num_epochs=2, minibatch_size=8, timesteps={STEPS: 32})
        path = saved.save_to_path(tmp_path / "group")
        state = saved.get_state(not_components="metrics_logger")
        expected = saved.update(batch=random_batch(32, seed=1), timesteps={STEPS: 64})
        expected_weights = saved.get_weights()
    with pytest.raises(ValueError, match="learner_class must be a Learner subclass"):
        LearnerGroup.from_checkpoint(path, learner_class=dict)  # type: ignore[arg-type]
    for num_learners in (0, 1):
        group = LearnerGroup.from_checkpoint(
            path, learner_class=SGDLearner, num_learners=num_learners, num_threads_per_learner=1, timeout_s=60
        )
        with group:
            assert group.is_remote == (num_learners == 1)
            # Weights, optimizer moments and counters arrive with the learner.
            assert_same_state(group.get_state(not_components="metrics_logger"), state)
            results = group.update(batch=random_batch(32, seed=1), timesteps={STEPS: 64})
            assert results[DEFAULT_MODULE_ID]["total_loss"] == pytest.approx(expected[DEFAULT_MODULE_ID]["total_loss"])
            assert results[ALL_MODULES]["weights_seq_no"] == expected[ALL_MODULES]["weights_seq_no"]
            assert_close_arrays(group.get_weights(), expected_weights)


def test_a_local_group_trains_its_learner_on_one_data_iterator():
    with LearnerGroup(SGDLearner(module_spec=bc_spec())) as group:
        results = group.update(data_iterators=[[random_batch(8, seed=s) for s in range(3)]], minibatch_size=4)
        assert results[ALL_MODULES]["dataset_num_iters_trained"] == 3
        assert results[ALL_MODULES]["weights_seq_no"] == 6
        with pytest.raises(ValueError, match="num_epochs=2 cannot be used with data_iterators"):
            group.update(data_iterators=[[random_batch(8)]], num_epochs=2)


def test_learner_processes_refuse_data_iterators_naming_what_they_take():
    with pytest.raises(ValueError, match="cannot train from data_iterators.*batch=, batches="):
        update_source(
            batch=None,
            batches=None,
            episodes=None,
            data_iterators=[[random_batch(8)]],
            training_data=None,
            num_learners=2,
            join_in_shared_memory=True,
        )
