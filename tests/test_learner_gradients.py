"""Gradients, clipping, optimizer steps and learning-rate schedules of the Learner."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from _helpers import ACT_SPACE, OBS_SPACE, bc_spec, random_batch, weights
from torch import nn

from lightning_rl import ALL_MODULES, DEFAULT_MODULE_ID, Columns, Learner, RLModule, RLModuleSpec
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.learner.optimizers import clip_gradients


def _sum_of_params_losses(learner: Learner) -> dict[str, torch.Tensor]:
    return {mid: sum(p.sum() for p in learner.module[mid].parameters()) for mid in learner.module.keys()}


def test_gradients_of_the_sum_of_all_parameters_are_all_ones():
    learner = BCLearner(module_spec=bc_spec())
    learner.build()
    gradients = learner.compute_gradients(_sum_of_params_losses(learner))
    params = list(learner.module.parameters())
    assert len(gradients) == len(params)
    for param in params:
        assert torch.equal(gradients[learner.get_param_ref(param)], torch.ones_like(param))


def _grads() -> dict[str, torch.Tensor]:
    return {"a": torch.tensor([3.0, -4.0]), "b": torch.tensor([[0.5, -12.0]])}


def test_clip_by_value_clamps_every_element():
    grads = _grads()
    clip_gradients(grads, grad_clip=1.0, grad_clip_by="value")
    assert torch.equal(grads["a"], torch.tensor([1.0, -1.0]))
    assert torch.equal(grads["b"], torch.tensor([[0.5, -1.0]]))


def test_clip_by_norm_scales_each_tensor_to_the_threshold():
    grads = _grads()
    clip_gradients(grads, grad_clip=2.5, grad_clip_by="norm")
    # |a| = 5 -> scaled by 2.5/5; |b| = sqrt(144.25) -> scaled by 2.5/|b|.
    torch.testing.assert_close(grads["a"], torch.tensor([3.0, -4.0]) * (2.5 / (5.0 + 1e-6)))
    norm_b = math.sqrt(0.25 + 144.0)
    torch.testing.assert_close(grads["b"], torch.tensor([[0.5, -12.0]]) * (2.5 / (norm_b + 1e-6)))


def test_clip_by_norm_leaves_small_tensors_alone():
    grads = {"a": torch.tensor([0.3, 0.4])}
    clip_gradients(grads, grad_clip=1.0, grad_clip_by="norm")
    assert torch.equal(grads["a"], torch.tensor([0.3, 0.4]))


def test_clip_by_global_norm_scales_all_tensors_together_and_returns_the_norm_before():
    grads = _grads()
    global_norm = math.sqrt(9 + 16 + 0.25 + 144)
    returned = clip_gradients(grads, grad_clip=1.0, grad_clip_by="global_norm")
    assert returned.item() == pytest.approx(global_norm)
    scale = 1.0 / (global_norm + 1e-6)
    torch.testing.assert_close(grads["a"], torch.tensor([3.0, -4.0]) * scale)
    torch.testing.assert_close(grads["b"], torch.tensor([[0.5, -12.0]]) * scale)
    assert torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads.values()])).item() == pytest.approx(1.0, abs=1e-5)


def test_clip_matches_torchs_clip_grad_norm():
    params = [nn.Parameter(torch.randn(5, 3)), nn.Parameter(torch.randn(7))]
    for p in params:
        p.grad = torch.randn_like(p) * 10
    expected = [p.grad.clone() for p in params]
    reference = [nn.Parameter(torch.zeros_like(p)) for p in params]
    for ref, grad in zip(reference, expected):
        ref.grad = grad
    torch.nn.utils.clip_grad_norm_(reference, 0.7)
    clip_gradients({p: p.grad for p in params}, grad_clip=0.7, grad_clip_by="global_norm")
    for p, ref in zip(params, reference):
        torch.testing.assert_close(p.grad, ref.grad)


class SGDLearner(BCLearner):
    """BC with plain SGD, so each step is checkable by hand."""

    def configure_optimizers_for_module(self, module_id: str, config: Any) -> None:
        params = self.get_parameters(self.module[module_id])
        self.register_optimizer(
            module_id=module_id, optimizer=torch.optim.SGD(params, lr=0.1), params=params, lr_or_lr_schedule=config.lr
        )


def test_apply_gradients_follows_the_plain_sgd_rule():
    learner = SGDLearner(module_spec=bc_spec(), lr=0.25)
    learner.build()
    before = {name: p.detach().clone() for name, p in learner.module.named_parameters()}
    gradients = {learner.get_param_ref(p): torch.full_like(p, float(i + 1)) for i, p in enumerate(learner.module.parameters())}
    learner.apply_gradients(gradients)
    for i, (name, param) in enumerate(learner.module.named_parameters()):
        torch.testing.assert_close(param.detach(), before[name] - 0.25 * (i + 1))


class TwoHeadModule(RLModule):
    """A policy head and a value head that share nothing."""

    def setup(self) -> None:
        self.pi = nn.Linear(4, 2)
        self.vf = nn.Linear(4, 1)

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        return {Columns.ACTION_DIST_INPUTS: self.pi(obs), Columns.VF_PREDS: self.vf(obs).squeeze(-1)}


class TwoOptimizerLearner(Learner):
    """One SGD for the policy head (fixed lr), one for the value head (scheduled lr)."""

    def configure_optimizers_for_module(self, module_id: str, config: Any) -> None:
        module = self.module[module_id]
        pi, vf = list(module.pi.parameters()), list(module.vf.parameters())
        self.register_optimizer(
            module_id=module_id, optimizer_name="pi", optimizer=torch.optim.SGD(pi, lr=0.1), params=pi, lr_or_lr_schedule=0.1
        )
        self.register_optimizer(
            module_id=module_id,
            optimizer_name="vf",
            optimizer=torch.optim.SGD(vf, lr=1.0),
            params=vf,
            lr_or_lr_schedule=[[0, 0.01], [100, 0.0]],
        )

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        pi_loss = fwd_out[Columns.ACTION_DIST_INPUTS].pow(2).mean()
        vf_loss = fwd_out[Columns.VF_PREDS].pow(2).mean()
        return pi_loss + vf_loss


def _two_head_learner(**kwargs: Any) -> TwoOptimizerLearner:
    spec = RLModuleSpec(module_class=TwoHeadModule, observation_space=OBS_SPACE, action_space=ACT_SPACE)
    learner = TwoOptimizerLearner(module_spec=spec, **kwargs)
    learner.build()
    return learner


def test_several_optimizers_on_one_module_step_only_their_own_parameters_with_their_own_lr():
    learner = _two_head_learner()
    module = learner.module[DEFAULT_MODULE_ID]
    batch = random_batch(16)
    obs = torch.as_tensor(batch[Columns.OBS])
    pi_before = [p.detach().clone() for p in module.pi.parameters()]
    vf_before = [p.detach().clone() for p in module.vf.parameters()]
    # Gradients by hand on a copy of the module.
    reference = TwoHeadModule(OBS_SPACE, ACT_SPACE)
    reference.load_state_dict(module.state_dict())
    loss = reference.pi(obs).pow(2).mean() + reference.vf(obs).squeeze(-1).pow(2).mean()
    loss.backward()

    results = learner.update_from_batch(batch, timesteps={"num_env_steps_sampled_lifetime": 50})

    # At timestep 50 the value head's schedule is halfway from 0.01 to 0.0.
    assert results[DEFAULT_MODULE_ID]["pi_learning_rate"] == pytest.approx(0.1)
    assert results[DEFAULT_MODULE_ID]["vf_learning_rate"] == pytest.approx(0.005)
    for before, param, ref in zip(pi_before, module.pi.parameters(), reference.pi.parameters()):
        torch.testing.assert_close(param.detach(), before - 0.1 * ref.grad)
    for before, param, ref in zip(vf_before, module.vf.parameters(), reference.vf.parameters()):
        torch.testing.assert_close(param.detach(), before - 0.005 * ref.grad)
    assert {"gradients_pi_global_norm", "gradients_vf_global_norm"} <= results[DEFAULT_MODULE_ID].keys()


def test_get_optimizer_and_get_optimizers_for_module_find_registered_optimizers():
    learner = _two_head_learner()
    pairs = learner.get_optimizers_for_module(DEFAULT_MODULE_ID)
    assert [name for name, _ in pairs] == ["pi", "vf"]
    assert learner.get_optimizer(DEFAULT_MODULE_ID, "vf") is pairs[1][1]
    assert learner.get_optimizer(optimizer_name="default_policy_pi") is pairs[0][1]
    assert learner.configure_optimizers() == [pairs[0][1], pairs[1][1]]
    with pytest.raises(KeyError, match="no optimizer 'critic'"):
        learner.get_optimizer(DEFAULT_MODULE_ID, "critic")


def test_filter_param_dict_for_optimizer_keeps_only_that_optimizers_params():
    learner = _two_head_learner()
    module = learner.module[DEFAULT_MODULE_ID]
    every = {p: torch.zeros_like(p) for p in module.parameters()}
    vf_optimizer = learner.get_optimizer(DEFAULT_MODULE_ID, "vf")
    assert set(learner.filter_param_dict_for_optimizer(every, vf_optimizer)) == set(module.vf.parameters())


def test_register_optimizer_rejects_params_the_optimizer_does_not_hold():
    learner = BCLearner(module_spec=bc_spec())
    learner.build()
    params = list(learner.module[DEFAULT_MODULE_ID].parameters())
    with pytest.raises(ValueError, match="exactly the params"):
        learner.register_optimizer(module_id=DEFAULT_MODULE_ID, optimizer_name="extra",
                                   optimizer=torch.optim.SGD(params[:1], lr=0.1), params=params)


def test_piecewise_lr_schedule_follows_the_sampled_timesteps():
    learner = BCLearner(module_spec=bc_spec(), lr=[[0, 1e-3], [1000, 1e-4]])
    learner.build()
    key = "default_optimizer_learning_rate"
    rates = [
        learner.update_from_batch(random_batch(), timesteps={"num_env_steps_sampled_lifetime": t})[DEFAULT_MODULE_ID][key]
        for t in (0, 500, 1000, 5000)
    ]
    assert rates == pytest.approx([1e-3, 5.5e-4, 1e-4, 1e-4])
    # Without timesteps the schedule stays where it was.
    assert learner.update_from_batch(random_batch())[DEFAULT_MODULE_ID][key] == pytest.approx(1e-4)


class StepLRLearner(BCLearner):
    def configure_optimizers_for_module(self, module_id: str, config: Any) -> None:
        params = self.get_parameters(self.module[module_id])
        self.register_optimizer(
            module_id=module_id,
            optimizer=torch.optim.Adam(params, lr=1.0),
            params=params,
            lr_or_lr_schedule=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5),
        )


def test_a_torch_lr_scheduler_steps_once_per_update():
    learner = StepLRLearner(module_spec=bc_spec())
    learner.build()
    rates = [learner.update_from_batch(random_batch())[DEFAULT_MODULE_ID]["default_optimizer_learning_rate"] for _ in range(3)]
    assert rates == [1.0, 0.5, 0.25]


def test_minibatch_epochs_take_ceil_rows_over_minibatch_steps_per_epoch():
    learner = BCLearner(module_spec=bc_spec())
    learner.build()
    results = learner.update_from_batch(random_batch(100), num_epochs=3, minibatch_size=32, shuffle_batch_per_epoch=True)
    assert results[ALL_MODULES]["weights_seq_no"] == 3 * 4
    assert results[ALL_MODULES]["num_env_steps_trained"] == 300
    assert results[DEFAULT_MODULE_ID]["module_train_batch_size_mean"] == pytest.approx(25.0)
    again = learner.update_from_batch(random_batch(100))
    assert again[ALL_MODULES]["num_env_steps_trained_lifetime"] == 400
    assert again[ALL_MODULES]["weights_seq_no"] == 13


def test_results_are_plain_floats_with_loss_per_module_and_all_modules():
    learner = BCLearner(module_spec=bc_spec())
    learner.build()
    results = learner.update_from_batch(random_batch())
    for values in results.values():
        assert all(type(v) is float for v in values.values())
    assert results[ALL_MODULES]["total_loss"] == pytest.approx(results[DEFAULT_MODULE_ID]["total_loss"])
    assert 0 < results[DEFAULT_MODULE_ID]["total_loss"] < 5


def test_update_changes_the_weights():
    learner = BCLearner(module_spec=bc_spec())
    learner.build()
    before = weights(learner)
    learner.update_from_batch(random_batch())
    assert any(not torch.equal(before[k], v) for k, v in weights(learner).items())


def test_a_torch_lr_scheduler_resumes_from_a_checkpoint(tmp_path):
    learner = StepLRLearner(module_spec=bc_spec())
    learner.build()
    for _ in range(2):
        learner.update_from_batch(random_batch())
    learner.save_to_path(str(tmp_path / "ckpt"))
    loaded = Learner.from_checkpoint(str(tmp_path / "ckpt"))
    key = "default_optimizer_learning_rate"
    assert loaded.update_from_batch(random_batch())[DEFAULT_MODULE_ID][key] == 0.25
    assert learner.update_from_batch(random_batch())[DEFAULT_MODULE_ID][key] == 0.25
