"""Around the CQL step: do d3rlpy and ours train on the same rows, and score one policy alike?

    python benchmarks/offline_paths.py --d3rlpy-python /path/to/d3rlpy-venv/bin/python \
        [--dataset pendulum/sac-medium-v0] [--steps 1500] [--episodes 100]

``cql_parity.py`` and ``cql_trajectory.py`` show the two libraries take the same CQL step; this
checks the two paths of ``offline.py`` around it, on a real dataset:

  rows        every transition d3rlpy's ``MDPDataset`` yields from ``offline.py``'s export (its
              transition picker, episode after episode) against every row ours trains on
              (``EpisodeRows``: obs, action, reward, next obs, terminated), in the same order;
  evaluation  d3rlpy trains CQL for ``--steps`` (``offline.py``'s settings) and scores its greedy
              policy as ``offline.py``'s d3rlpy variant does; ours loads that actor's weights
              into a ``CQLModule`` and scores it with ``offline.py``'s ours variant's own
              ``evaluate_greedy`` (10 envs side by side), and with one env: the same returns,
              episode by episode, up to float noise.

Exits non-zero if a row differs or an episode's return differs by more than ``--tolerance``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cql_parity import run_d3rlpy_side  # noqa: E402
from offline import COMMON, EVAL_SEED, HIDDEN, SETTINGS, evaluate_greedy, export_for_d3rlpy  # noqa: E402

COLUMNS = ("obs", "new_obs", "actions", "rewards", "terminateds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d3rlpy-python", required=True, help="a Python with d3rlpy 2.8")
    parser.add_argument("--dataset", default="pendulum/sac-medium-v0")
    parser.add_argument("--steps", type=int, default=1500, help="d3rlpy's CQL steps before its policy is scored")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-2, help="largest per-episode return difference")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        exported, _, env_id = export_for_d3rlpy(args.dataset, Path(scratch))
        settings = {**COMMON[1], **SETTINGS["cql"][1], "hidden_units": HIDDEN}
        theirs = run_d3rlpy_side(
            args.d3rlpy_python, "_d3rlpy_offline_paths.py", "--data", str(exported), "--env", env_id,
            "--settings", json.dumps(settings), "--steps", str(args.steps), "--episodes", str(args.episodes),
            "--eval-seed", str(EVAL_SEED), "--seed", str(args.seed),
        )  # fmt: skip
    rows_equal = compare_rows(args.dataset, theirs["transitions"])
    returns_close = compare_scores(env_id, theirs, args.episodes, args.tolerance)
    sys.exit(0 if rows_equal and returns_close else 1)


def compare_rows(dataset_id: str, theirs: dict[str, torch.Tensor]) -> bool:
    """Print and return whether ours' rows of ``dataset_id`` equal d3rlpy's transitions, in order."""
    from lightning_rl.data.dataset_rows import EpisodeRows, open_dataset

    dataset = open_dataset(dataset_id)
    rows = EpisodeRows(dataset, dataset_id, range(dataset.total_episodes), gamma=None)
    ours = rows.take(torch.arange(len(rows)), COLUMNS)
    print(f"rows: ours {len(rows)}, d3rlpy {len(theirs['obs'])}")
    if len(rows) != len(theirs["obs"]):
        return False
    equal = True
    for name in COLUMNS:
        mine, other = ours[name].double().reshape(len(rows), -1), theirs[name].double().reshape(len(rows), -1)
        gap = float((mine - other).abs().max())
        print(f"  {name:<12} max |ours - d3rlpy| {gap:.1e}")
        equal = equal and gap == 0.0
    return equal


def compare_scores(env_id: str, theirs: dict, episodes: int, tolerance: float) -> bool:
    """Score d3rlpy's actor with ours' evaluation; print and return whether each episode's return agrees."""
    import gymnasium as gym

    from lightning_rl import RLModuleSpec
    from lightning_rl.algorithms.cql import CQLLearner, CQLModule
    from lightning_rl.policy import Policy

    env = gym.make(env_id)
    spec = RLModuleSpec(
        module_class=CQLModule,
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config={"fcnet_hiddens": HIDDEN},
    )
    learner = CQLLearner(spec)
    learner.build()
    missing, unexpected = learner.module["default_policy"].load_state_dict(theirs["actor"], strict=False)
    if unexpected or any(name.startswith("pi.") for name in missing):
        raise SystemExit(f"the actor's weights do not map: missing {missing}, unexpected {unexpected}")
    policy = Policy.from_learner(learner)
    reference = theirs["returns"].numpy()
    print(f"evaluation of d3rlpy's policy, {episodes} episodes: d3rlpy's loop {reference.mean():.3f}")
    close = True
    for num_envs in (10, 1):
        returns = np.asarray(evaluate_greedy(policy, env_id, episodes, num_envs=num_envs))
        gap = float(np.abs(returns - reference).max())
        print(f"  ours, {num_envs:>2} env(s): {returns.mean():.3f}, largest per-episode gap {gap:.1e}")
        close = close and gap <= tolerance
    return close


if __name__ == "__main__":
    main()
