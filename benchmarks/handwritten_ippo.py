"""A hand-written, single-file IPPO on mpe2's simple_spread_v3 (plain torch + PettingZoo), CleanRL style.

It is the yardstick of ``benchmarks/multi_agent.py``: PPO with one policy shared by all agents
(parameter sharing), each agent acting on its own observation and learning from its own reward,
in the fewest lines that do it right. The settings start from MAPPO's MPE settings (Yu et al.
2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games": lr 7e-4, 10
epochs, clip 0.2, gamma 0.99, GAE lambda 0.95, entropy 0.01, [64, 64] MLPs, Adam eps 1e-5),
with a smaller rollout and a global-norm clip of 0.5 (as CleanRL's PPO) in place of their 10:

  8 env copies x 100 steps per rollout = 800 env steps = 2400 agent steps per update,
  10 epochs of shuffled minibatches of 800 agent steps, lr 7e-4 (constant), gamma 0.99,
  GAE lambda 0.95, clip 0.2, vf_coef 0.5 (unclipped MSE), ent_coef 0.01, global-norm clip
  0.5, separate policy and value MLPs [64, 64] tanh with orthogonal init (gain sqrt(2)
  hidden, 0.01 policy head, 1.0 value head), Adam eps 1e-5, per-minibatch advantage
  normalization.

The env is ``mpe2.simple_spread_v3.parallel_env()`` with its defaults (3 agents, local_ratio
0.5, max_cycles 25, discrete actions). Each step stacks the observations of every agent of
every copy and runs ONE forward of the policy and one of the value net over them. GAE runs
along each (copy, agent) column: never across agents. simple_spread's agents all act at every
step and all end together at max_cycles (a truncation, never a termination), which this loop
relies on; a truncated agent's last reward is bootstrapped with ``gamma * V(final_obs)``, a
terminated one's is not. A copy whose episode ended is reset in the same step (copy i is
seeded with ``seed + i`` at its first reset, later resets continue its RNG).

"Per-agent return" is the mean over the last (up to) 100 completed episodes of the episode's
undiscounted return summed over agents divided by the number of agents (simple_spread's
agents share most of their reward, so the per-agent returns are close to each other).

Run::

    python benchmarks/handwritten_ippo.py --seed 0 --env-steps 100000
    python benchmarks/handwritten_ippo.py --seed 0 --env-steps 100000 --random   # the baseline

It prints ``TRAINING_START time=<unix time>`` once set-up is done, with ``--verbose`` one
progress line per ``--log-every`` rollouts, and at the end one JSON line: ``env_steps``,
``agent_steps``, ``wall_s`` (training loop: first rollout to last update), ``setup_s``,
``env_steps_per_s`` (``env_steps / wall_s``), ``return_mean_per_agent``, ``episodes``,
``seed``, ``random``, ``threads``.
"""

from __future__ import annotations

import time

START_TIME = time.time()  # before the heavy imports: set-up time starts with the script

import argparse
import collections
import json
import random

import numpy as np
import torch
from mpe2 import simple_spread_v3
from torch import nn
from torch.distributions import Categorical

NUM_ENVS = 8
NUM_STEPS = 100  # per env copy and rollout
MINIBATCH_SIZE = 800  # agent steps
NUM_EPOCHS = 10
GAMMA = 0.99
GAE_LAMBDA = 0.95
LR = 7e-4
CLIP = 0.2
ENT_COEF = 0.01
VF_COEF = 0.5
MAX_GRAD_NORM = 0.5
ADAM_EPS = 1e-5
HIDDEN = 64
RETURN_WINDOW = 100  # episodes in the training-return mean


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env-steps", type=int, default=100_000, help="env steps (over all copies) to train for")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--random", action="store_true", help="uniform random actions and no updates: the baseline")
    parser.add_argument("--verbose", action="store_true", help="print the training return every --log-every rollouts")
    parser.add_argument("--log-every", type=int, default=25, help="rollouts between --verbose lines")
    return parser.parse_args()


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
    """Separate policy and value MLPs (no shared layers), shared by all agents."""

    def __init__(self, obs_dim: int, num_actions: int) -> None:
        super().__init__()
        self.policy = mlp(obs_dim, num_actions, head_gain=0.01)
        self.value = mlp(obs_dim, 1, head_gain=1.0)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value(obs).squeeze(-1)

    def get_dist(self, obs: torch.Tensor) -> Categorical:
        return Categorical(logits=self.policy(obs), validate_args=False)


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, starts: torch.Tensor, last_value: torch.Tensor,
                last_done: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """GAE(lambda) advantages ``[T, E, A]``: each (copy, agent) column on its own.

    ``starts[t]`` is 1.0 where row t's obs begins an episode (so row t - 1 ended one; its
    truncation bootstrap is already in its reward); ``last_done`` says whether the rollout's
    last step ended an episode.
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


def ppo_update(agent: Agent, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> None:
    """NUM_EPOCHS passes over ``batch`` (agent steps) in shuffled minibatches, one clipped Adam step each."""
    batch_size = len(batch["obs"])
    for _ in range(NUM_EPOCHS):
        order = torch.randperm(batch_size)
        for start in range(0, batch_size, MINIBATCH_SIZE):
            idx = order[start : start + MINIBATCH_SIZE]
            obs = batch["obs"][idx]
            dist = agent.get_dist(obs)
            new_logp = dist.log_prob(batch["actions"][idx])
            new_value = agent.get_value(obs)

            adv = batch["advantages"][idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            ratio = torch.exp(new_logp - batch["logp"][idx])
            pg_loss = -torch.min(adv * ratio, adv * torch.clamp(ratio, 1.0 - CLIP, 1.0 + CLIP)).mean()
            v_loss = nn.functional.mse_loss(new_value, batch["returns"][idx])
            entropy = dist.entropy().mean()
            loss = pg_loss + VF_COEF * v_loss - ENT_COEF * entropy

            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), MAX_GRAD_NORM)
            optimizer.step()


class Copies:
    """The env copies, stepped one after the other; observations and rewards as ``[E, A, ...]`` arrays."""

    def __init__(self, seed: int) -> None:
        self.envs = [simple_spread_v3.parallel_env() for _ in range(NUM_ENVS)]
        self.agents = list(self.envs[0].possible_agents)
        self.obs_dim = int(self.envs[0].observation_space(self.agents[0]).shape[0])
        self.num_actions = int(self.envs[0].action_space(self.agents[0]).n)
        self.seed = seed

    def reset(self) -> np.ndarray:
        """First reset of every copy, copy i seeded with ``seed + i``: observations ``[E, A, obs_dim]``."""
        return np.stack([self._stack(env.reset(seed=self.seed + i)[0]) for i, env in enumerate(self.envs)])

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        """Step every copy with ``actions [E, A]``; a copy whose episode ended is reset (unseeded).

        Returns:
            ``(next_obs, rewards, terminated, truncated, final_obs)``, each ``[E, A, ...]``;
            ``next_obs`` is the reset's observation where the episode ended, ``final_obs`` the
            observation the episode ended on.
        """
        next_obs = np.zeros((NUM_ENVS, len(self.agents), self.obs_dim), dtype=np.float32)
        final_obs = np.zeros_like(next_obs)
        rewards = np.zeros((NUM_ENVS, len(self.agents)), dtype=np.float32)
        terminated = np.zeros((NUM_ENVS, len(self.agents)), dtype=bool)
        truncated = np.zeros_like(terminated)
        for i, env in enumerate(self.envs):
            obs, reward, term, trunc, _ = env.step(dict(zip(self.agents, actions[i].tolist())))
            next_obs[i] = final_obs[i] = self._stack(obs)
            rewards[i] = [reward[a] for a in self.agents]
            terminated[i] = [term[a] for a in self.agents]
            truncated[i] = [trunc[a] for a in self.agents]
            if not env.agents:  # every agent is done: the episode is over
                next_obs[i] = self._stack(env.reset()[0])
        return next_obs, rewards, terminated, truncated, final_obs

    def _stack(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        return np.stack([obs[a] for a in self.agents])


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    copies = Copies(args.seed)
    num_agents, obs_dim = len(copies.agents), copies.obs_dim
    agent = Agent(obs_dim, copies.num_actions)
    optimizer = torch.optim.Adam(agent.parameters(), lr=LR, eps=ADAM_EPS)

    shape = (NUM_STEPS, NUM_ENVS, num_agents)
    obs_buf = torch.zeros((*shape, obs_dim))
    actions_buf = torch.zeros(shape, dtype=torch.long)
    logp_buf, rewards_buf, starts_buf, values_buf = (torch.zeros(shape) for _ in range(4))

    next_obs = torch.as_tensor(copies.reset())
    next_start = torch.ones((NUM_ENVS, num_agents))
    next_done = torch.zeros((NUM_ENVS, num_agents))
    episode_returns = np.zeros(NUM_ENVS)  # summed over agents
    completed: collections.deque[float] = collections.deque(maxlen=RETURN_WINDOW)  # per-agent returns
    env_steps = rollouts = 0

    training_start = time.time()
    print(f"TRAINING_START time={training_start:.6f}", flush=True)
    while env_steps < args.env_steps:
        # ---- rollout: NUM_STEPS steps of every copy, one forward over all agents of all copies ----
        for step in range(NUM_STEPS):
            flat_obs = next_obs.reshape(-1, obs_dim)
            with torch.no_grad():
                dist = agent.get_dist(flat_obs)
                action = torch.randint(copies.num_actions, (len(flat_obs),)) if args.random else dist.sample()
                logp = dist.log_prob(action).reshape(NUM_ENVS, num_agents)
                value = agent.get_value(flat_obs).reshape(NUM_ENVS, num_agents)
            action = action.reshape(NUM_ENVS, num_agents)
            obs_np, reward, terminated, truncated, final_obs = copies.step(action.numpy())
            env_steps += NUM_ENVS

            ended = terminated | truncated
            episode_returns += reward.sum(axis=1)
            for i in np.flatnonzero(ended.all(axis=1)):
                completed.append(float(episode_returns[i]) / num_agents)
                episode_returns[i] = 0.0
            # A time-limit end is not a real terminal: bootstrap it from the value of its final obs.
            cut = truncated & ~terminated
            if cut.any() and not args.random:
                with torch.no_grad():
                    final_values = agent.get_value(torch.as_tensor(final_obs[cut])).numpy()
                reward[cut] += GAMMA * final_values

            obs_buf[step] = next_obs
            actions_buf[step] = action
            logp_buf[step] = logp
            rewards_buf[step] = torch.as_tensor(reward)
            starts_buf[step] = next_start
            values_buf[step] = value
            next_obs = torch.as_tensor(obs_np)  # already reset where the episode ended
            next_start = next_done = torch.as_tensor(ended, dtype=torch.float32)
        rollouts += 1
        if args.verbose and rollouts % args.log_every == 0 and completed:
            mean = sum(completed) / len(completed)
            print(f"env_steps={env_steps} return_mean_per_agent={mean:.2f} s={time.time() - training_start:.1f}")

        if args.random:
            continue
        # ---- update: per-agent GAE, then NUM_EPOCHS passes of shuffled minibatches ----
        with torch.no_grad():
            last_value = agent.get_value(next_obs.reshape(-1, obs_dim)).reshape(NUM_ENVS, num_agents)
        advantages = compute_gae(rewards_buf, values_buf, starts_buf, last_value, next_done)
        batch = {
            "obs": obs_buf.reshape(-1, obs_dim),
            "actions": actions_buf.reshape(-1),
            "logp": logp_buf.reshape(-1),
            "advantages": advantages.reshape(-1),
            "returns": (advantages + values_buf).reshape(-1),
        }
        ppo_update(agent, optimizer, batch)

    wall = time.time() - training_start
    result = {
        "env_steps": env_steps,
        "agent_steps": env_steps * num_agents,
        "wall_s": round(wall, 3),
        "setup_s": round(training_start - START_TIME, 3),
        "env_steps_per_s": round(env_steps / wall, 1),
        "return_mean_per_agent": round(sum(completed) / len(completed), 3) if completed else None,
        "episodes": len(completed),
        "seed": args.seed,
        "random": args.random,
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
