"""CQL: the conservative penalty by hand, its gradients, the Lagrangian multiplier, SAC at weight 0, learning."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import assert_same_tensors, loader_of, make_trainer

from lightning_rl import Columns, Policy, RLModuleSpec, TrainingData, TrainItem
from lightning_rl.algorithms.cql import ALPHA_PRIME_OPTIMIZER, CQLLearner, CQLModule, conservative_gap
from lightning_rl.algorithms import sac
from lightning_rl.algorithms.sac import SACLearner, SACModule

OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 5.0], np.float32))
MODULE_ID = "default_policy"
# The same learning rates for CQL and SAC where they are compared (CQL's defaults are d3rlpy's).
SAME_LRS = dict(actor_lr=1e-3, critic_lr=2e-3, alpha_lr=3e-3)


def spec(
    module_class: type = CQLModule, action_space: gym.Space = BOX, hiddens: tuple[int, ...] = (8, 8)
) -> RLModuleSpec:
    return RLModuleSpec(
        module_class=module_class,
        observation_space=OBS,
        action_space=action_space,
        model_config={"fcnet_hiddens": list(hiddens)},
    )


def dataset_rows(rows: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """Dataset transitions with the shared interface's columns (no replay n_step or weights)."""
    rng = np.random.default_rng(seed)
    return {
        Columns.OBS: torch.as_tensor(rng.normal(size=(rows, 3)), dtype=torch.float32),
        Columns.ACTIONS: torch.as_tensor(rng.uniform(BOX.low, BOX.high, (rows, 2)), dtype=torch.float32),
        Columns.REWARDS: torch.as_tensor(rng.normal(size=rows), dtype=torch.float32),
        Columns.NEXT_OBS: torch.as_tensor(rng.normal(size=(rows, 3)), dtype=torch.float32),
        Columns.TERMINATEDS: torch.as_tensor(rng.random(rows) < 0.25),
        Columns.TRUNCATEDS: torch.as_tensor(rng.random(rows) < 0.25),
    }


def built(learner_class: type = CQLLearner, **kwargs: Any) -> Any:
    torch.manual_seed(kwargs.pop("init_seed", 0))
    module_class = CQLModule if learner_class is CQLLearner else SACModule
    learner = learner_class(kwargs.pop("module_spec", spec(module_class)), **kwargs)
    learner.build()
    return learner


def optimizer_params(learner: Any, name: str) -> list[torch.nn.Parameter]:
    return [p for group in learner.get_optimizer(MODULE_ID, name).param_groups for p in group["params"]]


def hand_penalty(
    module: CQLModule, batch: dict[str, torch.Tensor], uniform: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    """The mean over both critics of the conservative gap, one action at a time, from the paper's formulas.

    ``uniform`` ``[B, N, d]`` are the uniform actions in ``[-1, 1]^d``; ``noise`` ``[2B, N, d]`` the
    Gaussian draws of the policy samples at ``s`` (rows ``:B``) and ``s'`` (rows ``B:``). The log-density
    of a squashed sample is the Gaussian's minus ``log(1 - tanh(u)^2)``, written out directly.
    Differentiable in the critics' weights; computed in the module's dtype.
    """
    dtype = next(module.parameters()).dtype
    obs, next_obs = batch[Columns.OBS].to(dtype), batch[Columns.NEXT_OBS].to(dtype)
    data_actions = module.normalize_actions(batch[Columns.ACTIONS]).to(dtype)
    rows, num, dim = uniform.shape
    gaps = []
    for critic in (module.qf, module.qf_twin):
        per_row = []
        for b in range(rows):
            terms = []
            for j in range(num):
                q = critic(torch.cat([obs[b], uniform[b, j].to(dtype)]))[0]
                terms.append(q + dim * math.log(2.0))  # minus log(1 / 2^d)
            for policy_obs, offset in ((obs[b], 0), (next_obs[b], rows)):
                with torch.no_grad():
                    mean, log_std = (x[0] for x in module.action_dist_params(policy_obs.unsqueeze(0)))
                for j in range(num):
                    u = mean + log_std.exp() * noise[offset + b, j].to(dtype)
                    gaussian = torch.distributions.Normal(mean, log_std.exp()).log_prob(u).sum()
                    logp = gaussian - torch.log(1 - torch.tanh(u) ** 2).sum()
                    terms.append(critic(torch.cat([obs[b], torch.tanh(u)]))[0] - logp.detach())
            logsumexp = torch.log(torch.stack(terms).exp().sum())
            per_row.append(logsumexp - critic(torch.cat([obs[b], data_actions[b]]))[0])
        gaps.append(torch.stack(per_row).mean())
    return torch.stack(gaps).mean()


def cql_draws(seed: int, rows: int, num: int, dim: int = 2, soft: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The penalty's draws of a CQL step seeded with ``seed``, after the SAC draws before them."""
    torch.manual_seed(seed)
    torch.randn(rows, dim)  # a~ ~ pi(s) in forward_train
    if soft:
        torch.randn(rows, dim)  # a' ~ pi(s') of the soft backup
    uniform = torch.empty(rows, num, dim).uniform_(-1.0, 1.0)
    return uniform, torch.randn(2 * rows, num, dim)


# ---- The penalty ---------------------------------------------------------------------


def test_conservative_gap_is_the_mean_logsumexp_minus_the_data_value_per_critic():
    values = torch.tensor([[[0.0, math.log(3.0)], [1.0, 1.0]], [[2.0, 2.0], [0.0, 0.0]]])  # [2 critics, 2 rows, 2]
    data = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    expected = torch.tensor(
        [((math.log(4.0) - 1.0) + (1.0 + math.log(2.0))) / 2, ((2.0 + math.log(2.0)) + (math.log(2.0) - 1.0)) / 2]
    )
    torch.testing.assert_close(conservative_gap(values, data), expected)


def test_the_logged_penalty_equals_a_hand_computation_one_action_at_a_time():
    learner = built(cql_weight=2.5, num_cql_actions=3)
    batch = dataset_rows(rows=4)
    before = copy.deepcopy(learner.module[MODULE_ID]).double()
    torch.manual_seed(11)
    results = learner.update_from_batch(batch)[MODULE_ID]
    uniform, noise = cql_draws(11, rows=4, num=3)
    with torch.no_grad():
        expected = 2.5 * hand_penalty(before, batch, uniform.double(), noise.double())
    assert results["cql_penalty"] == pytest.approx(expected.item(), rel=1e-5)
    assert "cql_alpha" not in results  # no multiplier without lagrangian


def test_sampled_values_are_the_critics_at_s_of_uniform_and_policy_actions_in_one_batched_call():
    module = spec().build()
    obs, next_obs = torch.randn(5, 3), torch.randn(5, 3)
    calls = []
    module.qf.register_forward_hook(lambda _, inputs, __: calls.append(inputs[0].shape))
    torch.manual_seed(3)
    values = module.conservative_q_values(obs, next_obs, num_actions=4)
    assert values.shape == (2, 5, 12)
    assert calls == [(60, 5)]  # obs and action for all 5 rows x 12 samples at once
    torch.manual_seed(3)  # called alone, the uniform actions are its first draw
    uniform = torch.empty(5, 4, 2).uniform_(-1.0, 1.0)
    q_uniform = module.qf(torch.cat([obs.unsqueeze(1).expand(5, 4, 3), uniform], -1)).squeeze(-1)
    torch.testing.assert_close(values[0, :, :4], q_uniform + 2 * math.log(2.0))
    assert uniform.abs().max() <= 1.0 and uniform.min() < -0.5 and uniform.max() > 0.5  # the normalized range


# ---- Gradients -----------------------------------------------------------------------


@pytest.mark.parametrize("soft_q_backup", [True, False])
def test_the_critic_gradient_adds_the_penalty_and_the_actor_and_alpha_gradients_are_sacs(soft_q_backup: bool):
    """CQL's step against SAC's on the same weights and draws: only the critics' gradients differ, by the penalty's."""
    cql = built(cql_weight=3.0, num_cql_actions=2, soft_q_backup=soft_q_backup, **SAME_LRS)
    sac = built(SACLearner, **SAME_LRS)
    before = copy.deepcopy(cql.module[MODULE_ID])
    batch = dataset_rows(rows=6, seed=1)
    if not soft_q_backup:  # SAC's target is soft: give SAC CQL's deterministic one
        sac.module[MODULE_ID].sample_actions = lambda obs: (
            torch.tanh(sac.module[MODULE_ID].action_dist_params(obs)[0]),
            torch.zeros(obs.shape[0]),
        )
    for learner in (cql, sac):
        torch.manual_seed(5)
        learner.update_from_batch(batch)
    uniform, noise = cql_draws(5, rows=6, num=2, soft=soft_q_backup)
    penalty = 3.0 * hand_penalty(before, batch, uniform, noise)
    critics = [*before.qf.parameters(), *before.qf_twin.parameters()]
    penalty_grads = torch.autograd.grad(penalty, critics)

    for got, sac_grad, extra in zip(optimizer_params(cql, "qf"), optimizer_params(sac, "qf"), penalty_grads):
        assert extra.abs().max() > 0
        torch.testing.assert_close(got.grad, sac_grad.grad + extra, rtol=1e-4, atol=1e-5)
    for name in ("policy", "alpha"):
        for got, want in zip(optimizer_params(cql, name), optimizer_params(sac, name)):
            torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=0)


def test_the_default_target_is_the_target_critics_at_the_policy_mean_without_entropy():
    learner = built(cql_weight=1.0, gamma=0.9, initial_alpha=0.5)
    fresh = copy.deepcopy(learner.module[MODULE_ID])  # the weights the step starts from
    batch = dataset_rows(rows=5, seed=2)
    batch[Columns.TERMINATEDS] = torch.tensor([True, False, False, True, False])
    td_errors = []
    learner.record_td_errors = lambda module_id, td: td_errors.append(td)
    learner.update_from_batch(batch)
    with torch.no_grad():
        mean, _ = fresh.action_dist_params(batch[Columns.NEXT_OBS])
        next_in = torch.cat([batch[Columns.NEXT_OBS], torch.tanh(mean)], -1)
        next_q = torch.min(fresh.target_qf(next_in), fresh.target_qf_twin(next_in)).squeeze(-1)
        y = batch[Columns.REWARDS] + 0.9 * (~batch[Columns.TERMINATEDS]).float() * next_q
        q_in = torch.cat([batch[Columns.OBS], fresh.normalize_actions(batch[Columns.ACTIONS])], -1)
        expected = 0.5 * ((fresh.qf(q_in).squeeze(-1) - y).abs() + (fresh.qf_twin(q_in).squeeze(-1) - y).abs())
    torch.testing.assert_close(td_errors[0], expected)


def test_cql_weight_zero_trains_exactly_as_sac_step_for_step():
    cql = built(cql_weight=0.0, soft_q_backup=True, initial_alpha=0.3, **SAME_LRS)
    sac = built(SACLearner, initial_alpha=0.3, **SAME_LRS)
    for step in range(4):
        results = []
        for learner in (cql, sac):
            torch.manual_seed(100 + step)
            results.append(learner.update_from_batch(dataset_rows(seed=step))[MODULE_ID])
        assert "cql_penalty" not in results[0]
        assert results[0] == results[1]
    cql_weights = cql.module[MODULE_ID].state_dict()
    assert cql_weights.pop("log_alpha_prime").item() == 0.0  # untouched: no Lagrangian
    assert_same_tensors(cql_weights, sac.module[MODULE_ID].state_dict())
    for name in ("policy", "qf", "alpha"):
        assert_same_tensors(
            cql.get_optimizer(MODULE_ID, name).state_dict()["state"],
            sac.get_optimizer(MODULE_ID, name).state_dict()["state"],
        )


def test_critics_first_steps_critics_and_multiplier_as_the_joint_step_then_the_actor_without_the_penalty(
    monkeypatch,
):
    settings = dict(lagrangian=True, lagrangian_lr=0.05, initial_alpha=0.3, **SAME_LRS)
    joint, ordered = built(**settings), built(**settings, update_order="critics_first")
    # a~ ~ pi(s) from fixed noise, off the global RNG: the joint pass draws it before the penalty's
    # samples, critics_first's critic pass not at all (its actor pass does), so the penalty's draws align.
    noise = torch.randn(16, 2)  # dataset_rows(): 16 rows, 2-d actions
    monkeypatch.setattr(sac, "_gaussian_sample", lambda mean, log_std: mean + log_std.exp() * noise)
    results = []
    for learner in (joint, ordered):
        torch.manual_seed(5)
        results.append(learner.update_from_batch(dataset_rows())[MODULE_ID])
    stepped, joint_module = ordered.module[MODULE_ID], joint.module[MODULE_ID]
    # The first phase is the joint step's critic part, penalty and multiplier included.
    for name in ("qf", "qf_twin"):
        assert_same_tensors(getattr(stepped, name).state_dict(), getattr(joint_module, name).state_dict())
    assert stepped.log_alpha_prime.item() == joint_module.log_alpha_prime.item() != pytest.approx(0.0)
    assert results[1]["cql_penalty"] == results[0]["cql_penalty"]
    assert results[1]["qf_loss"] == results[0]["qf_loss"]
    # The second trains the actor against the stepped critics: another gradient, no penalty in it.
    assert not torch.equal(stepped.pi[0].weight.grad, joint_module.pi[0].weight.grad)
    assert stepped.qf[0].weight.grad is None  # the actor phase's backward pass reached no critic


# ---- The Lagrangian multiplier -------------------------------------------------------


def test_lagrangian_optimizer_trains_log_alpha_prime_which_is_frozen_without_it():
    plain = built()
    assert [name for name, _ in plain.get_optimizers_for_module(MODULE_ID)] == ["policy", "qf", "alpha"]
    assert not plain.module[MODULE_ID].log_alpha_prime.requires_grad
    lagrangian = built(lagrangian=True, initial_lagrangian_alpha=0.25, lagrangian_lr=0.02)
    module = lagrangian.module[MODULE_ID]
    names = [name for name, _ in lagrangian.get_optimizers_for_module(MODULE_ID)]
    assert names == ["policy", "qf", "alpha", ALPHA_PRIME_OPTIMIZER]
    assert optimizer_params(lagrangian, ALPHA_PRIME_OPTIMIZER) == [module.log_alpha_prime]
    assert module.log_alpha_prime.item() == pytest.approx(math.log(0.25))
    assert lagrangian.get_optimizer(MODULE_ID, ALPHA_PRIME_OPTIMIZER).param_groups[0]["lr"] == 0.02
    # d3rlpy's learning rates by default
    lrs = {name: lagrangian.get_optimizer(MODULE_ID, name).param_groups[0]["lr"] for name in names[:3]}
    assert lrs == {"policy": 1e-4, "qf": 3e-4, "alpha": 1e-4}


@pytest.mark.parametrize(("threshold", "direction"), [(-50.0, 1.0), (200.0, -1.0)])
def test_lagrangian_alpha_rises_while_the_gap_is_above_the_threshold_and_falls_below(threshold, direction):
    learner = built(lagrangian=True, lagrangian_threshold=threshold, cql_weight=2.0, lagrangian_lr=0.01)
    log_alpha_prime = learner.module[MODULE_ID].log_alpha_prime
    values = [log_alpha_prime.item()]
    for step in range(3):
        results = learner.update_from_batch(dataset_rows(seed=step))[MODULE_ID]
        # alpha' of the step, and its loss: -alpha' * cql_weight * (gap - threshold)
        assert results["cql_alpha"] == pytest.approx(math.exp(values[-1]), rel=1e-6)
        gap = results["cql_penalty"] / 2.0
        assert results["cql_alpha_loss"] == pytest.approx(-results["cql_alpha"] * 2.0 * (gap - threshold), rel=1e-5)
        values.append(log_alpha_prime.item())
    steps = np.diff(values)
    np.testing.assert_allclose(steps, direction * 0.01, rtol=1e-3)  # Adam: about lr per step, the gradient's sign


def test_lagrangian_critic_gradient_is_the_penalty_scaled_by_alpha_prime():
    """alpha' = 0.5 and cql_weight = 2 give the critics the gradient of cql_weight = 1 without the multiplier."""
    lagrangian = built(lagrangian=True, initial_lagrangian_alpha=0.5, cql_weight=2.0, lagrangian_threshold=3.0)
    plain = built(cql_weight=1.0)
    for learner in (lagrangian, plain):
        torch.manual_seed(9)
        learner.update_from_batch(dataset_rows(seed=4))
    for name in ("policy", "qf", "alpha"):
        for got, want in zip(optimizer_params(lagrangian, name), optimizer_params(plain, name)):
            torch.testing.assert_close(got.grad, want.grad)


# ---- Configuration -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cql_weight": -1.0}, "cql_weight must be a finite number >= 0"),
        ({"cql_weight": math.inf}, "cql_weight"),
        ({"num_cql_actions": 0}, "num_cql_actions must be an int >= 1"),
        ({"num_cql_actions": 2.5}, "num_cql_actions"),
        ({"lagrangian": "yes"}, "lagrangian must be True or False"),
        ({"soft_q_backup": 1}, "soft_q_backup must be True or False"),
        ({"lagrangian_threshold": math.nan}, "lagrangian_threshold must be a finite number"),
        ({"lagrangian_lr": [[5, 1e-3]]}, "lagrangian_lr"),
        ({"initial_lagrangian_alpha": 0.0}, "initial_lagrangian_alpha must be a number in"),
        ({"lagrangian": True, "cql_weight": 0.0}, "lagrangian=True .* cql_weight=0"),
        ({"initial_alpha": -1.0}, "initial_alpha"),  # SAC's checks still run
    ],
)
def test_invalid_cql_arguments_fail_at_construction_naming_them(kwargs: dict[str, Any], message: str):
    with pytest.raises(ValueError, match=message):
        CQLLearner(spec(), **kwargs)


def test_a_per_module_override_is_checked_too():
    with pytest.raises(ValueError, match="module 'default_policy': num_cql_actions"):
        CQLLearner(spec(), config_overrides_per_module={MODULE_ID: {"num_cql_actions": -3}})


def test_a_sac_module_is_refused_naming_the_cql_module():
    with pytest.raises(ValueError, match="CQLLearner trains CQLModules.*got SACModule"):
        CQLLearner(spec(SACModule)).build()


def test_an_inference_only_cql_module_has_the_actor_alone():
    inference = spec()
    inference.inference_only = True
    module = inference.build()
    assert {name.split(".")[0] for name, _ in module.named_parameters()} == {"pi"}


# ---- Checkpoints ---------------------------------------------------------------------


def cql_state(learner: CQLLearner) -> dict[str, Any]:
    return {
        "weights": {k: v.clone() for k, v in learner.module[MODULE_ID].state_dict().items()},
        "alpha_prime": copy.deepcopy(learner.get_optimizer(MODULE_ID, ALPHA_PRIME_OPTIMIZER).state_dict()["state"]),
    }


def test_a_saved_learner_restores_log_alpha_prime_and_its_optimizer_and_trains_on_alike(tmp_path: Path):
    learner = built(lagrangian=True, lagrangian_threshold=-20.0, lagrangian_lr=0.05, initial_lagrangian_alpha=2.0)
    for step in range(3):
        learner.update_from_batch(dataset_rows(seed=step))
    saved = cql_state(learner)
    assert saved["weights"]["log_alpha_prime"].item() == pytest.approx(math.log(2.0) + 0.15, rel=1e-3)
    learner.save_to_path(str(tmp_path / "cql"))

    restored = CQLLearner.from_checkpoint(str(tmp_path / "cql"))
    assert restored.hparams.lagrangian and restored.hparams.lagrangian_threshold == -20.0
    assert_same_tensors(cql_state(restored), saved)
    for other in (learner, restored):
        torch.manual_seed(1)
        other.update_from_batch(dataset_rows(seed=9))
    assert_same_tensors(cql_state(restored), cql_state(learner))


def test_a_trainer_checkpoint_round_trips_the_multiplier(tmp_path: Path):
    learner = CQLLearner(spec(), lagrangian=True, lagrangian_lr=0.05, lagrangian_threshold=-20.0)
    items = [
        TrainItem(
            TrainingData(batch={k: v.numpy() for k, v in dataset_rows(seed=i).items()}),
            timesteps={"num_env_steps_sampled_lifetime": 16 * (i + 1)},
            update_settings={"num_epochs": 1, "minibatch_size": None, "shuffle_batch_per_epoch": False},
        )
        for i in range(3)
    ]
    trainer = make_trainer(tmp_path)
    trainer.fit(learner, train_dataloaders=loader_of(items))
    assert learner.weights_seq_no == 3
    assert learner.module[MODULE_ID].log_alpha_prime.item() > 0.1  # three steps up from log(1)
    trainer.save_checkpoint(tmp_path / "cql.ckpt")
    restored = CQLLearner.from_checkpoint(str(tmp_path / "cql.ckpt"))
    assert_same_tensors(cql_state(restored), cql_state(learner))


def test_a_policy_from_the_checkpoint_acts_as_the_learners_module(tmp_path: Path):
    learner = built(lagrangian=True)
    learner.update_from_batch(dataset_rows())
    learner.save_to_path(str(tmp_path / "cql"))
    policy = Policy.from_checkpoint(str(tmp_path / "cql"))
    obs = np.random.default_rng(0).normal(size=3).astype(np.float32)
    with torch.no_grad():
        expected = learner.module[MODULE_ID].forward_inference({Columns.OBS: torch.as_tensor(obs)[None]})
    np.testing.assert_allclose(policy.act(obs), expected[Columns.ACTIONS][0].numpy(), rtol=1e-6)


# ---- Learning ------------------------------------------------------------------------

BANDIT_OBS = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
BANDIT_ACTIONS = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)


def bandit_rows(rows: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """A one-step bandit whose data holds actions in [-1, 0] only, reward 1 + a (rising towards the data's edge)."""
    actions = rng.uniform(-1.0, 0.0, (rows, 1))
    obs = rng.uniform(-1.0, 1.0, (rows, 1))
    return {
        Columns.OBS: torch.as_tensor(obs, dtype=torch.float32),
        Columns.ACTIONS: torch.as_tensor(actions, dtype=torch.float32),
        Columns.REWARDS: torch.as_tensor(1.0 + actions[:, 0], dtype=torch.float32),
        Columns.NEXT_OBS: torch.as_tensor(obs, dtype=torch.float32),
        Columns.TERMINATEDS: torch.ones(rows, dtype=torch.bool),
    }


def q_in_and_out_of_data(learner: Any) -> tuple[float, float]:
    """Mean of both critics over actions in the data's range [-1, 0] and outside it [0.25, 1]."""
    module = learner.module[MODULE_ID]
    obs = torch.linspace(-1, 1, 21).repeat_interleave(16).unsqueeze(-1)
    means = []
    for low, high in ((-1.0, 0.0), (0.25, 1.0)):
        actions = torch.linspace(low, high, 16).repeat(21).unsqueeze(-1)
        q_in = torch.cat([obs, module.normalize_actions(actions)], -1)
        with torch.no_grad():
            means.append(0.5 * (module.qf(q_in) + module.qf_twin(q_in)).mean().item())
    return means[0], means[1]


@pytest.mark.slow
def test_cql_pushes_q_of_actions_outside_the_data_below_those_inside_while_sac_extrapolates_them_up():
    results = {}
    for name, learner_class, kwargs in (("sac", SACLearner, {}), ("cql", CQLLearner, {"cql_weight": 1.0})):
        torch.manual_seed(0)
        rng = np.random.default_rng(0)
        module = RLModuleSpec(
            module_class=CQLModule if learner_class is CQLLearner else SACModule,
            observation_space=BANDIT_OBS,
            action_space=BANDIT_ACTIONS,
            model_config={"fcnet_hiddens": [32, 32]},
        )
        learner = learner_class(module, actor_lr=1e-3, critic_lr=1e-3, alpha_lr=1e-3, **kwargs)
        learner.build()
        for _ in range(400):
            learner.update_from_batch(bandit_rows(64, rng))
        results[name] = q_in_and_out_of_data(learner)
    (sac_in, sac_out), (cql_in, cql_out) = results["sac"], results["cql"]
    assert sac_in == pytest.approx(0.5, abs=0.15)  # the data's mean reward: both fit the data
    assert cql_in == pytest.approx(0.5, abs=0.3)
    assert sac_out > sac_in + 0.3  # SAC's critics extrapolate the rising reward past the data
    assert cql_out < cql_in - 0.3  # CQL's are pushed down where there is no data


# ---- Two ranks -----------------------------------------------------------------------


def _cql_fit_on_rank(
    rank: int, world_size: int, root: str, strategy: str, lagrangian: bool, update_order: str
) -> dict[str, Any]:
    from lightning.pytorch import Trainer

    torch.manual_seed(0)  # the same initial weights on both ranks (DDP and FSDP2 also start from rank 0's)
    learner = CQLLearner(
        spec(), lagrangian=lagrangian, lagrangian_lr=0.05, lagrangian_threshold=-20.0, update_order=update_order
    )
    items = [
        TrainItem(TrainingData(batch={k: v.numpy() for k, v in dataset_rows(8, seed=10 * rank + i).items()}))
        for i in range(3)
    ]
    trainer = Trainer(
        accelerator="cpu", strategy=strategy, devices=world_size, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
        use_distributed_sampler=False,  # each rank trains on its own three items
    )  # fmt: skip
    trainer.fit(learner, train_dataloaders=loader_of(items))
    state = learner.get_state(components=["rl_module"])["rl_module"][MODULE_ID]  # whole weights, also sharded
    weights = {name: value.detach().cpu().numpy().copy() for name, value in state.items()}
    steps = {
        name: sorted({int(s["step"]) for s in optimizer.state.values()})
        for name, optimizer in learner.get_optimizers_for_module(MODULE_ID)
    }
    return {"weights": weights, "optimizer_steps": steps}


@pytest.mark.parametrize(
    ("strategy", "lagrangian", "update_order"),
    [
        ("ddp", False, "joint"),
        ("fsdp2", True, "joint"),
        ("ddp", True, "critics_first"),
        ("fsdp2", True, "critics_first"),
    ],
)
def test_two_ranks_keep_the_same_weights_and_multiplier(
    tmp_path: Path, strategy: str, lagrangian: bool, update_order: str
):
    from ranks import run_on_ranks

    args = (str(tmp_path), strategy, lagrangian, update_order)
    rank0, rank1 = run_on_ranks(_cql_fit_on_rank, *args, world_size=2, timeout=240)
    # Each optimizer stepped once per item, also in critics_first's phases, where DDP's anchor gives
    # the other phase's parameters zero gradients (stepped, Adam would move them on its momentum).
    optimizers = ["policy", "qf", "alpha"] + (["alpha_prime"] if lagrangian else [])
    assert rank0["optimizer_steps"] == rank1["optimizer_steps"] == {name: [3] for name in optimizers}
    rank0, rank1 = rank0["weights"], rank1["weights"]
    assert rank0.keys() == rank1.keys()
    for name, value in rank0.items():
        np.testing.assert_allclose(value, rank1[name], rtol=0, atol=1e-6, err_msg=name)
    if lagrangian:
        assert rank0["log_alpha_prime"] == pytest.approx(0.15, rel=1e-2)  # three Adam steps of about lr 0.05 up
    else:
        assert rank0["log_alpha_prime"] == 0.0  # frozen: neither trained nor reduced
