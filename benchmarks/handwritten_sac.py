"""A hand-written SAC (plain torch + gymnasium), CleanRL style.

It is the yardstick of ``benchmarks/off_policy.py``: the algorithm of our ``SACLearner`` on an
off-policy ``EpisodeDataModule``, at the sizes of the config the parent passes (``--hparams``,
from ``examples/sac_pendulum.yaml``), in the fewest lines that do it right:

- ``num_envs`` envs in a ``SyncVectorEnv`` with SAME_STEP autoreset; a transition that ends an
  episode stores the true final observation (from ``infos["final_obs"]``), and only a
  *terminated* one stops the bootstrap (Pendulum's time-limit truncation bootstraps).
- Train items of ``train_freq`` env steps. Until the buffer holds ``learning_starts`` steps an
  item acts uniformly at random in the action Box; after that it samples the policy.
- After each item once the buffer holds ``learning_starts`` steps: ``gradient_steps`` steps,
  each on ``minibatch_size`` transitions drawn uniformly with replacement from a numpy ring
  buffer of ``replay_buffer_capacity`` steps (``handwritten_dqn.py``'s, whose MLP builder and
  target update this file shares too; n-step returns summed at sample time if
  ``n_step > 1``, cut at episode ends). Per step, as our Learner does, all three losses are
  computed from the same weights and backpropagated once, then each of the three Adams
  (actor, both critics, ``log_alpha``) steps with its own learning rate and gradient clip:

      y            = r_n + gamma^n (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s')),  a' ~ pi(s')
      critic loss  = 0.5 * (mean (Q_1(s, a) - y)^2 + mean (Q_2(s, a) - y)^2)
      actor loss   = mean(alpha log pi(a~|s) - min_i Q_i(s, a~)),  a~ ~ pi(s) reparameterized,
                     the critics' weights held fixed
      alpha loss   = -mean(log_alpha (log pi(a~|s) + target_entropy))

- The target critics move by ``tau`` after every ``target_network_update_freq``-th gradient
  step. The actor is an MLP to ``2 d`` outputs (means and log stds clamped to [-20, 2]) of a
  tanh-squashed Gaussian in ``[-1, 1]^d``, rescaled to the Box for the env; each critic an MLP
  of ``concat(obs, action in [-1, 1])``; torch's default init; ``log_alpha`` starts at
  ``log(initial_alpha)``; ``target_entropy`` ``"auto"`` is ``-d``.

Evaluation (greedy: ``tanh`` of the mean, timed apart) follows
``off_policy.GreedyEvaluation`` after every ``rollouts_per_epoch`` items and after the last.
Output: the protocol lines of ``off_policy.ChildClock``.

Run alone::

    python benchmarks/handwritten_sac.py --max-env-steps 15000 --seed 0 \\
        --hparams "$(python benchmarks/off_policy.py --algo sac --print-hparams)"
"""

from __future__ import annotations

import time

START_TIME = time.time()  # before the heavy imports: the run's clock starts with the script

import copy
import json
import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from handwritten_dqn import ACTIVATIONS, ReplayBuffer, mlp, update_target
from off_policy import ChildClock, GreedyEvaluation, child_parser, evaluation_due, unavailable

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def unsupported(model: dict[str, Any], data: dict[str, Any]) -> str | None:
    """What this loop does not implement of the config, or None."""
    lrs = [model["lr"] if model[name] is None else model[name] for name in ("actor_lr", "critic_lr", "alpha_lr")]
    checks = [
        (all(isinstance(lr, (int, float)) for lr in lrs), f"learning-rate schedules {lrs!r}"),
        (model["grad_clip_by"] == "global_norm", f"grad_clip_by={model['grad_clip_by']!r}"),
        (not data["prioritized_replay"], "prioritized_replay"),
        (isinstance(data["env"], str) and not (data["wrappers"] or data["evaluation_wrappers"]), "env callables or wrappers"),
        (data["random_actions_before_learning_starts"], "random_actions_before_learning_starts=False"),
        (not data["evaluation_explore"], "evaluation_explore"),
        (model["model_config"]["fcnet_activation"] in ACTIVATIONS, f"activation {model['model_config']['fcnet_activation']!r}"),
        (not model.get("config_overrides_per_module"), "config_overrides_per_module"),
    ]
    missing = [what for ok, what in checks if not ok]
    return ", ".join(missing) if missing else None


class Actor(nn.Module):
    """A tanh-squashed diagonal Gaussian policy in ``[-1, 1]^d``."""

    def __init__(self, obs_dim: int, action_dim: int, hiddens: list[int], activation: str) -> None:
        super().__init__()
        self.net = mlp(obs_dim, hiddens, activation, 2 * action_dim)

    def mean_log_std(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterized ``tanh(u)``, ``u ~ N(mean, std)``, and its log-density ``[B]``."""
        mean, log_std = self.mean_log_std(obs)
        u = mean + log_std.exp() * torch.randn_like(mean)
        gaussian_logp = -0.5 * ((u - mean) / log_std.exp()).pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        # log |d tanh(u) / du| = log(1 - tanh(u)^2), in a form that stays finite for large |u|.
        log_det = 2 * (math.log(2) - u - F.softplus(-2 * u))
        return torch.tanh(u), (gaussian_logp - log_det).sum(-1)


class Critic(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, hiddens: list[int], activation: str) -> None:
        super().__init__()
        self.net = mlp(obs_dim + action_dim, hiddens, activation, 1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs, actions], dim=-1)).squeeze(-1)


def main() -> None:
    args = child_parser(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    hparams = json.loads(args.hparams)
    model, data = hparams["model"], hparams["data"]
    reason = unsupported(model, data)
    if reason:
        unavailable(f"the hand-written SAC does not implement {reason}")
        return
    net_config = model["model_config"]
    hiddens, activation = list(net_config["fcnet_hiddens"]), net_config["fcnet_activation"]
    gamma, n_step, tau = model["gamma"], model["n_step"], model["tau"]
    num_envs, train_freq = data["num_envs"], data["train_freq"]
    np_rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)

    env_id, env_kwargs = data["env"], dict(data["env_kwargs"] or {})
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, **env_kwargs)] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    space = envs.single_action_space
    obs_dim, action_dim = int(np.prod(envs.single_observation_space.shape)), int(np.prod(space.shape))
    center, scale = (space.high + space.low) / 2, (space.high - space.low) / 2

    actor = Actor(obs_dim, action_dim, hiddens, activation)
    critics = nn.ModuleList([Critic(obs_dim, action_dim, hiddens, activation) for _ in range(2)])
    target_critics = copy.deepcopy(critics).requires_grad_(False)
    log_alpha = nn.Parameter(torch.tensor(math.log(model["initial_alpha"])))
    target_entropy = -float(action_dim) if model["target_entropy"] == "auto" else float(model["target_entropy"])

    def optimizer(params: list[nn.Parameter], which: str) -> tuple[torch.optim.Adam, list[nn.Parameter], float | None]:
        lr = model[f"{which}_lr"] if model[f"{which}_lr"] is not None else model["lr"]
        clip = model[f"{which}_grad_clip"] if model[f"{which}_grad_clip"] is not None else model["grad_clip"]
        return torch.optim.Adam(params, lr=lr), params, clip

    optimizers = [
        optimizer(list(actor.parameters()), "actor"),
        optimizer(list(critics.parameters()), "critic"),
        optimizer([log_alpha], "alpha"),
    ]
    buffer = ReplayBuffer(data["replay_buffer_capacity"], num_envs, (obs_dim,), seed=args.seed + 1,
                          action_shape=(action_dim,), action_dtype=np.float32)  # fmt: skip
    evaluation = GreedyEvaluation(data, args.seed)

    def greedy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            mean, _ = actor.mean_log_std(torch.as_tensor(obs, dtype=torch.float32).reshape(len(obs), -1))
        return (center + scale * torch.tanh(mean).numpy()).reshape(len(obs), *space.shape)

    def gradient_step() -> None:
        batch = buffer.sample(model["minibatch_size"], n_step, gamma)
        obs, actions = batch["obs"], batch["actions"]
        alpha = log_alpha.exp().detach()
        with torch.no_grad():
            next_actions, next_logp = actor.sample(batch["next_obs"])
            q_next = torch.min(*(critic(batch["next_obs"], next_actions) for critic in target_critics))
            y = batch["returns"] + batch["discounts"] * (q_next - alpha * next_logp)
        critic_loss = 0.5 * sum(F.mse_loss(critic(obs, actions), y) for critic in critics)

        resampled, logp = actor.sample(obs)
        critics.requires_grad_(False)  # the actor loss moves the actor only
        q_resampled = torch.min(*(critic(obs, resampled) for critic in critics))
        critics.requires_grad_(True)
        actor_loss = (alpha * logp - q_resampled).mean()
        alpha_loss = -(log_alpha * (logp + target_entropy).detach()).mean()

        for opt, _, _ in optimizers:
            opt.zero_grad()
        (critic_loss + actor_loss + alpha_loss).backward()
        for opt, params, clip in optimizers:
            if clip is not None:
                nn.utils.clip_grad_norm_(params, clip)
            opt.step()

    # As ours: learning starts once the buffer holds learning_starts steps (or is full), never empty.
    learning_starts = max(min(data["learning_starts"], len(buffer.obs) * num_envs), 1)
    clock = ChildClock()
    obs, _ = envs.reset(seed=args.seed)  # env i is seeded with seed + i
    obs = obs.reshape(num_envs, obs_dim)
    env_steps = items = gradient_steps = 0
    clock.training_start()
    while env_steps < args.max_env_steps:
        # ---- one train item: train_freq env steps ----
        random_item = len(buffer) < learning_starts
        for _ in range(train_freq // num_envs):
            if random_item:
                actions = np_rng.uniform(-1.0, 1.0, size=(num_envs, action_dim)).astype(np.float32)
            else:
                with torch.no_grad():
                    actions = actor.sample(torch.from_numpy(obs))[0].numpy()
            env_actions = (center + scale * actions).reshape(num_envs, *space.shape)
            next_obs, rewards, terminated, truncated, infos = envs.step(env_actions)
            next_obs = next_obs.reshape(num_envs, obs_dim)
            stored_next = next_obs.copy()
            for i in np.flatnonzero(terminated | truncated):
                stored_next[i] = infos["final_obs"][i].reshape(-1)  # next_obs[i] is already the next episode's reset
            buffer.add(obs, stored_next, actions, rewards, terminated, truncated)
            obs = next_obs
        env_steps += train_freq
        items += 1

        # ---- gradient steps, target updates ----
        if len(buffer) >= learning_starts:
            for _ in range(model["gradient_steps"]):
                gradient_step()
                gradient_steps += 1
                if gradient_steps % model["target_network_update_freq"] == 0:
                    update_target(target_critics, critics, tau)

        if evaluation_due(items, data) or env_steps >= args.max_env_steps:
            clock.evaluation_started()
            clock.evaluation_finished(env_steps, evaluation.run(greedy))
    clock.training_end(env_steps, torch.get_num_threads())
    envs.close()
    evaluation.close()
    clock.finish()


if __name__ == "__main__":
    main()
