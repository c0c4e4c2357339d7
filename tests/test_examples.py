"""The examples run and do what their docstrings promise."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from _helpers import EXAMPLES, load_example
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


@pytest.mark.slow
def test_custom_learner_clones_the_cartpole_expert_and_logs_to_tensorboard(tmp_path: Path):
    results = load_example("custom_learner").main(
        ["--updates", "30", "--eval-episodes", "10", "--log-dir", str(tmp_path)]
    )
    assert results["final_loss"] < 0.25 * math.log(2)
    assert results["mean_return"] > 400

    events = EventAccumulator(results["log_dir"])
    events.Reload()
    losses = [event.value for event in events.Scalars("default_policy/total_loss")]
    assert len(losses) == 30 and losses[-1] < losses[0]
    assert {"default_policy/default_optimizer_learning_rate", "__all_modules__/num_env_steps_trained_lifetime"} <= set(
        events.Tags()["scalars"]
    )


@pytest.mark.slow
def test_ppo_hopper_trains_with_normalization_and_saves_its_statistics(tmp_path: Path):
    pytest.importorskip("mujoco")
    from lightning_rl.cli import LightningRLCLI
    from lightning_rl.core.normalization import find_observation_normalization

    cli = LightningRLCLI(
        args=[
            "fit", "--config", str(EXAMPLES / "ppo_hopper.yaml"),
            "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
            "--data.init_args.max_env_steps", "2048", "--data.init_args.rollouts_per_epoch", "2",
            "--data.init_args.evaluation_num_episodes", "2", "--data.init_args.evaluation_num_envs", "2",
        ]
    )  # fmt: skip
    metrics = cli.trainer.callback_metrics
    assert math.isfinite(metrics["default_policy/total_loss"])
    assert metrics["eval/episode_return_mean"] > 0  # Hopper's own units: a healthy-reward sum

    checkpoint = torch.load(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=True)
    state = checkpoint["OnPolicyDataModule"]
    # One env: its first reset observation, then one observation acted on per env step.
    env_steps = state["num_env_steps_sampled_lifetime"]
    assert env_steps >= 1024
    assert state["observation_normalization"]["count"] == env_steps + 1
    assert state["reward_normalization"]["count"] == env_steps and state["reward_normalization"]["gamma"] == 0.999
    normalization = find_observation_normalization(checkpoint)
    assert normalization is not None and normalization.mean.shape == (11,)
