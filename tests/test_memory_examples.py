"""The memory examples: their envs resolve through the env factory and play, and the CartPole one learns.

POPGym's task skips without the optional ``popgym`` package.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_rl.env.env_factory import make_env, resolve_env

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _env_of(example: str) -> str:
    return yaml.safe_load((EXAMPLES / example).read_text())["data"]["init_args"]["env"]


def test_the_cartpole_example_names_the_registered_env_without_velocities():
    env = make_env(resolve_env(_env_of("ppo_cartpole_novel_lstm.yaml")), {}, [])
    assert env.observation_space.shape == (2,) and env.spec.max_episode_steps == 500


def test_the_popgym_example_env_is_a_51_step_card_game_with_discrete_spaces():
    pytest.importorskip("popgym")
    env = make_env(resolve_env(_env_of("ppo_popgym_lstm.yaml")), {}, [])
    assert env.observation_space.n == 4 and env.action_space.n == 4
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    total, steps, done = 0.0, 0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(int(rng.integers(4)))
        assert env.observation_space.contains(obs)
        total, steps, done = total + reward, steps + 1, terminated or truncated
    # One deck: 51 deals after the first card; 48 graded guesses of +-1/48 each.
    assert steps == 51 and terminated and -1.0 <= total <= 1.0


@pytest.mark.slow
def test_the_lstm_example_learns_cartpole_without_velocities_from_the_cli(tmp_path: Path):
    """Memory is what the task needs: a policy without it stays below ~60 (benchmarks/memory_ppo.py)."""
    from lightning_rl.cli import LightningRLCLI

    LightningRLCLI(
        args=[
            "fit", "--config", str(EXAMPLES / "ppo_cartpole_novel_lstm.yaml"),
            "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
            "--data.init_args.max_env_steps", "15360",
        ]
    )  # fmt: skip
    events = EventAccumulator(str(next(tmp_path.glob("lightning_logs/version_0"))))
    events.Reload()
    returns = [event.value for event in events.Scalars("eval/episode_return_mean")]
    assert len(returns) == 3 and max(returns) >= 200, returns
    assert (tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt").is_file()
