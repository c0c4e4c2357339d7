"""A hand-written, single-file PPO on CartPole-v1 (plain torch + gymnasium), CleanRL style.

It is the yardstick of ``benchmarks/ppo_cartpole.py``: the same algorithm as SB3's PPO with
the rl-zoo settings tuned for CartPole-v1, in the fewest lines that do it right:

  8 envs (``SyncVectorEnv``) x 32 steps = 256 rows per update, 20 epochs of minibatches of
  256 rows, gamma 0.98, GAE lambda 0.8, lr 1e-3 and clip 0.2 both annealed linearly to 0 over
  100k env steps (progress = 1 - env_steps / 100k, updated after each rollout, as SB3 does),
  ent_coef 0, vf_coef 0.5, global-norm gradient clipping 0.5, separate policy and value MLPs
  [64, 64] tanh with orthogonal init (gain sqrt(2) hidden, 0.01 policy head, 1.0 value head),
  Adam eps 1e-5, per-minibatch advantage normalization, unclipped MSE value loss.

Episode ends follow SB3: the vector env resets an episode in the same step it ends
(``AutoresetMode.SAME_STEP``); GAE stops at every end; a *truncated* (time-limit) episode is
bootstrapped by adding ``gamma * V(final_obs)`` to its last reward.

"Training return" is SB3's ``ep_info_buffer`` mean: the mean undiscounted return of the last
(up to) 100 completed training episodes, checked after each rollout (before the update).

Run alone::

    python benchmarks/handwritten_ppo.py --seed 0 --threshold 450 --max-env-steps 100000

It prints ``TRAINING_START time=<unix time>`` when set-up is done and the first rollout
begins, and one machine-readable line when the training return first reaches the threshold,
``REACHED env_steps=<int> time=<unix time> elapsed=<s since this script started> ...``
(or ``NOT_REACHED env_steps=<int> ...`` at ``--max-env-steps``), then exits after a last line
``PEAK_RSS_MB=<float>`` (this process's peak resident set size).
"""

from __future__ import annotations

import time

START_TIME = time.time()  # before the heavy imports: the run's clock starts with the script

import argparse
import collections
import random
import resource
import sys

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from _children import add_device_argument, check_device

ENV_ID = "CartPole-v1"
NUM_ENVS = 8
NUM_STEPS = 32  # per env and rollout
MINIBATCH_SIZE = 256
NUM_EPOCHS = 20
GAMMA = 0.98
GAE_LAMBDA = 0.8
LR = 1e-3
CLIP = 0.2
ANNEAL_STEPS = 100_000  # lr and clip reach 0 here (SB3's total_timesteps)
ENT_COEF = 0.0
VF_COEF = 0.5
MAX_GRAD_NORM = 0.5
ADAM_EPS = 1e-5
HIDDEN = 64
RETURN_WINDOW = 100  # episodes in the training-return mean


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threshold", type=float, default=450.0, help="stop when the training return reaches this")
    parser.add_argument("--max-env-steps", type=int, default=100_000, help="give up after this many env steps")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--verbose", action="store_true", help="print the training return after every rollout")
    add_device_argument(parser)
    args = parser.parse_args()
    check_device(args.device)
    return args


def linear(in_dim: int, out_dim: int, gain: float) -> nn.Linear:
    layer = nn.Linear(in_dim, out_dim)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def mlp(in_dim: int, out_dim: int, head_gain: float) -> nn.Sequential:
    hidden_gain = np.sqrt(2)
    return nn.Sequential(
        linear(in_dim, HIDDEN, hidden_gain),
        nn.Tanh(),
        linear(HIDDEN, HIDDEN, hidden_gain),
        nn.Tanh(),
        linear(HIDDEN, out_dim, head_gain),
    )


class Agent(nn.Module):
    """Separate policy and value MLPs (no shared layers)."""

    def __init__(self, obs_dim: int, num_actions: int) -> None:
        super().__init__()
        self.policy = mlp(obs_dim, num_actions, head_gain=0.01)
        self.value = mlp(obs_dim, 1, head_gain=1.0)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value(obs).squeeze(-1)

    def get_dist(self, obs: torch.Tensor) -> Categorical:
        return Categorical(logits=self.policy(obs), validate_args=False)


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    starts: torch.Tensor,
    last_value: torch.Tensor,
    last_done: torch.Tensor,
) -> torch.Tensor:
    """GAE(lambda) advantages [T, N], as SB3's ``RolloutBuffer.compute_returns_and_advantage``.

    ``starts[t]`` is 1.0 where row t's obs begins an episode (so row t - 1 ended one);
    ``last_done`` says whether the rollout's last step ended an episode.
    """
    advantages = torch.zeros_like(rewards)
    last_gae = torch.zeros_like(last_value)
    num_steps = rewards.shape[0]
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            next_non_terminal, next_values = 1.0 - last_done, last_value
        else:
            next_non_terminal, next_values = 1.0 - starts[t + 1], values[t + 1]
        delta = rewards[t] + GAMMA * next_values * next_non_terminal - values[t]
        last_gae = delta + GAMMA * GAE_LAMBDA * next_non_terminal * last_gae
        advantages[t] = last_gae
    return advantages


def ppo_update(
    agent: Agent, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor], *, lr: float, clip: float
) -> None:
    """NUM_EPOCHS passes over ``batch`` in shuffled minibatches, one clipped Adam step each."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    batch_size = len(batch["obs"])
    for _ in range(NUM_EPOCHS):
        order = torch.randperm(batch_size, device=batch["obs"].device)
        for start in range(0, batch_size, MINIBATCH_SIZE):
            idx = order[start : start + MINIBATCH_SIZE]
            obs = batch["obs"][idx]
            dist = agent.get_dist(obs)
            new_logp = dist.log_prob(batch["actions"][idx])
            new_value = agent.get_value(obs)

            adv = batch["advantages"][idx]
            if len(idx) > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            ratio = torch.exp(new_logp - batch["logp"][idx])
            pg_loss = -torch.min(adv * ratio, adv * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)).mean()
            v_loss = nn.functional.mse_loss(new_value, batch["returns"][idx])
            entropy = dist.entropy().mean()
            loss = pg_loss + VF_COEF * v_loss - ENT_COEF * entropy

            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), MAX_GRAD_NORM)
            optimizer.step()


def report(line: str) -> None:
    print(line, flush=True)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)  # the agent, rollout buffers and update; the envs stay on the CPU

    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(ENV_ID) for _ in range(NUM_ENVS)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs_dim = envs.single_observation_space.shape[0]
    agent = Agent(obs_dim, int(envs.single_action_space.n)).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=LR, eps=ADAM_EPS)

    obs_buf = torch.zeros((NUM_STEPS, NUM_ENVS, obs_dim), device=device)
    actions_buf = torch.zeros((NUM_STEPS, NUM_ENVS), dtype=torch.long, device=device)
    logp_buf = torch.zeros((NUM_STEPS, NUM_ENVS), device=device)
    rewards_buf = torch.zeros((NUM_STEPS, NUM_ENVS), device=device)
    starts_buf = torch.zeros((NUM_STEPS, NUM_ENVS), device=device)  # 1.0 where the row's obs begins an episode
    values_buf = torch.zeros((NUM_STEPS, NUM_ENVS), device=device)

    obs_np, _ = envs.reset(seed=args.seed)  # env i is seeded with seed + i
    next_obs = torch.as_tensor(obs_np, dtype=torch.float32, device=device)
    next_start = torch.ones(NUM_ENVS, device=device)
    next_done = np.zeros(NUM_ENVS, dtype=bool)
    episode_returns = np.zeros(NUM_ENVS)
    completed: collections.deque[float] = collections.deque(maxlen=RETURN_WINDOW)
    env_steps = 0
    reached = False

    report(f"TRAINING_START time={time.time():.6f}")  # set-up done: imports, envs, networks
    while env_steps < args.max_env_steps:
        # ---- rollout: NUM_STEPS steps of every env with the current policy ----
        for step in range(NUM_STEPS):
            with torch.no_grad():
                dist = agent.get_dist(next_obs)
                action = dist.sample()
                logp = dist.log_prob(action)
                value = agent.get_value(next_obs)
            obs_np, reward, terminated, truncated, info = envs.step(action.cpu().numpy())
            env_steps += NUM_ENVS
            reward = reward.astype(np.float32)  # a copy: the bootstrap below must not touch returns

            next_done = terminated | truncated
            episode_returns += reward
            for i in np.flatnonzero(next_done):
                completed.append(float(episode_returns[i]))
                episode_returns[i] = 0.0
            # A time-limit end is not a real terminal: bootstrap it from the value of its final obs.
            cut = np.flatnonzero(truncated & ~terminated)
            if cut.size:
                final_obs = torch.as_tensor(np.stack(info["final_obs"][cut]), dtype=torch.float32, device=device)
                with torch.no_grad():
                    reward[cut] += GAMMA * agent.get_value(final_obs).cpu().numpy()

            obs_buf[step] = next_obs
            actions_buf[step] = action
            logp_buf[step] = logp
            rewards_buf[step] = torch.as_tensor(reward, device=device)
            starts_buf[step] = next_start
            values_buf[step] = value
            next_obs = torch.as_tensor(obs_np, dtype=torch.float32, device=device)  # already reset where next_done
            next_start = torch.as_tensor(next_done, dtype=torch.float32, device=device)

        # ---- training return: SB3's ep_info_buffer mean, checked after each rollout ----
        if completed:
            mean_return = sum(completed) / len(completed)
            if args.verbose:
                print(f"env_steps={env_steps} return_mean={mean_return:.1f} episodes={len(completed)}", flush=True)
            if mean_return >= args.threshold:
                now = time.time()
                report(
                    f"REACHED env_steps={env_steps} time={now:.6f} elapsed={now - START_TIME:.3f} "
                    f"return_mean={mean_return:.2f} episodes={len(completed)} threads={torch.get_num_threads()}"
                )
                reached = True
                break
        if env_steps >= args.max_env_steps:
            break

        # ---- update: GAE, then NUM_EPOCHS passes of shuffled minibatches ----
        with torch.no_grad():
            last_value = agent.get_value(next_obs)
        last_done = torch.as_tensor(next_done, dtype=torch.float32, device=device)
        advantages = compute_gae(rewards_buf, values_buf, starts_buf, last_value, last_done)
        batch = {
            "obs": obs_buf.reshape(-1, obs_dim),
            "actions": actions_buf.reshape(-1),
            "logp": logp_buf.reshape(-1),
            "advantages": advantages.reshape(-1),
            "returns": (advantages + values_buf).reshape(-1),
        }
        progress_remaining = max(0.0, 1.0 - env_steps / ANNEAL_STEPS)
        ppo_update(agent, optimizer, batch, lr=LR * progress_remaining, clip=CLIP * progress_remaining)

    if not reached:
        mean_return = sum(completed) / len(completed) if completed else float("nan")
        report(f"NOT_REACHED env_steps={env_steps} return_mean={mean_return:.2f} episodes={len(completed)}")
    envs.close()
    report(f"PEAK_RSS_MB={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
