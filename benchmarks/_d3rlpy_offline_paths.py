"""The d3rlpy side of ``benchmarks/offline_paths.py``: d3rlpy's transitions, and a CQL policy with its own scores.

Runs under a Python that has d3rlpy (see ``_d3rlpy_offline.py``). Saves with ``torch.save`` (to
``--out``, tensors only): every transition d3rlpy's ``MDPDataset`` yields from the exported
``.npz`` (its transition picker, episode after episode), the returns of ``--episodes`` greedy
episodes of a CQL policy trained for ``--steps`` by ``_d3rlpy_offline``'s own code, and that
policy's actor weights under ``CQLModule``'s names.
"""

from __future__ import annotations

import argparse
import json

import d3rlpy
import numpy as np
import torch

from _d3rlpy_cql_parity import _our_names
from _d3rlpy_offline import build_algo, evaluate, fit, load_dataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--env", required=True)
    parser.add_argument("--settings", required=True, help="JSON: CQL's config fields, and hidden_units")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--episodes", type=int, required=True)
    parser.add_argument("--eval-seed", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    d3rlpy.seed(args.seed)
    dataset = load_dataset(args.data)

    columns: dict[str, list] = {"obs": [], "new_obs": [], "actions": [], "rewards": [], "terminateds": []}
    for episode in dataset.episodes:
        for index in range(episode.transition_count):
            transition = dataset.transition_picker(episode, index)
            columns["obs"].append(transition.observation)
            columns["new_obs"].append(transition.next_observation)
            columns["actions"].append(transition.action)
            columns["rewards"].append(transition.reward)
            columns["terminateds"].append(transition.terminal)
    saved = {"transitions": {name: torch.as_tensor(np.asarray(values)) for name, values in columns.items()}}

    algo = build_algo("cql", json.loads(args.settings), args.env, dataset)
    fit(algo, dataset, args.steps)
    saved["returns"] = torch.tensor(evaluate(algo, args.env, args.episodes, args.eval_seed), dtype=torch.float64)
    actor = {name: torch.cat([p.detach() for p in params]) for name, params in _our_names(algo.impl.modules).items()}
    saved["actor"] = {name: value for name, value in actor.items() if name.startswith("pi.")}
    torch.save(saved, args.out)


if __name__ == "__main__":
    main()
