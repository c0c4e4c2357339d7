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
import sys
import time
from pathlib import Path

import torch
from lightning.pytorch import seed_everything

from lightning_rl.algorithms.marwil import MARWILLearner
from lightning_rl.data import OfflineDataModule
from lightning_rl.policy import Policy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offline_cartpole import fit_one_pass, greedy_and_sampled_returns  # noqa: E402

DATASETS = ("pendulum/sac-medium-replay-v0", "pendulum/sac-medium-v0")


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
    fit_one_pass(learner, data)
    return greedy_and_sampled_returns(Policy.from_learner(learner), "Pendulum-v1", args.episodes, num_envs=10)


if __name__ == "__main__":
    main()
