"""PPO: the loss against a hand computation, schedules, the adaptive KL coefficient, modules."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.env import EnvRunner

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
DISCRETE = gym.spaces.Discrete(2)
BOX = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)


def ppo_spec(action_space: gym.Space = DISCRETE, **model_config) -> RLModuleSpec:
    config = {"fcnet_hiddens": [16], **model_config}
    return RLModuleSpec(module_class=PPOModule, observation_space=OBS, action_space=action_space, model_config=config)


def ppo_batch(rows: int = 32, seed: int = 0, action_space: gym.Space = DISCRETE) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if isinstance(action_space, gym.spaces.Discrete):
        actions = rng.integers(0, 2, rows)
    else:
        actions = rng.uniform(-2, 2, (rows, 1)).astype(np.float32)
    return {
        Columns.OBS: rng.normal(size=(rows, 4)).astype(np.float32),
        Columns.ACTIONS: actions,
        Columns.ACTION_LOGP: rng.normal(-0.7, 0.3, rows).astype(np.float32),
        Columns.ADVANTAGES: rng.normal(size=rows).astype(np.float32),
        Columns.VALUE_TARGETS: rng.normal(size=rows).astype(np.float32),
    }


def test_loss_is_the_clipped_surrogate_plus_value_loss_minus_entropy_bonus():
    learner = PPOLearner(ppo_spec(), clip_param=0.1, vf_clip_param=0.5, vf_loss_coeff=0.7, entropy_coeff=0.3)
    learner.build()
    batch = {k: torch.as_tensor(v) for k, v in ppo_batch().items()}
    learner.before_gradient_based_update(timesteps={})
    fwd_out = learner.module["default_policy"].forward_train(batch)
    loss = learner.compute_loss_for_module(
        module_id="default_policy", config=learner.config_for_module("default_policy"), batch=batch, fwd_out=fwd_out
    )

    # The same loss, written out from the paper's formulas.
    logits = fwd_out[Columns.ACTION_DIST_INPUTS]
    dist = torch.distributions.Categorical(logits=logits)
    ratio = torch.exp(dist.log_prob(batch[Columns.ACTIONS]) - batch[Columns.ACTION_LOGP])
    adv = batch[Columns.ADVANTAGES]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    surrogate = torch.min(adv * ratio, adv * torch.clamp(ratio, 0.9, 1.1)).mean()
    vf_loss = torch.clamp((fwd_out[Columns.VF_PREDS] - batch[Columns.VALUE_TARGETS]) ** 2, max=0.5).mean()
    expected = -surrogate + 0.7 * vf_loss - 0.3 * dist.entropy().mean()
    torch.testing.assert_close(loss, expected)


def test_the_value_loss_is_unclipped_with_vf_clip_param_none():
    learner = PPOLearner(ppo_spec(), vf_clip_param=None)
    learner.build()
    batch = {k: torch.as_tensor(v) for k, v in ppo_batch().items()}
    batch[Columns.VALUE_TARGETS] = batch[Columns.VALUE_TARGETS] * 100  # far beyond any clip
    results = learner.update_from_batch(batch)
    assert results["default_policy"]["vf_loss"] == pytest.approx(results["default_policy"]["vf_loss_unclipped"])
    assert results["default_policy"]["vf_loss"] > 100


def test_clip_param_and_entropy_coeff_follow_their_schedules():
    learner = PPOLearner(ppo_spec(), clip_param=[[0, 0.2], [1000, 0.0]], entropy_coeff=[[0, 0.01], [1000, 0.03]])
    learner.build()
    results = learner.update_from_batch(ppo_batch(), timesteps={"num_env_steps_sampled_lifetime": 500})
    assert results["default_policy"]["curr_clip_param"] == pytest.approx(0.1)
    assert results["default_policy"]["curr_entropy_coeff"] == pytest.approx(0.02)


@pytest.mark.parametrize("target,factor", [(1e-9, 1.5), (1e9, 0.5)])
def test_kl_coefficient_adapts_after_each_update_and_is_saved_with_the_state(target, factor):
    learner = PPOLearner(ppo_spec(), use_kl_loss=True, kl_coeff=0.2, kl_target=target, lr=0.01)
    learner.build()
    batch = ppo_batch()
    # The batch needs the sampling distribution's inputs for the KL term.
    with torch.no_grad():
        out = learner.module["default_policy"].forward_exploration({Columns.OBS: torch.as_tensor(batch[Columns.OBS])})
    batch[Columns.ACTION_DIST_INPUTS] = out[Columns.ACTION_DIST_INPUTS].numpy() + 0.5
    results = learner.update_from_batch(batch)
    assert learner.curr_kl_coeff("default_policy") == pytest.approx(0.2 * factor)
    assert results["default_policy"]["curr_kl_coeff"] == pytest.approx(0.2 * factor)

    restored = PPOLearner(ppo_spec(), use_kl_loss=True, kl_coeff=0.2, kl_target=target)
    restored.build()
    restored.set_state(learner.get_state())
    assert restored.curr_kl_coeff("default_policy") == pytest.approx(0.2 * factor)


def test_kl_loss_needs_the_sampling_distribution_inputs():
    learner = PPOLearner(ppo_spec(), use_kl_loss=True)
    learner.build()
    with pytest.raises(ValueError, match="action_dist_inputs"):
        learner.update_from_batch(ppo_batch())


@pytest.mark.parametrize("share", [False, True])
def test_box_actions_train_with_a_free_log_std_and_shared_or_separate_value_layers(share):
    learner = PPOLearner(ppo_spec(BOX, vf_share_layers=share), num_epochs=2, minibatch_size=16)
    learner.build()
    module = learner.module["default_policy"]
    assert module.log_std.shape == (1,)
    assert (module.encoder is not None) == share
    before = module.log_std.detach().clone()
    results = learner.update_from_batch(ppo_batch(action_space=BOX))
    assert math.isfinite(results["default_policy"]["total_loss"])
    assert not torch.equal(before, module.log_std.detach())


def test_update_from_episodes_computes_advantages_from_the_current_values():
    runner = EnvRunner("CartPole-v1", num_envs=2, rollout_fragment_length=20, seed=0)
    spec = RLModuleSpec(
        module_class=PPOModule,
        observation_space=runner.observation_space,
        action_space=runner.action_space,
        model_config={"fcnet_hiddens": [16]},
    )
    learner = PPOLearner(spec, minibatch_size=None, num_epochs=1, gamma=0.9, gae_lambda=0.5)
    learner.build()
    episodes = runner.sample(learner.module["default_policy"])
    batch = learner.episodes_to_train_batch(episodes)["default_policy"]
    assert len(batch[Columns.OBS]) == 40
    values = learner.module["default_policy"].compute_values({Columns.OBS: batch[Columns.OBS]})
    torch.testing.assert_close(batch[Columns.VF_PREDS], values.detach())
    # The advantages are left standardized (as RLlib's GAE piece leaves them); the value targets are raw.
    advantages = batch[Columns.ADVANTAGES]
    torch.testing.assert_close(advantages.mean(), torch.tensor(0.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(advantages.std(unbiased=False), torch.tensor(1.0))
    assert not torch.allclose(batch[Columns.VALUE_TARGETS], advantages + values.detach())
    results = learner.update_from_episodes(episodes)
    assert results["__all_modules__"]["num_env_steps_trained"] == 40


def test_invalid_ppo_hyperparameters_fail_at_construction_naming_them():
    with pytest.raises(ValueError, match="gamma must be in"):
        PPOLearner(ppo_spec(), gamma=1.5)
    with pytest.raises(ValueError, match="clip_param"):
        PPOLearner(ppo_spec(), clip_param=[[10, 0.2]])
    with pytest.raises(ValueError, match="vf_clip_param"):
        PPOLearner(ppo_spec(), vf_clip_param=-1.0)
    with pytest.raises(ValueError, match="either module_spec or model_config"):
        PPOLearner(ppo_spec(), model_config={"fcnet_hiddens": [8]})


def test_orthogonal_init_gives_a_near_uniform_initial_policy():
    module = ppo_spec().build()
    out = module.forward_inference({Columns.OBS: torch.randn(64, 4)})
    probs = torch.softmax(out[Columns.ACTION_DIST_INPUTS], -1)
    assert torch.allclose(probs, torch.full_like(probs, 0.5), atol=0.05)


def test_a_ppo_learner_made_from_model_config_loads_from_its_lightning_checkpoint(tmp_path):
    from lightning.pytorch import Trainer

    from lightning_rl import Learner
    from lightning_rl.data import OnPolicyDataModule

    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=32)
    data = OnPolicyDataModule("CartPole-v1", rollout_fragment_length=32, rollouts_per_epoch=1, seed=0)
    trainer = Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=0
    )
    trainer.fit(learner, datamodule=data)
    trainer.save_checkpoint(tmp_path / "ppo.ckpt")

    loaded = Learner.from_checkpoint(str(tmp_path / "ppo.ckpt"))
    assert isinstance(loaded, PPOLearner)
    assert loaded.module_spec.rl_module_specs["default_policy"].model_config == {"fcnet_hiddens": [8]}
    for name, value in learner.module.state_dict().items():
        assert torch.equal(value, loaded.module.state_dict()[name]), name
