"""The cost per env step of observation and reward normalization in ``EnvRunner.sample``.

Two runners on the same env, seeds and policy, one plain and one with
``normalize_observations=True, normalize_rewards=True``, each timed one rollout at a time,
interleaved for ``--rounds`` rounds after a warm-up round (alternating which goes first). The
verdict is the median over rounds of the paired ratio plain time / normalized time (see
``_paired``): 1.0 means normalization costs nothing, 0.9 that a rollout takes ~11% longer.

Run::

    python benchmarks/normalization.py                     # CartPole-v1, 8 envs, 256 steps
    python benchmarks/normalization.py --env Hopper-v5 --num-envs 1 --rollout 512
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch

# A sibling module: this directory is on sys.path when a benchmark runs as a script.
from _paired import print_paired_table

from lightning_rl import RLModuleSpec
from lightning_rl.algorithms.ppo import PPOModule
from lightning_rl.env import EnvRunner


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1", help="a registered env id with Box observations")
    parser.add_argument("--num-envs", type=int, default=8, help="env copies in the vector env")
    parser.add_argument("--rollout", type=int, default=256, help="vector steps per rollout")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds (one rollout of each runner per round)")
    parser.add_argument("--hiddens", type=int, nargs="+", default=[64, 64], help="hidden layer sizes of the policy")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    steps = args.rollout * args.num_envs
    print(f"torch {torch.__version__}, gymnasium {gym.__version__}, device=cpu, threads=1")
    print(
        f"env={args.env} num_envs={args.num_envs} (sync) rollout={args.rollout} -> {steps} env steps/rollout; "
        f"policy PPOModule hiddens={args.hiddens}; rounds={args.rounds}"
    )
    common = {"num_envs": args.num_envs, "rollout_fragment_length": args.rollout, "seed": args.seed}
    runners = {
        "plain": EnvRunner(args.env, **common),
        "normalized": EnvRunner(args.env, normalize_observations=True, normalize_rewards=True, **common),
    }
    torch.manual_seed(args.seed)
    module = RLModuleSpec(
        module_class=PPOModule,
        observation_space=runners["plain"].observation_space,
        action_space=runners["plain"].action_space,
        model_config={"fcnet_hiddens": list(args.hiddens), "fcnet_activation": "tanh"},
    ).build()

    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for round_index in range(args.rounds + 1):  # round 0 is a warm-up
        names = list(runners) if round_index % 2 == 0 else list(reversed(runners))
        for name in names:
            start = time.perf_counter()
            episodes = runners[name].sample(module)
            elapsed = time.perf_counter() - start
            assert sum(len(episode) for episode in episodes) == steps
            if round_index > 0:
                seconds[name].append(elapsed)
    for runner in runners.values():
        runner.close()

    labels = {"plain": "(a) EnvRunner.sample", "normalized": "(b) with normalization"}
    paired = print_paired_table(seconds, labels, baseline="plain", work=steps, unit="env steps/s")
    per_step_us = (sorted(seconds["normalized"])[args.rounds // 2] - sorted(seconds["plain"])[args.rounds // 2]) / steps
    print(f"normalization: {paired['normalized']:.2f}x the plain runner's speed (paired median)")
    print(f"extra time per env step (difference of medians): {per_step_us * 1e6:.2f} us")


if __name__ == "__main__":
    main()
