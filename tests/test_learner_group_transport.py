"""LearnerGroup's batch transport: a batch's arrays reach the learners through shared memory, and no block outlives an update.

The learners must train on tensors backed by the driver's shared-memory blocks (no pickled
copy of the arrays), and every block must be unlinked after an update, after a learner
raises or dies, and after ``shutdown``. A batch whose tensors are already in shared memory
must not be copied at all: the learners map the caller's own storage, copy-on-write, and the
update equals the copying one.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import bc_spec, random_batch

from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.learner.group import _processes, _shared
from lightning_rl.learner.group._data import update_source
from lightning_rl.learner.group._shared import SharedArray, SharedShards, attach_shared
from lightning_rl.learner.group.learner_group import LearnerGroup, LearnerGroupError

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="reads /dev/shm and /proc (Linux)")


def _shm_mappings() -> list[tuple[int, int, int]]:
    """``(start, stop, inode)`` of this process's mappings of ``/dev/shm`` files."""
    mappings = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/dev/shm/" in line:
                start, stop = (int(x, 16) for x in line.split()[0].split("-"))
                mappings.append((start, stop, int(line.split()[4])))
    return mappings


def _shm_ranges() -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of ``/dev/shm`` files."""
    return [(start, stop) for start, stop, _ in _shm_mappings()]


class RecordingLearner(BCLearner):
    """BC that records whether (and in which file) each column of its prepared batch lives in shared memory;
    raises on ``"fail"``."""

    def _prepare_batch(self, batch: Any) -> Any:
        prepared = super()._prepare_batch(batch)
        mappings = _shm_mappings()
        tensors = {
            column: tensor
            for columns in prepared.values()
            for column, tensor in columns.items()
            if isinstance(tensor, torch.Tensor)
        }
        self.column_files = {
            column: next((inode for lo, hi, inode in mappings if lo <= tensor.data_ptr() < hi), None)
            for column, tensor in tensors.items()
        }
        self.columns_in_shm = {column: inode is not None for column, inode in self.column_files.items()}
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

    def spy(self: SharedShards, shards: list[Any], *caller_memory: Any) -> None:
        original(self, shards, *caller_memory)
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


def _shared_batch(rows: int) -> dict[str, torch.Tensor]:
    """``random_batch(rows)`` as tensors moved into torch's shared memory by their owner (``share_memory_()``)."""
    return {column: torch.from_numpy(values.copy()).share_memory_() for column, values in random_batch(rows).items()}


def _numpy(values: torch.Tensor | np.ndarray) -> np.ndarray:
    return values.numpy() if isinstance(values, torch.Tensor) else values


def _file_of(tensor: torch.Tensor) -> int:
    """The inode of the shared-memory file a tensor's storage lives in."""
    return os.fstat(tensor.untyped_storage()._get_shared_fd()).st_ino


def test_shards_of_a_shared_batch_point_into_the_callers_storage_and_map_copy_on_write():
    batch = _shared_batch(10)
    batch["strided"] = torch.arange(40, dtype=torch.float32).reshape(10, 4).share_memory_()[:, 1]  # not contiguous
    batch["private"] = torch.arange(10)
    batch["numpy_view"] = torch.arange(10.0).share_memory_().numpy()  # found through its base
    expected = {column: _numpy(values).copy() for column, values in batch.items()}
    memory = _shared.caller_shared_memory(batch)
    assert sorted(m.stop - m.start for m in memory) == sorted([10 * 4 * 4, 10 * 8, 40 * 4, 10 * 4])  # whole storages
    arrays = {c: _numpy(v) for c, v in batch.items()}
    shards = [{c: v[:5] for c, v in arrays.items()}, {c: v[5:] for c, v in arrays.items()}]
    shared = SharedShards(shards, memory)
    try:
        described = shared.shards[1]
        assert described["obs"].path == f"/proc/{os.getpid()}/fd/{batch['obs'].untyped_storage()._get_shared_fd()}"
        assert described["obs"].offset == 5 * 4 * 4  # rows 5.. of the caller's storage, not a copy
        assert len(shared.blocks) == 2  # one per shard, for the strided and private columns only
        assert all(described[c].path.startswith("/dev/shm/") for c in ("strided", "private"))
        attached = attach_shared(described)
        assert described["numpy_view"].path.startswith("/proc/")
        for column, values in expected.items():
            np.testing.assert_array_equal(attached[column], values[5:])
        assert attached["obs"].ctypes.data != batch["obs"].data_ptr()  # its own mapping of the same file
        attached["obs"][...] = -1.0  # what a Learner writing into its batch in place does
        attached["actions"][...] = -1
    finally:
        shared.release()
    for column, values in expected.items():
        np.testing.assert_array_equal(_numpy(batch[column]), values)  # copy-on-write: the caller's are unchanged
    assert batch["obs"].is_shared() and not shared.caller_memory


def test_batches_for_learner_processes_are_joined_in_shared_memory_and_equal_the_private_join():
    halves = [random_batch(5, seed=0), {column: torch.from_numpy(values) for column, values in random_batch(3).items()}]
    _, private = update_source(**_only(batches=halves), num_learners=0, join_in_shared_memory=False)
    _, joined = update_source(**_only(batches=halves), num_learners=2, join_in_shared_memory=True)
    assert set(joined) == set(private)
    for column, values in private.items():
        assert joined[column].is_shared() and not isinstance(values, torch.Tensor)
        np.testing.assert_array_equal(joined[column].numpy(), values)
    assert _shared.caller_shared_memory(joined)  # what the transport reads in place


def _only(**source: Any) -> dict[str, Any]:
    """``update_source``'s data arguments with only ``source`` given."""
    return {"batch": None, "batches": None, "episodes": None, "data_iterators": None, "training_data": None} | source


def test_learners_map_a_copy_or_the_callers_shared_batch_alike_and_no_block_outlives_an_update_or_shutdown(
    created_blocks,
):
    group = _group()
    try:
        state = group.get_state()
        results_copied, weights_copied = group.update_from_batch(random_batch(64), minibatch_size=16, return_state=True)
        assert len(created_blocks) == 2 and not _left(created_blocks)  # one block per shard, unlinked once answered
        assert group.foreach_learner(lambda learner: learner.columns_in_shm) == [{"obs": True, "actions": True}] * 2

        # The same update on the same batch, moved into shared memory by its owner: read where it is.
        group.set_state(state)
        batch = _shared_batch(64)
        results_shared, weights_shared = group.update_from_batch(batch, minibatch_size=16, return_state=True)
        assert len(created_blocks) == 2  # no block of the update: nothing copied
        files = {column: _file_of(values) for column, values in batch.items()}
        assert group.foreach_learner(lambda learner: learner.column_files) == [files] * 2
        for column, values in random_batch(64).items():
            np.testing.assert_array_equal(batch[column].numpy(), values)

        # The same rows as two batches: the group joins them in shared memory and the learners read the join there.
        group.set_state(state)
        halves = [{c: v[:40] for c, v in random_batch(64).items()}, {c: v[40:] for c, v in random_batch(64).items()}]
        results_joined, weights_joined = group.update(batches=halves, minibatch_size=16, return_state=True)
        assert len(created_blocks) == 2
        assert all(None not in files.values() for files in group.foreach_learner(lambda learner: learner.column_files))

        finished = group.update_from_batch(random_batch(64), async_update=True)
        finished += group.update_from_batch(_shared_batch(64), async_update=True)  # dropped by the caller at once
        finished += group.update_from_batch(random_batch(64), async_update=True)
        assert len(finished + group.collect_async_results()) == 3
    finally:
        group.shutdown()
    assert len(created_blocks) == 6 and not _left(created_blocks)
    assert results_shared == results_copied and results_joined == results_copied
    for module_id, weights in weights_copied.items():
        for name, values in weights.items():
            np.testing.assert_array_equal(weights_shared[module_id][name], values)
            np.testing.assert_array_equal(weights_joined[module_id][name], values)
    for values in batch.values():  # the learners mapped files that have no name in /dev/shm to leave behind
        assert os.readlink(f"/proc/self/fd/{values.untyped_storage()._get_shared_fd()}").endswith("(deleted)")


def test_learners_that_cannot_open_the_drivers_files_get_a_shared_batch_copied_with_a_warning(
    created_blocks, monkeypatch
):
    # As if /proc/<driver pid>/fd were closed to the learners (a hardened /proc, a sandbox): no path they get opens.
    def unopenable(batch: Any) -> list[_shared.CallerMemory]:
        return [memory._replace(path=memory.path + "0000000") for memory in _shared.caller_shared_memory(batch)]

    monkeypatch.setattr(_processes, "caller_shared_memory", unopenable)
    with pytest.warns(UserWarning, match="cannot open this process's shared-memory files"):
        group = _group()
    try:
        state = group.get_state()
        copied = group.update_from_batch(random_batch(64), minibatch_size=16)
        group.set_state(state)
        shared = group.update_from_batch(_shared_batch(64), minibatch_size=16)
        assert len(created_blocks) == 4  # both batches copied, one block per shard each
        assert group.foreach_learner(lambda learner: learner.columns_in_shm) == [{"obs": True, "actions": True}] * 2
        joined = group.update(batches=[random_batch(64)], minibatch_size=16)
        assert len(created_blocks) == 6  # joined privately, then copied: the learners cannot read it in place
    finally:
        group.shutdown()
    assert shared == copied and joined is not None
