"""IQL: the expectile loss by hand, gradient routing to three optimizers, clipped weights, targets, acting, learning."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import assert_same, loader_of, make_trainer
from torch.distributions import Independent, Normal

from lightning_rl import Columns, Policy, RLModuleSpec, TrainingData, TrainItem
from lightning_rl.algorithms.iql import IQLLearner, IQLModule, expectile_loss
from lightning_rl.algorithms.off_policy import N_STEP, WEIGHTS
from lightning_rl.algorithms.sac import SACModule
from lightning_rl.core.acting import compute_actions
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.core.data_contract import DataOffer
from lightning_rl.env import EnvRunner

OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 5.0], np.float32))
MODULE_ID = "default_policy"
OPTIMIZERS = ("policy", "qf", "vf")


def iql_spec(action_space: gym.Space = BOX, observation_space: gym.Space = OBS, **model_config) -> RLModuleSpec:
    config = {"fcnet_hiddens": [16, 16], **model_config}
    return RLModuleSpec(
        module_class=IQLModule, observation_space=observation_space, action_space=action_space, model_config=config
    )


def transitions(rows: int = 32, seed: int = 0, action_space: gym.Space = BOX) -> dict[str, torch.Tensor]:
    """Dataset transitions: the shared interface's columns, env-space actions, some episode ends."""
    rng = np.random.default_rng(seed)
    return {
        Columns.OBS: torch.as_tensor(rng.normal(size=(rows, 3)), dtype=torch.float32),
        Columns.ACTIONS: torch.as_tensor(
            rng.uniform(action_space.low, action_space.high, (rows, *action_space.shape)), dtype=torch.float32
        ),
        Columns.REWARDS: torch.as_tensor(rng.normal(size=rows), dtype=torch.float32),
        Columns.NEXT_OBS: torch.as_tensor(rng.normal(size=(rows, 3)), dtype=torch.float32),
        Columns.TERMINATEDS: torch.as_tensor(rng.random(rows) < 0.25),
        Columns.TRUNCATEDS: torch.as_tensor(rng.random(rows) < 0.25),
    }


def built(**kwargs) -> IQLLearner:
    learner = IQLLearner(kwargs.pop("module_spec", iql_spec()), **kwargs)
    learner.build()
    return learner


def optimizer_params(learner: IQLLearner, name: str) -> list[torch.nn.Parameter]:
    return [p for group in learner.get_optimizer(MODULE_ID, name).param_groups for p in group["params"]]


def set_constant_output(network: torch.nn.Sequential, value: float) -> None:
    """Make a ``build_mlp`` network output ``value`` whatever its input."""
    with torch.no_grad():
        network[-1].weight.zero_()
        network[-1].bias.fill_(value)


def set_constant_critics(module: IQLModule, value: float, twin_value: float) -> None:
    """Constant critics and target critics (equal, so Polyak updates keep the targets)."""
    for network in (module.qf, module.target_qf):
        set_constant_output(network, value)
    for network in (module.qf_twin, module.target_qf_twin):
        set_constant_output(network, twin_value)


# ---- The expectile loss ----------------------------------------------------------------


def test_expectile_loss_against_hand_computed_values():
    diff = torch.tensor([2.0, -1.0, 0.5, -3.0])
    # tau = 0.7: positive differences weigh 0.7, negative ones 0.3.
    expected = (0.7 * 4 + 0.3 * 1 + 0.7 * 0.25 + 0.3 * 9) / 4
    assert expectile_loss(diff, 0.7).item() == pytest.approx(expected)
    assert expectile_loss(diff, 0.5).item() == pytest.approx(0.5 * diff.pow(2).mean().item())
    assert expectile_loss(-diff, 0.7).item() == pytest.approx((0.3 * 4 + 0.7 * 1 + 0.3 * 0.25 + 0.7 * 9) / 4)


def test_the_value_loss_regresses_on_the_smaller_target_critic():
    learner = built(expectile=0.7, lr=0.0)
    module = learner.module[MODULE_ID]
    set_constant_critics(module, 1.0, 2.0)  # min_i Q'_i = 1
    set_constant_output(module.vf, 1.5)  # u = 1 - 1.5 = -0.5 < 0: weight 0.3
    results = learner.update_from_batch(transitions())[MODULE_ID]
    assert results["vf_loss"] == pytest.approx(0.3 * 0.25)
    set_constant_output(module.vf, 0.0)  # u = 1 > 0: weight 0.7
    assert learner.update_from_batch(transitions())[MODULE_ID]["vf_loss"] == pytest.approx(0.7, rel=1e-4)


# ---- Optimizers and gradients --------------------------------------------------------


def test_three_optimizers_with_disjoint_params_cover_actor_critics_and_value_but_no_target():
    learner = built()
    module = learner.module[MODULE_ID]
    assert [name for name, _ in learner.get_optimizers_for_module(MODULE_ID)] == list(OPTIMIZERS)
    groups = {name: {id(p) for p in optimizer_params(learner, name)} for name in OPTIMIZERS}
    assert groups["policy"] == {id(p) for p in [*module.pi.parameters(), module.log_std_logit]}
    assert groups["qf"] == {id(p) for p in [*module.qf.parameters(), *module.qf_twin.parameters()]}
    assert groups["vf"] == {id(p) for p in module.vf.parameters()}
    assert sum(len(g) for g in groups.values()) == len(set().union(*groups.values()))  # disjoint
    targets = [*module.target_qf.parameters(), *module.target_qf_twin.parameters()]
    assert not any(p.requires_grad for p in targets)
    assert {id(p) for p in module.parameters() if p.requires_grad} == set().union(*groups.values())


def test_each_optimizer_steps_with_exactly_the_gradient_of_its_own_loss():
    learner = built(expectile=0.8, beta=2.0, max_weight=3.0, gamma=0.9)
    module = learner.module[MODULE_ID]
    # Targets unlike the critics, so that the losses tell them apart.
    with torch.no_grad():
        for target in (module.target_qf, module.target_qf_twin):
            for p in target.parameters():
                p.add_(0.3 * torch.randn_like(p))
    batch = transitions()
    obs, next_obs = batch[Columns.OBS], batch[Columns.NEXT_OBS]
    actions = (batch[Columns.ACTIONS] - torch.tensor([0.0, 2.5])) / torch.tensor([2.0, 2.5])  # to [-1, 1]
    q_in = torch.cat([obs, actions], -1)

    # Each loss from the paper's formulas (d3rlpy's parameterization), differentiated on its own.
    with torch.no_grad():
        q_target = torch.min(module.target_qf(q_in), module.target_qf_twin(q_in)).squeeze(-1)
        not_done = (~batch[Columns.TERMINATEDS]).float()
        y = batch[Columns.REWARDS] + 0.9 * not_done * module.vf(next_obs).squeeze(-1)
    values = module.vf(obs).squeeze(-1)
    u = q_target - values
    vf_loss = (torch.abs(0.8 - (u < 0).float()) * u**2).mean()
    qf_loss = sum(((q(q_in).squeeze(-1) - y) ** 2).mean() for q in (module.qf, module.qf_twin))
    weights = torch.exp(2.0 * u.detach()).clamp(max=3.0)
    std = (-5.0 + 7.0 * torch.sigmoid(module.log_std_logit)).exp()
    logp = Independent(Normal(torch.tanh(module.pi(obs)), std), 1).log_prob(actions)
    policy_loss = -(weights * logp).mean()
    expected = {
        "policy": torch.autograd.grad(policy_loss, optimizer_params(learner, "policy")),
        "qf": torch.autograd.grad(qf_loss, optimizer_params(learner, "qf")),
        "vf": torch.autograd.grad(vf_loss, optimizer_params(learner, "vf")),
    }

    results = learner.update_from_batch(batch)[MODULE_ID]
    for name, grads in expected.items():
        stepped = [p.grad for p in optimizer_params(learner, name)]
        assert len(stepped) == len(grads)
        for got, want in zip(stepped, grads):
            torch.testing.assert_close(got, want)
    assert results["policy_loss"] == pytest.approx(policy_loss.item(), rel=1e-5)
    assert results["qf_loss"] == pytest.approx(qf_loss.item(), rel=1e-5)
    assert results["vf_loss"] == pytest.approx(vf_loss.item(), rel=1e-5)
    assert results["total_loss"] == pytest.approx((policy_loss + qf_loss + vf_loss).item(), rel=1e-5)


def test_actor_weights_are_clipped_at_max_weight():
    learner = built(beta=3.0, max_weight=5.0, lr=0.0)
    module = learner.module[MODULE_ID]
    set_constant_critics(module, 10.0, 10.0)
    set_constant_output(module.vf, 0.0)  # advantage 10: exp(30) clipped to 5 on every row
    batch = transitions()
    with torch.no_grad():
        fwd_out = module.forward_train(batch)
        mean, log_std = fwd_out[Columns.ACTION_DIST_INPUTS].chunk(2, -1)
        logp = Independent(Normal(mean, log_std.exp()), 1).log_prob(module.normalize_actions(batch[Columns.ACTIONS]))
    results = learner.update_from_batch(batch)[MODULE_ID]
    assert results["advantage_weight_mean"] == pytest.approx(5.0)
    assert results["policy_loss"] == pytest.approx(-5.0 * logp.mean().item(), rel=1e-5)

    set_constant_output(module.vf, 10.5)  # advantage -0.5: exp(-1.5), under the clip
    assert learner.update_from_batch(batch)[MODULE_ID]["advantage_weight_mean"] == pytest.approx(math.exp(-1.5))


def test_critic_targets_bootstrap_from_the_next_value_unless_terminated():
    learner = built(gamma=0.9, lr=0.0)
    module = learner.module[MODULE_ID]
    set_constant_output(module.vf, 2.0)  # V(s') = 2
    set_constant_critics(module, 0.0, 0.0)
    batch = transitions(rows=2)
    batch[Columns.REWARDS] = torch.tensor([1.0, 1.0])
    batch[Columns.TERMINATEDS] = torch.tensor([True, False])
    batch[Columns.TRUNCATEDS] = torch.tensor([False, True])  # a truncated row bootstraps
    # y = [1, 1 + 0.9 * 2] = [1, 2.8]; Q = 0; qf_loss = 2 * mean(y^2).
    results = learner.update_from_batch(batch)[MODULE_ID]
    assert results["qf_loss"] == pytest.approx(2 * (1.0 + 2.8**2) / 2, rel=1e-6)


def test_rows_without_n_step_and_weights_train_as_one_step_rows_of_weight_one():
    plain = transitions(seed=3)
    replayed = {**plain, N_STEP: torch.ones(32, dtype=torch.int64), WEIGHTS: torch.ones(32)}
    learners = []
    for batch in (plain, replayed):
        torch.manual_seed(0)
        learner = built()
        learner.update_from_batch(batch)
        learners.append(learner)
    for a, b in zip(learners[0].module.parameters(), learners[1].module.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_learning_rates_default_as_d3rlpy_and_value_lr_follows_critic_lr():
    def lrs(learner: IQLLearner) -> dict[str, float]:
        return {name: learner.get_optimizer(MODULE_ID, name).param_groups[0]["lr"] for name in OPTIMIZERS}

    assert lrs(built()) == {"policy": 3e-4, "qf": 3e-4, "vf": 3e-4}
    assert lrs(built(critic_lr=1e-3, actor_lr=2e-4)) == {"policy": 2e-4, "qf": 1e-3, "vf": 1e-3}
    assert lrs(built(critic_lr=1e-3, value_lr=5e-4, lr=1e-2)) == {"policy": 1e-2, "qf": 1e-3, "vf": 5e-4}
    scheduled = built(value_lr=[[0, 1e-3], [1000, 0.0]])
    scheduled.update_from_batch(transitions(), timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 500})
    assert lrs(scheduled)["vf"] == pytest.approx(5e-4)


# ---- Targets ---------------------------------------------------------------------------


@pytest.mark.parametrize("freq", [1, 2])
def test_target_critics_move_by_polyak_averaging_after_the_update(freq: int):
    learner = built(tau=0.1, target_network_update_freq=freq)
    pairs = learner.module[MODULE_ID].get_target_network_pairs()
    assert len(pairs) == 2
    for step in range(1, 3):
        before = [[p.detach().clone() for p in target.parameters()] for _, target in pairs]
        learner.update_from_batch(transitions(seed=step))
        for (online, target), target_before in zip(pairs, before):
            for t, t_before, o in zip(target.parameters(), target_before, online.parameters()):
                expected = 0.9 * t_before + 0.1 * o.detach() if step % freq == 0 else t_before
                torch.testing.assert_close(t, expected)


# ---- Acting ------------------------------------------------------------------------------


def test_greedy_and_sampled_actions_stay_in_the_box_and_greedy_is_the_mean():
    module = iql_spec().build()
    with torch.no_grad():
        module.pi[-1].bias.copy_(torch.tensor([5.0, -5.0]))  # means near the bounds
        module.log_std_logit.fill_(10.0)  # the widest std, e^2
    obs = torch.randn(500, 3)
    low, high = torch.as_tensor(BOX.low), torch.as_tensor(BOX.high)
    with torch.inference_mode():
        for explore in (False, True):
            _, actions = compute_actions(module, obs, explore=explore)
            assert actions.shape == (500, 2)
            assert (actions >= low).all() and (actions <= high).all()
        _, greedy = compute_actions(module, obs, explore=False)
        mean, _ = module.action_dist_params(obs)
    torch.testing.assert_close(greedy, module.unnormalize_actions(mean))
    assert Policy(module).act(np.zeros(3, np.float32)).shape == (2,)


def test_the_log_std_is_a_bounded_state_independent_parameter():
    module = iql_spec().build()
    obs = torch.randn(4, 3)
    _, log_std = module.action_dist_params(obs)
    torch.testing.assert_close(log_std, torch.full((4, 2), -1.5))  # sigmoid(0) = 1/2 of [-5, 2]
    with torch.no_grad():
        module.log_std_logit.copy_(torch.tensor([-100.0, 100.0]))
    torch.testing.assert_close(module.action_dist_params(obs)[1], torch.tensor([[-5.0, 2.0]] * 4))


def test_an_inference_only_module_has_the_actor_alone_and_acts_in_pendulum():
    env = gym.make("Pendulum-v1")
    spec = iql_spec(env.action_space, env.observation_space)
    env.close()
    spec.inference_only = True
    module = spec.build()
    assert {name.split(".")[0] for name, _ in module.named_parameters()} == {"pi", "log_std_logit"}
    assert module.get_target_network_pairs() == []
    with EnvRunner("Pendulum-v1", seed=0) as runner:
        episodes = runner.sample_episodes(module, 1)
    assert len(episodes) == 1 and len(episodes[0]) == 200


def test_only_box_actions_with_finite_bounds_are_accepted():
    with pytest.raises(ValueError, match="Box action space"):
        iql_spec(gym.spaces.Discrete(3)).build()
    with pytest.raises(ValueError, match="finite"):
        iql_spec(gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)).build()


# ---- Configuration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"expectile": 1.0}, "expectile must be a number in \\(0, 1\\)"),
        ({"expectile": 0.0}, "expectile"),
        ({"beta": -1.0}, "beta must be a finite number >= 0"),
        ({"max_weight": 0.0}, "max_weight must be a finite number > 0"),
        ({"value_lr": [[5, 1e-3]]}, "value_lr"),
        ({"tau": 0.0}, "tau"),
        ({"gamma": 2.0}, "gamma"),
        ({"model_config": {"fcnet_hiddens": [8]}}, "either module_spec or model_config"),
    ],
)
def test_invalid_iql_hyperparameters_fail_at_construction_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        IQLLearner(iql_spec(), **kwargs)


def test_a_module_that_is_not_an_iql_module_is_refused():
    spec = RLModuleSpec(module_class=SACModule, observation_space=OBS, action_space=BOX)
    with pytest.raises(ValueError, match="IQLLearner trains IQLModules"):
        IQLLearner(spec).build()


def test_on_policy_data_is_refused():
    class OnPolicyData:
        def data_offer(self) -> DataOffer:
            return DataOffer(frozenset({"episodes"}))

        def accept_requirements(self, requirements: Any) -> None:
            pass

    with pytest.raises(ValueError, match="OffPolicyDataModule"):
        built().check_fits_data(OnPolicyData())


def test_the_learner_builds_an_iql_module_from_model_config_or_trains_the_one_given():
    learner = IQLLearner(model_config={"fcnet_hiddens": [5]})
    module_spec = learner.module_spec.rl_module_specs[MODULE_ID]
    assert module_spec.module_class is IQLModule and module_spec.model_config == {"fcnet_hiddens": [5]}
    module = iql_spec().build()
    given = IQLLearner(module=module)
    given.build()
    assert given.module[MODULE_ID] is module
    no_rows = {column: values[:0] for column, values in transitions().items()}
    out = module.forward_train(no_rows)
    assert all(len(value) == 0 for value in out.values())


# ---- Checkpoints -------------------------------------------------------------------------


def training_state(learner: IQLLearner) -> dict[str, Any]:
    return {
        "module": {k: v.clone() for k, v in learner.module[MODULE_ID].state_dict().items()},
        "optimizers": {name: copy.deepcopy(learner.get_optimizer(MODULE_ID, name).state_dict()) for name in OPTIMIZERS},
        "weights_seq_no": learner.weights_seq_no,
    }


def test_a_fit_over_dataset_items_checkpoints_targets_and_all_three_optimizers(tmp_path: Path):
    learner = IQLLearner(iql_spec(), tau=0.5)
    items = [
        TrainItem(
            TrainingData(batch=transitions(16, seed=i)),
            timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 16 * (i + 1)},
            update_settings={"num_epochs": 1, "minibatch_size": None, "shuffle_batch_per_epoch": False},
        )
        for i in range(3)
    ]
    trainer = make_trainer(tmp_path)
    trainer.fit(learner, train_dataloaders=loader_of(items))
    saved = training_state(learner)
    assert saved["weights_seq_no"] == 3
    module = learner.module[MODULE_ID]
    assert not torch.equal(module.target_qf[0].weight, learner.module[MODULE_ID].qf[0].weight)
    path = tmp_path / "iql.ckpt"
    trainer.save_checkpoint(path)
    assert_same(training_state(IQLLearner.from_checkpoint(str(path))), saved)
    assert_same(training_state(IQLLearner.from_checkpoint(learner.save_to_path(str(tmp_path / "iql")))), saved)


# ---- Learning ------------------------------------------------------------------------------


@pytest.mark.slow
def test_iql_greedy_action_approaches_the_best_in_data_action():
    """A one-state bandit: actions uniform in [-2, 2], reward -(a - 0.8)^2; the data's mean action is about 0.

    Seeds 0/1/2 give greedy actions 0.74/0.74/0.75 after 300 steps (about 6 s on a shared core).
    """
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    rows = 512
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    actions = rng.uniform(-2.0, 2.0, (rows, 1)).astype(np.float32)
    obs = np.zeros((rows, 3), np.float32)
    data = {
        Columns.OBS: obs,
        Columns.ACTIONS: actions,
        Columns.REWARDS: -((actions[:, 0] - 0.8) ** 2),
        Columns.NEXT_OBS: obs,
        Columns.TERMINATEDS: np.ones(rows, bool),
    }
    learner = IQLLearner(iql_spec(space, fcnet_hiddens=[32, 32]), lr=3e-3, tau=0.05)
    learner.build()
    for _ in range(300):
        index = rng.integers(0, rows, 128)
        learner.update_from_batch({column: values[index] for column, values in data.items()})
    with torch.no_grad():
        greedy = learner.module[MODULE_ID].forward_inference({Columns.OBS: torch.zeros(1, 3)})[Columns.ACTIONS]
    assert abs(float(actions.mean())) < 0.15
    assert greedy.item() == pytest.approx(0.8, abs=0.15)
