"""``Policy.act``: numpy or tensor, one or a batch, every algorithm; clipping, normalization, module choice, errors."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import onnxruntime
import pytest
import torch
from _algorithms import ROWS, AlgorithmRow
from _policy_common import greedy_actions, observations
from _helpers import bc_spec

from lightning_rl import DEFAULT_MODULE_ID, Policy, RLModuleSpec
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.algorithms.dqn import DQNModule
from lightning_rl.algorithms.ppo import PPOModule
from lightning_rl.core.normalization import OBSERVATION_NORMALIZATION_KEY, RunningMeanStd
from lightning_rl.env import EnvRunner
from lightning_rl.learner.state import add_to_lightning_checkpoint
from lightning_rl.policy.export import export_policy

ROW_IDS = [row.name for row in ROWS]


def built_module(row: AlgorithmRow, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return row.module_spec().build()


def pendulum_ppo() -> PPOModule:
    env = gym.make("Pendulum-v1")
    torch.manual_seed(0)
    return PPOModule(env.observation_space, env.action_space, {"fcnet_hiddens": [8]})


def assert_same_actions(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal actions: exactly for discrete ones; to float rounding for Box ones.

    The same observation in batches of different sizes may round differently in the last
    bit: a network with one output (IQL's mean of a 1-d action) multiplies through a
    matrix-vector kernel for one row and a matrix-matrix kernel for several.
    """
    if np.issubdtype(np.asarray(expected).dtype, np.floating):
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_numpy_in_numpy_out_tensor_in_tensor_out_one_or_a_batch(row: AlgorithmRow):
    policy = Policy(built_module(row))
    obs = observations(policy.observation_space, 5)
    action_shape = policy.action_space.shape

    batch = policy.act(obs)
    assert isinstance(batch, np.ndarray) and batch.shape == (5, *action_shape)
    one = policy.act(obs[0])
    assert isinstance(one, np.ndarray) and one.shape == action_shape
    assert_same_actions(one, batch[0])
    assert_same_actions(policy.act(obs[0].tolist()), batch[0])

    tensors = policy.act(torch.from_numpy(obs))
    assert isinstance(tensors, torch.Tensor) and tensors.shape == (5, *action_shape)
    np.testing.assert_array_equal(tensors.numpy(), batch)
    one_tensor = policy.act(torch.from_numpy(obs[0]))
    assert isinstance(one_tensor, torch.Tensor) and one_tensor.shape == action_shape
    assert all(policy.action_space.contains(action) for action in batch)


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS)
def test_greedy_actions_are_those_the_env_runner_evaluates_with(row: AlgorithmRow):
    module = built_module(row)
    runner = EnvRunner(row.env, num_envs=2, rollout_fragment_length=8, seed=0)
    try:
        episodes = runner.sample_episodes(module, 2, explore=False)
    finally:
        runner.close()
    policy = Policy(module)
    for episode in episodes:
        obs = np.asarray(episode.observations)[:-1]
        assert_same_actions(policy.act(obs), np.asarray(episode.actions))
        assert_same_actions(policy.act(obs), greedy_actions(module, torch.from_numpy(obs)).numpy())


def test_deterministic_false_samples_actions_as_training_does():
    row = next(row for row in ROWS if row.name == "PPO")
    policy = Policy(built_module(row))
    obs = np.repeat(observations(policy.observation_space, 1), 500, axis=0)
    torch.manual_seed(0)
    sampled = policy.act(obs, deterministic=False)
    assert set(sampled.tolist()) == {0, 1}  # a fresh policy's two actions are about equally likely
    assert len(set(policy.act(obs).tolist())) == 1


def test_box_actions_are_clipped_to_the_action_space_bounds():
    module = pendulum_ppo()
    policy = Policy(module)
    obs = observations(policy.observation_space, 16)
    mean_bias = module.pi[-1].bias
    for push, bound in ((100.0, 2.0), (-100.0, -2.0)):
        with torch.no_grad():
            mean_bias[0] = push  # the mean of the one action dimension, far outside [-2, 2]
        with torch.no_grad():
            mean = float(module.forward_inference({"obs": torch.from_numpy(obs)})["action_dist_inputs"][0, 0])
        assert mean * np.sign(bound) > 50  # the unclipped greedy action
        np.testing.assert_array_equal(policy.act(obs), np.full((16, 1), bound, dtype=np.float32))


def lightning_checkpoint(learner: BCLearner, path: Path, data_state: dict | None = None) -> Path:
    """A Lightning checkpoint of ``learner`` as ``Trainer.save_checkpoint`` lays it out, with a data module entry."""
    checkpoint = {
        "state_dict": learner.state_dict(),
        "optimizer_states": [optimizer.state_dict() for _, optimizer in learner.get_optimizers_for_module()],
        "OnPolicyDataModule": data_state or {},
    }
    add_to_lightning_checkpoint(learner, checkpoint)
    torch.save(checkpoint, path)
    return path


def test_the_observation_normalization_a_checkpoint_holds_is_applied_before_the_module(tmp_path: Path):
    module = pendulum_ppo()
    learner = BCLearner(module=module)
    learner.build()
    statistics = RunningMeanStd((3,))
    statistics.update(np.random.default_rng(1).normal([0.5, -0.5, 2.0], [0.1, 0.3, 3.0], size=(1000, 3)))
    saved = {**statistics.state_dict(), "clip": 2.0, "epsilon": 1e-8}
    path = lightning_checkpoint(learner, tmp_path / "normalized.ckpt", {OBSERVATION_NORMALIZATION_KEY: saved})

    policy = Policy.from_checkpoint(path)
    assert policy.observation_normalization is not None
    obs = observations(policy.observation_space, 64)
    normalized = np.clip((obs - statistics.mean) / np.sqrt(statistics.var + 1e-8), -2.0, 2.0).astype(np.float32)
    expected = greedy_actions(learner.module[DEFAULT_MODULE_ID], torch.from_numpy(normalized)).numpy()
    np.testing.assert_allclose(policy.act(obs), expected, atol=1e-6)
    unnormalized = greedy_actions(learner.module[DEFAULT_MODULE_ID], torch.from_numpy(obs)).numpy()
    assert not np.allclose(policy.act(obs), unnormalized, atol=1e-3)

    without = Policy.from_checkpoint(lightning_checkpoint(learner, tmp_path / "plain.ckpt"))
    assert without.observation_normalization is None
    np.testing.assert_array_equal(without.act(obs), unnormalized)


def test_module_id_chooses_among_several_modules_and_a_missing_or_ambiguous_one_is_an_error(tmp_path: Path):
    learner = BCLearner(bc_spec(), lr=1e-3)
    learner.build()
    learner.add_module(module_id="opponent", module_spec=bc_spec())
    path = learner.save_to_path(str(tmp_path / "league"))

    with pytest.raises(ValueError, match=r"holds 2 modules \['default_policy', 'opponent'\]; pass module_id="):
        Policy.from_checkpoint(path)
    with pytest.raises(ValueError, match=r"has no module 'nobody'; it holds \['default_policy', 'opponent'\]"):
        Policy.from_checkpoint(path, module_id="nobody")
    opponent = Policy.from_checkpoint(path, module_id="opponent")
    for name, value in learner.module["opponent"].state_dict().items():
        assert torch.equal(opponent.module.state_dict()[name], value), name

    with pytest.raises(ValueError, match="pass module_id="):
        Policy.from_learner(learner)
    assert Policy.from_learner(learner, module_id="opponent").module is learner.module["opponent"]


def test_from_learner_acts_with_the_learners_current_weights():
    learner = BCLearner(bc_spec(), lr=1e-1)
    learner.build()
    policy = Policy.from_learner(learner)
    obs = observations(policy.observation_space, 32)
    with torch.no_grad():
        learner.module[DEFAULT_MODULE_ID].pi[-1].bias.copy_(torch.tensor([50.0, -50.0]))
    np.testing.assert_array_equal(policy.act(obs), np.zeros(32, dtype=np.int64))


def test_bad_input_is_refused_with_a_message_naming_it(tmp_path: Path):
    row = next(row for row in ROWS if row.name == "PPO")
    policy = Policy(built_module(row))
    with pytest.raises(
        ValueError, match=r"observation of shape \(2, 3\) does not fit .* expected \(4,\) .* \(batch, 4\)"
    ):
        policy.act(np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="Policy takes one RLModule, got MultiRLModule"):
        Policy(built_module(row).as_multi_rl_module())
    with pytest.raises(ValueError, match=r"not built; call learner.build\(\)"):
        Policy.from_learner(BCLearner(bc_spec()))
    damaged = tmp_path / "damaged.ckpt"
    damaged.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=f"^{damaged}: not a checkpoint"):
        Policy.from_checkpoint(damaged)
    with pytest.raises(ValueError, match="no such file"):
        Policy.from_checkpoint(tmp_path / "missing.ckpt")


def test_a_policy_of_discrete_observations_acts_and_exports(tmp_path):
    spec = RLModuleSpec(
        module_class=DQNModule,
        observation_space=gym.spaces.Discrete(16),
        action_space=gym.spaces.Discrete(4),
        model_config={"fcnet_hiddens": [8]},
    )
    policy = Policy(spec.build())
    observations = np.arange(16)
    actions = policy.act(observations)
    assert actions.shape == (16,) and [policy.act(obs) for obs in observations] == list(actions)
    onnx_file = export_policy(policy, tmp_path / "frozen_lake.onnx", "onnx")
    session = onnxruntime.InferenceSession(str(onnx_file))
    np.testing.assert_array_equal(session.run(None, {"obs": observations})[0], actions)


def test_a_checkpoints_policy_acts_in_eval_mode_and_an_empty_batch_is_refused(tmp_path):
    learner = BCLearner(module_spec=bc_spec())
    learner.build()
    learner.save_to_path(tmp_path / "bc")
    policy = Policy.from_checkpoint(tmp_path / "bc")
    assert not policy.module.training
    with pytest.raises(ValueError, match="empty batch"):
        policy.act(np.zeros((0, 4), dtype=np.float32))
