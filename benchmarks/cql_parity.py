"""One CQL step from the same weights and batch in d3rlpy 2.8 and in ``CQLLearner``: do the two compute the same thing?

    python benchmarks/cql_parity.py --d3rlpy-python /path/to/d3rlpy-venv/bin/python

``benchmarks/_d3rlpy_cql_parity.py`` (under ``--d3rlpy-python``) builds d3rlpy's ``CQL`` with the
settings of ``examples/cql_pendulum.yaml`` but d3rlpy's penalty weight 5 on Pendulum's shapes and
saves its weights, a batch, and what d3rlpy's own methods compute from them. This script loads
the weights into a ``CQLModule`` (d3rlpy's mean and log-std heads stacked into our actor's last
layer) and compares, on the same batch:

  target        the Bellman target's next-state value, ``min_i Q'_i(s', tanh(mu(s')))``: exact;
  TD loss       the critics' squared TD errors summed over the critics: exact;
  gaps          each critic's conservative gap (logsumexp over sampled actions minus the data's
                value): equal up to the sampling noise of ``--samples`` actions of each kind;
  critic grad   of d3rlpy's critic loss and of our whole loss, over the critics' weights: the same
                direction, d3rlpy's twice as long (it sums the two critics' losses, ours halves
                the sum; Adam's steps do not depend on that scale);
  actor grad    of d3rlpy's actor loss and of ours, over the actor's weights: the same direction
                and length up to the noise of one sampled action per row.

It prints the numbers and exits non-zero if an exact one differs by more than float rounding.
What it cannot compare is the order of a step's updates (d3rlpy steps the critics, then the
actor against the updated critics; ours takes one backward pass) and the temperature's loss
(d3rlpy's on ``alpha``, ours on ``log_alpha``): both are the same at the step's start.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import gymnasium as gym
import torch

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms.cql import CQLLearner, CQLModule, conservative_gap
from lightning_rl.algorithms.sac import QF_PREDS, QF_TWIN_PREDS

MODULE_ID = "default_policy"
GAMMA = 0.99  # the d3rlpy side's (d3rlpy's default and the example's)
CQL_WEIGHT = 5.0  # the d3rlpy side's conservative_weight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d3rlpy-python", required=True, help="a Python with d3rlpy 2.8")
    parser.add_argument("--rows", type=int, default=4096, help="batch rows (more: less noise in the actor gradient)")
    parser.add_argument("--samples", type=int, default=200, help="sampled actions of each kind per row for the gaps")
    parser.add_argument("--hidden", nargs="+", type=int, default=[64, 64])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    theirs = run_d3rlpy_side(
        args.d3rlpy_python, "_d3rlpy_cql_parity.py",
        "--rows", str(args.rows), "--samples", str(args.samples), "--seed", str(args.seed),
        "--hidden", *map(str, args.hidden),
    )  # fmt: skip
    sys.exit(0 if compare(theirs, args.samples, args.hidden) else 1)


def run_d3rlpy_side(python: str, script: str, *args: str) -> dict:
    """Run ``script`` (a sibling of this file) under d3rlpy's ``python`` with ``args`` and load what it saves."""
    with tempfile.TemporaryDirectory() as scratch:
        saved = Path(scratch) / "d3rlpy.pt"
        subprocess.run([python, str(Path(__file__).with_name(script)), *args, "--out", str(saved)], check=True)
        return torch.load(saved, weights_only=True)


def compare(theirs: dict, samples: int, hidden: list[int]) -> bool:
    """Print each comparison; return whether the exact ones agree to float rounding."""
    pendulum = gym.make("Pendulum-v1")
    spec = RLModuleSpec(
        module_class=CQLModule,
        observation_space=pendulum.observation_space,
        action_space=pendulum.action_space,
        model_config={"fcnet_hiddens": hidden},
    )
    learner = CQLLearner(spec, cql_weight=CQL_WEIGHT, num_cql_actions=samples, gamma=GAMMA)
    learner.build()
    module = learner.module[MODULE_ID]
    missing, unexpected = module.load_state_dict(theirs["state"], strict=False)
    # Ours alone: the temperature and the Lagrange multiplier (neither enters the compared values at alpha = 1).
    if unexpected or set(missing) != {"log_alpha", "log_alpha_prime"}:
        raise SystemExit(f"the weights do not map: missing {missing}, unexpected {unexpected}")
    rows = theirs["obs"].shape[0]
    batch = {
        Columns.OBS: theirs["obs"],
        Columns.NEXT_OBS: theirs["next_obs"],
        Columns.ACTIONS: theirs["actions"],
        Columns.REWARDS: theirs["rewards"],
        Columns.TERMINATEDS: torch.zeros(rows, dtype=torch.bool),
    }
    print(f"{rows} rows, {samples} sampled actions of each kind per row, hidden {hidden}")

    next_value, _ = module.next_state_values(batch[Columns.NEXT_OBS], soft=False)
    target_diff = float((next_value - theirs["q_next"]).abs().max())
    print(f"target next-state value: max |ours - d3rlpy| = {target_diff:.2e}")

    fwd_out = module.forward_train(batch)
    with torch.no_grad():
        y = batch[Columns.REWARDS] + GAMMA * next_value
        td_sum = ((fwd_out[QF_PREDS] - y) ** 2).mean() + ((fwd_out[QF_TWIN_PREDS] - y) ** 2).mean()
        sampled = module.conservative_q_values(batch[Columns.OBS], batch[Columns.NEXT_OBS], samples)
        gaps = conservative_gap(sampled, torch.stack([fwd_out[QF_PREDS], fwd_out[QF_TWIN_PREDS]]))
    td_rel = abs(float(td_sum) - float(theirs["td_sum"])) / abs(float(theirs["td_sum"]))
    print(f"TD loss summed over the critics: ours {float(td_sum):.6f}, d3rlpy {float(theirs['td_sum']):.6f}")
    print(f"conservative gaps: ours {[round(g, 4) for g in gaps.tolist()]}, d3rlpy {[round(g, 4) for g in theirs['gaps'].tolist()]}")

    loss = learner.compute_loss_for_module(
        module_id=MODULE_ID, config=learner.config_for_module(MODULE_ID), batch=batch, fwd_out=fwd_out
    )
    params = dict(module.named_parameters())
    for part, expected_ratio in (("critic_grads", 2.0), ("actor_grads", 1.0)):
        names = list(theirs[part])
        ours = torch.cat([grad.flatten() for grad in torch.autograd.grad(loss, [params[n] for n in names], retain_graph=True)])
        d3 = torch.cat([theirs[part][name].flatten() for name in names])
        cosine = float(torch.nn.functional.cosine_similarity(ours, d3, dim=0))
        print(
            f"{part.replace('_grads', '')} gradient: cosine {cosine:.5f}, |d3rlpy| / |ours| "
            f"{float(d3.norm() / ours.norm()):.4f} (expected {expected_ratio:g})"
        )
    return target_diff < 1e-5 and td_rel < 1e-5


if __name__ == "__main__":
    main()
