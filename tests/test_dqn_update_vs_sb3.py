"""Our DQN gradient step is Stable-Baselines3's: same weights and minibatches in, same weights out (issue 36).

``examples/dqn_lunarlander.yaml`` is run beside SB3's DQN with the same settings
(``benchmarks/suite.py``); this pins the update itself, step by step: vanilla DQN's target,
the Huber loss, global-norm clipping and Adam, on rewards large enough that Huber's linear part
acts, and a clip small enough to act.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from _sb3_parity import FixedReplay, linears, spaces_only_env

from lightning_rl import RLModuleSpec
from lightning_rl.algorithms.dqn import DQNLearner, DQNModule
from lightning_rl.core.columns import Columns

OBS = gym.spaces.Box(-10.0, 10.0, (8,), np.float32)
ACTIONS = gym.spaces.Discrete(4)
HIDDENS = [32, 32]
ROWS = 64
# The Huber loss's mean bounds each row's gradient by 1 / ROWS: a clip below the example's 10 makes it act.
LR, GAMMA, GRAD_CLIP = 6.3e-4, 0.99, 0.1


def _minibatch(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        Columns.OBS: rng.normal(size=(ROWS, 8)).astype(np.float32),
        Columns.ACTIONS: rng.integers(0, 4, ROWS),
        # Rewards up to +-100 (LunarLander's landing and crash): TD errors far past Huber's delta of 1.
        Columns.REWARDS: (rng.normal(size=ROWS) * 40).astype(np.float32),
        Columns.NEXT_OBS: rng.normal(size=(ROWS, 8)).astype(np.float32),
        Columns.TERMINATEDS: rng.random(ROWS) < 0.1,
        Columns.TRUNCATEDS: np.zeros(ROWS, dtype=bool),
    }


def test_twenty_gradient_steps_leave_the_same_weights_as_sb3s():
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import DQN
    from stable_baselines3.common.logger import configure
    from stable_baselines3.common.type_aliases import ReplayBufferSamples

    env = spaces_only_env(OBS, ACTIONS)
    sb3 = DQN("MlpPolicy", env, learning_rate=LR, batch_size=ROWS, gamma=GAMMA, max_grad_norm=GRAD_CLIP,
              learning_starts=0, policy_kwargs={"net_arch": HIDDENS}, device="cpu", seed=0)  # fmt: skip
    sb3.set_logger(configure(None, []))
    spec = RLModuleSpec(module_class=DQNModule, observation_space=OBS, action_space=ACTIONS,
                        model_config={"fcnet_hiddens": HIDDENS, "fcnet_activation": "relu"})  # fmt: skip
    ours = DQNLearner(spec, lr=LR, gamma=GAMMA, double_q=False, td_error_loss_fn="huber", minibatch_size=ROWS,
                      gradient_steps=1, grad_clip=GRAD_CLIP, grad_clip_by="global_norm")  # fmt: skip
    ours.build()
    module = ours.module["default_policy"]
    with torch.no_grad():  # SB3's initial weights, online and target, into ours
        for theirs, mine in ((sb3.q_net, module.q_net), (sb3.q_net_target, module.target_q_net)):
            for source, layer in zip(linears(theirs), linears(mine), strict=True):
                layer.weight.copy_(source.weight)
                layer.bias.copy_(source.bias)

    rng = np.random.default_rng(0)
    for step in range(20):
        batch = _minibatch(rng)
        done = torch.as_tensor(batch[Columns.TERMINATEDS], dtype=torch.float32)[:, None]
        sample = ReplayBufferSamples(
            torch.as_tensor(batch[Columns.OBS]), torch.as_tensor(batch[Columns.ACTIONS])[:, None],
            torch.as_tensor(batch[Columns.NEXT_OBS]), done, torch.as_tensor(batch[Columns.REWARDS])[:, None], None,
        )  # fmt: skip
        sb3.replay_buffer.sample = lambda batch_size, env=None, sample=sample: sample
        sb3.train(gradient_steps=1, batch_size=ROWS)
        results = ours.update_from_replay(FixedReplay(batch))
        for source, layer in zip(linears(sb3.q_net), linears(module.q_net), strict=True):
            torch.testing.assert_close(layer.weight, source.weight, rtol=1e-5, atol=1e-6, msg=f"step {step}")
            torch.testing.assert_close(layer.bias, source.bias, rtol=1e-5, atol=1e-6, msg=f"step {step}")
    # The clipping acted: the gradient's norm before it was above GRAD_CLIP.
    assert results["default_policy"]["gradients_default_optimizer_global_norm"] > GRAD_CLIP
