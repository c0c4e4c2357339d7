"""The Learner under ``Trainer(strategy="ddp")`` on 2 CPU ranks: in step, in sync, never hanging.

Each test starts two spawned ranks (tests/ranks.py) that run one ``Trainer.fit`` each over
their own, deliberately uneven, train items. A rank that waited on the other forever would
fail the test at the timeout instead of hanging CI.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from _helpers import bc_spec, loader_of, make_trainer, random_batch
from lightning.pytorch import Callback
from ranks import run_on_ranks

from lightning_rl import MultiRLModuleSpec
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.core.train_item import TrainingData, TrainItem


class SGDBCLearner(BCLearner):
    """BC with plain SGD: one step on a mean loss is linear in the batch's rows, so shards average exactly."""

    def configure_optimizers_for_module(self, module_id: str, config: Any) -> None:
        params = self.get_parameters(self.module[module_id])
        self.register_optimizer(
            module_id=module_id, optimizer=torch.optim.SGD(params, lr=0.5), params=params, lr_or_lr_schedule=config.lr
        )


def _numpy_state(learner: BCLearner) -> dict[str, np.ndarray]:
    """``{"{module_id}.{name}": array}`` of every module's weights."""
    return {
        f"{module_id}.{name}": value.detach().numpy().copy()
        for module_id in learner.module.keys()
        for name, value in learner.module[module_id].state_dict().items()
    }


def _item(seed: int, **rows: int) -> TrainItem:
    return TrainItem(TrainingData(batch={module_id: random_batch(count, seed=seed + i) for i, (module_id, count) in enumerate(rows.items())}))


# The same whole batch for both ranks' last step; each rank trains on its half.
WHOLE = random_batch(64, seed=99)


class _Snapshots(Callback):
    """Rank-local snapshots: the weights when training starts and before the last item."""

    def __init__(self, last_batch_idx: int) -> None:
        self.last_batch_idx = last_batch_idx
        self.at_start: dict[str, np.ndarray] = {}
        self.before_last: dict[str, np.ndarray] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        self.at_start = _numpy_state(pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.last_batch_idx:
            self.before_last = _numpy_state(pl_module)


def _uneven_shards_main(rank: int, world_size: int, tmp_path: str) -> dict[str, Any]:
    spec = MultiRLModuleSpec(rl_module_specs={"a": bc_spec(), "b": bc_spec(), "frozen": bc_spec()})
    learner = SGDBCLearner(
        module_spec=spec, lr=0.5, num_epochs=2, minibatch_size=32, shuffle_batch_per_epoch=True, policies_to_train=["a", "b"]
    )
    half = slice(0, 32) if rank == 0 else slice(32, 64)
    if rank == 0:
        items = [_item(1, a=100, b=30), TrainItem(TrainingData(batch={})), TrainItem(TrainingData(batch={"a": random_batch(3, seed=5)}))]
    else:
        items = [_item(2, a=40), _item(3, a=10, b=5), TrainItem(TrainingData(batch={"a": random_batch(7, seed=6), "b": random_batch(2)}))]
    # Last item: both ranks hold one half of WHOLE; one epoch, one step over the shard.
    items.append(
        TrainItem(
            TrainingData(batch={"a": {k: v[half] for k, v in WHOLE.items()}}),
            update_settings={"num_epochs": 1, "minibatch_size": None},
        )
    )
    snapshots = _Snapshots(last_batch_idx=len(items) - 1)
    trainer = make_trainer(
        tmp_path, strategy="ddp", devices=world_size, callbacks=[snapshots], use_distributed_sampler=False
    )
    trainer.fit(learner, train_dataloaders=loader_of(items))
    optimizer_states = {
        name: {key: value.numpy().copy() for key, value in opt.state_dict()["state"].get(0, {}).items()}
        for name, opt in learner._named_optimizers.items()
    }
    return {
        "weights": _numpy_state(learner),
        "at_start": snapshots.at_start,
        "before_last": snapshots.before_last,
        "global_step": trainer.global_step,
        "seq_no": learner._weights_seq_no,
        "optimizer_states": optimizer_states,
    }


def test_uneven_shards_missing_modules_and_empty_ranks_stay_in_step_and_in_sync(tmp_path):
    rank0, rank1 = run_on_ranks(_uneven_shards_main, str(tmp_path), timeout=40)

    for name in rank0["weights"]:
        np.testing.assert_array_equal(rank0["weights"][name], rank1["weights"][name], err_msg=name)
    assert rank0["global_step"] == rank1["global_step"] and rank0["seq_no"] == rank1["seq_no"]
    # Item 1: 2 epochs x ceil(100 / 32) steps on both ranks, though rank 1 has 40 rows; then 2 x 1 (item 2),
    # 2 x 1 (item 3), 1 (item 4).
    assert rank0["seq_no"] == 2 * 4 + 2 + 2 + 1
    # The frozen module never moves; "b", absent on rank 1 at first and on rank 0 later, does.
    frozen = [name for name in rank0["weights"] if name.startswith("frozen.")]
    assert frozen
    for name in frozen:
        np.testing.assert_array_equal(rank0["weights"][name], rank0["at_start"][name])
    assert any(not np.array_equal(rank0["weights"][n], rank0["at_start"][n]) for n in rank0["weights"] if n.startswith("b."))

    # The last step (SGD on two equal halves) equals one learner's step on the whole batch.
    single = SGDBCLearner(module_spec=MultiRLModuleSpec(rl_module_specs={"a": bc_spec()}), lr=0.5)
    single.build()
    before = {n[len("a.") :]: torch.from_numpy(v) for n, v in rank0["before_last"].items() if n.startswith("a.")}
    single.module["a"].load_state_dict(before)
    single.update_from_batch({"a": WHOLE})
    for name, value in single.module["a"].state_dict().items():
        np.testing.assert_allclose(rank0["weights"][f"a.{name}"], value.numpy(), atol=1e-6, err_msg=name)


class _AddThenRemove(Callback):
    """Every rank adds module "new" after item 0 and removes "a" after item 2, at the same boundary."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == 0:
            pl_module.add_module(module_id="new", module_spec=bc_spec(hiddens=(16,)))
            self.new_at_add = _numpy_state(pl_module)
        elif batch_idx == 2:
            pl_module.remove_module("a")


def _add_remove_main(rank: int, world_size: int, tmp_path: str) -> dict[str, Any]:
    # A different torch seed per rank: the new module starts from different weights on each rank,
    # and DDP's rebuilt wrapper must broadcast rank 0's.
    torch.manual_seed(rank)
    learner = BCLearner(module_spec=MultiRLModuleSpec(rl_module_specs={"a": bc_spec()}), lr=0.05)
    seed = 10 * rank
    items = [_item(seed, a=16), _item(seed + 1, a=16, new=16), _item(seed + 2, a=8, new=24), _item(seed + 3, new=16)]
    # A last item whose settings differ between the ranks: refused on both, not a hang.
    items.append(dataclasses.replace(_item(seed + 4, new=16), update_settings={"num_epochs": 1 + rank}))
    callback = _AddThenRemove()
    trainer = make_trainer(tmp_path, strategy="ddp", devices=world_size, callbacks=[callback], use_distributed_sampler=False)
    try:
        trainer.fit(learner, train_dataloaders=loader_of(items))
        error = ""
    except ValueError as raised:
        error = str(raised)
    return {
        "error": error,
        "weights": _numpy_state(learner),
        "new_at_add": {n: v for n, v in callback.new_at_add.items() if n.startswith("new.")},
        "modules": sorted(learner.module.keys()),
        "optimizers": sorted(learner._named_optimizers),
    }


def test_a_module_added_and_removed_mid_fit_has_its_gradients_averaged_on_every_rank(tmp_path):
    rank0, rank1 = run_on_ranks(_add_remove_main, str(tmp_path), timeout=40)

    assert "num_epochs from 1 to 2" in rank0["error"] and rank0["error"] == rank1["error"]
    assert rank0["modules"] == rank1["modules"] == ["new"]
    assert rank0["optimizers"] == ["new_default_optimizer"]
    # Built from different seeds, the new module was made the same on both ranks by the rewrap ...
    for name in rank0["new_at_add"]:
        np.testing.assert_array_equal(rank0["new_at_add"][name], rank1["new_at_add"][name], err_msg=name)
    # ... and trained on different data it stays the same: its gradients are averaged.
    for name in rank0["weights"]:
        np.testing.assert_array_equal(rank0["weights"][name], rank1["weights"][name], err_msg=name)
    assert any(not np.array_equal(rank0["weights"][n], rank0["new_at_add"][n]) for n in rank0["weights"])
