"""MARWIL: BC at beta=0, the loss and moving average by hand, its checkpointed state, learning from mixed data."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import loader_of, make_trainer

from lightning_rl import Columns, RLModuleSpec, TrainingData, TrainItem
from lightning_rl.algorithms.bc import BCLearner, BCModule
from lightning_rl.algorithms.marwil import MARWILLearner, MARWILModule
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME

MODULE_ID = "default_policy"
OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
DISCRETE = gym.spaces.Discrete(3)
BOX = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
MODEL_CONFIG = {"fcnet_hiddens": [16, 16]}


def spec(module_class: type = MARWILModule, action_space: gym.Space = DISCRETE, **model_config) -> RLModuleSpec:
    return RLModuleSpec(
        module_class=module_class,
        observation_space=OBS,
        action_space=action_space,
        model_config={**MODEL_CONFIG, **model_config},
    )


def dataset_rows(rows: int = 32, seed: int = 0, action_space: gym.Space = DISCRETE) -> dict[str, torch.Tensor]:
    """Dataset rows as the offline data module yields them for MARWIL (extra transition columns included)."""
    rng = np.random.default_rng(seed)
    action_space.seed(seed)
    actions = np.stack([action_space.sample() for _ in range(rows)])
    return {
        Columns.OBS: torch.as_tensor(rng.normal(size=(rows, 3)), dtype=torch.float32),
        Columns.ACTIONS: torch.as_tensor(actions),
        Columns.REWARDS: torch.as_tensor(rng.normal(size=rows), dtype=torch.float32),
        Columns.VALUE_TARGETS: torch.as_tensor(rng.normal(3.0, 2.0, size=rows), dtype=torch.float32),
        Columns.BOOTSTRAP_OBS: torch.as_tensor(rng.normal(size=(rows, 3)), dtype=torch.float32),
        Columns.BOOTSTRAP_DISCOUNT: torch.as_tensor(rng.uniform(0.0, 1.0, size=rows), dtype=torch.float32),
    }


def full_targets(module: MARWILModule, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """The rows' value targets completed with the module's value of each episode's final observation."""
    with torch.no_grad():
        final_values = module.compute_values({Columns.OBS: rows[Columns.BOOTSTRAP_OBS]})
    return rows[Columns.VALUE_TARGETS] + rows[Columns.BOOTSTRAP_DISCOUNT] * final_values


def built(**kwargs) -> MARWILLearner:
    learner = MARWILLearner(kwargs.pop("module_spec", spec()), **kwargs)
    learner.build()
    return learner


# ---- beta = 0 is behaviour cloning -----------------------------------------------------


@pytest.mark.parametrize("action_space", [DISCRETE, BOX], ids=["discrete", "box"])
def test_beta_zero_takes_exactly_the_steps_of_bc(action_space: gym.Space):
    torch.manual_seed(0)
    bc = BCLearner(spec(BCModule, action_space), lr=1e-2)
    bc.build()
    torch.manual_seed(0)
    marwil = MARWILLearner(spec(MARWILModule, action_space), beta=0.0, lr=1e-2)
    marwil.build()
    value_before = {k: v.clone() for k, v in marwil.module[MODULE_ID].vf.state_dict().items()}

    for step in range(4):  # several updates, one of several minibatches, on the same rows
        rows = dataset_rows(24, seed=step, action_space=action_space)
        settings = dict(minibatch_size=8, num_epochs=2) if step == 2 else {}
        bc_results = bc.update_from_batch(rows, **settings)[MODULE_ID]
        marwil_results = marwil.update_from_batch(rows, **settings)[MODULE_ID]
        assert marwil_results["total_loss"] == bc_results["total_loss"]
        bc_pi, marwil_pi = bc.module[MODULE_ID].pi.state_dict(), marwil.module[MODULE_ID].pi.state_dict()
        assert bc_pi.keys() == marwil_pi.keys()
        for name in bc_pi:
            assert torch.equal(bc_pi[name], marwil_pi[name]), f"step {step}: pi.{name} differs from BC's"
    # No value loss: the value network is not trained, and no value loss is reported.
    for name, value in marwil.module[MODULE_ID].vf.state_dict().items():
        assert torch.equal(value, value_before[name])
    assert "vf_loss" not in marwil_results and "moving_avg_sqd_adv_norm" not in marwil_results


def test_beta_zero_needs_no_value_targets_but_beta_above_zero_does():
    assert built(beta=0.0).required_batch_columns(MODULE_ID) == [Columns.OBS, Columns.ACTIONS]
    learner = built(beta=1.0)
    assert learner.required_batch_columns(MODULE_ID) == [
        Columns.OBS,
        Columns.ACTIONS,
        Columns.VALUE_TARGETS,
        Columns.BOOTSTRAP_OBS,
        Columns.BOOTSTRAP_DISCOUNT,
    ]
    rows = dataset_rows()
    del rows[Columns.VALUE_TARGETS], rows[Columns.BOOTSTRAP_DISCOUNT]
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['value_targets', 'bootstrap_discount'\]"):
        learner.update_from_batch(rows)
    built(beta=0.0).update_from_batch(rows)  # BC trains on (obs, actions) alone
    # A recurrent module completes its targets too (from chunks: tests/test_recurrent_offline.py).
    recurrent = MARWILLearner(spec(use_lstm=True, max_seq_len=4), beta=1.0)
    assert recurrent.required_batch_columns(MODULE_ID) == learner.required_batch_columns(MODULE_ID)


# ---- The loss by hand ------------------------------------------------------------------


def test_loss_weights_and_moving_average_against_hand_computed_values():
    learner = built(
        module_spec=spec(action_space=gym.spaces.Discrete(2)),
        beta=1.0,
        vf_coeff=0.5,
        moving_average_sqd_adv_norm_update_rate=0.5,
        moving_average_sqd_adv_norm_start=12.0,
    )
    module = learner.module[MODULE_ID]
    # A uniform policy (logp = log 1/2 for either action) and a constant value V(s) = 1.
    with torch.no_grad():
        for net, bias in ((module.pi, [0.0, 0.0]), (module.vf, [1.0])):
            net[-1].weight.zero_()
            net[-1].bias.copy_(torch.tensor(bias))
    batch = {
        Columns.OBS: torch.randn(2, 3),
        Columns.ACTIONS: torch.tensor([0, 1]),
        Columns.VALUE_TARGETS: torch.tensor([3.0, -1.0]),
        # The first row's episode was truncated with half the discount left; the second's terminated.
        Columns.BOOTSTRAP_OBS: torch.randn(2, 3),
        Columns.BOOTSTRAP_DISCOUNT: torch.tensor([0.5, 0.0]),
    }
    # By hand: R = [3 + 0.5 * V(s_T), -1] = [3.5, -1]; A = R - V = [2.5, -2]; mean(A^2) = 5.125;
    # ma = 12 + 0.5 * (5.125 - 12) = 8.5625; w = exp(A / sqrt(ma)); policy loss = -mean(w) * log(1/2);
    # value loss = 0.5 * 5.125.
    weights = [math.exp(2.5 / math.sqrt(8.5625)), math.exp(-2 / math.sqrt(8.5625))]
    policy_loss = math.log(2) * (weights[0] + weights[1]) / 2
    total = policy_loss + 0.5 * 0.5 * 5.125

    fwd_out = module.forward_train(batch)
    loss = learner.compute_loss_for_module(
        module_id=MODULE_ID, config=learner.config_for_module(MODULE_ID), batch=batch, fwd_out=fwd_out
    )
    assert loss.item() == pytest.approx(total, rel=1e-6)
    assert module.moving_avg_sqd_adv_norm.item() == pytest.approx(8.5625)

    module.moving_avg_sqd_adv_norm.fill_(12.0)
    learner.metrics.reduce()  # drop the values the direct call logged
    results = learner.update_from_batch(batch)[MODULE_ID]
    assert results["policy_loss"] == pytest.approx(policy_loss, rel=1e-6)
    assert results["vf_loss"] == pytest.approx(0.5 * 5.125)
    assert results["total_loss"] == pytest.approx(total, rel=1e-6)
    assert results["moving_avg_sqd_adv_norm"] == pytest.approx(8.5625)
    # The weights are constants: the policy's gradient is that of -mean(w * logp) with w fixed,
    # the value network's that of vf_coeff * 0.5 * mean(A^2) with the target fixed too, V(s_T)
    # included: d/dbias = -vf_coeff * mean(A) = -0.125 (through V(s_T) as well it would be 0.1875).
    assert module.vf[-1].bias.grad.item() == pytest.approx(-0.125, abs=1e-6)
    probs_grad = torch.tensor([-(weights[0] - 0.5 * sum(weights)), -(weights[1] - 0.5 * sum(weights))]) / 2
    torch.testing.assert_close(module.pi[-1].bias.grad, probs_grad.float(), rtol=1e-5, atol=1e-6)


def test_the_moving_average_is_updated_once_per_minibatch():
    # lr=0 keeps the value network fixed, so each minibatch's mean squared advantage is known up front.
    learner = built(
        beta=1.0, lr=0.0, moving_average_sqd_adv_norm_update_rate=0.25, moving_average_sqd_adv_norm_start=50.0
    )
    module = learner.module[MODULE_ID]
    rows = dataset_rows(16)
    expected = 50.0
    with torch.no_grad():
        for index in (slice(0, 8), slice(8, 16)):  # two minibatches of 8, in order (no shuffling)
            values = module.compute_values({Columns.OBS: rows[Columns.OBS][index]})
            expected += 0.25 * ((full_targets(module, rows)[index] - values).pow(2).mean().item() - expected)
    results = learner.update_from_batch(rows, minibatch_size=8)[MODULE_ID]
    assert module.moving_avg_sqd_adv_norm.item() == pytest.approx(expected, rel=1e-6)
    assert results["moving_avg_sqd_adv_norm"] == pytest.approx(expected, rel=1e-6)  # the last value


def test_a_batch_with_a_non_finite_return_leaves_the_moving_average_and_the_weights_as_they_were():
    learner = built(beta=1.0, moving_average_sqd_adv_norm_update_rate=0.5)
    module = learner.module[MODULE_ID]
    learner.update_from_batch(dataset_rows(seed=1))
    average, weights = module.moving_avg_sqd_adv_norm.clone(), copy.deepcopy(module.state_dict())
    rows = dataset_rows(seed=2)
    rows[Columns.VALUE_TARGETS][3] = math.nan
    results = learner.update_from_batch(rows)[MODULE_ID]
    assert results["num_non_finite_updates_skipped"] == 1
    assert torch.equal(module.moving_avg_sqd_adv_norm, average)
    for name, value in module.state_dict().items():
        assert torch.equal(value, weights[name]), name
    learner.update_from_batch(dataset_rows(seed=3))
    assert math.isfinite(module.moving_avg_sqd_adv_norm.item()) and module.moving_avg_sqd_adv_norm != average


# ---- State ------------------------------------------------------------------------------


def test_the_moving_average_survives_get_state_set_state_and_checkpoints(tmp_path: Path):
    learner = built(beta=1.0, moving_average_sqd_adv_norm_update_rate=0.5)
    for seed in range(3):
        learner.update_from_batch(dataset_rows(seed=seed))
    moved = learner.module[MODULE_ID].moving_avg_sqd_adv_norm.item()
    assert moved != pytest.approx(100.0)

    fresh = built(beta=1.0, moving_average_sqd_adv_norm_update_rate=0.5)
    assert fresh.module[MODULE_ID].moving_avg_sqd_adv_norm.item() == 100.0
    fresh.set_state(learner.get_state())
    assert fresh.module[MODULE_ID].moving_avg_sqd_adv_norm.item() == moved
    restored = MARWILLearner.from_checkpoint(learner.save_to_path(str(tmp_path / "marwil")))
    assert restored.module[MODULE_ID].moving_avg_sqd_adv_norm.item() == moved


def test_a_trainer_checkpoint_carries_the_moving_average(tmp_path: Path):
    learner = MARWILLearner(spec(), beta=1.0, moving_average_sqd_adv_norm_update_rate=0.5)
    items = [
        TrainItem(
            TrainingData(batch=dataset_rows(8, seed=i)),
            timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 8 * (i + 1)},
            update_settings={"num_epochs": 1, "minibatch_size": None, "shuffle_batch_per_epoch": False},
        )
        for i in range(3)
    ]
    trainer = make_trainer(tmp_path)
    trainer.fit(learner, train_dataloaders=loader_of(items))
    assert learner.weights_seq_no == 3
    moved = learner.module[MODULE_ID].moving_avg_sqd_adv_norm.item()
    path = tmp_path / "marwil.ckpt"
    trainer.save_checkpoint(path)
    restored = MARWILLearner.from_checkpoint(str(path))
    assert restored.module[MODULE_ID].moving_avg_sqd_adv_norm.item() == moved != pytest.approx(100.0)


def test_the_start_value_is_set_per_module_when_built():
    learner = built(moving_average_sqd_adv_norm_start=7.0)
    assert learner.module[MODULE_ID].moving_avg_sqd_adv_norm.item() == 7.0
    overridden = built(config_overrides_per_module={MODULE_ID: {"moving_average_sqd_adv_norm_start": 3.0}})
    assert overridden.module[MODULE_ID].moving_avg_sqd_adv_norm.item() == 3.0


# ---- Configuration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"beta": -0.1}, "beta must be a finite number >= 0"),
        ({"beta": math.inf}, "beta"),
        ({"vf_coeff": -1.0}, "vf_coeff"),
        ({"moving_average_sqd_adv_norm_update_rate": 1.5}, "moving_average_sqd_adv_norm_update_rate must be"),
        ({"moving_average_sqd_adv_norm_start": 0.0}, "moving_average_sqd_adv_norm_start must be a finite number > 0"),
        ({"gamma": 1.01}, "gamma must be a number in"),
        ({"beta": "high"}, "beta"),
        ({"config_overrides_per_module": {MODULE_ID: {"beta": -1.0}}}, "module 'default_policy': beta"),
    ],
)
def test_invalid_marwil_hyperparameters_fail_at_construction_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MARWILLearner(spec(), **kwargs)


def test_a_module_other_than_a_training_marwil_module_is_refused():
    with pytest.raises(ValueError, match="MARWILLearner trains MARWILModules"):
        MARWILLearner(spec(BCModule)).build()


def test_an_inference_only_module_has_the_policy_alone_and_acts_as_bc():
    inference = spec()
    inference.inference_only = True
    module = inference.build()
    assert {name.split(".")[0] for name in module.state_dict()} == {"pi"}
    out = module.forward_inference({Columns.OBS: torch.randn(4, 3)})
    assert out[Columns.ACTION_DIST_INPUTS].shape == (4, 3)
    with pytest.raises(ValueError, match="inference_only"):
        module.compute_values({Columns.OBS: torch.randn(4, 3)})


def test_the_learner_builds_a_marwil_module_from_model_config_or_trains_the_one_given():
    learner = MARWILLearner(model_config={"fcnet_hiddens": [5]})
    module_spec = learner.module_spec.rl_module_specs[MODULE_ID]
    assert module_spec.module_class is MARWILModule and module_spec.model_config == {"fcnet_hiddens": [5]}
    module = spec().build()
    given = MARWILLearner(module=module)
    given.build()
    assert given.module[MODULE_ID] is module
    empty = {Columns.OBS: torch.zeros(0, 3), Columns.ACTIONS: torch.zeros(0, dtype=torch.long)}
    out = module.forward_train(empty)
    assert out[Columns.ACTION_DIST_INPUTS].shape == (0, 3) and out[Columns.VF_PREDS].shape == (0,)


# ---- Learning ------------------------------------------------------------------------------


@pytest.mark.slow
def test_marwil_prefers_the_high_return_action_where_bc_copies_the_mix():
    """One-step episodes: action 0 returns 1, action 1 returns 0; the data takes action 0 in 30% of rows."""
    rng = np.random.default_rng(0)
    rows = 256
    actions = (rng.random(rows) >= 0.3).astype(np.int64)  # 0 (good) in about 30% of rows
    batch = {
        Columns.OBS: rng.normal(size=(rows, 3)).astype(np.float32),
        Columns.ACTIONS: actions,
        Columns.VALUE_TARGETS: (actions == 0).astype(np.float32),
        Columns.BOOTSTRAP_OBS: np.zeros((rows, 3), np.float32),
        Columns.BOOTSTRAP_DISCOUNT: np.zeros(rows, np.float32),  # every episode terminated
    }
    good_share = float((actions == 0).mean())
    probabilities = {}
    for beta in (0.0, 2.0):
        torch.manual_seed(0)
        learner = MARWILLearner(
            spec(action_space=gym.spaces.Discrete(2), fcnet_hiddens=[16]),
            beta=beta,
            lr=1e-2,
            moving_average_sqd_adv_norm_update_rate=0.1,
        )
        learner.build()
        for _ in range(150):
            learner.update_from_batch(batch)
        with torch.no_grad():
            logits = learner.module[MODULE_ID].forward_inference({Columns.OBS: torch.as_tensor(batch[Columns.OBS])})
            probabilities[beta] = torch.softmax(logits[Columns.ACTION_DIST_INPUTS], -1)[:, 0].mean().item()
    assert probabilities[0.0] == pytest.approx(good_share, abs=0.08)  # BC copies the mix
    assert probabilities[2.0] > 0.9  # MARWIL takes the high-return action
