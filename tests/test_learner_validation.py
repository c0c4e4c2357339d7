"""Bad input gets a clear error and leaves the weights untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import assert_same_tensors, bc_spec, random_batch

from lightning_rl import ALL_MODULES, DEFAULT_MODULE_ID, Columns, MultiRLModuleSpec
from lightning_rl.algorithms.appo import APPOLearner
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.algorithms.dqn import DQNLearner
from lightning_rl.algorithms.sac import SACLearner


@pytest.fixture
def learner() -> BCLearner:
    learner = BCLearner(module_spec=bc_spec())
    learner.build()
    return learner


def _assert_rejected_without_change(learner: BCLearner, batch, match: str) -> None:
    before = learner.get_state()
    with pytest.raises(ValueError, match=match):
        learner.update_from_batch(batch)
    after = learner.get_state()
    assert_same_tensors(before["rl_module"], after["rl_module"])
    assert after["weights_seq_no"] == before["weights_seq_no"]


def test_unknown_module_id_is_rejected_naming_it(learner):
    batch = {DEFAULT_MODULE_ID: random_batch(), "ghost": random_batch()}
    _assert_rejected_without_change(learner, batch, r"module ids \['ghost'\].*modules are \['default_policy'\]")


def test_missing_column_is_rejected_naming_module_and_column(learner):
    batch = random_batch()
    del batch[Columns.ACTIONS]
    _assert_rejected_without_change(learner, batch, r"module 'default_policy'.*lacks column\(s\) \['actions'\]")


def test_observation_of_the_wrong_shape_is_rejected_naming_the_shapes(learner):
    batch = random_batch()
    batch[Columns.OBS] = np.zeros((64, 3), np.float32)
    _assert_rejected_without_change(learner, batch, r"column 'obs' has shape \(64, 3\).*expects \[batch, 4\]")


def test_actions_of_the_wrong_shape_are_rejected(learner):
    batch = random_batch()
    batch[Columns.ACTIONS] = np.zeros((64, 2), np.int64)
    _assert_rejected_without_change(learner, batch, r"column 'actions' has shape \(64, 2\).*expects \[batch\]")


def test_columns_of_unequal_length_are_rejected(learner):
    batch = random_batch()
    batch[Columns.ACTIONS] = batch[Columns.ACTIONS][:10]
    _assert_rejected_without_change(learner, batch, r"same, non-zero number of rows.*'actions': 10")


def test_flat_batch_for_a_multi_module_learner_is_rejected():
    spec = MultiRLModuleSpec(rl_module_specs={"a": bc_spec(), "b": bc_spec()})
    learner = BCLearner(module_spec=spec)
    learner.build()
    _assert_rejected_without_change(learner, random_batch(), r"ambiguous.*\['a', 'b'\]")


def test_non_finite_loss_skips_the_step_and_is_counted(learner):
    batch = random_batch()
    batch[Columns.OBS][3, 1] = np.nan
    before = learner.get_state()
    results = learner.update_from_batch(batch)
    assert results[DEFAULT_MODULE_ID]["num_non_finite_updates_skipped"] == 1
    assert_same_tensors(before["rl_module"], learner.get_state()["rl_module"])
    # Adam's moments are untouched too: a later good batch trains normally.
    assert_same_tensors(before["optimizer"], learner.get_state()["optimizer"])
    good = learner.update_from_batch(random_batch())
    assert good[DEFAULT_MODULE_ID]["num_non_finite_updates_skipped"] == 0  # this update's count, not a stale one
    assert all(torch.isfinite(p).all() for p in learner.module.parameters())


def test_non_finite_minibatch_skips_only_itself(learner):
    batch = random_batch(64)
    batch[Columns.OBS][0, 0] = np.inf
    results = learner.update_from_batch(batch, num_epochs=1, minibatch_size=16)
    assert results[DEFAULT_MODULE_ID]["num_non_finite_updates_skipped"] == 1
    assert results[ALL_MODULES]["weights_seq_no"] == 3  # 4 minibatch steps; the skipped one changed no weights
    assert all(torch.isfinite(p).all() for p in learner.module.parameters())


@pytest.mark.parametrize(
    "lr, match",
    [
        ([[0, 1e-3], [100, -1e-4]], "values must be >= 0"),
        ([[0, 1e-3], [500, 1e-4], [200, 1e-5]], "strictly increasing"),
        ([[10, 1e-3]], "must start at timestep 0"),
        ([[0, 1e-3, 5]], r"\[timestep, value\] pair"),
        ([], "non-empty list"),
        (-0.1, "values must be >= 0"),
        ("fast", "expected a number"),
    ],
)
def test_invalid_lr_schedule_fails_at_construction(lr, match):
    with pytest.raises(ValueError, match=match):
        BCLearner(module_spec=bc_spec(), lr=lr)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"grad_clip": -1.0}, "grad_clip must be a positive number"),
        ({"grad_clip_by": "l1"}, "grad_clip_by must be one of"),
        ({"num_epochs": 0}, "num_epochs must be an int >= 1"),
        ({"minibatch_size": 0}, "minibatch_size must be an int >= 1"),
        ({"torch_compile_what_to_compile": "everything"}, "torch_compile_what_to_compile must be one of"),
        ({"config_overrides_per_module": {"p": {"learning_rate": 1.0}}}, "unknown hyperparameter 'learning_rate'"),
        ({"config_overrides_per_module": {"p": {"model_config": {}}}}, "give the module a spec with its own model_config"),
        ({"config_overrides_per_module": {"p": {"lr": [[5, 1.0]]}}}, "module 'p': lr: a schedule must start"),
    ],
)
def test_invalid_hyperparameters_fail_at_construction_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BCLearner(module_spec=bc_spec(), **kwargs)


def test_updating_before_build_says_to_build(learner):
    with pytest.raises(ValueError, match=r"call learner.build\(\) first"):
        BCLearner(module_spec=bc_spec()).update_from_batch(random_batch())


def test_build_without_a_spec_says_what_is_missing():
    with pytest.raises(ValueError, match="no module_spec"):
        BCLearner().build()


@pytest.mark.parametrize(
    "learner_class, overrides",
    [
        (BCLearner, {"num_epochs": 2}),
        (BCLearner, {"minibatch_size": 32}),
        (BCLearner, {"torch_compile": True, "cuda_graphs": True}),
        (DQNLearner, {"tau": 0.5}),
        (DQNLearner, {"target_network_update_freq": 10}),
        (APPOLearner, {"tau": 0.5}),
        (SACLearner, {"update_order": "critics_first"}),
    ],
)
def test_a_learner_wide_hyperparameter_is_refused_per_module(learner_class, overrides):
    # Read once for all modules (the update loop, a target-network callback): a module's own value would be ignored.
    names = ", ".join(sorted(overrides))
    with pytest.raises(ValueError, match=f"module 'p': {names} apply to the whole Learner"):
        learner_class(model_config={}, config_overrides_per_module={"p": overrides})


def test_a_replay_learner_takes_a_modules_own_minibatch_size():
    learner = DQNLearner(model_config={}, config_overrides_per_module={"p": {"minibatch_size": 64, "lr": 1e-3}})
    assert (learner.config_for_module("p").minibatch_size, learner.config_for_module("p").lr) == (64, 1e-3)


def test_a_checkpoint_saved_with_a_now_refused_override_loads_with_the_overrides_given_again(tmp_path, monkeypatch):
    # Saved before num_epochs was refused per module (it was silently ignored there): as if by that version.
    monkeypatch.setattr(BCLearner, "learner_wide_hyperparameters", frozenset())
    overrides = {DEFAULT_MODULE_ID: {"lr": 1e-3, "num_epochs": 3}}
    saved = BCLearner(module_spec=bc_spec(), config_overrides_per_module=overrides)
    saved.build()
    saved.save_to_path(tmp_path / "learner")
    monkeypatch.undo()

    refused = "num_epochs apply to the whole Learner.*config_overrides_per_module=<its overrides"
    with pytest.raises(ValueError, match=refused):
        BCLearner.load_from_checkpoint(tmp_path / "learner")
    loaded = BCLearner.load_from_checkpoint(
        tmp_path / "learner", config_overrides_per_module={DEFAULT_MODULE_ID: {"lr": 1e-3}}
    )
    assert loaded.config_for_module(DEFAULT_MODULE_ID).lr == 1e-3
    assert_same_tensors(loaded.module.state_dict(), saved.module.state_dict())
