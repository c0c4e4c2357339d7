"""The d3rlpy side of ``benchmarks/cql_parity.py``: one CQL step's losses and gradients from d3rlpy 2.8's own code.

Runs under a Python that has d3rlpy (its own virtual environment; see ``benchmarks/offline.py``),
so it imports neither lightning_rl nor Minari. It builds d3rlpy's ``CQL`` with the settings of
``examples/cql_pendulum.yaml`` but its own penalty weight 5 on Pendulum's shapes (3 observation numbers, 1 action),
nudges the target critics away from the online ones (as training does), makes a batch of
Pendulum-like transitions, and saves (``torch.save``, tensors only) the weights in
lightning_rl's ``CQLModule`` parameter names, the batch (actions in env space, ``[-2, 2]``),
and what d3rlpy computes from them with its own methods: the Bellman target's next-state
value, the critics' summed TD loss, each critic's conservative gap, the critics' gradient of
d3rlpy's critic loss, and the actor's gradient of its actor loss.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math

import d3rlpy
import numpy as np
import structlog
import torch
from torch import nn

# d3rlpy logs every build, dataset and epoch at info level; the d3rlpy sides of the CQL tools (this
# file and those importing it) print their own results and d3rlpy's warnings only.
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

# Pendulum's action bound: d3rlpy trains in [-1, 1] (MinMaxActionScaler in benchmarks/offline.py).
ACTION_HIGH = 2.0
CONSERVATIVE_WEIGHT = 5.0
ALPHA_THRESHOLD = 10.0  # d3rlpy's default; its penalty is weight * (gap - threshold)
# How far (std of added noise) the target critics are moved from the online ones.
TARGET_NUDGE = 0.05


@dataclasses.dataclass
class _Batch:
    """The fields of d3rlpy's ``TorchMiniBatch`` that ``compute_target`` and ``compute_actor_loss`` read."""

    observations: torch.Tensor
    next_observations: torch.Tensor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--samples", type=int, required=True, help="n_action_samples")
    parser.add_argument("--hidden", nargs="+", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the .pt file to write")
    args = parser.parse_args()
    torch.set_num_threads(1)
    impl = build_cql(args.hidden, args.samples, args.seed)
    modules = impl._modules
    with torch.no_grad():
        for param in modules.targ_q_funcs.parameters():
            param.add_(TARGET_NUDGE * torch.randn_like(param))

    obs, next_obs, actions, rewards = _pendulum_like_batch(args.rows, np.random.default_rng(args.seed + 1))
    batch = _Batch(observations=obs, next_observations=next_obs)
    q_next = impl.compute_target(batch)
    td_sum = impl._q_func_forwarder.compute_error(
        observations=obs, actions=actions, rewards=rewards, target=q_next, terminals=torch.zeros_like(rewards), gamma=0.99
    )
    penalties = impl._compute_conservative_loss(obs, actions, next_obs, None)  # [critics]: weight * (gap - threshold)
    critic_params = [param for q_func in modules.q_funcs for param in q_func.parameters()]
    critic_grads = torch.autograd.grad(td_sum + penalties.sum(), critic_params)

    # The actor loss alone: with a temperature optimizer d3rlpy steps the temperature inside it.
    impl._modules = dataclasses.replace(modules, temp_optim=None)
    actor_loss = impl.compute_actor_loss(batch, modules.policy(obs)).actor_loss
    actor_params = list(modules.policy.parameters())
    grads = dict(zip(critic_params, critic_grads))
    grads.update(zip(actor_params, torch.autograd.grad(actor_loss, actor_params)))

    named = _our_names(modules)
    torch.save(
        {
            "state": {name: torch.cat([param.detach() for param in parts]) for name, parts in named.items()},
            "critic_grads": {
                name: torch.cat([grads[param] for param in parts])
                for name, parts in named.items()
                if name.startswith("qf")
            },
            "actor_grads": {
                name: torch.cat([grads[param] for param in parts])
                for name, parts in named.items()
                if name.startswith("pi.")
            },
            "obs": obs,
            "next_obs": next_obs,
            "actions": ACTION_HIGH * actions,
            "rewards": rewards[:, 0],
            "q_next": q_next[:, 0].detach(),
            "td_sum": td_sum.detach(),
            "gaps": penalties.detach() / CONSERVATIVE_WEIGHT + ALPHA_THRESHOLD,
            "actor_loss": actor_loss.detach(),
        },
        args.out,
    )


def build_cql(hidden: list[int], samples: int, seed: int, temp_learning_rate: float = 1e-4):
    """d3rlpy's ``CQL`` implementation with the example's settings on Pendulum's shapes (3 observations, 1 action).

    d3rlpy's defaults are the example's (lr 1e-4 actor and temperature, 3e-4 critics, gamma 0.99,
    tau 0.005, the deterministic backup); the penalty's weight is fixed (``alpha_learning_rate=0``).
    """
    d3rlpy.seed(seed)
    encoder = d3rlpy.models.VectorEncoderFactory(hidden_units=hidden, activation="relu")
    config = d3rlpy.algos.CQLConfig(
        conservative_weight=CONSERVATIVE_WEIGHT,
        alpha_threshold=ALPHA_THRESHOLD,
        n_action_samples=samples,
        alpha_learning_rate=0.0,
        initial_alpha=1.0,
        temp_learning_rate=temp_learning_rate,
        actor_encoder_factory=encoder,
        critic_encoder_factory=encoder,
    )
    algo = config.create(device="cpu:0")
    algo.create_impl((3,), 1)
    return algo.impl


def _pendulum_like_batch(rows: int, rng: np.random.Generator) -> tuple[torch.Tensor, ...]:
    """Observations ``(cos, sin, theta_dot)``, next ones a small step on, actions in ``[-1, 1]``, Pendulum's reward."""
    theta, speed = rng.uniform(-math.pi, math.pi, rows), rng.uniform(-8.0, 8.0, rows)
    next_theta, next_speed = theta + 0.05 * speed, np.clip(speed + rng.normal(0.0, 0.5, rows), -8.0, 8.0)

    def observations(angle: np.ndarray, velocity: np.ndarray) -> torch.Tensor:
        return torch.tensor(np.stack([np.cos(angle), np.sin(angle), velocity], 1), dtype=torch.float32)

    actions = torch.tensor(rng.uniform(-1.0, 1.0, (rows, 1)), dtype=torch.float32)
    rewards = torch.tensor(-(theta**2 + 0.1 * speed**2)[:, None], dtype=torch.float32)
    return observations(theta, speed), observations(next_theta, next_speed), actions, rewards


def _our_names(modules) -> dict[str, tuple[nn.Parameter, ...]]:
    """d3rlpy's parameters under ``CQLModule``'s names (``pi.0.weight``, ``qf_twin.4.bias``, ...).

    Each name maps to the d3rlpy parameters whose values, concatenated, make ours: one, except
    for the actor's last layer, where d3rlpy has separate mean and log-std heads and ours is one
    layer whose outputs are the means, then the log-stds.
    """
    named: dict[str, tuple[nn.Parameter, ...]] = {}
    critics = {
        "qf": modules.q_funcs[0],
        "qf_twin": modules.q_funcs[1],
        "target_qf": modules.targ_q_funcs[0],
        "target_qf_twin": modules.targ_q_funcs[1],
    }
    for name, q_func in critics.items():
        for index, layer in enumerate([*_linears(q_func._encoder._layers), q_func._fc]):
            named[f"{name}.{2 * index}.weight"], named[f"{name}.{2 * index}.bias"] = (layer.weight,), (layer.bias,)
    policy = modules.policy
    hidden = _linears(policy._encoder._layers)
    for index, layer in enumerate(hidden):
        named[f"pi.{2 * index}.weight"], named[f"pi.{2 * index}.bias"] = (layer.weight,), (layer.bias,)
    last = 2 * len(hidden)
    named[f"pi.{last}.weight"] = (policy._mu.weight, policy._logstd.weight)
    named[f"pi.{last}.bias"] = (policy._mu.bias, policy._logstd.bias)
    return named


def _linears(layers: nn.Module) -> list[nn.Linear]:
    return [layer for layer in layers if isinstance(layer, nn.Linear)]


if __name__ == "__main__":
    main()
