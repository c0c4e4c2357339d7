"""The d3rlpy side of ``benchmarks/cql_trajectory.py``: d3rlpy 2.8's CQL steps on given batches and noise.

Runs under a Python that has d3rlpy (see ``benchmarks/offline.py``). It builds d3rlpy's ``CQL``
as ``_d3rlpy_cql_parity.py`` does (the example's settings on Pendulum's shapes), then takes
``--steps`` updates with d3rlpy's own ``update``, each on a Pendulum-like batch and with every
random draw of the step replaced by noise this script draws and saves: the Gaussian noise of the
policy samples at ``s`` and at ``s'`` of the conservative penalty, the uniform actions of the
penalty, and the Gaussian noise of the actor's reparameterized sample. It saves (``torch.save``,
tensors only) the initial weights, the batches, the noise and the weights after every step, in
lightning_rl's ``CQLModule`` parameter names.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from _d3rlpy_cql_parity import ACTION_HIGH, _our_names, _pendulum_like_batch, build_cql
from d3rlpy.models.torch import get_parameter
from d3rlpy.torch_utility import TorchMiniBatch
from torch.distributions import Normal


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--samples", type=int, required=True, help="n_action_samples")
    parser.add_argument("--hidden", nargs="+", type=int, required=True)
    parser.add_argument("--temp-lr", type=float, required=True, help="temp_learning_rate (0: the temperature stays)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the .pt file to write")
    args = parser.parse_args()
    torch.set_num_threads(1)
    impl = build_cql(args.hidden, args.samples, args.seed, temp_learning_rate=args.temp_lr)
    named = _our_names(impl._modules)

    def state() -> dict[str, torch.Tensor]:
        return {name: torch.cat([param.detach().clone() for param in parts]) for name, parts in named.items()}

    # Every draw of a step, replayed in d3rlpy's order: the penalty's policy samples at s, then at
    # s' ([n, B, d] each, Normal.rsample((n,))), the penalty's uniform actions ([B * n, d],
    # Tensor.uniform_), then the actor's sample ([B, d]).
    gaussians: list[torch.Tensor] = []
    uniforms: list[torch.Tensor] = []

    def rsample(self: Normal, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        noise = gaussians.pop(0)
        if noise.shape != self._extended_shape(sample_shape):
            raise RuntimeError(f"d3rlpy drew {self._extended_shape(sample_shape)}, the replay holds {noise.shape}")
        return self.loc + noise * self.scale

    def uniform_(self: torch.Tensor, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        noise = uniforms.pop(0)
        if noise.shape != self.shape or (low, high) != (-1.0, 1.0):
            raise RuntimeError(f"d3rlpy drew uniform {tuple(self.shape)} in [{low}, {high}]; the replay: {noise.shape}")
        return self.copy_(noise)

    Normal.rsample = rsample
    torch.Tensor.uniform_ = uniform_
    rng = np.random.default_rng(args.seed + 1)
    generator = torch.Generator().manual_seed(args.seed + 2)
    rows, n = args.rows, args.samples
    saved = {"initial": state(), "batches": [], "noise": [], "states": []}
    for step in range(args.steps):
        obs, next_obs, actions, rewards = _pendulum_like_batch(rows, rng)
        noise = {
            "policy_s": torch.randn(rows, n, 1, generator=generator),  # [B, n, d], our layout
            "policy_next": torch.randn(rows, n, 1, generator=generator),
            "uniform": torch.rand(rows, n, 1, generator=generator) * 2 - 1,
            "actor": torch.randn(rows, 1, generator=generator),
        }
        gaussians[:] = [noise["policy_s"].transpose(0, 1), noise["policy_next"].transpose(0, 1), noise["actor"]]
        uniforms[:] = [noise["uniform"].reshape(rows * n, 1)]
        batch = TorchMiniBatch(
            observations=obs,
            actions=actions,
            rewards=rewards,
            next_observations=next_obs,
            next_actions=torch.zeros_like(actions),
            returns_to_go=torch.zeros_like(rewards),
            terminals=torch.zeros_like(rewards),
            intervals=torch.ones_like(rewards),
            device="cpu:0",
        )
        impl.update(batch, step)
        if gaussians or uniforms:
            raise RuntimeError(f"step {step}: d3rlpy left {len(gaussians)} Gaussian and {len(uniforms)} uniform draws")
        saved["batches"].append(
            {"obs": obs, "next_obs": next_obs, "actions": ACTION_HIGH * actions, "rewards": rewards[:, 0]}
        )
        saved["noise"].append(noise)
        saved["states"].append(state())
    saved["log_temp"] = get_parameter(impl._modules.log_temp).detach().clone().reshape(())
    torch.save(saved, args.out)


if __name__ == "__main__":
    main()
