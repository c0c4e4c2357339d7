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

``--lstm N`` trains recurrent modules instead (an LSTM of N units in both networks, sequences of
``--max-seq-len`` steps, ``batch_size // max_seq_len`` of them per minibatch), whose value core
values the final observation at the end of the episode's last chunk. ``--returns-to-go-only``
is the baseline: the targets without that completion, the returns-to-go alone (a recurrent
module's targets before 2026-11-29), so one run of each shows what the completion is worth:

    python benchmarks/marwil_pendulum.py --seeds 0 1 2 --lstm 64
    python benchmarks/marwil_pendulum.py --seeds 0 1 2 --lstm 64 --returns-to-go-only
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import seed_everything

from lightning_rl.algorithms.marwil import MARWILLearner
from lightning_rl.core.columns import Columns
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
    parser.add_argument("--lstm", type=int, default=None, help="LSTM cell size: recurrent modules")
    parser.add_argument("--max-seq-len", type=int, default=20, help="steps per sequence, with --lstm")
    parser.add_argument("--returns-to-go-only", action="store_true", help="no V(s_T) completion: the baseline")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"rate {args.rate}, {args.steps} gradient steps, {args.episodes} evaluation episodes per mode, "
        f"lstm {args.lstm}, max_seq_len {args.max_seq_len if args.lstm else None}, "
        f"returns-to-go only {args.returns_to_go_only}",
        flush=True,
    )
    for dataset_id in args.datasets:
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
    model_config = {"fcnet_hiddens": [64, 64], "fcnet_activation": "relu"}
    if args.lstm is not None:
        model_config |= {"use_lstm": True, "lstm_cell_size": args.lstm, "max_seq_len": args.max_seq_len}
    learner_class = ReturnsToGoMARWIL if args.returns_to_go_only else MARWILLearner
    learner = learner_class(
        model_config=model_config,
        lr=1e-3,
        beta=1.0,
        vf_coeff=1.0,
        gamma=0.99,
        moving_average_sqd_adv_norm_update_rate=args.rate,
    )
    data = OfflineDataModule(dataset_id, batch_size=256, updates_per_epoch=args.steps, seed=seed, evaluation_env=None)
    fit_one_pass(learner, data)
    return greedy_and_sampled_returns(Policy.from_learner(learner), "Pendulum-v1", args.episodes, num_envs=10)


class ReturnsToGoMARWIL(MARWILLearner):
    """The baseline: MARWIL whose targets are the returns-to-go alone, not completed by ``V(s_T)``."""

    @staticmethod
    def _value_targets(module: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch[Columns.VALUE_TARGETS].float()


if __name__ == "__main__":
    main()
