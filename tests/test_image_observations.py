"""Image observations end to end: bytes on every path to the module, every algorithm's CNNs train, fit and CLI runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml
from _image_envs import EPISODE_STEPS, IMAGE_SHAPE, make_bright_side_env
from lightning.pytorch import Callback, Trainer, seed_everything
from torch import nn

from lightning_rl import Columns, Learner, Policy, RLModuleSpec
from lightning_rl.algorithms.bc import BCLearner, BCModule
from lightning_rl.algorithms.cql import CQLLearner, CQLModule
from lightning_rl.algorithms.dqn import DQNLearner, DQNModule
from lightning_rl.algorithms.iql import IQLLearner, IQLModule
from lightning_rl.algorithms.marwil import MARWILLearner, MARWILModule
from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.algorithms.sac import QF_RESAMPLED, SACLearner, SACModule
from lightning_rl.cli import LightningRLCLI
from lightning_rl.core.encoders import ObservationEncoder
from lightning_rl.data import OffPolicyDataModule, OnPolicyDataModule

IMAGES = gym.spaces.Box(0, 255, IMAGE_SHAPE, np.uint8)
BOX_ACTIONS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
DISCRETE = gym.spaces.Discrete(2)
SMALL = {"fcnet_hiddens": [16], "conv_filters": [[4, 3, 2]]}
TRAINER = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def observation_encoders(module: nn.Module) -> dict[str, ObservationEncoder]:
    return {name: part for name, part in module.named_modules() if isinstance(part, ObservationEncoder)}


class RecordObservations(Callback):
    """Records the dtype of every batch of observations that reaches one of the module's encoders."""

    def __init__(self) -> None:
        self.dtypes: set[torch.dtype] = set()
        self.calls = 0

    def on_fit_start(self, trainer: Trainer, learner: Learner) -> None:
        for encoder in observation_encoders(learner.module["default_policy"]).values():
            encoder.register_forward_pre_hook(self._record)

    def _record(self, _: nn.Module, args: tuple[Any, ...]) -> None:
        self.dtypes.add(args[0].dtype)
        self.calls += 1


@pytest.mark.parametrize(
    ("learner", "data"),
    [
        (
            lambda: PPOLearner(model_config=SMALL, num_epochs=1, minibatch_size=32),
            lambda: OnPolicyDataModule(
                make_bright_side_env, num_envs=2, rollout_fragment_length=32, max_env_steps=256, seed=0,
                evaluation_num_episodes=2,
            ),
        ),
        (
            lambda: DQNLearner(model_config=SMALL, minibatch_size=16, gradient_steps=2),
            lambda: OffPolicyDataModule(
                make_bright_side_env, num_envs=2, replay_buffer_capacity=500, train_freq=32, learning_starts=32,
                max_env_steps=256, seed=0, evaluation_num_episodes=2,
            ),
        ),
    ],
    ids=["PPO episodes", "DQN replay"],
)  # fmt: skip
def test_images_reach_the_module_as_bytes_when_acting_learning_and_evaluating(learner, data):
    record = RecordObservations()
    ppo_or_dqn = learner()
    trainer = Trainer(max_epochs=-1, callbacks=[record], **TRAINER)
    trainer.fit(ppo_or_dqn, datamodule=data())
    trainer.validate(ppo_or_dqn, datamodule=data())
    assert record.calls > 0 and record.dtypes == {torch.uint8}
    assert trainer.callback_metrics["eval/num_episodes"] == 2

    policy = Policy.from_learner(ppo_or_dqn)
    policy.act(IMAGES.sample())
    policy.act(np.stack([IMAGES.sample(), IMAGES.sample()]))
    assert record.dtypes == {torch.uint8}


def image_batch(rows: int = 16, seed: int = 0, *, box_actions: bool) -> dict[str, torch.Tensor]:
    """Transitions between random images, with every column any of the algorithms reads."""
    rng = np.random.default_rng(seed)
    actions = rng.uniform(-1.0, 1.0, (rows, 2)) if box_actions else rng.integers(0, 2, rows)
    return {
        Columns.OBS: torch.as_tensor(rng.integers(0, 256, (rows, *IMAGE_SHAPE)), dtype=torch.uint8),
        Columns.NEXT_OBS: torch.as_tensor(rng.integers(0, 256, (rows, *IMAGE_SHAPE)), dtype=torch.uint8),
        Columns.ACTIONS: torch.as_tensor(actions, dtype=torch.float32 if box_actions else torch.int64),
        Columns.REWARDS: torch.as_tensor(rng.normal(size=rows), dtype=torch.float32),
        Columns.TERMINATEDS: torch.as_tensor(rng.random(rows) < 0.25),
        Columns.TRUNCATEDS: torch.zeros(rows, dtype=torch.bool),
        Columns.VALUE_TARGETS: torch.as_tensor(rng.normal(size=rows), dtype=torch.float32),
        Columns.BOOTSTRAP_OBS: torch.as_tensor(rng.integers(0, 256, (rows, *IMAGE_SHAPE)), dtype=torch.uint8),
        Columns.BOOTSTRAP_DISCOUNT: torch.as_tensor(rng.uniform(0.0, 1.0, rows), dtype=torch.float32),
    }


@pytest.mark.parametrize(
    ("learner_class", "module_class", "kwargs", "encoders"),
    [
        (SACLearner, SACModule, dict(tau=0.5), {"pi_obs_encoder", "qf_obs_encoder"}),
        (CQLLearner, CQLModule, dict(tau=0.5, num_cql_actions=2), {"pi_obs_encoder", "qf_obs_encoder"}),
        (IQLLearner, IQLModule, dict(tau=0.5), {"pi_obs_encoder", "qf_obs_encoder", "vf_obs_encoder"}),
        (DQNLearner, DQNModule, dict(target_network_update_freq=1), {"q_net.obs_encoder"}),
        (BCLearner, BCModule, {}, {"pi_obs_encoder"}),
        (MARWILLearner, MARWILModule, dict(beta=1.0), {"pi_obs_encoder", "vf_obs_encoder"}),
    ],
    ids=["SAC", "CQL", "IQL", "DQN", "BC", "MARWIL"],
)
def test_every_algorithm_trains_the_cnn_of_each_network_and_moves_its_target_copies(
    learner_class, module_class, kwargs, encoders
):
    box_actions = learner_class in (SACLearner, CQLLearner, IQLLearner)
    spec = RLModuleSpec(module_class, IMAGES, BOX_ACTIONS if box_actions else DISCRETE, SMALL)
    torch.manual_seed(0)
    learner = learner_class(spec, lr=1e-2, **kwargs)
    learner.build()
    module = learner.module["default_policy"]
    online = {name: encoder for name, encoder in observation_encoders(module).items() if not name.startswith("target_")}
    assert set(online) == encoders
    has_targets = bool(getattr(module, "get_target_network_pairs", list)())
    before = {name: value.clone() for name, value in module.state_dict().items() if ".convs." in name}

    for seed in range(2):
        learner.update_from_batch(image_batch(seed=seed, box_actions=box_actions))

    after = module.state_dict()
    changed = {name for name, value in before.items() if not torch.equal(after[name], value)}
    for name in encoders:  # every online CNN learns
        assert f"{name}.convs.0.weight" in changed, name
    # The target copies follow (SAC, CQL and IQL average them, DQN copies them).
    assert any(name.startswith("target_") for name in changed) == has_targets

def test_the_sac_actor_loss_reaches_the_actors_cnn_but_not_the_critics():
    module = SACModule(IMAGES, BOX_ACTIONS, SMALL)
    out = module.forward_train(image_batch(box_actions=True))
    out[QF_RESAMPLED].sum().backward()  # the actor loss's Q term: through the critics, to the actions
    assert module.qf_obs_encoder.convs[0].weight.grad is None
    assert module.pi_obs_encoder.convs[0].weight.grad.abs().sum() > 0


@pytest.mark.slow
@pytest.mark.parametrize("vf_share_layers", [True, False])
def test_ppo_learns_from_images_which_side_is_lit(vf_share_layers: bool):
    # A random policy earns half of the 8 steps, a perfect one all 8; PPO gets 8 within 3072 steps on seeds 0-2.
    seed_everything(0)
    learner = PPOLearner(
        model_config={**SMALL, "vf_share_layers": vf_share_layers, "fcnet_activation": "relu"},
        lr=3e-3, num_epochs=4, minibatch_size=64,
    )  # fmt: skip
    data = OnPolicyDataModule(
        make_bright_side_env, num_envs=4, rollout_fragment_length=32, max_env_steps=3072, seed=0,
        evaluation_num_episodes=8,
    )  # fmt: skip
    trainer = Trainer(max_epochs=-1, **TRAINER)
    trainer.fit(learner, datamodule=data)
    trainer.validate(learner, datamodule=data, verbose=False)
    assert trainer.callback_metrics["eval/episode_return_mean"] >= 0.85 * EPISODE_STEPS
    convs = [layer for layer in learner.module["default_policy"].modules() if isinstance(layer, nn.Conv2d)]
    assert len(convs) == (1 if vf_share_layers else 2) and convs[0].in_channels == 3


def test_ppo_on_stacked_image_frames_from_the_command_line(tmp_path: Path):
    config = {
        "seed_everything": 0,
        "trainer": {"max_epochs": -1, "default_root_dir": str(tmp_path), "enable_progress_bar": False},
        "model": {
            "class_path": "lightning_rl.algorithms.ppo.PPOLearner",
            "init_args": {
                "model_config": {"fcnet_hiddens": [16], "conv_filters": [[8, 3, 1]], "vf_share_layers": True},
                "num_epochs": 1,
                "minibatch_size": 32,
            },
        },
        "data": {
            "class_path": "lightning_rl.data.OnPolicyDataModule",
            "init_args": {
                "env": "_image_envs.make_bright_side_env",
                "wrappers": [
                    {"class_path": "gymnasium.wrappers.FrameStackObservation", "init_args": {"stack_size": 2}}
                ],
                "num_envs": 2,
                "rollout_fragment_length": 32,
                "max_env_steps": 256,
                "evaluation_num_episodes": 2,
            },
        },
    }
    path = tmp_path / "ppo_images.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    cli = LightningRLCLI(args=["fit", "--config", str(path)])
    assert cli.datamodule.observation_space.shape == (2, *IMAGE_SHAPE)
    conv = next(layer for layer in cli.model.module["default_policy"].modules() if isinstance(layer, nn.Conv2d))
    assert conv.in_channels == 2 * IMAGE_SHAPE[-1]  # two frames of three channels
    assert cli.trainer.callback_metrics["eval/num_episodes"] == 2

    checkpoint = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"  # the CLI saves last.ckpt
    policy = Policy.from_checkpoint(str(checkpoint))
    stacked = np.stack([IMAGES.sample(), IMAGES.sample()])
    assert policy.act(stacked) in (0, 1)


@pytest.mark.skipif(importlib.util.find_spec("minatar") is None, reason="needs minatar (pip install minatar)")
def test_ppo_runs_on_minatar_breakout_with_the_small_cnn():
    learner = PPOLearner(model_config={"fcnet_hiddens": [32], "vf_share_layers": True}, num_epochs=1, minibatch_size=64)
    data = OnPolicyDataModule(
        "minatar.gym.BaseEnv", env_kwargs={"game": "breakout", "use_minimal_action_set": True}, num_envs=2,
        rollout_fragment_length=64, max_env_steps=256, seed=0, evaluation_num_episodes=1,
    )  # fmt: skip
    Trainer(max_epochs=-1, **TRAINER).fit(learner, datamodule=data)
    assert (data.observation_space.shape, data.observation_space.dtype) == ((10, 10, 4), np.bool_)
    convs = [layer for layer in learner.module["default_policy"].modules() if isinstance(layer, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [(4, 16, (3, 3))]
    assert data.num_env_steps_sampled_lifetime == 256
