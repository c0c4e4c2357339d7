"""MARWIL on the Pendulum datasets, whose every episode is truncated (200 steps): greedy and sampled returns.

    python examples/make_offline_datasets.py --only pendulum-medium-replay pendulum-medium
    python benchmarks/marwil_pendulum.py --seeds 0 1 2 3 4 --rate 0.1

Per dataset and seed: ``MARWILLearner`` with ``examples/marwil_cartpole.yaml``'s settings ([64, 64]
ReLU networks, lr 1e-3, beta 1, vf_coeff 1, gamma 0.99; minibatches of 256) but the moving
average's update rate (``--rate``; RLlib's default 1e-8 leaves the advantages' norm at its start,
10, which Pendulum's advantages of hundreds overflow), ``--steps`` gradient steps, then
``--episodes`` episodes on seeds 7,000,000 + i (the datasets were recorded on 5,000,000 + i),
greedy and sampling. Here MARWIL's targets complete a truncated episode's returns with the value of
its final observation, so these datasets show what that completion is worth.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
from lightning.pytorch import Trainer, seed_everything

from lightning_rl.algorithms.marwil import MARWILLearner
from lightning_rl.cli.evaluate_command import PolicyActor, episode_stats, run_episodes
from lightning_rl.data import OfflineDataModule
from lightning_rl.policy import Policy

DATASETS = ("pendulum/sac-medium-replay-v0", "pendulum/sac-medium-v0")
EVALUATION_SEED = 7_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rate", type=float, default=0.1, help="moving_average_sqd_adv_norm_update_rate")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--episodes", type=int, default=50, help="evaluation episodes per run and mode")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"rate {args.rate}, {args.steps} gradient steps, {args.episodes} evaluation episodes per mode", flush=True)
    for dataset_id in DATASETS:
        for seed in args.seeds:
            start = time.perf_counter()
            greedy, sampled = train_and_evaluate(dataset_id, seed, args)
            print(
                f"  {dataset_id} seed {seed}: greedy {greedy:.1f}, sampled {sampled:.1f} "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )


def train_and_evaluate(dataset_id: str, seed: int, args: argparse.Namespace) -> tuple[float, float]:
    """Train one MARWIL run; its mean greedy and sampled returns."""
    seed_everything(seed, verbose=False)
    learner = MARWILLearner(
        model_config={"fcnet_hiddens": [64, 64], "fcnet_activation": "relu"},
        lr=1e-3,
        beta=1.0,
        vf_coeff=1.0,
        gamma=0.99,
        moving_average_sqd_adv_norm_update_rate=args.rate,
    )
    data = OfflineDataModule(dataset_id, batch_size=256, updates_per_epoch=args.steps, seed=seed, evaluation_env=None)
    trainer = Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(learner, datamodule=data)
    policy = Policy.from_learner(learner)
    returns = []
    for deterministic in (True, False):
        envs = [gym.make("Pendulum-v1") for _ in range(min(10, args.episodes))]
        actor = PolicyActor(policy, deterministic=deterministic, num_envs=len(envs))
        returns.append(float(np.mean(episode_stats(run_episodes(envs, actor, EVALUATION_SEED, args.episodes)).returns)))
    return returns[0], returns[1]


if __name__ == "__main__":
    main()
