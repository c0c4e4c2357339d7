"""The d3rlpy side of ``benchmarks/offline.py``: train d3rlpy's CQL or IQL on an exported dataset, time it, evaluate it.

Runs under a Python that has d3rlpy (its own virtual environment: d3rlpy 2.8 pins
gymnasium 1.0), so it imports neither lightning_rl nor Minari. The parent exports the
dataset as an ``.npz`` in d3rlpy's flat ``MDPDataset`` layout and reads one JSON line
from stdout (``RESULT {...}``).
"""

from __future__ import annotations

import argparse
import json
import time

import d3rlpy
import gymnasium as gym
import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, help=".npz with observations, actions, rewards, terminals, timeouts")
    parser.add_argument("--algo", choices=("cql", "iql"), required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", required=True, help="JSON: the config fields, and hidden_units")
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--eval-seed", type=int, default=1_000_000)
    parser.add_argument("--eval-at", nargs="*", type=int, default=[], help="also evaluate after these gradient steps")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    d3rlpy.seed(args.seed)
    dataset = load_dataset(args.data)
    algo = build_algo(args.algo, json.loads(args.settings), args.env, dataset)

    # The loop's own time, as the ours variant takes it: from the end of the first gradient step to the
    # end of the last (fit's set-up, the first step's warm-up and the evaluations left out).
    step_ends: list[float] = []
    evals: dict[str, list[float]] = {}
    eval_seconds = 0.0

    def after_step(_algo: object, epoch: int, total_step: int) -> None:
        nonlocal eval_seconds
        step_ends.append(time.perf_counter() - eval_seconds)
        if len(step_ends) in args.eval_at:
            start = time.perf_counter()
            with torch.random.fork_rng():  # the training's draws stay those of a run without this evaluation
                evals[str(len(step_ends))] = evaluate(algo, args.env, args.eval_episodes, args.eval_seed)
            eval_seconds += time.perf_counter() - start

    fit(algo, dataset, args.steps, after_step)
    seconds = step_ends[-1] - step_ends[0]
    returns = evaluate(algo, args.env, args.eval_episodes, args.eval_seed)
    result = {"seconds": seconds, "steps": len(step_ends) - 1, "eval_returns": returns, "evals": evals}
    print("RESULT " + json.dumps(result), flush=True)


def load_dataset(path: str) -> d3rlpy.dataset.ReplayBuffer:
    """The exported ``.npz`` (``offline.export_for_d3rlpy``) as d3rlpy's ``MDPDataset``."""
    data = np.load(path)
    return d3rlpy.dataset.MDPDataset(
        observations=data["observations"],
        actions=data["actions"],
        rewards=data["rewards"],
        terminals=data["terminals"],
        timeouts=data["timeouts"],
    )


def build_algo(
    algo: str, settings: dict, env_id: str, dataset: d3rlpy.dataset.ReplayBuffer
) -> d3rlpy.base.LearnableBase:
    """d3rlpy's ``CQL`` or ``IQL`` with ``settings`` (its config fields and ``hidden_units``), built for ``dataset``."""
    settings = dict(settings)
    # Our networks' sizes, for every network d3rlpy builds (actor, critics, IQL's value).
    encoder = d3rlpy.models.VectorEncoderFactory(hidden_units=settings.pop("hidden_units"), activation="relu")
    encoders = {"actor_encoder_factory": encoder, "critic_encoder_factory": encoder}
    if algo == "iql":
        encoders["value_encoder_factory"] = encoder
    # Train in [-1, 1] as our modules do (d3rlpy's policies are tanh-bounded there); predict() scales back.
    space = gym.make(env_id).action_space
    scaler = d3rlpy.preprocessing.MinMaxActionScaler(minimum=space.low, maximum=space.high)
    config_class = {"cql": d3rlpy.algos.CQLConfig, "iql": d3rlpy.algos.IQLConfig}[algo]
    built = config_class(**settings, **encoders, action_scaler=scaler).create(device="cpu:0")
    built.build_with_dataset(dataset)
    return built


def fit(algo: d3rlpy.base.LearnableBase, dataset: d3rlpy.dataset.ReplayBuffer, steps: int, callback=None) -> None:
    """``steps`` gradient steps in one epoch, without logging, progress bar or saved models."""
    algo.fit(
        dataset,
        n_steps=steps,
        n_steps_per_epoch=steps,
        show_progress=False,
        save_interval=steps + 1,
        logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
        callback=callback,
    )


def evaluate(algo: d3rlpy.base.LearnableBase, env_id: str, episodes: int, first_seed: int) -> list[float]:
    """The returns of ``episodes`` greedy episodes (``predict``), episode ``i`` reset with seed ``first_seed + i``."""
    env = gym.make(env_id)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=first_seed + episode)
        done, total = False, 0.0
        while not done:
            action = algo.predict(np.asarray(obs, dtype=np.float32)[None])[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


if __name__ == "__main__":
    main()
