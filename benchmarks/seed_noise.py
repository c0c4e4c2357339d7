"""Is ours' median return below the other library's by more than seed noise? A permutation test.

Every learning target here compares two medians over a few seeds, and a seed's return spreads
far more than the gaps in question. This reads the result files the benchmarks write, pools
each task's final returns per variant over every file given (a seed counted once), and prints
each variant's median, mean and range and, for ours against each other variant, the gap of the
medians with its one-sided permutation p-value: the share of all splits of the pooled runs into
two groups of these sizes whose median gap is at or below the observed one, i.e. how often
chance alone would put ours this far behind (or further) were both from one distribution.

Reads:
- ``suite.py``'s run records (``<task>-<library>-seed<S>.json``): the last evaluation's return,
  and (a task of its own) the final policy's ``--final-episodes`` mean return where it was played;
- ``multi_agent.py --json`` files: each run's ``return_mean_per_agent`` (simple_spread);
- ``offline.py --json`` files: each run's ``eval_return_mean``, per algorithm and dataset (told
  apart by the dataset's mean return: the same id recorded on another machine is another dataset),
  and with ``--eval-at`` each earlier budget's mean return.

Usage::

    python benchmarks/seed_noise.py benchmarks/results/2026-11-28/suite/dqn_lunarlander-*.json
    python benchmarks/seed_noise.py benchmarks/results/2026-11-2[78]/simple_spread_*.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

# Siblings (this directory is on sys.path when a benchmark runs as a script); both import only the standard
# library, numpy and _children at their top.
from multi_agent import default_config
from offline import OURS_OPTIONS, SHARED_OPTIONS, STEPS  # STEPS: the budget of an offline run without --steps

EXACT_SPLITS_LIMIT = 200_000
"""Up to this many splits of the pooled runs, :func:`median_gap_p_value` counts every one."""
SAMPLED_SPLITS = 100_000
"""Beyond it, the number of random splits (seeded, so a report reproduces) it counts instead."""


def _counts_every_split(first: int, second: int) -> bool:
    return math.comb(first + second, first) <= EXACT_SPLITS_LIMIT


def exactness(first: int, second: int) -> str:
    """How :func:`median_gap_p_value` counts the splits of ``first + second`` runs, in words."""
    return "exact" if _counts_every_split(first, second) else f"estimated from {SAMPLED_SPLITS:,} random splits"


def median_gap_p_value(ours: list[float], other: list[float]) -> tuple[float, float]:
    """``median(ours) - median(other)`` and its one-sided permutation p-value.

    The p-value is the fraction of all splits of the pooled values into groups of
    ``len(ours)`` and ``len(other)`` whose median difference is at most the observed one. Every
    split is counted while there are at most ``EXACT_SPLITS_LIMIT`` (3 + 3 seeds: 20; 10 + 10:
    184,756); past that (12 + 12 seeds: 2.7 million), ``SAMPLED_SPLITS`` splits drawn uniformly
    at random, whose estimate is within about 0.003 of the exact value.
    """
    pooled = np.asarray(ours + other, dtype=np.float64)
    gap = statistics.median(ours) - statistics.median(other)
    if _counts_every_split(len(ours), len(other)):
        chosen = np.zeros((math.comb(len(pooled), len(ours)), len(pooled)), dtype=bool)
        for row, indices in enumerate(itertools.combinations(range(len(pooled)), len(ours))):
            chosen[row, list(indices)] = True
    else:
        ranks = np.random.default_rng(0).random((SAMPLED_SPLITS, len(pooled))).argsort(axis=1)
        chosen = ranks < len(ours)  # a uniformly random subset of len(ours) runs per row
    first = np.sort(np.where(chosen, pooled, np.nan), axis=1)[:, : len(ours)]  # NaN sorts last
    second = np.sort(np.where(chosen, np.nan, pooled), axis=1)[:, : len(other)]
    gaps = np.median(first, axis=1) - np.median(second, axis=1)
    return gap, float(np.mean(gaps <= gap + 1e-9))


def final_returns(path: Path) -> list[tuple[str, str, int, float]]:
    """``(task, variant, seed, final return)`` of every finished run in one result file.

    A task names its budget; ours' variant names the settings it ran with beyond the example's
    (``ours --model.init_args.update_order critics_first``), so that other settings' runs are
    never pooled with the example's.
    """
    content = json.loads(path.read_text())
    if "library" in content:  # one suite.py run record
        if content.get("status") != "done" or not content.get("evals"):
            return []
        task = f"{content['task']}, {content['max_env_steps']:,} env steps"
        variant = " ".join([content["library"], *content.get("extra_args", [])])
        found = [(task, variant, content["seed"], content["evals"][-1]["return_mean"])]
        played = content.get("final_evaluation")
        if played:
            reading = f"{task}, the final policy's {played['num_episodes']} episodes on seeds of its own"
            found.append((reading, variant, content["seed"], played["return_mean"]))
        return found
    runs = content.get("runs")
    if not isinstance(runs, list):
        raise SystemExit(f"{path}: not a result file this script reads (no 'runs' list and no 'library')")
    found = []
    for run in runs:
        if "return_mean_per_agent" in run:  # multi_agent.py
            if run.get("status") == "OK" and run["return_mean_per_agent"] is not None:
                config = content.get("config", {})
                game = config.get("game", "simple_spread")
                task = f"{game}, {run['env_steps']:,} env steps"
                variant = run["variant"]
                if variant == "ours" and config.get("config") not in (None, default_config(game)):
                    variant = f"ours --config {config['config']}"
                found.append((task, variant, run["seed"], run["return_mean_per_agent"]))
        elif "eval_return_mean" in run:  # offline.py
            budgets = {content["args"]["steps"] or STEPS[run["algo"]]: run["eval_return_mean"]}
            # --eval-at: the same run evaluated after earlier budgets too.
            budgets.update({int(steps): statistics.mean(returns) for steps, returns in run.get("evals", {}).items()})
            variant = run["variant"]
            if variant == "ours":
                variant += offline_flags(content["args"], run["algo"])
            shared = offline_flags(content["args"], run["algo"], SHARED_OPTIONS)
            # The dataset's own return tells two recordings of one id apart (each machine makes its own).
            data = f" (data {run['dataset_return_mean']:.1f})" if "dataset_return_mean" in run else ""
            for steps, value in budgets.items():
                task = f"{run['algo']} {run['dataset']}{data}, {steps:,} gradient steps{shared}"
                found.append((task, variant, run["seed"], value))
    return found


def offline_flags(args: dict, algo: str, options: dict[str, Any] = OURS_OPTIONS) -> str:
    """The ``offline.py`` flags, as written, by which a run differs from the defaults in ``options``
    (``""`` for none): ``OURS_OPTIONS`` for ours' variant, ``SHARED_OPTIONS`` for the task.

    ``cql_`` options apply to CQL runs only; an option a file predates counts as its default.
    """
    flags = ""
    for name, default in options.items():
        value = args.get(name, default)
        if value == default or (name.startswith("cql_") and algo != "cql"):
            continue
        flag = "--" + name.replace("_", "-")
        flags += f" {flag}" if value is True else f" {flag} {value}"
    return flags


def pool(paths: list[Path]) -> dict[str, dict[str, dict[int, float]]]:
    """``{task: {variant: {seed: return}}}`` over every file; a seed read twice must agree."""
    pooled: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    source: dict[tuple[str, str, int], Path] = {}
    for path in paths:
        for task, variant, seed, value in final_returns(path):
            seeds = pooled[task][variant]
            if seed in seeds and not math.isclose(seeds[seed], value, rel_tol=1e-9, abs_tol=1e-9):
                raise SystemExit(
                    f"{task}: {variant} seed {seed}: {seeds[seed]} in {source[task, variant, seed]} "
                    f"but {value} in {path}; give one of the two files"
                )
            seeds[seed] = value
            source[task, variant, seed] = path
    return pooled


def report(pooled: dict[str, dict[str, dict[int, float]]]) -> list[str]:
    """Per task: each variant's spread, then ours' median gap and p-value against each other variant."""
    lines = []
    for task, variants in pooled.items():
        lines.append(f"{task}:")
        for variant, seeds in variants.items():
            values = list(seeds.values())
            lines.append(
                f"  {variant:<12} n={len(values):<3} median {statistics.median(values):10.2f}  "
                f"mean {statistics.mean(values):10.2f}  [{min(values):.2f}, {max(values):.2f}]  "
                f"seeds {min(seeds)}-{max(seeds)}"
            )
        for name, ours_seeds in variants.items():
            if not name.startswith("ours"):
                continue
            ours = list(ours_seeds.values())
            for other, seeds in variants.items():
                if other.startswith("ours") or other == "random" or len(ours) < 2 or len(seeds) < 2:
                    continue
                gap, p_value = median_gap_p_value(ours, list(seeds.values()))
                lines.append(
                    f"  {name} - {other}: median gap {gap:+.2f}, one-sided permutation p {p_value:.3f} "
                    f"({exactness(len(ours), len(seeds))}; {len(ours)} + {len(seeds)} runs)"
                )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="result files (JSON); other files are skipped")
    args = parser.parse_args(argv)
    paths = [path for path in args.files if path.suffix == ".json"]
    if not paths:
        raise SystemExit("no .json result files given")
    print("\n".join(report(pool(paths))))


if __name__ == "__main__":
    main()
