"""SAC: the squashed Gaussian, action rescaling, gradient routing to three optimizers, targets, learning."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import assert_same, make_trainer
from lightning.pytorch import Callback, Trainer, seed_everything
from torch.distributions import Independent, Normal, TanhTransform, TransformedDistribution

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms.off_policy import N_STEP, WEIGHTS
from lightning_rl.algorithms.ppo import PPOModule
from lightning_rl.algorithms import sac
from lightning_rl.algorithms.sac import (
    ACTION_LOGP_NEXT,
    ACTION_LOGP_RESAMPLED,
    QF_PREDS,
    QF_RESAMPLED,
    QF_TARGET_NEXT,
    QF_TWIN_PREDS,
    SACLearner,
    SACModule,
    squashed_gaussian_logp,
)
from lightning_rl.cli import LightningRLCLI
from lightning_rl.data import OffPolicyDataModule

OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 5.0], np.float32))
MODULE_ID = "default_policy"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sac_pendulum.yaml"
# The learning test: env steps, and env steps (= gradient steps) per train item (8, not 1,
# to spend the time on gradient steps rather than on the per-item overhead).
SLOW_STEPS, SLOW_TRAIN_FREQ, SLOW_MINIBATCH = 3000, 8, 128


def sac_spec(action_space: gym.Space = BOX, **model_config) -> RLModuleSpec:
    config = {"fcnet_hiddens": [16, 16], **model_config}
    return RLModuleSpec(module_class=SACModule, observation_space=OBS, action_space=action_space, model_config=config)


def replay_batch(rows: int = 32, seed: int = 0, action_space: gym.Space = BOX) -> dict[str, torch.Tensor]:
    """A replay minibatch as ``ReplayBuffer.sample`` returns it: env-space actions, mixed ends, weights."""
    rng = np.random.default_rng(seed)
    low, high = action_space.low, action_space.high
    return {
        Columns.OBS: torch.as_tensor(rng.normal(size=(rows, 3)), dtype=torch.float32),
        Columns.ACTIONS: torch.as_tensor(rng.uniform(low, high, (rows, *action_space.shape)), dtype=torch.float32),
        Columns.REWARDS: torch.as_tensor(rng.normal(size=rows), dtype=torch.float32),
        Columns.NEXT_OBS: torch.as_tensor(rng.normal(size=(rows, 3)), dtype=torch.float32),
        Columns.TERMINATEDS: torch.as_tensor(rng.random(rows) < 0.25),
        Columns.TRUNCATEDS: torch.as_tensor(rng.random(rows) < 0.25),
        N_STEP: torch.as_tensor(rng.integers(1, 4, rows), dtype=torch.int64),
        WEIGHTS: torch.as_tensor(rng.uniform(0.2, 1.0, rows), dtype=torch.float32),
    }


def built(**kwargs) -> SACLearner:
    learner = SACLearner(kwargs.pop("module_spec", sac_spec()), **kwargs)
    learner.build()
    return learner


def optimizer_params(learner: SACLearner, name: str) -> list[torch.nn.Parameter]:
    return [p for group in learner.get_optimizer(MODULE_ID, name).param_groups for p in group["params"]]


# ---- The squashed Gaussian and the actions ---------------------------------------------


def test_squashed_gaussian_logp_equals_torch_tanh_transformed_normal():
    torch.manual_seed(0)
    mean, log_std = torch.randn(64, 3, dtype=torch.float64), torch.randn(64, 3, dtype=torch.float64).clamp(-2, 1)
    pre_tanh = mean + log_std.exp() * torch.randn(64, 3, dtype=torch.float64)
    reference = TransformedDistribution(Independent(Normal(mean, log_std.exp()), 1), [TanhTransform()])
    expected = reference.log_prob(torch.tanh(pre_tanh))
    torch.testing.assert_close(squashed_gaussian_logp(pre_tanh, mean, log_std), expected)


def test_squashed_gaussian_logp_stays_finite_and_exact_where_tanh_saturates():
    pre_tanh = torch.tensor([[-30.0], [-12.0], [12.0], [30.0]])
    mean, log_std = torch.zeros(4, 1), torch.zeros(4, 1)
    logp = squashed_gaussian_logp(pre_tanh, mean, log_std)
    assert torch.isfinite(logp).all()
    # log(1 - tanh(u)^2) = log(4) - 2|u| - 2 log(1 + exp(-2|u|)), exact in float64.
    u = pre_tanh.double()
    log_det_jacobian = math.log(4) - 2 * u.abs() - 2 * torch.log1p(torch.exp(-2 * u.abs()))
    expected = -0.5 * u**2 - 0.5 * math.log(2 * math.pi) - log_det_jacobian
    torch.testing.assert_close(logp.double(), expected.squeeze(-1), rtol=1e-6, atol=1e-4)


def test_tanh_epsilon_bounds_the_correction_and_its_pull_on_saturated_actions():
    # SB3's, RLlib's and CleanRL's form: log(1 - tanh(u)^2 + eps) in place of the exact log(1 - tanh(u)^2).
    pre_tanh = torch.tensor([[0.5], [3.0], [12.0]], requires_grad=True)
    mean, log_std = torch.zeros(3, 1), torch.zeros(3, 1)
    logp = squashed_gaussian_logp(pre_tanh, mean, log_std, tanh_epsilon=1e-6)
    normal_logp = -0.5 * pre_tanh.detach() ** 2 - 0.5 * math.log(2 * math.pi)
    expected = normal_logp - torch.log(1 - torch.tanh(pre_tanh.detach()) ** 2 + 1e-6)
    torch.testing.assert_close(logp, expected.squeeze(-1))
    exact = squashed_gaussian_logp(pre_tanh.detach(), mean, log_std)
    torch.testing.assert_close(logp[:2], exact[:2], rtol=1e-4, atol=1e-4)  # alike away from the bounds
    assert logp[2] < exact[2] - 5  # past them the correction is capped near -log(1e-6)
    # The exact form's change-of-variables term keeps a gradient of 2 tanh(u) on u; eps's vanishes there.
    (grad,) = torch.autograd.grad(logp.sum(), pre_tanh)
    (exact_grad,) = torch.autograd.grad(squashed_gaussian_logp(pre_tanh, mean, log_std).sum(), pre_tanh)
    assert abs(exact_grad[2, 0] - (-12.0 + 2.0)) < 1e-4  # d/du of -u^2/2 - log(1 - tanh^2) at u = 12
    assert abs(grad[2, 0] - (-12.0)) < 1e-4  # the Gaussian's term alone


@pytest.mark.parametrize("value", [-1e-6, float("nan"), "1e-6", True])
def test_a_bad_tanh_epsilon_is_refused_naming_the_key(value):
    with pytest.raises(ValueError, match="tanh_epsilon.*a finite number >= 0"):
        sac_spec(tanh_epsilon=value).build()


def test_actions_stay_in_the_box_and_the_rescaling_round_trips():
    module = sac_spec().build()
    with torch.no_grad():
        module.pi[-1].bias.copy_(torch.tensor([0.0, 0.0, 2.0, 2.0]))  # wide Gaussians: many saturated samples
    obs = torch.randn(2000, 3)
    low, high = torch.as_tensor(BOX.low), torch.as_tensor(BOX.high)
    with torch.inference_mode():
        for forward in (module.forward_exploration, module.forward_inference):
            actions = forward({Columns.OBS: obs})[Columns.ACTIONS]
            assert actions.shape == (2000, 2)
            assert (actions >= low).all() and (actions <= high).all()
    explored = module.forward_exploration({Columns.OBS: obs})[Columns.ACTIONS]
    assert explored[:, 1].min() < 0.5 and explored[:, 1].max() > 4.5  # the whole box is reached

    corners = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0]])
    torch.testing.assert_close(module.unnormalize_actions(corners), torch.tensor([[-2.0, 0.0], [2.0, 5.0], [0.0, 2.5]]))
    env_actions = torch.rand(100, 2) * (high - low) + low
    torch.testing.assert_close(module.unnormalize_actions(module.normalize_actions(env_actions)), env_actions)


def test_inference_is_tanh_of_the_mean_and_multi_dim_boxes_keep_their_shape():
    space = gym.spaces.Box(-3.0, 3.0, (2, 2), np.float32)
    module = sac_spec(space).build()
    obs = torch.randn(5, 3)
    mean, _ = module.action_dist_params(obs)
    actions = module.forward_inference({Columns.OBS: obs})[Columns.ACTIONS]
    torch.testing.assert_close(actions, 3 * torch.tanh(mean).reshape(5, 2, 2))


def test_only_box_actions_with_finite_bounds_are_accepted():
    with pytest.raises(ValueError, match="Box action space"):
        sac_spec(gym.spaces.Discrete(3)).build()
    with pytest.raises(ValueError, match="finite"):
        sac_spec(gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)).build()


def test_an_inference_only_module_has_the_actor_alone():
    spec = sac_spec()
    spec.inference_only = True
    module = spec.build()
    assert {name.split(".")[0] for name, _ in module.named_parameters()} == {"pi"}
    assert module.get_target_network_pairs() == []
    assert module.forward_inference({Columns.OBS: torch.randn(4, 3)})[Columns.ACTIONS].shape == (4, 2)


# ---- Optimizers and gradients --------------------------------------------------------


def test_three_optimizers_with_disjoint_params_cover_actor_critics_and_log_alpha_but_no_target():
    learner = built()
    module = learner.module[MODULE_ID]
    assert [name for name, _ in learner.get_optimizers_for_module(MODULE_ID)] == ["policy", "qf", "alpha"]
    groups = {name: {id(p) for p in optimizer_params(learner, name)} for name in ("policy", "qf", "alpha")}
    assert groups["policy"] == {id(p) for p in module.pi.parameters()}
    assert groups["qf"] == {id(p) for p in [*module.qf.parameters(), *module.qf_twin.parameters()]}
    assert groups["alpha"] == {id(module.log_alpha)}
    assert sum(len(g) for g in groups.values()) == len(set().union(*groups.values()))  # disjoint
    targets = [*module.target_qf.parameters(), *module.target_qf_twin.parameters()]
    assert not any(p.requires_grad for p in targets)
    assert not {id(p) for p in targets} & set().union(*groups.values())
    trainable = {id(p) for p in module.parameters() if p.requires_grad}
    assert trainable == set().union(*groups.values())


def _hand_actor_and_alpha_losses(
    module: SACModule, batch: dict[str, torch.Tensor], noise: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """SAC's actor and temperature losses by hand (the paper's formulas); ``noise`` is the Gaussian draw of ``a~``."""
    obs = batch[Columns.OBS]
    alpha = module.log_alpha.exp().detach()
    mean, log_std = module.action_dist_params(obs)
    pre_tanh = mean + log_std.exp() * noise
    logp = squashed_gaussian_logp(pre_tanh, mean, log_std)
    resampled = torch.cat([obs, torch.tanh(pre_tanh)], -1)
    policy_loss = (alpha * logp - torch.min(module.qf(resampled), module.qf_twin(resampled)).squeeze(-1)).mean()
    return policy_loss, -(module.log_alpha * (logp.detach() - 2.0)).mean()  # target entropy -dim(A) = -2


def test_each_optimizer_steps_with_exactly_the_gradient_of_its_own_loss():
    learner = built(initial_alpha=0.3, gamma=0.9)
    module = learner.module[MODULE_ID]
    batch = replay_batch()
    actor, critics = list(module.pi.parameters()), [*module.qf.parameters(), *module.qf_twin.parameters()]

    # Each loss from the paper's formulas, with the same noise draws forward_train takes
    # (one for a~ ~ pi(s), then one for a' ~ pi(s')), differentiated on its own.
    torch.manual_seed(7)
    obs, next_obs = batch[Columns.OBS], batch[Columns.NEXT_OBS]
    alpha = module.log_alpha.exp().detach()
    policy_loss, alpha_loss = _hand_actor_and_alpha_losses(module, batch, torch.randn(len(obs), 2))
    with torch.no_grad():
        next_mean, next_log_std = module.action_dist_params(next_obs)
        next_pre_tanh = next_mean + next_log_std.exp() * torch.randn_like(next_mean)
        next_in = torch.cat([next_obs, torch.tanh(next_pre_tanh)], -1)
        next_q = torch.min(module.target_qf(next_in), module.target_qf_twin(next_in)).squeeze(-1)
        next_logp = squashed_gaussian_logp(next_pre_tanh, next_mean, next_log_std)
        not_done = (~batch[Columns.TERMINATEDS]).float()
        y = batch[Columns.REWARDS] + 0.9 ** batch[N_STEP].float() * not_done * (next_q - alpha * next_logp)
    q_in = torch.cat([obs, module.normalize_actions(batch[Columns.ACTIONS])], -1)
    w = batch[WEIGHTS]
    qf_loss = 0.5 * sum((w * (q(q_in).squeeze(-1) - y) ** 2).mean() for q in (module.qf, module.qf_twin))
    expected = {
        "policy": torch.autograd.grad(policy_loss, actor),
        "qf": torch.autograd.grad(qf_loss, critics),
        "alpha": torch.autograd.grad(alpha_loss, [module.log_alpha]),
    }

    torch.manual_seed(7)
    results = learner.update_from_batch(batch)[MODULE_ID]
    for name, grads in expected.items():
        stepped = [p.grad for p in optimizer_params(learner, name)]
        assert len(stepped) == len(grads)
        for got, want in zip(stepped, grads):
            torch.testing.assert_close(got, want)
    assert results["policy_loss"] == pytest.approx(policy_loss.item(), rel=1e-5)
    assert results["qf_loss"] == pytest.approx(qf_loss.item(), rel=1e-5)
    assert results["alpha_loss"] == pytest.approx(alpha_loss.item(), rel=1e-5)
    assert results["alpha_value"] == pytest.approx(0.3)
    assert results["log_alpha_value"] == pytest.approx(math.log(0.3))


def test_critics_first_steps_the_critics_then_trains_actor_and_alpha_against_the_stepped_critics(monkeypatch):
    lrs = dict(actor_lr=1e-2, critic_lr=1e-2, alpha_lr=1e-2, initial_alpha=0.3, gamma=0.9)
    joint, ordered = built(**lrs), built(**lrs, update_order="critics_first")
    ordered.module.load_state_dict(joint.module.state_dict())
    before = copy.deepcopy(joint.module[MODULE_ID])
    batch = replay_batch()
    # The same Gaussian noise for a~ ~ pi(s) and a' ~ pi(s') in both orders: the joint pass draws
    # a~ then a'; critics_first's critic pass draws a' alone, its actor pass a~ alone.
    noise_s, noise_next = torch.randn(len(batch[Columns.OBS]), 2), torch.randn(len(batch[Columns.OBS]), 2)
    replayed: list[torch.Tensor] = []
    monkeypatch.setattr(sac, "_gaussian_sample", lambda mean, log_std: mean + log_std.exp() * replayed.pop(0))
    for learner, draws in ((joint, [noise_s, noise_next]), (ordered, [noise_next, noise_s])):
        replayed[:] = draws
        learner.update_from_batch(batch)
        assert not replayed, "a step drew another number of Gaussian samples"

    # The critic phase is the joint step's critic part: the same draw, gradients and Adam step.
    stepped = ordered.module[MODULE_ID]
    for name in ("qf", "qf_twin"):
        assert_same(getattr(stepped, name).state_dict(), getattr(joint.module[MODULE_ID], name).state_dict())
    assert not torch.equal(stepped.qf[0].weight, before.qf[0].weight)

    # The second phase differentiates the actor's and alpha's losses against the critics the first phase stepped.
    against_stepped = copy.deepcopy(before)
    for name in ("qf", "qf_twin"):
        getattr(against_stepped, name).load_state_dict(getattr(stepped, name).state_dict())
    policy_loss, alpha_loss = _hand_actor_and_alpha_losses(against_stepped, batch, noise_s)
    want_actor = torch.autograd.grad(policy_loss, list(against_stepped.pi.parameters()))
    want_alpha = torch.autograd.grad(alpha_loss, [against_stepped.log_alpha])
    for got, want in zip([p.grad for p in optimizer_params(ordered, "policy")], want_actor):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(stepped.log_alpha.grad, want_alpha[0])
    # Against the critics as they were, the same draw gives another actor gradient.
    stale_loss, _ = _hand_actor_and_alpha_losses(before, batch, noise_s)
    stale = torch.autograd.grad(stale_loss, list(before.pi.parameters()))
    assert not torch.allclose(stale[0], want_actor[0])


def test_each_gradient_phases_pass_computes_only_what_its_losses_read():
    module = built().module[MODULE_ID]
    batch = replay_batch()
    critic_outputs = {QF_PREDS, QF_TWIN_PREDS, ACTION_LOGP_NEXT, QF_TARGET_NEXT}
    actor_outputs = {Columns.ACTION_DIST_INPUTS, ACTION_LOGP_RESAMPLED, QF_RESAMPLED}
    assert set(module.forward_train(batch)) == critic_outputs | actor_outputs
    assert set(module.forward_train(batch, gradient_phase=frozenset({"qf"}))) == critic_outputs
    assert set(module.forward_train(batch, gradient_phase=frozenset({"policy", "alpha"}))) == actor_outputs
    assert set(module.forward_train(batch, gradient_phase=frozenset({"alpha"}))) == actor_outputs


@pytest.mark.parametrize("update_order", ["joint", "critics_first"])
def test_each_optimizer_steps_once_per_minibatch_step_in_either_order(update_order: str):
    learner = built(update_order=update_order)
    results = learner.update_from_batch(replay_batch(rows=32), minibatch_size=8, num_epochs=2)
    for name in ("policy", "qf", "alpha"):
        states = learner.get_optimizer(MODULE_ID, name).state.values()
        assert [int(state["step"]) for state in states] == [8] * len(states), name
    assert learner.weights_seq_no == 8
    # Each loss is logged once per step, in the phase that computes it, and the total is their sum.
    module_results = results[MODULE_ID]
    parts = module_results["qf_loss"] + module_results["policy_loss"] + module_results["alpha_loss"]
    assert module_results["total_loss"] == pytest.approx(parts, rel=1e-5)


def test_each_optimizer_takes_its_own_learning_rate_schedule_and_clip():
    learner = built(
        actor_lr=1e-3,
        critic_lr=[[0, 4e-3], [1000, 0.0]],
        alpha_lr=None,  # the Learner's lr
        lr=5e-3,
        actor_grad_clip=1e-3,
        critic_grad_clip=2e-3,
        alpha_grad_clip=None,  # the Learner's grad_clip
        grad_clip=3e-3,
    )
    module = learner.module[MODULE_ID]
    before = {name: [p.detach().clone() for p in optimizer_params(learner, name)] for name in ("policy", "qf", "alpha")}
    results = learner.update_from_batch(replay_batch(), timesteps={"num_env_steps_sampled_lifetime": 500})[MODULE_ID]

    lrs = {"policy": 1e-3, "qf": 2e-3, "alpha": 5e-3}  # the critics' schedule is halfway down at step 500
    clips = {"policy": 1e-3, "qf": 2e-3, "alpha": 3e-3}
    for name in ("policy", "qf", "alpha"):
        params = optimizer_params(learner, name)
        assert learner.get_optimizer(MODULE_ID, name).param_groups[0]["lr"] == pytest.approx(lrs[name])
        assert results[f"{name}_learning_rate"] == pytest.approx(lrs[name])
        # The logged norm is before clipping; the stepped gradients were clipped to the threshold.
        assert results[f"gradients_{name}_global_norm"] > clips[name]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        assert norm.item() == pytest.approx(clips[name], rel=1e-4)
        # Adam's first step moves every element with a gradient by about lr (m / sqrt(v) = sign(g)).
        steps = torch.cat([(p.detach() - b).abs().flatten() for p, b in zip(params, before[name])])
        assert steps.max().item() == pytest.approx(lrs[name], rel=1e-2)
    assert module.log_alpha.item() == pytest.approx(-5e-3, rel=1e-2)  # logp > -dim(A): alpha goes down


def test_initial_alpha_sets_log_alpha_and_auto_target_entropy_is_minus_the_action_dims():
    learner = built(initial_alpha=0.2)
    assert learner.module[MODULE_ID].log_alpha.item() == pytest.approx(math.log(0.2))
    assert learner.target_entropy(MODULE_ID) == -2.0
    cube = built(module_spec=sac_spec(gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)))
    assert cube.target_entropy(MODULE_ID) == -6.0
    fixed = built(target_entropy=-0.5)
    assert fixed.target_entropy(MODULE_ID) == -0.5
    results = fixed.update_from_batch(replay_batch())[MODULE_ID]
    assert results["target_entropy"] == -0.5


# ---- Targets ---------------------------------------------------------------------------


@pytest.mark.parametrize("freq", [1, 2])
def test_target_critics_move_by_polyak_averaging_after_the_update(freq: int):
    learner = built(tau=0.1, target_network_update_freq=freq)
    module = learner.module[MODULE_ID]
    pairs = module.get_target_network_pairs()
    assert len(pairs) == 2
    for step in range(1, 3):
        before = [[p.detach().clone() for p in target.parameters()] for _, target in pairs]
        learner.update_from_batch(replay_batch(seed=step))
        for (online, target), target_before in zip(pairs, before):
            for t, t_before, o in zip(target.parameters(), target_before, online.parameters()):
                expected = 0.9 * t_before + 0.1 * o.detach() if step % freq == 0 else t_before
                torch.testing.assert_close(t, expected)


def test_critic_targets_bootstrap_truncated_rows_but_not_terminated_ones():
    learner = built(initial_alpha=0.5, gamma=0.9)
    module = learner.module[MODULE_ID]
    batch = replay_batch(rows=4)
    # Rows 0 and 1 are the same transition, ended by termination vs. truncation; row 2 is a 3-step return.
    for column in (Columns.OBS, Columns.ACTIONS, Columns.REWARDS, Columns.NEXT_OBS):
        batch[column][1] = batch[column][0]
    batch[Columns.TERMINATEDS] = torch.tensor([True, False, False, False])
    batch[Columns.TRUNCATEDS] = torch.tensor([False, True, False, False])
    batch[N_STEP] = torch.tensor([1, 1, 3, 1])
    batch[WEIGHTS] = torch.ones(4)

    torch.manual_seed(3)
    fwd_out = module.forward_train(batch)
    td_errors = []
    learner.record_td_errors = lambda module_id, td: td_errors.append(td)
    learner.compute_loss_for_module(
        module_id=MODULE_ID, config=learner.config_for_module(MODULE_ID), batch=batch, fwd_out=fwd_out
    )

    # The bootstrap value by hand: a' from the same noise, its log-prob from torch's tanh-Normal.
    torch.manual_seed(3)
    with torch.no_grad():
        torch.randn(4, 2)  # forward_train's draw for a~ ~ pi(s)
        mean, log_std = module.action_dist_params(batch[Columns.NEXT_OBS])
        next_actions = torch.tanh(mean + log_std.exp() * torch.randn(4, 2))
        next_in = torch.cat([batch[Columns.NEXT_OBS], next_actions], -1)
        next_q = torch.min(module.target_qf(next_in), module.target_qf_twin(next_in)).squeeze(-1)
        tanh_normal = TransformedDistribution(Independent(Normal(mean, log_std.exp()), 1), [TanhTransform()])
        next_logp = tanh_normal.log_prob(next_actions.clamp(-1 + 1e-6, 1 - 1e-6))
        soft_value = next_q - 0.5 * next_logp
        r = batch[Columns.REWARDS]
        y = torch.stack([r[0], r[1] + 0.9 * soft_value[1], r[2] + 0.9**3 * soft_value[2], r[3] + 0.9 * soft_value[3]])
        q_in = torch.cat([batch[Columns.OBS], module.normalize_actions(batch[Columns.ACTIONS])], -1)
        expected_td = 0.5 * ((module.qf(q_in).squeeze(-1) - y).abs() + (module.qf_twin(q_in).squeeze(-1) - y).abs())
    torch.testing.assert_close(fwd_out[QF_TARGET_NEXT], next_q)
    torch.testing.assert_close(fwd_out[ACTION_LOGP_NEXT], next_logp, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(td_errors[0], expected_td, rtol=1e-4, atol=1e-4)


# ---- Configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"initial_alpha": 0.0}, "initial_alpha"),
        ({"target_entropy": "max"}, "target_entropy"),
        ({"critic_grad_clip": -1.0}, "critic_grad_clip"),
        ({"actor_lr": [[5, 1e-3]]}, "actor_lr"),
        ({"tau": 0.0}, "tau"),
        ({"model_config": {"fcnet_hiddens": [8]}}, "either module_spec or model_config"),
        ({"update_order": "actor_first"}, "update_order"),
        ({"update_order": "critics_first", "cuda_graphs": True}, "cuda_graphs=True cannot replay"),
    ],
)
def test_invalid_sac_hyperparameters_fail_at_construction_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SACLearner(sac_spec(), **kwargs)


def test_update_order_is_the_whole_learners_not_a_modules():
    with pytest.raises(ValueError, match="module 'b'.*update_order apply to the whole Learner"):
        SACLearner(sac_spec(), config_overrides_per_module={"b": {"update_order": "critics_first"}})


class _TwoPhases(SACLearner):
    def gradient_phases(self) -> tuple[frozenset[str] | None, ...]:
        return (frozenset({"qf"}), frozenset({"policy", "alpha"}))


def test_cuda_graphs_refuse_a_learner_with_several_gradient_phases_when_it_is_built():
    learner = _TwoPhases(sac_spec(), cuda_graphs=True)  # on CPU: the phases are refused before the device
    with pytest.raises(ValueError, match=r"steps its optimizers in 2 phases \(qf then alpha\+policy\)"):
        learner.build()


def test_a_module_that_is_not_a_sac_module_is_refused():
    spec = RLModuleSpec(module_class=PPOModule, observation_space=OBS, action_space=BOX)
    with pytest.raises(ValueError, match="SACLearner trains SACModules"):
        SACLearner(spec).build()


# ---- Training runs -----------------------------------------------------------------------


def pendulum_data(**kwargs: Any) -> OffPolicyDataModule:
    settings = dict(
        env="Pendulum-v1",
        seed=0,
        replay_buffer_capacity=10_000,
        train_freq=1,
        learning_starts=20,
        rollouts_per_epoch=40,
        evaluation_num_episodes=1,
    )
    settings.update(kwargs)
    return OffPolicyDataModule(**settings)


def quiet_trainer(tmp_path: Path, **kwargs: Any) -> Trainer:
    return make_trainer(tmp_path, **{"num_sanity_val_steps": 0, "limit_val_batches": 0, **kwargs})


def training_state(learner: SACLearner) -> dict[str, Any]:
    module = learner.module[MODULE_ID]
    return {
        "target_qf": {k: v.clone() for k, v in module.target_qf.state_dict().items()},
        "target_qf_twin": {k: v.clone() for k, v in module.target_qf_twin.state_dict().items()},
        "log_alpha": module.log_alpha.detach().clone(),
        "optimizers": {
            name: copy.deepcopy(learner.get_optimizer(MODULE_ID, name).state_dict())
            for name in ("policy", "qf", "alpha")
        },
        "weights_seq_no": learner.weights_seq_no,
    }


class StateAtTrainStart(Callback):
    """The Learner's state once a resumed fit has restored the checkpoint, before its first step."""

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        self.state = training_state(pl_module)


def test_a_checkpoint_restores_target_critics_log_alpha_and_all_three_optimizer_states(tmp_path: Path):
    learner = SACLearner(model_config={"fcnet_hiddens": [16, 16]}, minibatch_size=16, initial_alpha=0.5)
    trainer = quiet_trainer(tmp_path)
    trainer.fit(learner, datamodule=pendulum_data())
    saved = training_state(learner)
    assert saved["weights_seq_no"] == 21  # one step per item from the 20th env step on
    assert saved["log_alpha"].item() != pytest.approx(math.log(0.5))  # alpha was trained
    path = tmp_path / "sac.ckpt"
    trainer.save_checkpoint(path)
    assert_same(training_state(SACLearner.from_checkpoint(str(path))), saved)  # the Learner alone, too

    torch.manual_seed(123)  # other initial weights, which the checkpoint must replace
    resumed = SACLearner(model_config={"fcnet_hiddens": [16, 16]}, minibatch_size=16, initial_alpha=0.5)
    at_start = StateAtTrainStart()
    trainer = quiet_trainer(tmp_path, max_epochs=2, callbacks=[at_start])
    trainer.fit(resumed, datamodule=pendulum_data(), ckpt_path=str(path))
    assert_same(at_start.state, saved)
    assert resumed.weights_seq_no > saved["weights_seq_no"]  # and training went on from there


@pytest.mark.slow
def test_sac_learns_to_swing_up_the_pendulum(tmp_path: Path):
    seed_everything(0)
    learner = SACLearner(
        model_config={"fcnet_hiddens": [64, 64]}, lr=1e-3, minibatch_size=SLOW_MINIBATCH, gradient_steps=SLOW_TRAIN_FREQ
    )
    data = pendulum_data(
        replay_buffer_capacity=SLOW_STEPS,
        train_freq=SLOW_TRAIN_FREQ,
        learning_starts=100,
        rollouts_per_epoch=SLOW_STEPS // SLOW_TRAIN_FREQ,
        max_env_steps=SLOW_STEPS,
        evaluation_num_episodes=10,
        evaluation_num_envs=10,
    )
    trainer = quiet_trainer(tmp_path, max_epochs=-1, limit_val_batches=None)
    trainer.fit(learner, datamodule=data)
    assert data.num_env_steps_sampled_lifetime == SLOW_STEPS
    # A random policy scores about -1200 to -1500. With these settings seeds 0-2 score
    # -774/-843/-823 after 2.5k env steps, seeds 0-5 -306/-234/-234/-330/-290/-276 after 3k
    # (~30 s on one core beside another run) and seeds 0-2 about -200 after 4k.
    assert trainer.callback_metrics["eval/episode_return_mean"] > -700


def test_the_example_config_runs_from_the_command_line(tmp_path: Path):
    cli = LightningRLCLI(
        args=[
            "fit", "--config", str(EXAMPLE),
            "--trainer.default_root_dir", str(tmp_path),
            "--trainer.logger", "false",
            "--trainer.enable_checkpointing", "false",
            "--trainer.enable_progress_bar", "false",
            "--model.init_args.model_config", '{"fcnet_hiddens": [16, 16]}',
            "--model.init_args.minibatch_size", "32",
            "--data.init_args.max_env_steps", "300",
            "--data.init_args.learning_starts", "100",
            "--data.init_args.rollouts_per_epoch", "150",
            "--data.init_args.evaluation_num_episodes", "1",
            "--data.init_args.evaluation_num_envs", "1",
        ]
    )  # fmt: skip
    assert cli.datamodule.num_env_steps_sampled_lifetime == 300
    assert cli.model.weights_seq_no == 201  # one gradient step per env step from learning_starts on
    assert "eval/episode_return_mean" in cli.trainer.callback_metrics
    assert cli.trainer.callback_metrics["default_policy/alpha_value"] < 1.0


def test_rows_without_n_step_and_weights_train_as_one_step_rows_of_weight_one():
    """Offline datasets hold plain transitions: no replay ``n_step`` or ``weights`` columns."""
    plain = replay_batch(seed=3)
    del plain[N_STEP], plain[WEIGHTS]
    replayed = {**plain, N_STEP: torch.ones(32, dtype=torch.int64), WEIGHTS: torch.ones(32)}
    learners = []
    for batch in (plain, replayed):
        torch.manual_seed(0)
        learner = built()
        learner.update_from_batch(batch)
        learners.append(learner)
    for a, b in zip(learners[0].module.parameters(), learners[1].module.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
