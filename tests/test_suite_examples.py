"""The standard-suite example configs (MuJoCo, Box2D, MinAtar) parse and train a few hundred env steps from the CLI.

Each runs its own config with only the sizes shrunk by flags (budget, rollout, evaluation),
so everything else the config sets (env, wrappers, model_config, normalization, schedules)
is what a user gets. ``benchmarks/suite.py`` runs the same configs for the results in docs/benchmarks.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lightning_rl.cli import LightningRLCLI

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# One evaluation episode on one env, with the checkpoint and logger of a real run.
_EVALUATION = ["--data.init_args.evaluation_num_episodes", "1", "--data.init_args.evaluation_num_envs", "1"]
_PPO = [
    "--data.init_args.max_env_steps", "256", "--data.init_args.rollouts_per_epoch", "1",
    "--model.init_args.num_epochs", "1",
]  # fmt: skip
_OFF_POLICY = [
    "--data.init_args.max_env_steps", "300", "--data.init_args.learning_starts", "100",
    "--data.init_args.replay_buffer_capacity", "1000",
]  # fmt: skip

# config -> (the package its env needs, flags that shrink it)
CONFIGS = {
    "ppo_hopper.yaml": ("mujoco", [*_PPO, "--data.init_args.rollout_fragment_length", "128"]),
    "ppo_hopper_cleanrl.yaml": ("mujoco", [*_PPO, "--data.init_args.rollout_fragment_length", "128"]),
    "ppo_halfcheetah.yaml": ("mujoco", [*_PPO, "--data.init_args.rollout_fragment_length", "128"]),
    "ppo_lunarlander.yaml": ("Box2D", [
        *_PPO, "--data.init_args.num_envs", "2", "--data.init_args.rollout_fragment_length", "64",
    ]),
    "ppo_minatar_breakout.yaml": ("minatar", [
        *_PPO, "--data.init_args.num_envs", "2", "--data.init_args.rollout_fragment_length", "64",
        "--model.init_args.minibatch_size", "64",
    ]),
    "sac_halfcheetah.yaml": ("mujoco", [*_OFF_POLICY, "--data.init_args.rollouts_per_epoch", "150"]),
    "sac_hopper.yaml": ("mujoco", [*_OFF_POLICY, "--data.init_args.rollouts_per_epoch", "150"]),
    "dqn_lunarlander.yaml": ("Box2D", [*_OFF_POLICY, "--data.init_args.rollouts_per_epoch", "50"]),
}  # fmt: skip


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_the_suite_example_trains_a_few_hundred_env_steps_from_the_cli(tmp_path: Path, monkeypatch, config: str):
    package, flags = CONFIGS[config]
    pytest.importorskip(package)
    monkeypatch.chdir(tmp_path)  # MuJoCo writes MUJOCO_LOG.TXT into the working directory
    cli = LightningRLCLI(
        args=[
            "fit", "--config", str(EXAMPLES / config), "--trainer.default_root_dir", str(tmp_path),
            "--trainer.enable_progress_bar", "false", *_EVALUATION, *flags,
        ]
    )  # fmt: skip
    budget = cli.datamodule.hparams.max_env_steps
    assert budget <= cli.datamodule.num_env_steps_sampled_lifetime < budget + 256
    metrics = cli.trainer.callback_metrics
    assert math.isfinite(metrics["default_policy/total_loss"])  # at least one update ran
    assert math.isfinite(metrics["eval/episode_return_mean"])  # and an evaluation
    checkpoint = torch.load(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=True)
    assert checkpoint["global_step"] > 0
