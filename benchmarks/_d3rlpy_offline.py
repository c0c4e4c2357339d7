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
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    d3rlpy.seed(args.seed)

    data = np.load(args.data)
    dataset = d3rlpy.dataset.MDPDataset(
        observations=data["observations"],
        actions=data["actions"],
        rewards=data["rewards"],
        terminals=data["terminals"],
        timeouts=data["timeouts"],
    )
    settings = json.loads(args.settings)
    # Our networks' sizes, for every network d3rlpy builds (actor, critics, IQL's value).
    encoder = d3rlpy.models.VectorEncoderFactory(hidden_units=settings.pop("hidden_units"), activation="relu")
    encoders = {"actor_encoder_factory": encoder, "critic_encoder_factory": encoder}
    if args.algo == "iql":
        encoders["value_encoder_factory"] = encoder
    # Train in [-1, 1] as our modules do (d3rlpy's policies are tanh-bounded there); predict() scales back.
    space = gym.make(args.env).action_space
    scaler = d3rlpy.preprocessing.MinMaxActionScaler(minimum=space.low, maximum=space.high)
    config_class = {"cql": d3rlpy.algos.CQLConfig, "iql": d3rlpy.algos.IQLConfig}[args.algo]
    algo = config_class(**settings, **encoders, action_scaler=scaler).create(device="cpu:0")
    algo.build_with_dataset(dataset)

    # The loop's own time, as the ours variant takes it: from the end of the first gradient step to the
    # end of the last (fit's set-up, the first step's warm-up and the evaluation left out).
    step_ends: list[float] = []
    algo.fit(
        dataset,
        n_steps=args.steps,
        n_steps_per_epoch=args.steps,
        show_progress=False,
        save_interval=args.steps + 1,
        logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
        callback=lambda algo, epoch, total_step: step_ends.append(time.perf_counter()),
    )
    seconds = step_ends[-1] - step_ends[0]

    env = gym.make(args.env)
    returns = []
    for episode in range(args.eval_episodes):
        obs, _ = env.reset(seed=args.eval_seed + episode)
        done, total = False, 0.0
        while not done:
            action = algo.predict(np.asarray(obs, dtype=np.float32)[None])[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    print("RESULT " + json.dumps({"seconds": seconds, "steps": len(step_ends) - 1, "eval_returns": returns}), flush=True)


if __name__ == "__main__":
    main()
