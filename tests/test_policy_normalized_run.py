"""A run trained on normalized observations: its Policy, its exported graph and ``evaluate`` see raw observations.

The other tests check each piece on its own (the runner's statistics, a crafted checkpoint entry,
the export's parity); this one goes through a real fit, from the runner to the deployed graph.
"""

from __future__ import annotations

import numpy as np
import onnxruntime
import torch
from _helpers import make_trainer

from lightning_rl import Policy
from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.core.acting import clip_actions, compute_actions
from lightning_rl.data import OnPolicyDataModule
from lightning_rl.policy.export import export_policy


def test_a_normalized_runs_policy_and_exported_graph_act_on_raw_observations_as_its_runner_did(tmp_path):
    data = OnPolicyDataModule(
        "Pendulum-v1", num_envs=2, rollout_fragment_length=64, rollouts_per_epoch=2, max_env_steps=256, seed=0,
        normalize_observations=True,
    )  # fmt: skip
    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=64)
    trainer = make_trainer(tmp_path, max_epochs=-1, limit_val_batches=0)
    trainer.fit(learner, datamodule=data)
    path = tmp_path / "normalized.ckpt"
    trainer.save_checkpoint(path)

    high = np.array([1.0, 1.0, 8.0], dtype=np.float32)
    raw = np.random.default_rng(0).uniform(-high, high, size=(1000, 3)).astype(np.float32)
    # What the trained module does with the observations its runner normalizes.
    normalized = torch.from_numpy(data.train_runner.normalization.normalize_observations(raw))
    with torch.no_grad():
        _, greedy = compute_actions(learner.module["default_policy"], normalized, explore=False)
    expected = clip_actions(greedy, data.action_space).numpy()
    assert not np.allclose(normalized.numpy(), raw)  # the statistics moved away from the identity

    policy = Policy.from_checkpoint(path)
    np.testing.assert_allclose(policy.act(raw), expected, atol=1e-6)

    onnx_file = export_policy(policy, tmp_path / "policy.onnx", "onnx")
    session = onnxruntime.InferenceSession(str(onnx_file))
    np.testing.assert_allclose(session.run(None, {"obs": raw})[0], expected, atol=1e-5)
    data.teardown("fit")
