"""A hand-written, single-file DQN (plain torch + gymnasium), CleanRL style.

It is the yardstick of ``benchmarks/off_policy.py``: the algorithm of our ``DQNLearner`` on an
off-policy ``EpisodeDataModule``, at the sizes of the config the parent passes (``--hparams``,
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
- The target network moves by ``tau`` (1: a copy) after every ``target_network_update_freq``-th
  gradient step; the Q network is an MLP (``fcnet_hiddens``, ``fcnet_activation``, torch's
  default init), dueling (``V + A - mean A``, each stream with its own last hidden layer) if
  the config says so.

Evaluation (greedy, timed apart) follows ``off_policy.GreedyEvaluation`` after every
``rollouts_per_epoch`` items and after the last. Output: the protocol lines of
``off_policy.ChildClock``.

Run alone::

    python benchmarks/handwritten_dqn.py --max-env-steps 50000 --seed 0 \\
        --hparams "$(python benchmarks/off_policy.py --algo dqn --print-hparams)"
"""

from __future__ import annotations

import time

START_TIME = time.time()  # before the heavy imports: the run's clock starts with the script

import copy
import json
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from off_policy import ChildClock, GreedyEvaluation, child_parser, evaluation_due, unavailable

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU, "swish": nn.SiLU, "elu": nn.ELU}


def unsupported(model: dict[str, Any], data: dict[str, Any]) -> str | None:
    """What this loop does not implement of the config, or None."""
    checks = [
        (isinstance(model["lr"], (int, float)), f"lr schedule {model['lr']!r}"),
        (model["grad_clip"] is None or model["grad_clip_by"] == "global_norm", f"grad_clip_by={model['grad_clip_by']!r}"),
        (not data["prioritized_replay"], "prioritized_replay"),
        (isinstance(data["env"], str) and not (data["wrappers"] or data["evaluation_wrappers"]), "env callables or wrappers"),
        (data["random_actions_before_learning_starts"], "random_actions_before_learning_starts=False"),
        (not data["evaluation_explore"], "evaluation_explore"),
        (model["model_config"]["fcnet_activation"] in ACTIVATIONS, f"activation {model['model_config']['fcnet_activation']!r}"),
        (not model.get("config_overrides_per_module"), "config_overrides_per_module"),
    ]
    missing = [what for ok, what in checks if not ok]
    return ", ".join(missing) if missing else None


def mlp(in_dim: int, hiddens: list[int], activation: str, out_dim: int | None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for size in hiddens:
        layers += [nn.Linear(in_dim, size), ACTIVATIONS[activation]()]
        in_dim = size
    if out_dim is not None:
        layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


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


class ReplayBuffer:
    """A numpy ring of ``capacity // num_envs`` vector steps; n-step returns at sample time.

    Uniform replay with replacement over the stored env steps, as our ``ReplayBuffer``. One
    row per vector step keeps each env's steps in order, so an n-step return walks down its
    env's column. (``handwritten_sac.py`` uses it too, with float actions.)
    """

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        *,
        seed: int,
        action_shape: tuple[int, ...] = (),
        action_dtype: type = np.int64,
    ) -> None:
        self.rows, self.num_envs = capacity // num_envs, num_envs
        self.obs = np.zeros((self.rows, num_envs, *obs_shape), dtype=np.float32)
        self.next_obs = np.zeros_like(self.obs)
        self.actions = np.zeros((self.rows, num_envs, *action_shape), dtype=action_dtype)
        self.rewards = np.zeros((self.rows, num_envs), dtype=np.float32)
        self.terminated = np.zeros((self.rows, num_envs), dtype=bool)
        self.ended = np.zeros((self.rows, num_envs), dtype=bool)  # terminated or truncated
        self.pos, self.full = 0, False
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return (self.rows if self.full else self.pos) * self.num_envs

    def add(self, obs: np.ndarray, next_obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            terminated: np.ndarray, truncated: np.ndarray) -> None:  # fmt: skip
        row = self.pos
        self.obs[row], self.next_obs[row], self.actions[row], self.rewards[row] = obs, next_obs, actions, rewards
        self.terminated[row], self.ended[row] = terminated, terminated | truncated
        self.pos = (row + 1) % self.rows
        self.full = self.full or self.pos == 0

    def sample(self, batch_size: int, n_step: int, gamma: float) -> dict[str, torch.Tensor]:
        flat = self.rng.integers(0, len(self), size=batch_size)
        rows, envs = flat // self.num_envs, flat % self.num_envs
        last = rows.copy()
        returns = self.rewards[rows, envs].astype(np.float64)
        steps = np.ones(batch_size, dtype=np.int64)
        for k in range(1, n_step):
            # Walk on in the same env while the episode goes on and the next row is stored
            # (the slot at pos is the next to be written: unwritten, or the oldest row).
            following = (last + 1) % self.rows
            walking = np.flatnonzero(~self.ended[last, envs] & (following != self.pos))
            if not len(walking):
                break
            last[walking] = following[walking]
            returns[walking] += gamma**k * self.rewards[last[walking], envs[walking]]
            steps[walking] += 1
        discounts = gamma**steps * ~self.terminated[last, envs]
        return {
            "obs": torch.from_numpy(self.obs[rows, envs]),
            "actions": torch.from_numpy(self.actions[rows, envs]),
            "returns": torch.from_numpy(returns.astype(np.float32)),
            "next_obs": torch.from_numpy(self.next_obs[last, envs]),
            "discounts": torch.from_numpy(discounts.astype(np.float32)),
        }


@torch.no_grad()
def update_target(target: nn.Module, online: nn.Module, tau: float) -> None:
    """``target <- tau * online + (1 - tau) * target``; an exact copy for ``tau == 1``."""
    for target_param, online_param in zip(target.parameters(), online.parameters()):
        if tau == 1:
            target_param.copy_(online_param)
        else:
            target_param.lerp_(online_param, tau)


def main() -> None:
    args = child_parser(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    hparams = json.loads(args.hparams)
    model, data = hparams["model"], hparams["data"]
    reason = unsupported(model, data)
    if reason:
        unavailable(f"the hand-written DQN does not implement {reason}")
        return
    net_config = model["model_config"]
    gamma, n_step, tau = model["gamma"], model["n_step"], model["tau"]
    num_envs, train_freq = data["num_envs"], data["train_freq"]
    np_rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)

    env_id, env_kwargs = data["env"], dict(data["env_kwargs"] or {})
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, **env_kwargs)] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    obs_shape = envs.single_observation_space.shape
    num_actions = int(envs.single_action_space.n)
    q_net = QNetwork(int(np.prod(obs_shape)), num_actions, list(net_config["fcnet_hiddens"]),
                     net_config["fcnet_activation"], bool(net_config["dueling"]))  # fmt: skip
    target_net = copy.deepcopy(q_net).requires_grad_(False)
    optimizer = torch.optim.Adam(q_net.parameters(), lr=model["lr"])
    buffer = ReplayBuffer(data["replay_buffer_capacity"], num_envs, obs_shape, seed=args.seed + 1)
    evaluation = GreedyEvaluation(data, args.seed)
    eps_steps, eps_values = zip(*model["epsilon"]) if isinstance(model["epsilon"], list) else ([0], [model["epsilon"]])

    def greedy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return q_net(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()

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

    # As ours: learning starts once the buffer holds learning_starts steps (or is full), never empty.
    learning_starts = max(min(data["learning_starts"], len(buffer.obs) * num_envs), 1)
    clock = ChildClock()
    obs, _ = envs.reset(seed=args.seed)  # env i is seeded with seed + i
    env_steps = items = gradient_steps = 0
    clock.training_start()
    while env_steps < args.max_env_steps:
        # ---- one train item: train_freq env steps ----
        random_item = len(buffer) < learning_starts
        epsilon = float(np.interp(env_steps, eps_steps, eps_values))
        for _ in range(train_freq // num_envs):
            actions = np_rng.integers(num_actions, size=num_envs)
            if not random_item:
                actions = np.where(np_rng.random(num_envs) < epsilon, actions, greedy(obs))
            next_obs, rewards, terminated, truncated, infos = envs.step(actions)
            stored_next = next_obs.copy()
            for i in np.flatnonzero(terminated | truncated):
                stored_next[i] = infos["final_obs"][i]  # next_obs[i] is already the next episode's reset
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
                    update_target(target_net, q_net, tau)

        if evaluation_due(items, data) or env_steps >= args.max_env_steps:
            clock.evaluation_started()
            clock.evaluation_finished(env_steps, evaluation.run(greedy))
    clock.training_end(env_steps, torch.get_num_threads())
    envs.close()
    evaluation.close()
    clock.finish()


if __name__ == "__main__":
    main()
