"""Many CQL steps from the same weights, batches and noise in d3rlpy 2.8 and in ``CQLLearner``: same weights out?

    python benchmarks/cql_trajectory.py --d3rlpy-python /path/to/d3rlpy-venv/bin/python [--steps 200]

``benchmarks/cql_parity.py`` compares one step's losses and gradients; this follows the weights
over many steps, where a difference in the order of a step's updates, in an optimizer or in the
target networks' averaging would add up. ``benchmarks/_d3rlpy_cql_trajectory.py`` (under
``--d3rlpy-python``) takes ``--steps`` of d3rlpy's own CQL updates (the settings of
``examples/cql_pendulum.yaml`` but d3rlpy's weight: lr 1e-4 / 3e-4, penalty weight 5 fixed, 10 sampled actions
of each kind, tau 0.005, the deterministic backup) on Pendulum-like batches, with every random
draw replaced by noise it saves. This script loads d3rlpy's initial weights into a
``CQLLearner`` with ``update_order="critics_first"`` (d3rlpy's order: the critics step, then the
actor against the stepped critics), replays the same batches and noise, and prints after
chosen steps the largest difference between the two libraries' weights per network.

The temperature's loss differs by design (d3rlpy's is on ``alpha``, ours on ``log_alpha``), so
it stays fixed at 1 in both unless ``--temp-lr`` is given; ``--temperature-loss alpha`` gives ours
d3rlpy's (``offline.cql_learner_class``, as ``offline.py --cql-temperature-loss alpha`` does). d3rlpy's
critic loss is twice ours (it sums the two critics' losses, ours averages them): Adam's step does
not depend on that scale except through its ``eps``, so our critics' Adam runs with ``eps`` 5e-9,
which is d3rlpy's 1e-8 on its gradient (``--critic-eps 1e-8``, ours' own, shows what that changes).
It exits non-zero if a weight differs by more than ``--tolerance`` after the last step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gymnasium as gym
import torch

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms import sac
from lightning_rl.algorithms.cql import CQLModule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cql_parity import run_d3rlpy_side  # noqa: E402
from offline import cql_learner_class  # noqa: E402

MODULE_ID = "default_policy"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d3rlpy-python", required=True, help="a Python with d3rlpy 2.8")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rows", type=int, default=256, help="batch rows (the example's batch_size)")
    parser.add_argument("--samples", type=int, default=10, help="sampled actions of each kind per row")
    parser.add_argument("--hidden", nargs="+", type=int, default=[64, 64])
    parser.add_argument("--temp-lr", type=float, default=0.0, help="the temperature's lr in both (default: fixed)")
    parser.add_argument(
        "--temperature-loss", choices=["log_alpha", "alpha"], default="log_alpha", help="our temperature's loss"
    )
    parser.add_argument("--update-order", choices=["critics_first", "joint"], default="critics_first")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument(
        "--critic-eps",
        type=float,
        default=5e-9,
        help="our critics' Adam eps (default 5e-9: d3rlpy's critic loss is twice ours, so this is its 1e-8; "
        "1e-8, ours' own, shows what that scale changes)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    theirs = run_d3rlpy_side(
        args.d3rlpy_python, "_d3rlpy_cql_trajectory.py",
        "--steps", str(args.steps), "--rows", str(args.rows), "--samples", str(args.samples),
        "--hidden", *map(str, args.hidden), "--temp-lr", str(args.temp_lr), "--seed", str(args.seed),
    )  # fmt: skip
    sys.exit(0 if follow(theirs, args) else 1)


def follow(theirs: dict, args: argparse.Namespace) -> bool:
    """Replay d3rlpy's batches and noise through ours; print the weight differences; whether they stay close."""
    pendulum = gym.make("Pendulum-v1")
    spec = RLModuleSpec(
        module_class=CQLModule,
        observation_space=pendulum.observation_space,
        action_space=pendulum.action_space,
        model_config={"fcnet_hiddens": args.hidden, "fcnet_activation": "relu"},
    )
    learner = cql_learner_class(args.temperature_loss, args.critic_eps)(
        spec, actor_lr=1e-4, critic_lr=3e-4, alpha_lr=args.temp_lr, initial_alpha=1.0, cql_weight=5.0,
        num_cql_actions=args.samples, gamma=0.99, tau=0.005, minibatch_size=args.rows, gradient_steps=1,
        update_order=args.update_order,
    )  # fmt: skip
    learner.build()
    module = learner.module[MODULE_ID]
    missing, unexpected = module.load_state_dict(theirs["initial"], strict=False)
    if unexpected or set(missing) != {"log_alpha", "log_alpha_prime"}:
        raise SystemExit(f"the weights do not map: missing {missing}, unexpected {unexpected}")

    # Each draw gets d3rlpy's noise for it: the penalty's uniform actions (Tensor.uniform_), its policy
    # samples at s and s' (one torch.randn of [2B, n, d]) and the actor's sample (sac._gaussian_sample).
    replay: dict[str, list[torch.Tensor]] = {"uniform": [], "randn": [], "actor": []}
    uniform, randn, gaussian_sample = torch.Tensor.uniform_, torch.randn, sac._gaussian_sample

    def replayed_uniform(self: torch.Tensor, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        return self.copy_(replay["uniform"].pop(0))

    def replayed_randn(*shape, **kwargs) -> torch.Tensor:
        noise = replay["randn"].pop(0)
        if tuple(noise.shape) != tuple(shape):
            raise RuntimeError(f"ours drew randn {shape}, the replay holds {tuple(noise.shape)}")
        return noise

    torch.Tensor.uniform_, torch.randn = replayed_uniform, replayed_randn
    sac._gaussian_sample = lambda mean, log_std: mean + log_std.exp() * replay["actor"].pop(0)
    report_at = sorted({1, 10, 50, 100, args.steps} & set(range(1, args.steps + 1)))
    print(f"{args.steps} steps of {args.rows} rows, {args.samples} sampled actions of each kind, hidden {args.hidden}, "
          f"update_order {args.update_order}, temperature lr {args.temp_lr} on {args.temperature_loss}")  # fmt: skip
    print("step | max |ours - d3rlpy| over: actor | critics | target critics")
    worst = 0.0
    try:
        for step, (batch, noise, state) in enumerate(zip(theirs["batches"], theirs["noise"], theirs["states"]), 1):
            replay["uniform"] = [noise["uniform"]]
            replay["randn"] = [torch.cat([noise["policy_s"], noise["policy_next"]])]
            replay["actor"] = [noise["actor"]]
            rows = batch["obs"].shape[0]
            columns = {
                Columns.OBS: batch["obs"], Columns.ACTIONS: batch["actions"], Columns.REWARDS: batch["rewards"],
                Columns.NEXT_OBS: batch["next_obs"], Columns.TERMINATEDS: torch.zeros(rows, dtype=torch.bool),
            }  # fmt: skip
            learner.update(batch={MODULE_ID: columns}, minibatch_size=None)  # one gradient step on the whole batch
            if any(replay.values()):
                raise RuntimeError(f"step {step}: ours left draws unused: { {k: len(v) for k, v in replay.items()} }")
            ours = module.state_dict()
            gaps = {name: float((ours[name] - value).abs().max()) for name, value in state.items()}
            diffs = {
                part: max(gap for name, gap in gaps.items() if name.startswith(prefix))
                for part, prefix in (("actor", "pi."), ("critics", "qf"), ("targets", "target_qf"))
            }
            worst = max(diffs.values())
            if step in report_at:
                print(f"{step:>4} | {diffs['actor']:.2e} | {diffs['critics']:.2e} | {diffs['targets']:.2e}")
    finally:
        torch.Tensor.uniform_, torch.randn, sac._gaussian_sample = uniform, randn, gaussian_sample
    print(f"log temperature: ours {module.log_alpha.item():.6f}, d3rlpy {theirs['log_temp'].item():.6f}")
    return worst <= args.tolerance


if __name__ == "__main__":
    main()
