"""PPO under ``Trainer(strategy="ddp", devices=2)`` on CPU: two real ranks, end to end.

One spawned run (tests/ranks.py) does the whole scenario, because starting two ranks costs a
few seconds of imports: a fit that stops on ``max_env_steps``, a checkpoint, and a resumed fit
from that checkpoint. Each rank returns what it saw; the test compares the ranks.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ranks import run_on_ranks

# Per rank: 2 envs x 32 steps = 64 env steps per rollout, 128 over both ranks.
PER_RANK_ROLLOUT = 64
FIRST_BUDGET = 384  # 3 rollouts over 2 ranks: one epoch of 2, then one more and stop
RESUMED_BUDGET = 640  # 2 more rollouts after the resume


def _numpy_state(learner: Any) -> dict[str, np.ndarray]:
    """Weights and optimizer moments, as numpy (tensors do not survive the rank's exit)."""
    state = {f"w/{name}": value.detach().cpu().numpy().copy() for name, value in learner.state_dict().items()}
    for full_name, optimizer in learner._named_optimizers.items():
        for index, values in optimizer.state_dict()["state"].items():
            for key, value in values.items():
                value = value.detach().cpu() if hasattr(value, "detach") else value
                state[f"opt/{full_name}/{index}/{key}"] = np.asarray(value)
    return state


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    return {key: float(value) for key, value in metrics.items()}


def _fit_resume_on_rank(rank: int, world_size: int, root: str) -> dict[str, Any]:
    from lightning.pytorch import Callback, Trainer, seed_everything

    from lightning_rl.algorithms.ppo import PPOLearner
    from lightning_rl.data import OnPolicyDataModule

    def parts(budget: int) -> tuple[PPOLearner, OnPolicyDataModule, dict[str, list]]:
        seed_everything(0)
        learner = PPOLearner(
            model_config={"fcnet_hiddens": [16]}, num_epochs=2, minibatch_size=32, lr=[[0, 1e-3], [1024, 0.0]]
        )
        data = OnPolicyDataModule(
            "CartPole-v1", num_envs=2, rollout_fragment_length=32, seed=0, rollouts_per_epoch=2,
            max_env_steps=budget, evaluation_num_episodes=2,
        )
        seen: dict[str, list] = {"timesteps": [], "first_obs": [], "eval_first_obs": [], "eval_episodes": []}
        update, sample_eval = learner.update_from_episodes, data.sample_eval_item

        def recording_update(episodes, *, timesteps=None, **kwargs):
            seen["timesteps"].append(int(timesteps["num_env_steps_sampled_lifetime"]))
            seen["first_obs"].append(np.array(episodes[0].observations[0]))
            return update(episodes, timesteps=timesteps, **kwargs)

        def recording_eval():
            item = sample_eval()
            seen["eval_first_obs"].append(np.array(item.data.episodes[0].observations[0]))
            seen["eval_episodes"].append([float(episode.get_return()) for episode in item.data.episodes])
            return item

        learner.update_from_episodes, data.sample_eval_item = recording_update, recording_eval
        return learner, data, seen

    class RecordStops(Callback):
        def __init__(self) -> None:
            self.stops: list[bool] = []

        def on_train_batch_end(self, trainer, *args: Any) -> None:
            self.stops.append(bool(trainer.should_stop))

    def trainer(stops: RecordStops) -> Trainer:
        return Trainer(
            accelerator="cpu", strategy="ddp", devices=world_size, max_epochs=-1, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, default_root_dir=root, callbacks=[stops],
        )

    learner, data, seen = parts(FIRST_BUDGET)
    stops = RecordStops()
    fit = trainer(stops)
    fit.fit(learner, datamodule=data)
    checkpoint = str(Path(root) / "ddp.ckpt")
    fit.save_checkpoint(checkpoint)  # every rank calls it; rank 0 writes
    first = {
        "seen": seen, "stops": stops.stops, "global_step": fit.global_step, "epoch": fit.current_epoch,
        "lifetime": data.num_env_steps_sampled_lifetime, "state": _numpy_state(learner),
        "metrics": _scalars(fit.callback_metrics),
    }

    learner, data, seen = parts(RESUMED_BUDGET)
    stops = RecordStops()
    fit = trainer(stops)
    fit.fit(learner, datamodule=data, ckpt_path=checkpoint)
    resumed = {
        "seen": seen, "stops": stops.stops, "global_step": fit.global_step,
        "lifetime": data.num_env_steps_sampled_lifetime, "state": _numpy_state(learner),
        "lr": learner.get_optimizer().param_groups[0]["lr"], "metrics": _scalars(fit.callback_metrics),
    }
    return {"first": first, "resumed": resumed}


def _assert_same_state(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    assert any(key.startswith("opt/") for key in a)  # the optimizer moments are compared too
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_two_rank_ppo_fit_samples_apart_trains_alike_stops_together_and_resumes(tmp_path):
    rank0, rank1 = run_on_ranks(_fit_resume_on_rank, str(tmp_path), world_size=2, timeout=240)

    for run in ("first", "resumed"):
        # Weights and Adam moments agree bit for bit: the gradients were averaged every step.
        _assert_same_state(rank0[run]["state"], rank1[run]["state"])
        assert rank0[run]["global_step"] == rank1[run]["global_step"]
        # Every rank stopped on the same rollout, the one that reached the budget.
        assert rank0[run]["stops"] == rank1[run]["stops"]
        assert rank0[run]["stops"][-1] and not any(rank0[run]["stops"][:-1])
        # Sampling statistics are global: the same numbers on every rank.
        env_runners = [key for key in rank0[run]["metrics"] if key.startswith("env_runners/")]
        assert "env_runners/episode_return_mean" in env_runners and "env_runners/env_steps_per_sec" in env_runners
        for key in env_runners:
            value, other = rank0[run]["metrics"][key], rank1[run]["metrics"][key]
            assert value == other or (math.isnan(value) and math.isnan(other)), key

    # The schedules saw the sum over ranks: 128 env steps per rollout, not 64.
    assert rank0["first"]["seen"]["timesteps"] == [128, 256, 384]
    assert rank1["first"]["seen"]["timesteps"] == [128, 256, 384]
    for rank in (rank0, rank1):
        assert rank["first"]["lifetime"] == FIRST_BUDGET == 2 * 3 * PER_RANK_ROLLOUT
        assert rank["first"]["metrics"]["env_runners/num_env_steps_sampled_lifetime"] == FIRST_BUDGET
        assert rank["first"]["epoch"] == rank0["first"]["epoch"]
    assert rank0["first"]["global_step"] > 0

    # Each rank sampled its own envs (own seeds), for training and for evaluation.
    assert not np.array_equal(rank0["first"]["seen"]["first_obs"][0], rank1["first"]["seen"]["first_obs"][0])
    assert not np.array_equal(rank0["first"]["seen"]["eval_first_obs"][0], rank1["first"]["seen"]["eval_first_obs"][0])
    # Each rank plays its share of the 2 evaluation episodes.
    assert [len(returns) for returns in rank0["first"]["seen"]["eval_episodes"]] == [1, 1]
    assert [len(returns) for returns in rank1["first"]["seen"]["eval_episodes"]] == [1, 1]

    # The resumed run continued the global counters and the learning-rate schedule.
    for rank in (rank0, rank1):
        assert rank["resumed"]["seen"]["timesteps"] == [512, 640]
        assert rank["resumed"]["lifetime"] == RESUMED_BUDGET
        assert rank["resumed"]["lr"] == pytest.approx(1e-3 * (1 - 640 / 1024))
    assert rank0["resumed"]["global_step"] > rank0["first"]["global_step"]

    # Evaluation statistics cover both ranks' episodes, the same numbers on every rank.
    returns = rank0["resumed"]["seen"]["eval_episodes"][-1] + rank1["resumed"]["seen"]["eval_episodes"][-1]
    for rank in (rank0, rank1):
        metrics = rank["resumed"]["metrics"]
        assert metrics["eval/num_episodes"] == 2
        assert metrics["eval/episode_return_mean"] == pytest.approx(np.mean(returns))
        assert metrics["eval/episode_return_min"] == min(returns)
        assert metrics["eval/episode_return_max"] == max(returns)


@pytest.mark.slow
def test_the_command_line_runs_ddp_on_two_cpu_ranks_through_lightnings_relaunch(tmp_path):
    """``lightning-rl fit ... --trainer.strategy=ddp --trainer.devices=2``: Lightning starts rank 1
    by running the same command again; both ranks train, each with the ``--threads`` count (no
    ``OMP_NUM_THREADS`` set: Lightning's launcher alone would give each cpu_count // 2, which is
    not 2 on the 2-core CI machine), and the checkpoint holds global counters. The default count
    (1) takes the same path, ``OMP_NUM_THREADS`` set before the relaunch (test_cli_threads.py)."""
    import os
    import shutil
    import subprocess
    import sys

    import torch

    repo = Path(__file__).resolve().parents[1]
    command = shutil.which("lightning-rl")
    launcher = [command] if command else [sys.executable, "-m", "lightning_rl"]
    flags = {
        "trainer.strategy": "ddp", "trainer.devices": "2", "trainer.accelerator": "cpu",
        "trainer.default_root_dir": str(tmp_path), "trainer.enable_progress_bar": "false",
        "data.init_args.max_env_steps": "512", "data.init_args.rollouts_per_epoch": "1",
        "data.init_args.evaluation_num_episodes": "2", "model.init_args.num_epochs": "1",
    }  # fmt: skip
    args = [*launcher, "fit", "--config", str(repo / "examples" / "ppo_cartpole.yaml")]
    args += [f"--{key}={value}" for key, value in flags.items()]
    args += ["--trainer.callbacks+=_thread_probe.PrintThreads", "--threads=2"]
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo / "tests"), environment.get("PYTHONPATH")]))
    result = subprocess.run(args, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "All distributed processes registered. Starting with 2 processes" in result.stderr + result.stdout
    for rank in (0, 1):
        assert f"RANK {rank} THREADS 2 OMP 2" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    checkpoint = torch.load(tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    state = checkpoint["OnPolicyDataModule"]
    # One rollout of 8 envs x 32 steps on each of 2 ranks: 512 env steps, half of them rank 0's.
    assert state["num_env_steps_sampled_lifetime"] == 512
    assert state["train_runner"]["num_env_steps_sampled_lifetime"] == 256


def _fit_with_a_failing_env_on_rank_1(rank: int, world_size: int, root: str) -> str:
    import gymnasium as gym
    from lightning.pytorch import Trainer

    from lightning_rl.algorithms.ppo import PPOLearner
    from lightning_rl.data import OnPolicyDataModule

    def make_env(**kwargs: Any) -> gym.Env:
        env = gym.make("CartPole-v1")
        return _FailsOnRank1(env) if rank == 1 else env

    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, minibatch_size=32)
    data = OnPolicyDataModule(make_env, num_envs=2, rollout_fragment_length=32, seed=0, evaluation_num_episodes=1)
    trainer = Trainer(
        accelerator="cpu", devices=world_size, strategy="ddp", max_epochs=1, logger=False, num_sanity_val_steps=0,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
    )  # fmt: skip
    try:
        trainer.fit(learner, datamodule=data)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


class _FailsOnRank1:
    """A CartPole whose 5th step raises (wrapped on rank 1 only)."""

    def __new__(cls, env: Any) -> Any:
        import gymnasium as gym

        class Failing(gym.Wrapper):
            steps = 0

            def step(self, action: Any) -> Any:
                Failing.steps += 1
                if Failing.steps == 5:
                    raise RuntimeError("the simulator crashed")
                return self.env.step(action)

        return Failing(env)


def test_a_rank_whose_env_fails_stops_every_rank_at_the_same_rollout(tmp_path):
    # Without the agreement rank 0 learnt only from its next collective, as gloo's "Connection
    # closed by peer" once rank 1's process group went down, naming neither rank nor cause.
    rank0, rank1 = run_on_ranks(_fit_with_a_failing_env_on_rank_1, str(tmp_path), world_size=2, timeout=120)
    assert "the simulator crashed" in rank1
    assert rank0.startswith("SamplingFailedOnAnotherRank: sampling failed on rank(s) [1]")
