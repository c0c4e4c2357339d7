"""What keeps sharded (FSDP2) Learners safe, checked in one process: the order of whole-state
gathers, optimizers that sharding could not rebuild, updates outside the Trainer, and what a
rebuilt module takes over.

The multi-rank behaviour is in test_fsdp_updates.py, test_fsdp_checkpoints.py and
test_learner_group_fsdp.py; these guards need no second rank.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import bc_spec, random_batch

from lightning_rl import MultiRLModuleSpec
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.learner.sharding import _copy_flags, shard_modules


def _two_module_learner() -> BCLearner:
    learner = BCLearner(module_spec=MultiRLModuleSpec(rl_module_specs={"a": bc_spec(), "b": bc_spec()}))
    learner.build()
    return learner


def test_module_states_come_in_the_modules_own_order_whatever_order_the_ids_are_asked_in():
    # Gathering sharded weights is a collective call: every rank must gather the same tensors in
    # turn, also when each process iterates a set of ids in its own (hash-seeded) order.
    learner = _two_module_learner()
    assert list(learner.get_module_state(["b", "a"])) == ["a", "b"]
    assert list(learner.module.get_state(("b", "a"))) == ["a", "b"]


def test_an_optimizer_registered_after_build_is_refused_before_anything_is_sharded():
    learner = _two_module_learner()
    extra = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([extra], lr=0.1)
    learner.register_optimizer(module_id="a", optimizer_name="extra", optimizer=optimizer, params=[extra])
    module = learner.module
    with pytest.raises(ValueError, match=r"optimizers \['a_extra'\] were registered after build\(\)"):
        shard_modules(learner, mesh=None)
    assert learner.module is module and learner.get_optimizer("a", "extra") is optimizer
    assert learner._sharding_mesh is None
    # Those of configure_optimizers_for_module (also of a module added later) can be rebuilt.
    learner.remove_module("a")
    learner.add_module(module_id="c", module_spec=bc_spec())
    assert learner._optimizer_registry.registered_directly == set()


def test_rebuilt_optimizers_keep_their_states_and_their_count_of_skipped_steps():
    learner = _two_module_learner()
    learner.update_from_batch({"a": random_batch(8), "b": random_batch(8)})
    old = learner.get_optimizer("a")
    learner._non_finite_steps.in_a_row[old] = 2
    state = learner._optimizer_registry.get_state(include_optimizers=True)
    learner._rebuild_optimizers(state)
    new = learner.get_optimizer("a")
    assert new is not old
    assert learner._non_finite_steps.in_a_row == {new: 2}
    saved, rebuilt = old.state_dict()["state"], new.state_dict()["state"]
    assert saved.keys() == rebuilt.keys()
    for index in saved:
        for key, value in saved[index].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(rebuilt[index][key]))


def test_a_sharded_learner_refuses_updates_outside_the_trainer_that_sharded_it():
    learner = _two_module_learner()
    learner._sharding_mesh = object()  # as configure_model leaves it under strategy="fsdp2"
    before = learner.get_module_state()
    with pytest.raises(ValueError, match="sharded \\(FSDP2\\): it updates only within the Trainer"):
        learner.update_from_batch({"a": random_batch(8)})
    after = learner.get_module_state()
    assert all(torch.equal(before[m][k], after[m][k]) for m in before for k in before[m])


def test_a_rebuilt_module_keeps_frozen_parameters_and_eval_modes():
    source, target = bc_spec().build(), bc_spec().build()
    frozen = next(iter(dict(source.named_parameters())))
    source.get_parameter(frozen).requires_grad_(False)
    first_child = next(iter(dict(source.named_children())))
    source.get_submodule(first_child).eval()
    _copy_flags(source, target)
    assert not target.get_parameter(frozen).requires_grad
    assert sum(not p.requires_grad for p in target.parameters()) == 1
    assert not target.get_submodule(first_child).training and target.training
