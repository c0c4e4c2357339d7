"""Check that one PPOLearner update equals Stable-Baselines3's on the same rollout and weights.

Not a timing: a correctness cross-check behind ``benchmarks/ppo_cartpole.py``'s comparison.
SB3 collects one rollout of CartPole-v1 (8 envs x 32 steps, short time limit so that some
episodes are truncated); our ``PPOModule`` gets SB3's initial weights; both then update on
that rollout with the tuned CartPole settings (20 epochs of one 256-row minibatch, clip and
lr at their annealed values, global-norm clip 0.5, value coefficient 0.5, Adam eps 1e-5).
The printed differences between the two networks' weights afterwards should be float noise
(about 1e-7); the weights themselves moved by up to ~0.01.

Needs ``pip install -e ".[bench]"``. Run: ``python benchmarks/ppo_update_vs_sb3.py``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from torch import nn

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule


def main() -> None:
    torch.set_num_threads(1)
    env = make_vec_env("CartPole-v1", n_envs=8, seed=3, env_kwargs={"max_episode_steps": 20})
    model = PPO(
        "MlpPolicy", env, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8,
        learning_rate=lambda p: 1e-3 * p, clip_range=lambda p: 0.2 * p, ent_coef=0.0, device="cpu", seed=3,
    )  # fmt: skip
    total_timesteps, callback = model._setup_learn(100_000, None)
    callback.on_training_start(locals(), globals())
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=32)
    model._update_current_progress_remaining(model.num_timesteps, total_timesteps)
    progress = model._current_progress_remaining

    learner = PPOLearner(
        cartpole_spec(), lr=1e-3 * progress, clip_param=0.2 * progress, num_epochs=20, minibatch_size=256,
        grad_clip=0.5, vf_loss_coeff=0.5, vf_clip_param=None, entropy_coeff=0.0,
    )  # fmt: skip
    learner.build()
    pairs = copy_sb3_weights(learner, model)
    before = {name: theirs.weight.detach().clone() for name, (_, theirs) in pairs.items()}

    buffer = model.rollout_buffer
    batch = {
        Columns.OBS: buffer.observations.reshape(-1, 4),
        Columns.ACTIONS: buffer.actions.reshape(-1).astype(np.int64),
        Columns.ACTION_LOGP: buffer.log_probs.reshape(-1),
        Columns.ADVANTAGES: buffer.advantages.reshape(-1),
        Columns.VALUE_TARGETS: buffer.returns.reshape(-1),
    }
    model.train()
    learner.update_from_batch(batch, num_epochs=20, minibatch_size=256)

    print(f"torch {torch.__version__}; one update of 20 epochs at lr {1e-3 * progress:.6f}, clip {0.2 * progress:.4f}")
    print_weight_differences(pairs, before)


def cartpole_spec() -> RLModuleSpec:
    """Our ``PPOModule`` for CartPole with SB3's ``MlpPolicy`` sizes: separate [64, 64] policy and value MLPs."""
    return RLModuleSpec(
        module_class=PPOModule,
        observation_space=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [64, 64]},
    )


def copy_sb3_weights(learner: PPOLearner, model: PPO) -> dict[str, tuple[nn.Linear, nn.Linear]]:
    """Load SB3's weights into the built ``learner``'s module; return ``{layer: (ours, SB3's)}``."""
    ours, policy = learner.module["default_policy"], model.policy
    pairs = {
        "pi[0]": (ours.pi[0], policy.mlp_extractor.policy_net[0]),
        "pi[2]": (ours.pi[2], policy.mlp_extractor.policy_net[2]),
        "pi[4]": (ours.pi[4], policy.action_net),
        "vf[0]": (ours.vf[0], policy.mlp_extractor.value_net[0]),
        "vf[2]": (ours.vf[2], policy.mlp_extractor.value_net[2]),
        "vf[4]": (ours.vf[4], policy.value_net),
    }
    with torch.no_grad():
        for mine, theirs in pairs.values():
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)
    return pairs


def print_weight_differences(pairs: dict[str, tuple[nn.Linear, nn.Linear]], before: dict[str, torch.Tensor]) -> None:
    """Per layer, how far our weights are from SB3's after both updated, beside how far SB3's moved."""
    print(f"{'layer':8s} {'max |ours - sb3|':>18s} {'max |sb3 change|':>18s}")
    for name, (mine, theirs) in pairs.items():
        diff = float((mine.weight - theirs.weight).detach().abs().max())
        moved = float((theirs.weight - before[name]).detach().abs().max())
        print(f"{name:8s} {diff:18.2e} {moved:18.2e}")


if __name__ == "__main__":
    main()
