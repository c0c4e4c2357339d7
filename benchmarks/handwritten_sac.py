"""A hand-written SAC (plain torch + gymnasium), CleanRL style.

It is the yardstick of ``benchmarks/off_policy.py``: the algorithm of our ``SACLearner`` on an
``OffPolicyDataModule``, at the sizes of the config the parent passes (``--hparams``,
from ``examples/sac_pendulum.yaml``), in the fewest lines that do it right:

- ``num_envs`` envs in a ``SyncVectorEnv`` with SAME_STEP autoreset; a transition that ends an
  episode stores the true final observation (from ``infos["final_obs"]``), and only a
  *terminated* one stops the bootstrap (Pendulum's time-limit truncation bootstraps).
- Train items of ``train_freq`` env steps. Until the buffer holds ``learning_starts`` steps an
  item acts uniformly at random in the action Box; after that it samples the policy.
- After each item once the buffer holds ``learning_starts`` steps: ``gradient_steps`` steps,
  each on ``minibatch_size`` transitions drawn uniformly with replacement from a numpy ring
  buffer of ``replay_buffer_capacity`` steps (``_handwritten_common.py``'s, as are the env
  loop, MLP builder and target update, shared with ``handwritten_dqn.py``; n-step returns
  summed at sample time if ``n_step > 1``, cut at episode ends). Per step, as our Learner
  does, all three losses are computed from the same weights and backpropagated once, then
  each of the three Adams (actor, both critics, ``log_alpha``) steps with its own learning
  rate and gradient clip:

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
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from _handwritten_common import Act, ReplayBuffer, make_train_envs, mlp, start_run, train, unsupported_reason
from off_policy import GreedyEvaluation

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def unsupported(model: dict[str, Any], data: dict[str, Any]) -> str | None:
    """What this loop does not implement of the config, or None."""
    lrs = [model["lr"] if model[name] is None else model[name] for name in ("actor_lr", "critic_lr", "alpha_lr")]
    return unsupported_reason(
        [
            (all(isinstance(lr, (int, float)) for lr in lrs), f"learning-rate schedules {lrs!r}"),
            (model["grad_clip_by"] == "global_norm", f"grad_clip_by={model['grad_clip_by']!r}"),
        ],
        model,
        data,
    )


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
    started = start_run(__doc__, unsupported, "SAC")
    if started is None:
        return
    args, model, data = started
    net_config = model["model_config"]
    hiddens, activation = list(net_config["fcnet_hiddens"]), net_config["fcnet_activation"]
    gamma, n_step, num_envs = model["gamma"], model["n_step"], data["num_envs"]
    np_rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)  # networks and minibatches; envs and replay stay on the CPU

    envs = make_train_envs(data)
    space = envs.single_action_space
    obs_dim, action_dim = int(np.prod(envs.single_observation_space.shape)), int(np.prod(space.shape))
    center, scale = (space.high + space.low) / 2, (space.high - space.low) / 2

    actor = Actor(obs_dim, action_dim, hiddens, activation).to(device)
    critics = nn.ModuleList([Critic(obs_dim, action_dim, hiddens, activation) for _ in range(2)]).to(device)
    target_critics = copy.deepcopy(critics).requires_grad_(False)
    log_alpha = nn.Parameter(torch.tensor(math.log(model["initial_alpha"]), device=device))
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
                          action_shape=(action_dim,), action_dtype=np.float32, device=device)  # fmt: skip
    evaluation = GreedyEvaluation(data, args.seed)

    def greedy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            obs_tensor = torch.as_tensor(obs, dtype=torch.float32, device=device)
            mean, _ = actor.mean_log_std(obs_tensor.reshape(len(obs), -1))
        return (center + scale * torch.tanh(mean).cpu().numpy()).reshape(len(obs), *space.shape)

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

    def item_policy(env_steps: int, random_item: bool) -> Act:
        """Uniformly random actions in ``[-1, 1]^d`` until learning starts, then policy samples; rescaled for the env."""

        def act(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            if random_item:
                actions = np_rng.uniform(-1.0, 1.0, size=(num_envs, action_dim)).astype(np.float32)
            else:
                with torch.no_grad():
                    actions = actor.sample(torch.from_numpy(obs).to(device))[0].cpu().numpy()
            return actions, (center + scale * actions).reshape(num_envs, *space.shape)

        return act

    train(
        envs, buffer, evaluation, model=model, data=data, seed=args.seed, max_env_steps=args.max_env_steps,
        item_policy=item_policy, gradient_step=gradient_step, target=target_critics, online=critics, greedy=greedy,
        flatten_obs=True,
    )  # fmt: skip


if __name__ == "__main__":
    main()
