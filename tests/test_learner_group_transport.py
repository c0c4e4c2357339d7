"""LearnerGroup's batch transport: a batch's arrays reach the learners through shared memory, and no block outlives an update.

The learners must train on tensors backed by the driver's shared-memory blocks (no pickled
copy of the arrays), and every block must be unlinked after an update, after a learner
raises or dies, and after ``shutdown``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch
from conftest import bc_spec, random_batch

from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.learner.group import _shared
from lightning_rl.learner.group._shared import SharedArray, SharedShards, attach_shared
from lightning_rl.learner.group.learner_group import LearnerGroup, LearnerGroupError

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="reads /dev/shm and /proc (Linux)")


def _shm_ranges() -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of ``/dev/shm`` files."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/dev/shm/" in line:
                start, stop = (int(x, 16) for x in line.split()[0].split("-"))
                ranges.append((start, stop))
    return ranges


class RecordingLearner(BCLearner):
    """BC that records whether each column of its prepared batch lives in shared memory; raises on ``"fail"``."""

    def _prepare_batch(self, batch: Any) -> Any:
        prepared = super()._prepare_batch(batch)
        ranges = _shm_ranges()
        self.columns_in_shm = {
            column: any(lo <= tensor.data_ptr() < hi for lo, hi in ranges)
            for columns in prepared.values()
            for column, tensor in columns.items()
            if isinstance(tensor, torch.Tensor)
        }
        return prepared

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: Any, fwd_out: Any) -> Any:
        if "fail" in batch and self.global_rank == 1:
            if int(batch["fail"][0]) == 2:
                os._exit(3)
            raise RuntimeError("deliberate failure on rank 1")
        return super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)


@pytest.fixture
def created_blocks(monkeypatch) -> list[str]:
    """The names of the shared-memory blocks the driver creates during the test."""
    names: list[str] = []
    original = _shared.SharedShards.__init__

    def spy(self: SharedShards, shards: list[Any]) -> None:
        original(self, shards)
        names.extend(block.name for block in self.blocks)

    monkeypatch.setattr(_shared.SharedShards, "__init__", spy)
    return names


def _left(names: list[str]) -> list[str]:
    return [name for name in names if os.path.exists(f"/dev/shm/{name}")]


def _group() -> LearnerGroup:
    return LearnerGroup(
        RecordingLearner(module_spec=bc_spec(), lr=0.1), num_learners=2, num_threads_per_learner=1, timeout_s=60
    )


def test_shards_round_trip_through_shared_memory_without_copies():
    batch = random_batch(10)
    batch["object"] = np.array(["a"] * 10, dtype=object)  # not shareable: stays in the pickled payload
    shards = [{"mod": {k: v[:5] for k, v in batch.items()}}, {"mod": {k: v[5:] for k, v in batch.items()}}, {}]
    shared = SharedShards(shards)
    try:
        assert len(shared.blocks) == 2  # one per non-empty shard
        assert isinstance(shared.shards[0]["mod"]["obs"], SharedArray)
        assert shared.shards[0]["mod"]["object"] is shards[0]["mod"]["object"]
        assert shared.shards[2] == {}
        attached = attach_shared(shared.shards[1])
        for column, values in shards[1]["mod"].items():
            np.testing.assert_array_equal(attached["mod"][column], values)
        ranges = _shm_ranges()
        assert any(lo <= attached["mod"]["obs"].ctypes.data < hi for lo, hi in ranges)
        assert torch.from_numpy(attached["mod"]["obs"]).data_ptr() == attached["mod"]["obs"].ctypes.data
        names = [block.name for block in shared.blocks]
    finally:
        shared.release()
    assert names and not _left(names)
    np.testing.assert_array_equal(attached["mod"]["obs"], shards[1]["mod"]["obs"])  # mapped until dropped
    shared.release()  # idempotent


def test_learners_train_on_shared_memory_and_no_block_outlives_an_update_or_shutdown(created_blocks):
    group = _group()
    try:
        group.update_from_batch(random_batch(64), minibatch_size=16)
        assert created_blocks and not _left(created_blocks)
        per_rank = group.foreach_learner(lambda learner: learner.columns_in_shm)
        assert per_rank == [{"obs": True, "actions": True}] * 2
        group.update_from_batch(random_batch(64), async_update=True)
        group.update_from_batch(random_batch(64), async_update=True)
    finally:
        group.shutdown()
    assert len(created_blocks) == 6 and not _left(created_blocks)


@pytest.mark.parametrize("mode", [1, 2], ids=["learner raises", "learner dies"])
def test_no_block_outlives_a_failing_learner(created_blocks, mode):
    group = _group()
    try:
        batch = random_batch(16)
        batch["fail"] = np.full(16, mode)
        with pytest.raises(LearnerGroupError, match="rank 1"):
            group.update_from_batch(batch)
        assert created_blocks and not _left(created_blocks)
    finally:
        group.shutdown()


def test_a_batch_that_shared_memory_has_no_room_for_is_pickled_with_a_warning(created_blocks, monkeypatch):
    monkeypatch.setattr(_shared, "_SHM_DIR", "/nonexistent-shm")  # as if /dev/shm were missing or full
    group = _group()
    try:
        with pytest.warns(UserWarning, match="no room for this batch"):
            group.update_from_batch(random_batch(64))
        group.update_from_batch(random_batch(64))  # warned once
        assert group.foreach_learner(lambda learner: learner.columns_in_shm) == [{"obs": False, "actions": False}] * 2
        assert not created_blocks
    finally:
        group.shutdown()
