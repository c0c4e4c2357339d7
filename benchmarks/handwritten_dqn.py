"""A hand-written DQN (plain torch + gymnasium), CleanRL style.

It is the yardstick of ``benchmarks/off_policy.py``: the algorithm of our ``DQNLearner`` on an
``OffPolicyDataModule``, at the sizes of the config the parent passes (``--hparams``,
from ``examples/dqn_cartpole.yaml``), in the fewest lines that do it right:

- ``num_envs`` envs in a ``SyncVectorEnv`` with SAME_STEP autoreset; a transition that ends an
  episode stores the true final observation (from ``infos["final_obs"]``), and only a
  *terminated* one stops the bootstrap (a time-limit truncation bootstraps from it).
- Train items of ``train_freq`` env steps. Until the buffer holds ``learning_starts`` steps an
  item acts uniformly at random; after that epsilon-greedy (a per-env coin), with epsilon
  from the piecewise-linear schedule at the env steps sampled before the item.
- After each item once the buffer holds ``learning_starts`` steps: ``gradient_steps`` Adam
  steps, each on ``minibatch_size`` transitions drawn uniformly with replacement from a numpy
  ring buffer of ``replay_buffer_capacity`` steps; n-step returns (``n_step``) are summed at
  sample time, cut at episode ends. The loss is the Huber (delta 1) or squared TD error
  against ``r_n + gamma^n (1 - terminated) Q_target(s', a*)``, ``a*`` the online network's
  argmax (double Q) or the target's; gradients clipped by global norm (``grad_clip``).
- ``--device cuda`` puts the networks and each replay minibatch on the GPU (envs, replay and
  the epsilon coins stay on the CPU; greedy actions come back to numpy).
- The target network moves by ``tau`` (1: a copy) after every ``target_network_update_freq``-th
  gradient step; the Q network is an MLP (``fcnet_hiddens``, ``fcnet_activation``, torch's
  default init), dueling (``V + A - mean A``, each stream with its own last hidden layer) if
  the config says so.

Evaluation (greedy, timed apart) follows ``off_policy.GreedyEvaluation`` after every
``rollouts_per_epoch`` items and after the last. Output: the protocol lines of
``off_policy.ChildClock``. The env loop, replay buffer, MLP builder and target update are
``_handwritten_common.py``'s, shared with ``handwritten_sac.py``; the Q network, acting and
loss are here.

Run alone::

    python benchmarks/handwritten_dqn.py --max-env-steps 50000 --seed 0 \\
        --hparams "$(python benchmarks/off_policy.py --algo dqn --print-hparams)"
"""

from __future__ import annotations

import time

START_TIME = time.time()  # before the heavy imports: the run's clock starts with the script

import copy
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from _handwritten_common import Act, ReplayBuffer, make_train_envs, mlp, start_run, train, unsupported_reason
from off_policy import GreedyEvaluation


def unsupported(model: dict[str, Any], data: dict[str, Any]) -> str | None:
    """What this loop does not implement of the config, or None."""
    return unsupported_reason(
        [
            (isinstance(model["lr"], (int, float)), f"lr schedule {model['lr']!r}"),
            (
                model["grad_clip"] is None or model["grad_clip_by"] == "global_norm",
                f"grad_clip_by={model['grad_clip_by']!r}",
            ),
        ],
        model,
        data,
    )


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, num_actions: int, hiddens: list[int], activation: str, dueling: bool) -> None:
        super().__init__()
        self.dueling = dueling
        if not dueling:
            self.q = mlp(obs_dim, hiddens, activation, num_actions)
            return
        self.encoder = mlp(obs_dim, hiddens[:-1], activation, None)
        features = hiddens[-2] if len(hiddens) > 1 else obs_dim
        self.value = mlp(features, hiddens[-1:], activation, 1)
        self.advantage = mlp(features, hiddens[-1:], activation, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        obs = obs.flatten(1)
        if not self.dueling:
            return self.q(obs)
        features = self.encoder(obs)
        advantages = self.advantage(features)
        return self.value(features) + advantages - advantages.mean(-1, keepdim=True)


def main() -> None:
    started = start_run(__doc__, unsupported, "DQN")
    if started is None:
        return
    args, model, data = started
    net_config = model["model_config"]
    gamma, n_step, num_envs = model["gamma"], model["n_step"], data["num_envs"]
    np_rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    envs = make_train_envs(data)
    obs_shape = envs.single_observation_space.shape
    num_actions = int(envs.single_action_space.n)
    q_net = QNetwork(int(np.prod(obs_shape)), num_actions, list(net_config["fcnet_hiddens"]),
                     net_config["fcnet_activation"], bool(net_config["dueling"])).to(device)  # fmt: skip
    target_net = copy.deepcopy(q_net).requires_grad_(False)
    optimizer = torch.optim.Adam(q_net.parameters(), lr=model["lr"])
    buffer = ReplayBuffer(data["replay_buffer_capacity"], num_envs, obs_shape, seed=args.seed + 1, device=device)
    evaluation = GreedyEvaluation(data, args.seed)
    eps_steps, eps_values = zip(*model["epsilon"]) if isinstance(model["epsilon"], list) else ([0], [model["epsilon"]])

    def greedy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return q_net(torch.as_tensor(obs, dtype=torch.float32, device=device)).argmax(-1).cpu().numpy()

    def gradient_step() -> None:
        batch = buffer.sample(model["minibatch_size"], n_step, gamma)
        with torch.no_grad():
            q_target_next = target_net(batch["next_obs"])
            chooser = q_net(batch["next_obs"]) if model["double_q"] else q_target_next
            q_next = q_target_next.gather(-1, chooser.argmax(-1, keepdim=True)).squeeze(-1)
            targets = batch["returns"] + batch["discounts"] * q_next
        q_taken = q_net(batch["obs"]).gather(-1, batch["actions"].unsqueeze(-1)).squeeze(-1)
        if model["td_error_loss_fn"] == "huber":
            loss = F.huber_loss(q_taken, targets, delta=1.0)
        else:
            loss = F.mse_loss(q_taken, targets)
        optimizer.zero_grad()
        loss.backward()
        if model["grad_clip"] is not None:
            nn.utils.clip_grad_norm_(q_net.parameters(), model["grad_clip"])
        optimizer.step()

    def item_policy(env_steps: int, random_item: bool) -> Act:
        """Uniformly random actions until learning starts, then epsilon-greedy at the item's epsilon."""
        epsilon = float(np.interp(env_steps, eps_steps, eps_values))

        def act(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            actions = np_rng.integers(num_actions, size=num_envs)
            if not random_item:
                actions = np.where(np_rng.random(num_envs) < epsilon, actions, greedy(obs))
            return actions, actions

        return act

    train(
        envs, buffer, evaluation, model=model, data=data, seed=args.seed, max_env_steps=args.max_env_steps,
        item_policy=item_policy, gradient_step=gradient_step, target=target_net, online=q_net, greedy=greedy,
    )  # fmt: skip


if __name__ == "__main__":
    main()
