"""RLlib's Learner names: one module's state, module weights, Learner(module=...), config per module, result keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _helpers import assert_same_tensors, bc_spec, random_batch, weights

from lightning_rl import DEFAULT_MODULE_ID, Learner, MultiRLModule
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.learner import result_keys as learner_module


def _two_module_learner(**kwargs) -> BCLearner:
    learner = BCLearner(module_spec=bc_spec(), **kwargs)
    learner.build()
    learner.add_module(module_id="other", module_spec=bc_spec(), config_overrides={"lr": 0.05})
    learner.update_from_batch({DEFAULT_MODULE_ID: random_batch(seed=1), "other": random_batch(seed=2)})
    return learner


def test_get_state_of_one_module_component_returns_exactly_that_modules_weights():
    learner = _two_module_learner()
    state = learner.get_state(components="rl_module/other")
    assert list(state["rl_module"]) == ["other"]
    assert_same_tensors(state["rl_module"]["other"], weights(learner, "other"))
    assert "optimizer" not in state and "metrics_logger" not in state
    # What it returns restores that module alone.
    target = _two_module_learner()
    target.set_state({"rl_module": state["rl_module"]})
    assert_same_tensors(weights(target, "other"), weights(learner, "other"))


def test_not_components_leaves_one_module_out_of_the_weights():
    learner = _two_module_learner()
    state = learner.get_state(not_components="rl_module/other")
    assert list(state["rl_module"]) == [DEFAULT_MODULE_ID]
    assert "optimizer" in state and "metrics_logger" in state
    assert list(learner.get_state(components=["rl_module"], not_components=["rl_module/other"])["rl_module"]) == [
        DEFAULT_MODULE_ID
    ]


@pytest.mark.parametrize(
    "kwargs", [{"components": "rl_module/ghost"}, {"components": "weights"}, {"not_components": "rl_module/ghost"}]
)
def test_an_unknown_component_or_module_id_is_rejected_naming_the_valid_ones(kwargs):
    learner = _two_module_learner()
    with pytest.raises(ValueError, match=r"unknown state component.*'rl_module/default_policy', 'rl_module/other'"):
        learner.get_state(**kwargs)


def test_get_module_state_returns_the_weights_of_all_or_the_listed_modules():
    learner = _two_module_learner()
    everything = learner.get_module_state()
    assert sorted(everything) == [DEFAULT_MODULE_ID, "other"]
    assert_same_tensors(everything[DEFAULT_MODULE_ID], weights(learner))
    assert list(learner.get_module_state(["other"])) == ["other"]
    assert list(learner.get_module_state("other")) == ["other"]
    with pytest.raises(ValueError, match="ghost"):
        learner.get_module_state(["ghost"])


def test_get_module_state_is_a_copy_unaffected_by_later_updates():
    learner = _two_module_learner()
    saved = learner.get_module_state()
    frozen = {module_id: {k: v.clone() for k, v in w.items()} for module_id, w in saved.items()}
    learner.update_from_batch({DEFAULT_MODULE_ID: random_batch(seed=3), "other": random_batch(seed=4)})
    assert_same_tensors(saved, frozen)


def test_set_module_state_loads_the_named_modules_and_leaves_the_others():
    source, target = _two_module_learner(), _two_module_learner()
    target.update_from_batch({DEFAULT_MODULE_ID: random_batch(seed=5), "other": random_batch(seed=6)})
    untouched = weights(target)
    target.set_module_state(source.get_module_state(["other"]))
    assert_same_tensors(weights(target, "other"), weights(source, "other"))
    assert_same_tensors(weights(target), untouched)


def test_set_module_state_checks_everything_first_and_changes_nothing_on_error():
    learner = _two_module_learner()
    before = learner.get_module_state()
    good = {module_id: {k: torch.zeros_like(v) for k, v in w.items()} for module_id, w in before.items()}
    bad = dict(good)
    bad["other"] = {k: v for k, v in list(good["other"].items())[1:]}  # one weight missing
    with pytest.raises(ValueError, match="other"):
        learner.set_module_state(bad)
    assert_same_tensors(learner.get_module_state(), before)
    with pytest.raises(ValueError, match="ghost"):
        learner.set_module_state({"ghost": good["other"]})
    with pytest.raises(ValueError, match="module_id: {name: tensor}"):
        learner.set_module_state({"other": 1.0})


def test_a_learner_given_a_built_module_trains_that_very_module():
    module = bc_spec().build()
    learner = BCLearner(module=module)
    assert learner.module is None  # built on build(), as with a spec
    learner.build()
    assert learner.module[DEFAULT_MODULE_ID] is module
    before = {k: v.clone() for k, v in module.state_dict().items()}
    learner.update_from_batch(random_batch())
    assert any(not torch.equal(before[k], v) for k, v in module.state_dict().items())


def test_a_learner_given_a_module_has_the_same_state_dict_keys_as_one_built_from_its_spec():
    from_module = BCLearner(module=bc_spec().build())
    from_module.build()
    from_spec = BCLearner(module_spec=bc_spec())
    from_spec.build()
    assert list(from_module.state_dict()) == list(from_spec.state_dict())


def test_a_learner_given_a_multi_rl_module_trains_each_of_its_modules():
    multi = MultiRLModule({"a": bc_spec().build(), "b": bc_spec().build()})
    learner = BCLearner(module=multi)
    learner.build()
    assert learner.module is multi
    results = learner.update_from_batch({"a": random_batch(seed=1), "b": random_batch(seed=2)})
    assert "total_loss" in results["a"] and "total_loss" in results["b"]


def test_the_checkpoint_of_a_learner_given_a_module_rebuilds_it(tmp_path: Path):
    learner = BCLearner(module=bc_spec(hiddens=(5, 3)).build(), lr=1e-3)
    learner.build()
    learner.update_from_batch(random_batch())
    learner.save_to_path(str(tmp_path / "ckpt"))
    loaded = Learner.from_checkpoint(str(tmp_path / "ckpt"))
    assert type(loaded) is BCLearner
    assert_same_tensors(loaded.get_state()["rl_module"], learner.get_state()["rl_module"])
    assert_same_tensors(loaded.get_state()["optimizer"], learner.get_state()["optimizer"])


def test_module_is_not_a_hyperparameter():
    learner = BCLearner(module=bc_spec().build())
    assert "module" not in learner.hparams and "module_spec" not in learner.hparams


def test_module_and_module_spec_together_are_refused():
    with pytest.raises(ValueError, match="module_spec or module, not both"):
        BCLearner(bc_spec(), module=bc_spec().build())
    with pytest.raises(ValueError, match="module must be an RLModule"):
        BCLearner(module=torch.nn.Linear(2, 2))


def test_config_get_config_for_module_applies_that_modules_overrides():
    learner = _two_module_learner(lr=1e-3)
    assert learner.config.lr == 1e-3
    assert learner.config.get_config_for_module("other").lr == 0.05
    assert learner.config.get_config_for_module(DEFAULT_MODULE_ID).lr == 1e-3
    assert learner.config.get_config_for_module("other") == learner.config_for_module("other")


def test_result_keys_are_readable_as_class_attributes_with_rllibs_strings():
    assert Learner.TOTAL_LOSS_KEY == learner_module.TOTAL_LOSS_KEY == "total_loss"
    assert BCLearner.TOTAL_LOSS_KEY == "total_loss"
    assert Learner.NUM_ENV_STEPS_TRAINED == "num_env_steps_trained"
    assert Learner.WEIGHTS_SEQ_NO == "weights_seq_no"
    learner = BCLearner(module_spec=bc_spec())
    learner.build()
    assert Learner.TOTAL_LOSS_KEY in learner.update_from_batch(random_batch())[DEFAULT_MODULE_ID]
