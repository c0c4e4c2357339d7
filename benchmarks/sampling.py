"""Sampling throughput of ``EnvRunner.sample`` versus a hand-written loop over a vector env.

What it measures: env steps per second of one *rollout* (``--rollout`` vector steps of
``--num-envs`` copies of ``--env``, so rollout x num_envs env steps) for two variants doing
the same work with the same policy:

  (a) hand-written  a plain loop over a gymnasium ``SyncVectorEnv`` built the same way
                    (SAME_STEP autoreset, ``copy=False``): ``forward_exploration``, a
                    ``torch.distributions.Categorical`` sample and its log-prob, and
                    observations, actions, rewards, terminateds, truncateds, log-probs and
                    distribution inputs written into preallocated numpy arrays; the true
                    final observation of every episode that ends is kept, so episode
                    boundaries are respected as in (b). It builds no episode objects.
  (b) env runner    ``EnvRunner.sample(module)``: the same steps, then cut into
                    ``SingleAgentEpisode`` chunks, plus the runner's counters and statistics.

The policy is one BCModule MLP (``--hiddens``, tanh) shared by both variants, run on the CPU
with one torch thread (``--threads``). Both run in one process, interleaved rollout by
rollout for ``--rounds`` rounds after a warm-up round, alternating which goes first. On a
shared machine the speed of the same loop drifts by +-25% over seconds, so each round's
ratio (a time / b time) is taken under the same conditions and the verdict uses the median
of these paired ratios.

Run::

    python benchmarks/sampling.py                                  # CartPole-v1, 8 envs, 256 steps
    python benchmarks/sampling.py --num-envs 1 --rollout 1000 --rounds 10
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.distributions as D
from gymnasium.vector import AutoresetMode

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms.bc import BCModule
from lightning_rl.env import EnvRunner

# A sibling module: this directory is on sys.path when a benchmark runs as a script.
from _paired import print_paired_table

TARGET_RATIO = 0.85


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1", help="a registered env id with a Discrete action space")
    parser.add_argument("--num-envs", type=int, default=8, help="env copies in the vector env")
    parser.add_argument("--rollout", type=int, default=256, help="vector steps per rollout")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds (one rollout of each variant per round)")
    parser.add_argument("--hiddens", type=int, nargs="+", default=[64, 64], help="hidden layer sizes of the policy")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


class HandWritten:
    """The same rollout as ``EnvRunner.sample``, written as a plain loop into numpy arrays."""

    def __init__(self, env_id: str, num_envs: int, seed: int) -> None:
        self.env = gym.vector.SyncVectorEnv(
            [lambda: gym.make(env_id)] * num_envs, copy=False, autoreset_mode=AutoresetMode.SAME_STEP
        )
        obs, _ = self.env.reset(seed=seed)
        self.obs = np.array(obs)
        self.space = self.env.single_observation_space
        self.num_envs = num_envs

    def rollout(self, module: BCModule, num_steps: int) -> dict[str, Any]:
        n = self.num_envs
        obs = np.empty((num_steps + 1, n, *self.space.shape), dtype=self.space.dtype)
        actions = np.empty((num_steps, n), dtype=np.int64)
        rewards = np.empty((num_steps, n), dtype=np.float32)
        terminateds = np.empty((num_steps, n), dtype=np.bool_)
        truncateds = np.empty((num_steps, n), dtype=np.bool_)
        logp = np.empty((num_steps, n), dtype=np.float32)
        dist_inputs: np.ndarray | None = None
        final_obs: dict[tuple[int, int], np.ndarray] = {}
        obs[0] = self.obs
        with torch.inference_mode():
            for t in range(num_steps):
                logits = module.forward_exploration({Columns.OBS: torch.from_numpy(obs[t])})[Columns.ACTION_DIST_INPUTS]
                dist = D.Categorical(logits=logits, validate_args=False)
                action = dist.sample()
                action_np = action.numpy()
                if dist_inputs is None:
                    dist_inputs = np.empty((num_steps, *logits.shape), dtype=np.float32)
                dist_inputs[t] = logits.numpy()
                logp[t] = dist.log_prob(action).numpy()
                actions[t] = action_np
                next_obs, reward, terminated, truncated, infos = self.env.step(action_np)
                obs[t + 1] = next_obs
                rewards[t] = reward
                terminateds[t] = terminated
                truncateds[t] = truncated
                if infos:  # in SAME_STEP mode, an episode ended: keep its true final observation
                    for i in np.flatnonzero(terminated | truncated):
                        final_obs[t, i] = np.asarray(infos["final_obs"][i])
        self.obs = obs[num_steps]
        return {"obs": obs, "actions": actions, "rewards": rewards, "logp": logp, "final_obs": final_obs}

    def close(self) -> None:
        self.env.close()


def time_call(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    steps = args.rollout * args.num_envs
    print(f"torch {torch.__version__}, gymnasium {gym.__version__}, device=cpu, threads={torch.get_num_threads()}")
    print(
        f"env={args.env} num_envs={args.num_envs} (sync, SAME_STEP autoreset) rollout={args.rollout} "
        f"-> {steps} env steps/rollout; policy BCModule hiddens={args.hiddens}; rounds={args.rounds}"
    )

    runner = EnvRunner(args.env, num_envs=args.num_envs, rollout_fragment_length=args.rollout, seed=args.seed)
    hand = HandWritten(args.env, args.num_envs, args.seed)
    if not isinstance(runner.action_space, gym.spaces.Discrete):
        raise SystemExit(f"{args.env} has action space {runner.action_space}; this benchmark needs Discrete actions")
    torch.manual_seed(args.seed)
    module = RLModuleSpec(
        module_class=BCModule,
        observation_space=runner.observation_space,
        action_space=runner.action_space,
        model_config={"fcnet_hiddens": list(args.hiddens), "fcnet_activation": "tanh"},
    ).build()

    seconds: dict[str, list[float]] = {"hand-written": [], "env runner": []}
    runs = {
        "hand-written": lambda: hand.rollout(module, args.rollout),
        "env runner": lambda: runner.sample(module),
    }
    for round_index in range(args.rounds + 1):  # round 0 is a warm-up
        names = list(runs) if round_index % 2 == 0 else list(reversed(runs))
        for name in names:
            elapsed, result = time_call(runs[name])
            if name == "env runner":  # the same work: every env step of the rollout is in the episodes
                assert sum(len(episode) for episode in result) == steps
            else:
                assert result["actions"].size == steps
            if round_index > 0:
                seconds[name].append(elapsed)
    metrics = runner.get_metrics()
    runner.close()
    hand.close()

    print("each round times one rollout of (a) and (b), alternating which goes first")
    print("paired = median over rounds of (a)'s time / (b)'s time in the same round [10th-90th percentile]")
    labels = {"hand-written": "(a) hand-written loop", "env runner": "(b) EnvRunner.sample"}
    paired = print_paired_table(seconds, labels, baseline="hand-written", work=steps, unit="env steps/s")
    print(
        f"EnvRunner.get_metrics(): env_steps_per_sec={metrics['env_steps_per_sec']:,.0f} "
        f"(all rounds), episodes={metrics['num_episodes']:.0f}, episode_return_mean={metrics['episode_return_mean']:.1f}"
    )
    verdict = "PASS" if paired["env runner"] >= TARGET_RATIO else "FAIL"
    print(f"verdict: {verdict} (target: paired >= {TARGET_RATIO:.2f}x of hand-written): env runner {paired['env runner']:.2f}x")


if __name__ == "__main__":
    main()
