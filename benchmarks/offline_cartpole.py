"""Behaviour cloning and MARWIL on CartPole datasets: the offline CartPole table of docs/benchmarks.md.

    python examples/make_offline_datasets.py --only cartpole-expert   # and --only cartpole-mixed
    python benchmarks/offline_cartpole.py --seeds 0 1 2

Runs, per seed, each from its example config (``examples/bc_cartpole.yaml``,
``examples/marwil_cartpole.yaml``: their model and data arguments; the seed set to the run's):

  BC on ``cartpole/ppo-expert-v0``         ``--expert-steps`` gradient steps;
  BC on ``cartpole/mixed-v0``              ``--mixed-steps`` gradient steps (MARWIL with beta 0);
  MARWIL on ``cartpole/mixed-v0``          the same steps, beta from the config (1.0).

After training, each policy plays ``--episodes`` episodes on seeds 7,000,000 + i (the datasets
were recorded on 5,000,000 + i) twice: greedy (the most likely action) and sampling from the
policy (RLlib's default evaluation). The table shows the mean return per run and the mean
over seeds. No validation runs during training, so every variant trains on the same rows in
the same order for a given seed. One intra-op thread (``--threads``).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import yaml
from lightning.pytorch import Trainer, seed_everything

from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.algorithms.marwil import MARWILLearner
from lightning_rl.cli.evaluate_command import PolicyActor, episode_stats, run_episodes
from lightning_rl.data import OfflineDataModule
from lightning_rl.policy import Policy

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# Not the seeds the datasets were recorded on (lightning-rl record's default, 5,000,000 + i):
# CartPole is deterministic, so those would replay the training episodes' start states.
EVALUATION_SEED = 7_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--expert-steps", type=int, default=2000)
    parser.add_argument("--mixed-steps", type=int, default=5000)
    parser.add_argument("--episodes", type=int, default=50, help="evaluation episodes per run and mode")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # one line per run is enough
    variants = [
        ("BC", "cartpole/ppo-expert-v0", "bc_cartpole.yaml", {}, args.expert_steps),
        ("BC", "cartpole/mixed-v0", "marwil_cartpole.yaml", {"beta": 0.0}, args.mixed_steps),
        ("MARWIL", "cartpole/mixed-v0", "marwil_cartpole.yaml", {}, args.mixed_steps),
    ]
    print(f"{args.threads} thread(s); {args.episodes} evaluation episodes per run and mode")
    rows = []
    for name, dataset_id, config, overrides, steps in variants:
        results = []
        for seed in args.seeds:
            start = time.perf_counter()
            greedy, sampled = train_and_evaluate(EXAMPLES / config, dataset_id, overrides, steps, seed, args.episodes)
            results.append((greedy, sampled))
            print(
                f"  {name} {dataset_id} seed {seed}: greedy {greedy:.1f}, sampled {sampled:.1f} "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
        rows.append((name, dataset_id, steps, results))
    print()
    print("| learner | dataset | gradient steps | greedy return (per seed) | sampled return (per seed) |")
    print("|---|---|---|---|---|")
    for name, dataset_id, steps, results in rows:
        cells = []
        for index in (0, 1):
            values = [result[index] for result in results]
            cells.append(f"{statistics.mean(values):.1f} ({', '.join(f'{v:.0f}' for v in values)})")
        print(f"| {name} | {dataset_id} | {steps} | {cells[0]} | {cells[1]} |")


def train_and_evaluate(
    config: Path, dataset_id: str, overrides: dict[str, Any], steps: int, seed: int, episodes: int
) -> tuple[float, float]:
    """Train the config's Learner for ``steps`` gradient steps; return its greedy and sampled mean returns."""
    content = yaml.safe_load(config.read_text())
    learner_class = {"BCLearner": BCLearner, "MARWILLearner": MARWILLearner}[
        content["model"]["class_path"].rsplit(".", 1)[1]
    ]
    data_args = {**content["data"]["init_args"], "dataset_id": dataset_id, "updates_per_epoch": steps, "seed": seed}
    seed_everything(seed, verbose=False)
    learner = learner_class(**{**content["model"]["init_args"], **overrides})
    fit_one_pass(learner, OfflineDataModule(**data_args))
    return greedy_and_sampled_returns(Policy.from_learner(learner), "CartPole-v1", episodes)


def fit_one_pass(learner: Any, data: OfflineDataModule) -> None:
    """Train ``learner`` for one epoch of ``data`` (its ``updates_per_epoch``), with no logging or validation."""
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


def greedy_and_sampled_returns(policy: Policy, env_id: str, episodes: int, num_envs: int = 8) -> tuple[float, float]:
    """The mean return of ``episodes`` episodes on seeds ``EVALUATION_SEED + i``, ``num_envs`` at a time:
    greedy, then sampling (whose draws depend on ``num_envs``: the policy acts on every env at once)."""
    returns = []
    for deterministic in (True, False):
        envs = [gym.make(env_id) for _ in range(min(num_envs, episodes))]
        actor = PolicyActor(policy, deterministic=deterministic, num_envs=len(envs))
        played = run_episodes(envs, actor, EVALUATION_SEED, episodes)
        returns.append(float(np.mean(episode_stats(played).returns)))
    return returns[0], returns[1]


if __name__ == "__main__":
    main()
