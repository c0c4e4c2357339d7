"""MultiDiscrete and multi-dimensional Box actions end to end: sampling, training, checkpoints, acting.

The envs (``tests/_action_space_envs.py``) check every action they are stepped with, so each
run here also proves that the action column kept the space's shape from the module to the env.
PPO learns a MultiDiscrete task; PPO and SAC train a few hundred env steps on a Box of shape
(2, 3) through ``Trainer.fit``, SAC also through ``lightning-rl fit``; BC and MARWIL imitate
both kinds, IQL and CQL update on the box; each checkpoint acts through ``Policy``, the
``evaluate`` command and an ONNX export with actions of the space's shape and dtype.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import onnxruntime
import pytest
import torch
import yaml
from _action_space_envs import ACTION_SHAPE, MATCH_TARGETS_ID, NVEC, REACH_TARGETS_ID, MatchTargetsEnv, ReachTargetsEnv
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_rl import Columns, Policy, RLModuleSpec
from lightning_rl.algorithms.bc import BCLearner, BCModule
from lightning_rl.algorithms.cql import CQLLearner, CQLModule
from lightning_rl.algorithms.dqn import DQNLearner
from lightning_rl.algorithms.iql import IQLLearner, IQLModule
from lightning_rl.algorithms.marwil import MARWILLearner, MARWILModule
from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.algorithms.sac import SACLearner
from lightning_rl.cli import LightningRLCLI, evaluate_command, export_command
from lightning_rl.data import OffPolicyDataModule, OnPolicyDataModule

# Module-qualified ids, as a user names an env from their own package (the CLI imports the module).
MATCH_TARGETS = f"_action_space_envs:{MATCH_TARGETS_ID}"
REACH_TARGETS = f"_action_space_envs:{REACH_TARGETS_ID}"
SMALL = {"fcnet_hiddens": [32]}
RANDOM_MATCH_RETURN = 16 * float(np.mean([1 / n for n in NVEC]))  # about 5.8 of at most 16


def fit(learner, data, directory: Path | None = None) -> Trainer:
    """``Trainer.fit`` without a logger; with ``directory``, a ``last.ckpt`` is saved there."""
    callbacks = [] if directory is None else [ModelCheckpoint(dirpath=directory, save_last=True)]
    trainer = Trainer(
        max_epochs=-1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=directory is not None, num_sanity_val_steps=0, callbacks=callbacks,
    )  # fmt: skip
    trainer.fit(learner, datamodule=data)
    return trainer


def on_policy_data(env: str, max_env_steps: int, **kwargs) -> OnPolicyDataModule:
    return OnPolicyDataModule(
        env=env, num_envs=4, rollout_fragment_length=64, seed=0, max_env_steps=max_env_steps,
        rollouts_per_epoch=4, evaluation_num_episodes=8, **kwargs,
    )  # fmt: skip


def off_policy_data(env: str, max_env_steps: int) -> OffPolicyDataModule:
    return OffPolicyDataModule(
        env=env, num_envs=2, seed=0, max_env_steps=max_env_steps, train_freq=16, learning_starts=64,
        replay_buffer_capacity=1000, rollouts_per_epoch=8, evaluation_num_episodes=2,
    )  # fmt: skip


def assert_acts_in(policy: Policy, space: gym.Space) -> None:
    """``policy.act`` gives one action of ``space``'s shape and dtype kind per observation, inside the space."""
    obs = np.stack([policy.observation_space.sample() for _ in range(5)])
    for deterministic in (True, False):
        batch = policy.act(obs, deterministic=deterministic)
        assert batch.shape == (5, *space.shape)
        one = policy.act(obs[0], deterministic=deterministic)
        assert one.shape == space.shape
        for action in batch:
            assert space.contains(action.astype(space.dtype)), f"{action} not in {space}"
    expected_kind = np.int64 if isinstance(space, gym.spaces.MultiDiscrete) else np.float32
    assert batch.dtype == expected_kind


# ---- MultiDiscrete ----------------------------------------------------------------------


@pytest.mark.slow
def test_ppo_learns_to_match_every_dimension_of_a_multi_discrete_action():
    seed_everything(0)
    learner = PPOLearner(model_config=SMALL, lr=3e-3, num_epochs=4, minibatch_size=64)
    trainer = fit(learner, on_policy_data(MATCH_TARGETS, max_env_steps=4096))
    # A random policy earns about 5.8; a correct PPO passes 13 here (16 is every dimension right).
    assert trainer.callback_metrics["eval/episode_return_mean"] >= 11.0 > 1.5 * RANDOM_MATCH_RETURN


def test_a_multi_discrete_ppo_checkpoint_acts_evaluates_and_exports_with_one_index_per_dimension(tmp_path, capsys):
    seed_everything(0)
    fit(PPOLearner(model_config=SMALL, num_epochs=1), on_policy_data(MATCH_TARGETS, max_env_steps=512), tmp_path)
    checkpoint = tmp_path / "last.ckpt"
    policy = Policy.from_checkpoint(checkpoint)
    assert policy.action_space == gym.spaces.MultiDiscrete(NVEC)
    assert_acts_in(policy, policy.action_space)

    evaluate_command.main(["--ckpt_path", str(checkpoint), "--num_episodes", "2", "--env", MATCH_TARGETS])
    assert "2 greedy episodes" in capsys.readouterr().out

    output = tmp_path / "policy.onnx"
    export_command.main(["--ckpt_path", str(checkpoint), "--format", "onnx", "--output", str(output)])
    obs = np.stack([policy.observation_space.sample() for _ in range(64)])
    actions = onnxruntime.InferenceSession(str(output), providers=["CPUExecutionProvider"]).run(None, {"obs": obs})[0]
    assert actions.shape == (64, len(NVEC)) and actions.dtype == np.int64
    np.testing.assert_array_equal(actions, policy.act(obs))


def test_dqn_on_a_multi_discrete_env_fails_when_fit_builds_its_module_naming_the_space_and_ppo():
    data = off_policy_data(MATCH_TARGETS, max_env_steps=64)
    with pytest.raises(ValueError, match=r"DQNModule needs a Discrete action space .*MultiDiscrete\(\[3 4 2\]\).*use PPO"):
        fit(DQNLearner(model_config=SMALL), data)


# ---- Box of shape (2, 3) ----------------------------------------------------------------


def test_ppo_trains_on_a_box_2x3_with_a_free_log_std_per_number_and_its_checkpoint_acts_in_the_box(tmp_path):
    seed_everything(0)
    learner = PPOLearner(model_config=SMALL, num_epochs=1)
    fit(learner, on_policy_data(REACH_TARGETS, max_env_steps=512), tmp_path)
    module = learner.module["default_policy"]
    assert module.log_std.shape == (int(np.prod(ACTION_SHAPE)),)
    assert_acts_in(Policy.from_checkpoint(tmp_path / "last.ckpt"), ReachTargetsEnv().action_space)


def test_sac_trains_on_a_box_2x3_and_replays_actions_of_its_shape(tmp_path):
    seed_everything(0)
    learner = SACLearner(model_config=SMALL, minibatch_size=32)
    data = off_policy_data(REACH_TARGETS, max_env_steps=320)
    fit(learner, data, tmp_path)
    replayed = data.replay_buffer.sample(8)[Columns.ACTIONS]
    assert replayed.shape == (8, *ACTION_SHAPE) and replayed.dtype == np.float32
    assert learner.target_entropy("default_policy") == -6.0
    assert_acts_in(Policy.from_checkpoint(tmp_path / "last.ckpt"), ReachTargetsEnv().action_space)


def test_sac_on_a_box_2x3_from_the_command_line_evaluates_and_exports(tmp_path, capsys):
    config = {
        "seed_everything": 0,
        "trainer": {
            "max_epochs": -1, "enable_progress_bar": False, "enable_model_summary": False,
            "num_sanity_val_steps": 0, "default_root_dir": str(tmp_path),
            "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True}}],
        },
        "model": {"class_path": "lightning_rl.algorithms.sac.SACLearner",
                  "init_args": {"model_config": SMALL, "minibatch_size": 32}},
        "data": {"class_path": "lightning_rl.data.OffPolicyDataModule",
                 "init_args": {"env": REACH_TARGETS, "num_envs": 2, "seed": 0, "max_env_steps": 320, "train_freq": 16,
                               "learning_starts": 64, "replay_buffer_capacity": 1000, "rollouts_per_epoch": 8,
                               "evaluation_num_episodes": 2}},
    }  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = LightningRLCLI(args=["fit", "--config", str(path)])
    assert cli.datamodule.num_env_steps_sampled_lifetime == 320
    checkpoint = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    policy = Policy.from_checkpoint(checkpoint)
    assert_acts_in(policy, ReachTargetsEnv().action_space)

    capsys.readouterr()
    evaluate_command.main(["--ckpt_path", str(checkpoint), "--num_episodes", "2", "--config", str(path)])
    assert "2 greedy episodes" in capsys.readouterr().out
    output = tmp_path / "policy.onnx"
    export_command.main(["--ckpt_path", str(checkpoint), "--format", "onnx", "--output", str(output)])
    assert f"wrote {output} (onnx): SACModule" in capsys.readouterr().out


# ---- Offline algorithms --------------------------------------------------------------------


def expert_batch(env: MatchTargetsEnv | ReachTargetsEnv, rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``rows`` steps of ``env`` taking its best actions (full reward), with returns-to-go of one."""
    observation, _ = env.reset(seed=seed)
    obs, actions = [], []
    for _ in range(rows):
        obs.append(observation)
        actions.append(env.best_action())
        observation, _, _, truncated, _ = env.step(actions[-1])
        if truncated:
            observation, _ = env.reset()
    return {
        Columns.OBS: np.stack(obs),
        Columns.ACTIONS: np.stack(actions),
        Columns.VALUE_TARGETS: np.ones(rows, np.float32),
        Columns.BOOTSTRAP_OBS: np.stack(obs),
        Columns.BOOTSTRAP_DISCOUNT: np.zeros(rows, np.float32),
    }


@pytest.mark.parametrize("learner_class, module_class", [(BCLearner, BCModule), (MARWILLearner, MARWILModule)])
@pytest.mark.parametrize("env_class", [MatchTargetsEnv, ReachTargetsEnv], ids=["MultiDiscrete", "Box2x3"])
def test_bc_and_marwil_imitate_multi_discrete_and_box_2x3_experts(learner_class, module_class, env_class):
    torch.manual_seed(0)
    env = env_class()
    spec = RLModuleSpec(module_class=module_class, observation_space=env.observation_space,
                        action_space=env.action_space, model_config=SMALL)  # fmt: skip
    learner = learner_class(spec, lr=1e-2)
    learner.build()
    batch = expert_batch(env, 256)
    for _ in range(150):
        learner.update_from_batch(batch)
    test = expert_batch(env, 64, seed=1)
    actions = Policy.from_learner(learner).act(test[Columns.OBS])
    assert actions.shape == test[Columns.ACTIONS].shape
    if env_class is MatchTargetsEnv:
        assert actions.dtype == np.int64 and np.mean(actions == test[Columns.ACTIONS]) > 0.9
    else:
        assert np.mean(np.abs(actions - test[Columns.ACTIONS])) < 0.1  # targets are spread over [-0.8, 0.8]


@pytest.mark.parametrize("learner_class, module_class", [(IQLLearner, IQLModule), (CQLLearner, CQLModule)])
def test_iql_and_cql_update_on_box_2x3_actions_and_act_in_the_box(learner_class, module_class):
    torch.manual_seed(0)
    env = ReachTargetsEnv()
    spec = RLModuleSpec(module_class=module_class, observation_space=env.observation_space,
                        action_space=env.action_space, model_config=SMALL)  # fmt: skip
    learner = learner_class(spec, minibatch_size=32)
    learner.build()
    batch = expert_batch(env, 32)
    rng = np.random.default_rng(0)
    batch.update({
        Columns.REWARDS: rng.normal(size=32).astype(np.float32),
        Columns.NEXT_OBS: rng.uniform(-0.8, 0.8, (32, 6)).astype(np.float32),
        Columns.TERMINATEDS: np.zeros(32, bool),
        Columns.TRUNCATEDS: np.zeros(32, bool),
    })  # fmt: skip
    del batch[Columns.VALUE_TARGETS]
    before = {name: value.clone() for name, value in learner.module["default_policy"].state_dict().items()}
    results = learner.update_from_batch(batch)["default_policy"]
    assert all(np.isfinite(value) for value in results.values() if isinstance(value, float))
    after = learner.module["default_policy"].state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before if name.startswith("pi."))
    assert_acts_in(Policy.from_learner(learner), env.action_space)
