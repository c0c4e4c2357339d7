"""Sampling throughput of ``EnvRunner.sample`` with ``vectorize_mode`` sync, async and envpool, side by side.

What it measures: env steps per second of one *rollout* (``--rollout`` vector steps of
``--num-envs`` env copies: rollout x num_envs env steps) of our ``EnvRunner``, the same
runner with the same policy in each mode:

  sync     gymnasium ``SyncVectorEnv`` (SAME_STEP autoreset), the envs stepped one after the
           other in this process
  async    gymnasium ``AsyncVectorEnv``, one subprocess per env
  envpool  ``EnvPoolVectorEnv``: EnvPool's C++ pool with the same-step reset of the envs that
           ended; one variant per ``--envpool-threads`` value (EnvPool's ``num_threads``;
           0 is EnvPool's own default; the threads each pool started are printed)

So each number includes the policy's forward pass (a BCModule MLP, ``--hiddens``, tanh, on the
CPU with ``--threads`` torch threads), the runner's buffers, episode cutting and env-fault
checks: what training sees, not the raw env speed. For each env in ``--envs`` the
runners are built once and timed interleaved, rollout by rollout, for ``--rounds`` rounds after
a warm-up round, rotating which goes first; the verdict per env is the median over rounds of
the paired ratio (sync time / the variant's time in the same round), since the speed of the same loop
drifts by +-25% over seconds on a shared machine.

LunarLander needs Box2D (``pip install "gymnasium[box2d]"``, in the ``bench`` extra) for the
gymnasium modes; Hopper needs MuJoCo (``gymnasium[mujoco]``). An env whose gymnasium modes
cannot be built is reported and skipped.

Run::

    python benchmarks/envpool_sampling.py                        # CartPole, LunarLander, Hopper; 8 envs
    python benchmarks/envpool_sampling.py --envs CartPole-v1 --num-envs 16 --rounds 10
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import gymnasium as gym
import numpy as np
import torch

from lightning_rl import RLModuleSpec
from lightning_rl.algorithms.bc import BCModule
from lightning_rl.env import EnvRunner

# A sibling module: this directory is on sys.path when a benchmark runs as a script.
from _paired import print_paired_table

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "LunarLander-v3", "Hopper-v5"])
    parser.add_argument("--num-envs", type=int, default=8, help="env copies per vector env")
    parser.add_argument("--rollout", type=int, default=128, help="vector steps per rollout")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds (one rollout of each variant per round)")
    parser.add_argument("--hiddens", type=int, nargs="+", default=[64, 64], help="hidden layer sizes of the policy")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument(
        "--envpool-threads", type=int, nargs="+", default=[0, 1],
        help="EnvPool's num_threads, one envpool variant each (0: EnvPool's default)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def thread_count() -> int:
    """Threads of this process now (Linux), to show how many an EnvPool pool started."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def variants(args: argparse.Namespace) -> dict[str, tuple[str, dict[str, int]]]:
    """``{variant: (vectorize_mode, env_kwargs)}``: sync, async, then one envpool variant per thread count."""
    result: dict[str, tuple[str, dict[str, int]]] = {"sync": ("sync", {}), "async": ("async", {})}
    for threads in args.envpool_threads:
        result[f"envpool-{threads}"] = ("envpool", {"num_threads": threads})
    return result


def build_runners(args: argparse.Namespace, env_id: str) -> tuple[dict[str, EnvRunner], dict[str, int]]:
    """One runner per variant for ``env_id``; and the threads each envpool runner's pool started."""
    runners: dict[str, EnvRunner] = {}
    started: dict[str, int] = {}
    try:
        for name, (mode, env_kwargs) in variants(args).items():
            before = thread_count()
            runners[name] = EnvRunner(
                env_id, env_kwargs=env_kwargs, num_envs=args.num_envs, vectorize_mode=mode,
                rollout_fragment_length=args.rollout, seed=args.seed,
            )  # fmt: skip
            if mode == "envpool":  # the pool's threads start when it is made
                started[name] = thread_count() - before
    except Exception:
        for runner in runners.values():
            runner.close()
        raise
    return runners, started


def bench_env(args: argparse.Namespace, env_id: str) -> dict[str, tuple[float, float]] | None:
    """Time every variant on ``env_id``; ``{variant: (env steps/s, paired ratio to sync)}``, ``None`` if skipped."""
    steps = args.rollout * args.num_envs
    try:
        runners, started = build_runners(args, env_id)
    except (gym.error.DependencyNotInstalled, ImportError, ValueError) as error:
        print(f"\n{env_id}: skipped ({type(error).__name__}: {error})")
        return None
    torch.manual_seed(args.seed)
    module = RLModuleSpec(
        module_class=BCModule,
        observation_space=runners["sync"].observation_space,
        action_space=runners["sync"].action_space,
        model_config={"fcnet_hiddens": list(args.hiddens), "fcnet_activation": "tanh"},
    ).build()
    names = list(runners)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    try:
        for round_index in range(args.rounds + 1):  # round 0 is a warm-up
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                episodes = runners[name].sample(module)
                elapsed = time.perf_counter() - start
                assert sum(len(episode) for episode in episodes) == steps
                if round_index > 0:
                    seconds[name].append(elapsed)
        returns = {name: runners[name].get_metrics()["episode_return_mean"] for name in names}
    finally:
        for runner in runners.values():
            runner.close()
    print(
        f"\n{env_id}: obs {runners['sync'].observation_space.shape}, actions {runners['sync'].action_space}; "
        "threads each EnvPool pool started: " + ", ".join(f"{name} {count}" for name, count in started.items())
    )
    labels = {"sync": "(a) sync (gymnasium)", "async": "(b) async (gymnasium)"}
    for name in names[2:]:
        threads = name.split("-")[1]
        labels[name] = "(c) envpool, default threads" if threads == "0" else f"(c) envpool, num_threads={threads}"
    paired = print_paired_table(seconds, labels, baseline="sync", work=steps, unit="env steps/s")
    print("episode_return_mean (same random-init policy): " + ", ".join(f"{n} {r:.1f}" for n, r in returns.items()))
    return {name: (steps / float(np.median(seconds[name])), paired[name]) for name in names}


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32.*")
    import envpool

    print(
        f"torch {torch.__version__}, gymnasium {gym.__version__}, envpool {envpool.__version__}, "
        f"cpu cores {os.cpu_count()}, torch threads={torch.get_num_threads()}"
    )
    print(
        f"num_envs={args.num_envs} rollout={args.rollout} -> {args.rollout * args.num_envs} env steps/rollout; "
        f"policy BCModule hiddens={args.hiddens}; rounds={args.rounds}; paired = median over rounds of "
        "sync's time / the variant's time in the same round [10th-90th percentile]"
    )
    results = {env_id: bench_env(args, env_id) for env_id in args.envs}
    names = list(variants(args))
    print("\nenv steps/s (median over rounds), paired ratio to sync")
    print("| env | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for env_id, result in results.items():
        if result is None:
            print(f"| {env_id} | skipped |" + " |" * (len(names) - 1))
            continue
        cells = [f"{result[name][0]:,.0f} ({result[name][1]:.2f}x)" for name in names]
        print(f"| {env_id} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
