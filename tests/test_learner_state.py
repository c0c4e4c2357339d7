"""Learner state: get/set, save/restore, from_checkpoint, add/remove modules, safe loading."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from _helpers import assert_same_tensors, bc_spec, random_batch, weights

from lightning_rl import ALL_MODULES, DEFAULT_MODULE_ID, Learner
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.core.checkpoint import with_checksum


def _trained_learner(**kwargs) -> BCLearner:
    learner = BCLearner(module_spec=bc_spec(), **kwargs)
    learner.build()
    learner.update_from_batch(random_batch(seed=1), timesteps={"num_env_steps_sampled_lifetime": 100})
    return learner


def _fresh_learner(**kwargs) -> BCLearner:
    torch.manual_seed(123)  # different initial weights than the trained one
    learner = BCLearner(module_spec=bc_spec(), **kwargs)
    learner.build()
    return learner


def test_get_state_is_a_snapshot_unaffected_by_later_updates():
    learner = _trained_learner()
    state = learner.get_state()
    frozen = {k: v.clone() for k, v in state["rl_module"][DEFAULT_MODULE_ID].items()}
    adam_moment = state["optimizer"]["optimizers"]["default_policy_default_optimizer"]["state"][0]["exp_avg"].clone()
    learner.update_from_batch(random_batch(seed=2))
    assert_same_tensors(state["rl_module"][DEFAULT_MODULE_ID], frozen)
    assert torch.equal(state["optimizer"]["optimizers"]["default_policy_default_optimizer"]["state"][0]["exp_avg"], adam_moment)


def test_get_state_components_select_what_is_returned():
    learner = _trained_learner()
    assert "optimizer" not in learner.get_state(components="rl_module")
    assert "rl_module" in learner.get_state(components="rl_module")
    only_metrics = learner.get_state(components=["metrics_logger"])
    assert "rl_module" not in only_metrics and "metrics_logger" in only_metrics
    assert "rl_module" not in learner.get_state(not_components="rl_module")


def test_set_state_reproduces_weights_and_optimizer_state_exactly():
    source = _trained_learner()
    target = _fresh_learner()
    target.set_state(source.get_state())
    assert_same_tensors(source.get_state()["rl_module"], target.get_state()["rl_module"])
    assert_same_tensors(source.get_state()["optimizer"], target.get_state()["optimizer"])


def test_resuming_from_state_then_updating_equals_updating_without_a_break():
    uninterrupted = _trained_learner()
    resumed = _fresh_learner()
    resumed.set_state(uninterrupted.get_state())
    for seed in (5, 6):
        a = uninterrupted.update_from_batch(random_batch(seed=seed), num_epochs=2, minibatch_size=16)
        b = resumed.update_from_batch(random_batch(seed=seed), num_epochs=2, minibatch_size=16)
    assert a == b
    assert_same_tensors(uninterrupted.get_state()["rl_module"], resumed.get_state()["rl_module"])


def test_save_to_path_then_restore_from_path_reproduces_the_learner(tmp_path: Path):
    source = _trained_learner()
    source.save_to_path(str(tmp_path / "ckpt"))
    target = _fresh_learner()
    target.restore_from_path(str(tmp_path / "ckpt"))
    assert_same_tensors(source.get_state()["rl_module"], target.get_state()["rl_module"])
    assert_same_tensors(source.get_state()["optimizer"], target.get_state()["optimizer"])
    a = source.update_from_batch(random_batch(seed=9))
    b = target.update_from_batch(random_batch(seed=9))
    assert a == b  # same counters, schedules and lifetime metrics too


def test_from_checkpoint_rebuilds_added_modules_and_continues_exactly(tmp_path: Path):
    learner = _trained_learner(lr=[[0, 1e-3], [1000, 1e-4]])
    learner.add_module(module_id="rookie", module_spec=bc_spec((16,)), config_overrides={"lr": 0.05})
    learner.remove_module(DEFAULT_MODULE_ID)
    learner.update_from_batch(random_batch(seed=3))
    learner.save_to_path(str(tmp_path / "league"))

    loaded = Learner.from_checkpoint(str(tmp_path / "league"))
    assert type(loaded) is BCLearner
    assert list(loaded.module.keys()) == ["rookie"]
    assert loaded.config_for_module("rookie").lr == 0.05
    assert_same_tensors(learner.get_state()["rl_module"], loaded.get_state()["rl_module"])
    assert_same_tensors(learner.get_state()["optimizer"], loaded.get_state()["optimizer"])
    a = learner.update_from_batch(random_batch(seed=4), num_epochs=2, minibatch_size=16)
    b = loaded.update_from_batch(random_batch(seed=4), num_epochs=2, minibatch_size=16)
    assert a == b
    assert a["rookie"]["default_optimizer_learning_rate"] == pytest.approx(0.05)


def test_restore_from_path_adds_and_removes_modules_to_match_the_checkpoint(tmp_path: Path):
    source = _trained_learner()
    source.add_module(module_id="extra", module_spec=bc_spec())
    source.save_to_path(str(tmp_path / "two"))
    target = _fresh_learner()
    target.add_module(module_id="stale", module_spec=bc_spec())
    target.restore_from_path(str(tmp_path / "two"))
    assert sorted(target.module.keys()) == ["default_policy", "extra"]
    assert_same_tensors(source.get_state()["rl_module"], target.get_state()["rl_module"])
    assert_same_tensors(source.get_state()["optimizer"], target.get_state()["optimizer"])


def test_restore_of_a_mismatched_checkpoint_names_file_and_keys_and_changes_nothing(tmp_path: Path):
    wide = BCLearner(module_spec=bc_spec((32,)))
    wide.build()
    wide.save_to_path(str(tmp_path / "wide"))
    learner = _trained_learner()
    before = learner.get_state()
    with pytest.raises(ValueError, match=r"wide/learner_state.pt.*'pi\.0\.weight': module has \(8, 4\), state has \(32, 4\)"):
        learner.restore_from_path(str(tmp_path / "wide"))
    assert_same_tensors(before["rl_module"], learner.get_state()["rl_module"])
    assert_same_tensors(before["optimizer"], learner.get_state()["optimizer"])


def test_set_state_with_missing_weights_names_them_and_changes_nothing():
    learner = _trained_learner()
    before = weights(learner)
    state = learner.get_state(components="rl_module")
    state["rl_module"][DEFAULT_MODULE_ID] = {k: v + 1 for k, v in state["rl_module"][DEFAULT_MODULE_ID].items()}
    del state["rl_module"][DEFAULT_MODULE_ID]["pi.0.bias"]
    with pytest.raises(ValueError, match=r"(?i)module 'default_policy'.*missing keys \['pi\.0\.bias'\]"):
        learner.set_state(state)
    assert_same_tensors(before, weights(learner))


def test_set_state_for_an_unknown_module_is_rejected():
    learner = _trained_learner()
    with pytest.raises(ValueError, match=r"Unknown module id\(s\) \['ghost'\]"):
        learner.set_state({"rl_module": {"ghost": {}}})


def test_set_state_with_optimizer_state_of_the_wrong_shape_is_rejected_before_any_change():
    learner = _trained_learner()
    state = learner.get_state()
    moments = state["optimizer"]["optimizers"]["default_policy_default_optimizer"]["state"][0]
    moments["exp_avg"] = torch.zeros(3, 3)
    state["rl_module"][DEFAULT_MODULE_ID] = {k: v + 1 for k, v in state["rl_module"][DEFAULT_MODULE_ID].items()}
    before = weights(learner)
    with pytest.raises(ValueError, match=r"exp_avg.*\(3, 3\).*\(8, 4\)"):
        learner.set_state(state)
    assert_same_tensors(before, weights(learner))


def test_a_damaged_checkpoint_file_gives_an_error_naming_it(tmp_path: Path):
    learner = _trained_learner()
    learner.save_to_path(str(tmp_path / "ckpt"))
    file = tmp_path / "ckpt" / "learner_state.pt"
    file.write_bytes(file.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"learner_state\.pt: the file is truncated or damaged"):
        Learner.from_checkpoint(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="nowhere: no such file"):
        Learner.from_checkpoint(str(tmp_path / "nowhere"))


class _Payload:
    """Not plain data: a checkpoint holding it must not load."""


def test_loading_never_unpickles_code(tmp_path: Path):
    path = tmp_path / "evil"
    path.mkdir()
    torch.save({"format_version": 1, "learner_class": "x", "hparams": {}, "state": {"x": _Payload()}}, path / "learner_state.pt")
    with pytest.raises(ValueError, match=r"learner_state\.pt: it holds .*_Payload, which is code, not data"):
        Learner.from_checkpoint(str(path))


def test_from_checkpoint_refuses_a_class_that_is_not_a_learner(tmp_path: Path):
    learner = _trained_learner()
    learner.save_to_path(str(tmp_path / "ckpt"))
    payload = torch.load(tmp_path / "ckpt" / "learner_state.pt", weights_only=True)
    payload["learner_class"] = "collections.OrderedDict"
    torch.save(with_checksum(payload), tmp_path / "ckpt" / "learner_state.pt")  # a valid checksum: crafted, not damaged
    with pytest.raises(ValueError, match="not a loaded subclass of Learner"):
        Learner.from_checkpoint(str(tmp_path / "ckpt"))


def test_from_checkpoint_never_imports_the_module_a_learner_class_names(tmp_path: Path):
    learner = _trained_learner()
    learner.save_to_path(str(tmp_path / "ckpt"))
    payload = torch.load(tmp_path / "ckpt" / "learner_state.pt", weights_only=True)
    payload["learner_class"] = "antigravity.Learner"  # importing antigravity opens a web browser
    torch.save(with_checksum(payload), tmp_path / "ckpt" / "learner_state.pt")
    with pytest.raises(ValueError, match="import the module that defines it"):
        Learner.from_checkpoint(str(tmp_path / "ckpt"))
    assert "antigravity" not in sys.modules


def test_save_to_path_replaces_an_old_checkpoint_atomically(tmp_path: Path):
    learner = _trained_learner()
    learner.save_to_path(str(tmp_path / "ckpt"))
    learner.update_from_batch(random_batch(seed=8))
    learner.save_to_path(str(tmp_path / "ckpt"))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["learner_state.pt"]
    loaded = Learner.from_checkpoint(str(tmp_path / "ckpt"))
    assert_same_tensors(learner.get_state()["rl_module"], loaded.get_state()["rl_module"])


def test_add_module_then_remove_default_trains_only_the_new_module_with_its_own_lr():
    learner = _trained_learner(lr=1e-3)
    learner.add_module(module_id="new", module_spec=bc_spec(), config_overrides={"lr": 0.05})
    learner.remove_module(DEFAULT_MODULE_ID)
    assert list(learner.module.keys()) == ["new"]
    assert learner.get_optimizers_for_module(DEFAULT_MODULE_ID) == []
    before = weights(learner, "new")
    results = learner.update_from_batch(random_batch())
    after = weights(learner, "new")
    # Adam's first step moves every weight by about lr (|g| >> eps).
    largest_move = max((after[k] - before[k]).abs().max().item() for k in before)
    assert largest_move == pytest.approx(0.05, rel=1e-3)
    assert results["new"]["default_optimizer_learning_rate"] == pytest.approx(0.05)
    assert DEFAULT_MODULE_ID not in results


def test_policies_to_train_leaves_other_modules_untouched():
    learner = _trained_learner()
    learner.add_module(module_id="frozen", module_spec=bc_spec(), new_should_module_be_updated=["default_policy"])
    frozen_before = weights(learner, "frozen")
    trained_before = weights(learner)
    results = learner.update_from_batch({"default_policy": random_batch(), "frozen": random_batch()})
    assert_same_tensors(frozen_before, weights(learner, "frozen"))
    assert any(not torch.equal(trained_before[k], v) for k, v in weights(learner).items())
    assert "total_loss" not in results["frozen"]
    assert learner.should_module_be_updated("frozen") is False


def test_a_callable_policies_to_train_is_asked_per_module():
    learner = BCLearner(module_spec=bc_spec(), policies_to_train=lambda module_id, batch: module_id != "frozen")
    learner.build()
    learner.add_module(module_id="frozen", module_spec=bc_spec())
    assert learner.should_module_be_updated("default_policy") and not learner.should_module_be_updated("frozen")


def test_add_module_rejects_an_existing_or_invalid_id():
    learner = _trained_learner()
    with pytest.raises(ValueError, match="already exists"):
        learner.add_module(module_id=DEFAULT_MODULE_ID, module_spec=bc_spec())
    with pytest.raises(ValueError):
        learner.add_module(module_id="a.b", module_spec=bc_spec())
    with pytest.raises(ValueError, match="no module 'ghost' to remove"):
        learner.remove_module("ghost")


def test_multi_module_batches_train_each_module_on_its_own_rows():
    learner = _trained_learner()
    learner.add_module(module_id="other", module_spec=bc_spec())
    results = learner.update_from_batch(
        {"default_policy": random_batch(64), "other": random_batch(16)}, num_epochs=1, minibatch_size=32
    )
    assert results["default_policy"]["num_module_steps_trained"] == 64
    assert results["other"]["num_module_steps_trained"] == 64  # cycles its 16 rows over 2 steps of 32
    assert results[ALL_MODULES]["num_env_steps_trained"] == 64
    assert results[ALL_MODULES]["total_loss"] == pytest.approx(
        results["default_policy"]["total_loss"] + results["other"]["total_loss"], rel=1e-5
    )


class WeightedBCLearner(BCLearner):
    """A subclass with a hyperparameter of its own."""

    def __init__(self, loss_weight: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        return config.loss_weight * super().compute_loss_for_module(
            module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
        )


def test_a_subclass_hyperparameter_is_saved_overridable_per_module_and_restored(tmp_path: Path):
    learner = WeightedBCLearner(module_spec=bc_spec(), loss_weight=2.0, config_overrides_per_module={"default_policy": {"loss_weight": 0.5}})
    learner.build()
    assert learner.config.loss_weight == 2.0
    assert learner.config_for_module(DEFAULT_MODULE_ID).loss_weight == 0.5
    learner.save_to_path(str(tmp_path / "ckpt"))
    loaded = Learner.from_checkpoint(str(tmp_path / "ckpt"))
    assert type(loaded) is WeightedBCLearner
    assert loaded.hparams.loss_weight == 2.0
    assert loaded.config_for_module(DEFAULT_MODULE_ID).loss_weight == 0.5


def test_a_callable_policies_to_train_is_supplied_again_when_loading(tmp_path: Path):
    def only_default(module_id, batch):
        return module_id == DEFAULT_MODULE_ID

    learner = BCLearner(module_spec=bc_spec(), policies_to_train=only_default)
    learner.build()
    learner.save_to_path(str(tmp_path / "ckpt"))
    loaded = Learner.from_checkpoint(str(tmp_path / "ckpt"), policies_to_train=only_default)
    loaded.add_module(module_id="other", module_spec=bc_spec())
    assert loaded.should_module_be_updated(DEFAULT_MODULE_ID) and not loaded.should_module_be_updated("other")


@pytest.mark.parametrize("rule", ["default_policy", ["default_policy", 3]])
def test_policies_to_train_refuses_a_string_or_non_string_ids_naming_the_fix(rule):
    with pytest.raises(ValueError, match="policies_to_train must be a list of module ids"):
        BCLearner(module_spec=bc_spec(), policies_to_train=rule)


def test_set_state_refuses_a_rule_that_is_not_a_list_of_module_ids():
    learner = _trained_learner()
    state = learner.get_state()
    state["should_module_be_updated"] = "builtins.print"
    with pytest.raises(ValueError, match="should_module_be_updated must be a list of module ids"):
        learner.set_state(state)
