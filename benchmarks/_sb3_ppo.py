"""Child script of ``benchmarks/ppo_cartpole.py``: Stable-Baselines3's PPO on CartPole-v1.

The rl-zoo settings tuned for CartPole-v1, the same as ``handwritten_ppo.py`` and our
``examples/ppo_cartpole.yaml``: ``PPO("MlpPolicy", ...)`` on 8 envs (``DummyVecEnv``, SB3's
sequential vector env) x ``n_steps=32``, ``batch_size=256``, ``n_epochs=20``, ``gamma=0.98``,
``gae_lambda=0.8``, learning rate 1e-3 and clip range 0.2 annealed linearly to 0
(``progress_remaining * value``), ``ent_coef=0``, ``vf_coef=0.5``, ``max_grad_norm=0.5`` and
SB3's MlpPolicy defaults (separate [64, 64] tanh policy and value nets, orthogonal init,
Adam eps 1e-5, advantage normalization per minibatch).

SB3's linear schedules run over ``learn(total_timesteps)``, so ``total_timesteps`` is the
anneal horizon, 100k env steps; a callback checks the training return (the mean of
``model.ep_info_buffer``: the last up to 100 completed episodes) after every rollout and
stops the run when it reaches ``--threshold`` or ``--max-env-steps`` is used up.

Output protocol (the same as ``handwritten_ppo.py``): ``TRAINING_START time=<unix time>``
before the first rollout, ``REACHED env_steps=<int>
time=<unix time> elapsed=<s since this script started> ...`` or ``NOT_REACHED env_steps=<int>
...``, then ``PEAK_RSS_MB=<float>`` at exit. Needs ``pip install stable-baselines3``.

Run alone::

    python benchmarks/_sb3_ppo.py --seed 0 --threshold 450 --max-env-steps 100000
"""

from __future__ import annotations

import time

START_TIME = time.time()  # before the heavy imports: the run's clock starts with the script

import resource
import sys
from collections.abc import Callable

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv

# The same command-line flags as the hand-written PPO (this directory is on sys.path when run).
from handwritten_ppo import parse_args

ANNEAL_STEPS = 100_000


def linear_schedule(initial: float) -> Callable[[float], float]:
    """rl-zoo's ``lin_<initial>``: SB3 calls it with progress_remaining = 1 - steps / total."""

    def schedule(progress_remaining: float) -> float:
        return progress_remaining * initial

    return schedule


class StopAtTrainingReturn(BaseCallback):
    """After each rollout: report and stop once the ep_info_buffer mean reaches the threshold."""

    def __init__(self, threshold: float, max_env_steps: int, verbose: bool) -> None:
        super().__init__()
        self.threshold = threshold
        self.max_env_steps = max_env_steps
        self.print_progress = verbose
        self.done = False
        self.reached = False
        self.env_steps = 0  # at the last rollout end (learn() counts one more step before it stops)

    def _on_training_start(self) -> None:
        print(f"TRAINING_START time={time.time():.6f}", flush=True)  # set-up done, first rollout next

    def _on_step(self) -> bool:
        return not self.done  # False stops learn() at the next env step

    def _on_rollout_end(self) -> None:
        self.env_steps = self.num_timesteps
        buffer = self.model.ep_info_buffer
        if buffer:
            mean_return = float(np.mean([info["r"] for info in buffer]))
            if self.print_progress:
                print(
                    f"env_steps={self.num_timesteps} return_mean={mean_return:.1f} episodes={len(buffer)}", flush=True
                )
            if mean_return >= self.threshold:
                now = time.time()
                print(
                    f"REACHED env_steps={self.num_timesteps} time={now:.6f} elapsed={now - START_TIME:.3f} "
                    f"return_mean={mean_return:.2f} episodes={len(buffer)} threads={torch.get_num_threads()}",
                    flush=True,
                )
                self.done = self.reached = True
        if self.num_timesteps >= self.max_env_steps:
            self.done = True


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    vec_env = make_vec_env("CartPole-v1", n_envs=8, seed=args.seed, vec_env_cls=DummyVecEnv)
    model = PPO(
        "MlpPolicy",
        vec_env,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        learning_rate=linear_schedule(1e-3),
        clip_range=linear_schedule(0.2),
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        device=args.device,
        seed=args.seed,
    )
    callback = StopAtTrainingReturn(args.threshold, args.max_env_steps, args.verbose)
    model.learn(total_timesteps=ANNEAL_STEPS, callback=callback)
    if not callback.reached:
        buffer = model.ep_info_buffer or []
        mean_return = float(np.mean([info["r"] for info in buffer])) if buffer else float("nan")
        print(
            f"NOT_REACHED env_steps={callback.env_steps} return_mean={mean_return:.2f} episodes={len(buffer)}",
            flush=True,
        )
    vec_env.close()
    print(f"PEAK_RSS_MB={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
