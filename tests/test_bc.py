"""Behaviour cloning on continuous actions: the Gaussian policy's mean learns the expert."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from lightning_rl import DEFAULT_MODULE_ID, Columns, RLModuleSpec
from lightning_rl.algorithms.bc import BCLearner, BCModule


def test_bc_on_box_actions_fits_a_linear_expert():
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(512, 3)).astype(np.float32)
    weights = np.array([[0.5, -1.0], [0.3, 0.2], [-0.7, 0.4]], np.float32)
    actions = np.tanh(obs @ weights)
    spec = RLModuleSpec(
        module_class=BCModule,
        observation_space=gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
        action_space=gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        model_config={"fcnet_hiddens": [32]},
    )
    learner = BCLearner(module_spec=spec, lr=3e-3)
    learner.build()
    batch = {Columns.OBS: obs, Columns.ACTIONS: actions}
    first = learner.update_from_batch(batch)[DEFAULT_MODULE_ID]["total_loss"]
    for _ in range(150):
        last = learner.update_from_batch(batch, num_epochs=1, minibatch_size=128, shuffle_batch_per_epoch=True)
    module = learner.module[DEFAULT_MODULE_ID]
    with torch.no_grad():
        out = module.forward_inference({Columns.OBS: torch.as_tensor(obs)})
        mean = module.get_inference_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS]).deterministic_sample()
    assert last[DEFAULT_MODULE_ID]["total_loss"] < first - 1.0  # the log-std shrinks as the mean fits
    assert float(((mean.numpy() - actions) ** 2).mean()) < 0.01
