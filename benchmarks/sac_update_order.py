"""The cost of SAC's ``update_order="critics_first"`` (SB3's and d3rlpy's order) against the one-pass ``"joint"``.

    python benchmarks/sac_update_order.py                   # HalfCheetah's spaces, [256, 256], 256 rows
    python benchmarks/sac_update_order.py --rounds 10 --steps 100

What it measures: the CPU seconds of this process (``time.process_time``, which other
processes sharing the cores do not inflate as they do wall time) and the wall seconds of
``--steps`` standalone gradient steps (``SACLearner.update_from_batch`` on one ``--rows``-row
minibatch each, no Trainer) of each order, from the same initial weights, on random rows of
HalfCheetah-v5's spaces (17-d observations, 6-d actions in [-1, 1]). The two orders alternate
round by round, so a change in the machine's load falls on both; the ratios are of the medians
over ``--rounds``. ``"joint"`` runs one forward and backward pass per step; ``"critics_first"``
two (the critics', then the actor's and temperature's against the stepped critics), each pass
computing only its own losses' inputs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _children import print_versions  # noqa: E402

from lightning_rl import Columns, RLModuleSpec  # noqa: E402
from lightning_rl.algorithms.sac import SACLearner, SACModule  # noqa: E402

OBS_DIM, ACT_DIM = 17, 6  # HalfCheetah-v5's
ORDERS = ("joint", "critics_first")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=256, help="rows per minibatch (SB3's batch_size)")
    parser.add_argument("--hiddens", nargs="+", type=int, default=[256, 256])
    parser.add_argument("--steps", type=int, default=50, help="gradient steps per timing")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_versions()
    print(f"{args.steps} gradient steps of {args.rows} rows, hiddens {args.hiddens}, {args.threads} thread(s)")

    observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)
    spec = RLModuleSpec(SACModule, observation_space, action_space, {"fcnet_hiddens": args.hiddens})
    learners = {}
    for order in ORDERS:
        torch.manual_seed(0)
        learners[order] = SACLearner(spec, update_order=order)
        learners[order].build()
    generator = torch.Generator().manual_seed(0)
    batch = {
        Columns.OBS: torch.randn(args.rows, OBS_DIM, generator=generator),
        Columns.ACTIONS: torch.rand(args.rows, ACT_DIM, generator=generator) * 2 - 1,
        Columns.REWARDS: torch.randn(args.rows, generator=generator),
        Columns.NEXT_OBS: torch.randn(args.rows, OBS_DIM, generator=generator),
        Columns.TERMINATEDS: torch.zeros(args.rows, dtype=torch.bool),
    }
    for learner in learners.values():  # warm-up: allocator, Adam's state
        for _ in range(5):
            learner.update_from_batch(batch)

    cpu: dict[str, list[float]] = {order: [] for order in ORDERS}
    wall: dict[str, list[float]] = {order: [] for order in ORDERS}
    for index in range(args.rounds):
        for order in ORDERS if index % 2 == 0 else ORDERS[::-1]:
            cpu_start, wall_start = time.process_time(), time.perf_counter()
            for _ in range(args.steps):
                learners[order].update_from_batch(batch)
            cpu[order].append(time.process_time() - cpu_start)
            wall[order].append(time.perf_counter() - wall_start)
    for name, seconds in (("CPU", cpu), ("wall", wall)):
        medians = {order: statistics.median(values) for order, values in seconds.items()}
        per_step = ", ".join(f"{order} {1000 * medians[order] / args.steps:.2f} ms" for order in ORDERS)
        ratio = medians["critics_first"] / medians["joint"]
        print(f"{name:>4} per gradient step (median of {args.rounds}): {per_step}; critics_first / joint {ratio:.2f}x")

if __name__ == "__main__":
    main()
