"""What the hand-written off-policy loops (``handwritten_dqn.py``, ``handwritten_sac.py``) share.

The pieces that are the same in both algorithms: the MLP builder, the uniform numpy replay
buffer with n-step returns, the target-network update, the config checks neither loop
implements, the training envs, and the env loop itself (train items of ``train_freq`` env
steps into the buffer, ``gradient_steps`` gradient steps after each with target updates,
evaluation on ``off_policy.GreedyEvaluation``'s schedule, the protocol lines of
``off_policy.ChildClock``). Each loop keeps what is its algorithm's own: its networks, how it
acts and its gradient step.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from off_policy import ChildClock, GreedyEvaluation, child_parser, evaluation_due, unavailable

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU, "swish": nn.SiLU, "elu": nn.ELU}
# ``act(obs)`` of one vector step -> (actions to store in the buffer, actions for the env).
Act = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def start_run(
    description: str, unsupported: Callable[[dict[str, Any], dict[str, Any]], str | None], algo: str
) -> tuple[argparse.Namespace, dict[str, Any], dict[str, Any]] | None:
    """Read the child's command line, set torch's threads, and check the config.

    Args:
        description: The loop's ``--help`` text.
        unsupported: The loop's ``unsupported(model, data)``: what of the config it does not implement, or None.
        algo: The algorithm's name, for the ``UNAVAILABLE`` line.

    Returns:
        ``(args, model, data)``; None after telling the parent the loop is unavailable.
    """
    args = child_parser(description).parse_args()
    torch.set_num_threads(args.threads)
    hparams = json.loads(args.hparams)
    model, data = hparams["model"], hparams["data"]
    reason = unsupported(model, data)
    if reason:
        unavailable(f"the hand-written {algo} does not implement {reason}")
        return None
    return args, model, data


def unsupported_reason(own_checks: list[tuple[bool, str]], model: dict[str, Any], data: dict[str, Any]) -> str | None:
    """What a loop does not implement of the config, or None.

    Args:
        own_checks: The loop's own ``(supported, what)`` checks; they come first in the reason.
        model: The Learner's hyperparameters.
        data: The data module's hyperparameters.
    """
    checks = [
        *own_checks,
        (not data["prioritized_replay"], "prioritized_replay"),
        (
            isinstance(data["env"], str) and not (data["wrappers"] or data["evaluation_wrappers"]),
            "env callables or wrappers",
        ),
        (data["random_actions_before_learning_starts"], "random_actions_before_learning_starts=False"),
        (not data["evaluation_explore"], "evaluation_explore"),
        (
            model["model_config"]["fcnet_activation"] in ACTIVATIONS,
            f"activation {model['model_config']['fcnet_activation']!r}",
        ),
        (not model.get("config_overrides_per_module"), "config_overrides_per_module"),
    ]
    missing = [what for ok, what in checks if not ok]
    return ", ".join(missing) if missing else None


def mlp(in_dim: int, hiddens: list[int], activation: str, out_dim: int | None) -> nn.Sequential:
    """Linear layers of ``hiddens`` sizes, each followed by ``activation``; a last linear one to ``out_dim`` if given."""
    layers: list[nn.Module] = []
    for size in hiddens:
        layers += [nn.Linear(in_dim, size), ACTIVATIONS[activation]()]
        in_dim = size
    if out_dim is not None:
        layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class ReplayBuffer:
    """A numpy ring of ``capacity // num_envs`` vector steps; n-step returns at sample time.

    Uniform replay with replacement over the stored env steps, as our ``ReplayBuffer``. One
    row per vector step keeps each env's steps in order, so an n-step return walks down its
    env's column. DQN stores integer actions, SAC float ones (``action_shape``, ``action_dtype``).
    The rows live in numpy on the CPU; ``sample`` hands its minibatch over on ``device``.
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
        device: torch.device | str = "cpu",
    ) -> None:
        self.device = torch.device(device)
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
        batch = {
            "obs": torch.from_numpy(self.obs[rows, envs]),
            "actions": torch.from_numpy(self.actions[rows, envs]),
            "returns": torch.from_numpy(returns.astype(np.float32)),
            "next_obs": torch.from_numpy(self.next_obs[last, envs]),
            "discounts": torch.from_numpy(discounts.astype(np.float32)),
        }
        if self.device.type == "cpu":
            return batch
        return {key: value.to(self.device) for key, value in batch.items()}


@torch.no_grad()
def update_target(target: nn.Module, online: nn.Module, tau: float) -> None:
    """``target <- tau * online + (1 - tau) * target``; an exact copy for ``tau == 1``."""
    for target_param, online_param in zip(target.parameters(), online.parameters()):
        if tau == 1:
            target_param.copy_(online_param)
        else:
            target_param.lerp_(online_param, tau)


def make_train_envs(data: dict[str, Any]) -> gym.vector.SyncVectorEnv:
    """The ``num_envs`` training envs of ``data["env"]`` in a ``SyncVectorEnv`` with SAME_STEP autoreset."""
    env_id, env_kwargs = data["env"], dict(data["env_kwargs"] or {})
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, **env_kwargs)] * data["num_envs"], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def train(
    envs: gym.vector.SyncVectorEnv,
    buffer: ReplayBuffer,
    evaluation: GreedyEvaluation,
    *,
    model: dict[str, Any],
    data: dict[str, Any],
    seed: int,
    max_env_steps: int,
    item_policy: Callable[[int, bool], Act],
    gradient_step: Callable[[], None],
    target: nn.Module,
    online: nn.Module,
    greedy: Callable[[np.ndarray], np.ndarray],
    flatten_obs: bool = False,
) -> None:
    """The env loop: train items, gradient steps, target updates and evaluations until ``max_env_steps``.

    As ours, learning starts once the buffer holds ``learning_starts`` steps (or is full),
    never empty; until then an item's actions are uniformly random. A transition that ends an
    episode stores the true final observation. After the loop the envs and the evaluation are
    closed and the peak memory reported.

    Args:
        envs: The training envs (:func:`make_train_envs`), reset here with ``seed``.
        buffer: The replay buffer the steps go into.
        evaluation: Plays the greedy evaluation episodes.
        model: The Learner's hyperparameters (``gradient_steps``, ``target_network_update_freq``, ``tau``).
        data: The data module's hyperparameters (``num_envs``, ``train_freq``, ``learning_starts``,
            ``rollouts_per_epoch``).
        seed: The run's seed: env i starts from ``seed + i``.
        max_env_steps: The run's budget.
        item_policy: ``item_policy(env_steps, random_item)`` at the start of each train item
            (``env_steps`` sampled before it; ``random_item`` while learning has not started):
            the item's ``act``.
        gradient_step: One gradient step on a minibatch from ``buffer``.
        target: The target network, moved toward ``online`` by ``tau`` after every
            ``target_network_update_freq``-th gradient step.
        online: The network ``target`` follows.
        greedy: Observations ``[envs, ...]`` -> greedy env actions, for evaluation.
        flatten_obs: Flatten each env's observation to one dimension before it is acted on and stored.
    """
    num_envs, train_freq = data["num_envs"], data["train_freq"]
    learning_starts = max(min(data["learning_starts"], len(buffer.obs) * num_envs), 1)
    clock = ChildClock()
    obs, _ = envs.reset(seed=seed)  # env i is seeded with seed + i
    if flatten_obs:
        obs = obs.reshape(num_envs, -1)
    env_steps = items = gradient_steps = 0
    clock.training_start()
    while env_steps < max_env_steps:
        # ---- one train item: train_freq env steps ----
        act = item_policy(env_steps, len(buffer) < learning_starts)
        for _ in range(train_freq // num_envs):
            actions, env_actions = act(obs)
            next_obs, rewards, terminated, truncated, infos = envs.step(env_actions)
            if flatten_obs:
                next_obs = next_obs.reshape(num_envs, -1)
            stored_next = next_obs.copy()
            for i in np.flatnonzero(terminated | truncated):
                # next_obs[i] is already the next episode's reset
                stored_next[i] = infos["final_obs"][i].reshape(-1) if flatten_obs else infos["final_obs"][i]
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
                    update_target(target, online, model["tau"])

        if evaluation_due(items, data) or env_steps >= max_env_steps:
            clock.evaluation_started()
            clock.evaluation_finished(env_steps, evaluation.run(greedy))
    clock.training_end(env_steps, torch.get_num_threads())
    envs.close()
    evaluation.close()
    clock.finish()
