"""Cost of a Learner update's logging: the MetricsLogger before RLlib's settings versus now.

What it measures: the time to log and reduce the metrics of one realistic PPO-like update of
``--modules`` modules over ``--minibatches`` minibatch steps, per logged value. Each module
logs 8 values per minibatch step (losses, KL, entropy, clip fraction, gradient norm) and once
per update 4 current hyperparameters, 2 step counts, a lifetime count and the batch size;
the ``__all_modules__`` entry logs a total loss per step and 6 counters and timesteps per
update (3 modules: 55 keys, 130 values). Values logged per step are scalar tensors that
carry autograd history (as losses do); the others are Python numbers. ``reduce`` runs once
at the end, as ``Learner.update`` does.

Variants, the same values in each:

  (a) before     the MetricsLogger of ``--before`` (default: the last commit before RLlib's
                 settings), loaded from git as a module; per-step means with the default
                 settings, hyperparameters with ``reduce="last"``.
  (b) now        this tree's MetricsLogger with the settings that report the same numbers:
                 per-step means with ``window=math.inf, clear_on_reduce=True``,
                 hyperparameters with ``window=1, clear_on_reduce=True``.
  (c) now, EMA   as (b), but the per-step means with the default settings (RLlib's EMA).

The variants run interleaved, round by round, on one thread; the verdict is the median of
the paired ratios (see ``_paired.py``).

Run::

    python benchmarks/metrics_logger.py
    python benchmarks/metrics_logger.py --modules 6 --minibatches 16 --rounds 50
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from lightning_rl.core.metrics import MetricsLogger

# A sibling module: this directory is on sys.path when a benchmark runs as a script.
from _paired import print_paired_table

REPO = Path(__file__).resolve().parent.parent
BEFORE = "5fde486"  # the last commit whose MetricsLogger had no window or EMA
PER_STEP = ["policy_loss", "vf_loss", "vf_loss_unclipped", "entropy", "mean_kl", "clip_fraction", "total_loss"]
HYPERPARAMETERS = ["default_optimizer_lr", "curr_clip_param", "curr_entropy_coeff", "curr_kl_coeff"]
ALL_MODULES = "__all_modules__"


def load_before(revision: str) -> ModuleType:
    """The ``metrics.py`` of ``revision``, imported as a stand-alone module."""
    command = ["git", "show", f"{revision}:lightning_rl/core/metrics.py"]
    source = subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "metrics_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("metrics_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and annotations look the module up by name
    spec.loader.exec_module(module)
    return module


def settings_for(variant: str) -> dict[str, dict[str, Any]]:
    """The ``log_value`` keyword arguments of each kind of value, in ``variant``'s API."""
    if variant == "before":
        return {"step": {}, "last": {"reduce": "last"}, "sum": {"reduce": "sum"}, "lifetime": _LIFETIME}
    period_mean = {"window": math.inf, "clear_on_reduce": True}
    return {
        "step": period_mean if variant == "now" else {},
        "last": {"window": 1, "clear_on_reduce": True},
        "sum": {"reduce": "sum", "clear_on_reduce": True},
        "lifetime": _LIFETIME,
    }


_LIFETIME = {"reduce": "sum", "clear_on_reduce": False}


def log_update(metrics: Any, settings: dict[str, dict[str, Any]], values: list[torch.Tensor], modules: int) -> int:
    """Log one update's values into ``metrics`` and reduce; returns the number of values logged."""
    log = metrics.log_value
    module_ids = [f"module_{i}" for i in range(modules)]
    logged = 0
    for step_values in values:
        for index, module_id in enumerate(module_ids):
            for name, value in zip(PER_STEP, step_values[index * len(PER_STEP) :]):
                log((module_id, name), value, **settings["step"])
            log((module_id, "gradients_default_optimizer_global_norm"), step_values[-1], **settings["step"])
            logged += len(PER_STEP) + 1
        log((ALL_MODULES, "total_loss"), step_values[-1], **settings["step"])
        logged += 1
    for module_id in module_ids:
        for name in HYPERPARAMETERS:
            log((module_id, name), 3e-4, **settings["last"])
        log((module_id, "num_module_steps_trained"), 128, **settings["sum"])
        log((module_id, "weights_seq_no"), 7, **settings["last"])
        log((module_id, "num_module_steps_trained_lifetime"), 128, **settings["lifetime"])
        log((module_id, "module_train_batch_size_mean"), 32.0, **settings["step"])
        logged += len(HYPERPARAMETERS) + 4
    for name in ["num_module_steps_trained", "num_env_steps_trained"]:
        log((ALL_MODULES, name), 128 * modules, **settings["sum"])
        log((ALL_MODULES, f"{name}_lifetime"), 128 * modules, **settings["lifetime"])
    for name in ["weights_seq_no", "num_env_steps_sampled_lifetime"]:
        log((ALL_MODULES, name), 7, **settings["last"])
    metrics.reduce()
    return logged + 6


def make_values(modules: int, minibatches: int) -> list[list[torch.Tensor]]:
    """Scalar tensors with autograd history, one list per minibatch step."""
    weight = torch.randn(8, requires_grad=True)
    return [[(weight * (i + 1)).mean() for i in range(modules * len(PER_STEP) + 1)] for _ in range(minibatches)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modules", type=int, default=3)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--updates", type=int, default=200, help="updates timed per round and variant")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--before", default=BEFORE, help="git revision of the baseline metrics.py")
    args = parser.parse_args()
    torch.set_num_threads(1)
    before = load_before(args.before)
    loggers = {"before": before.MetricsLogger, "now": MetricsLogger, "now_ema": MetricsLogger}
    settings = {"before": settings_for("before"), "now": settings_for("now"), "now_ema": settings_for("now_ema")}
    values = make_values(args.modules, args.minibatches)
    seconds: dict[str, list[float]] = {name: [] for name in loggers}
    logged = 0
    for _ in range(args.rounds + 1):  # the first round warms up
        for name, logger_class in loggers.items():
            metrics = logger_class()
            start = time.perf_counter()
            for _ in range(args.updates):
                logged = log_update(metrics, settings[name], values, args.modules)
            seconds[name].append((time.perf_counter() - start) / args.updates)
    seconds = {name: times[1:] for name, times in seconds.items()}
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread; {args.modules} modules x "
        f"{args.minibatches} minibatches: {logged} values per update; {args.rounds} rounds of {args.updates} updates"
    )
    labels = {"before": f"(a) before ({args.before})", "now": "(b) now, same numbers", "now_ema": "(c) now, EMA means"}
    paired = print_paired_table(seconds, labels, baseline="before", work=logged, unit="values/s")
    for name, times in seconds.items():
        per_value = statistics.median(times) / logged * 1e6
        print(f"{labels[name]:<30} {per_value:6.2f} us per value (median), paired ratio before/this {paired[name]:.2f}")


if __name__ == "__main__":
    main()
