"""Start-up time of the ``lightning-rl`` command beside baselines, measured in the same run.

What it measures: the wall-clock seconds of fresh interpreters running

  lightning-rl --help              the top-level help (this package only; no torch, no Lightning)
  lightning-rl fit --help (cold)   the full parser: torch, Lightning and every algorithm imported,
                                   run with an empty help cache
  lightning-rl fit --help (warm)   the same, answered from the help cache the cold run wrote
  lightning-rl fit --model.help PPOLearner (cold cache)   a class's help, built: torch, Lightning
                                   and the class's signature
  lightning-rl fit --model.help PPOLearner (warm cache)   the same, answered from the help cache

and, as baselines, ``python -c pass``, ``python -c "import torch"``, ``python -c "import
lightning"`` and, if installed, ``python -c "import stable_baselines3"``. Each command runs
``--repeats`` times, interleaved round by round so that a busy machine slows all of them
alike; the table gives the median and the fastest run. The help cache lives in a temporary
directory (``XDG_CACHE_HOME``), so your own cache is untouched.

Run::

    python benchmarks/startup.py               # 5 rounds
    python benchmarks/startup.py --repeats 3
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def commands() -> dict[str, list[str]]:
    """Each measured command by its label; the ``lightning-rl`` ones run through ``python -m lightning_rl``."""
    command = [sys.executable, "-m", "lightning_rl"]
    measured = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import torch": [sys.executable, "-c", "import torch"],
        "import lightning": [sys.executable, "-c", "import lightning"],
        "lightning-rl --help": [*command, "--help"],
        "lightning-rl fit --help (warm cache)": [*command, "fit", "--help"],
        # Each round starts with an empty cache (main()), so the first of these two builds the help.
        "lightning-rl fit --model.help PPOLearner (cold cache)": [*command, "fit", "--model.help", "PPOLearner"],
        "lightning-rl fit --model.help PPOLearner (warm cache)": [*command, "fit", "--model.help", "PPOLearner"],
    }
    if importlib.util.find_spec("stable_baselines3") is not None:
        measured["import stable_baselines3"] = [sys.executable, "-c", "import stable_baselines3"]
    return measured


def seconds(argv: list[str], env: dict[str, str]) -> float:
    """Wall-clock seconds of one run of ``argv``; a failed run stops the benchmark with its output."""
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds; each runs every command once")
    options = parser.parse_args()
    measured = commands()
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": cache, "OMP_NUM_THREADS": "1"}
        times: dict[str, list[float]] = {label: [] for label in measured}
        cold: list[float] = []
        for _ in range(options.repeats):
            for entry in Path(cache).rglob("help-*"):
                entry.unlink()
            cold.append(seconds(measured["lightning-rl fit --help (warm cache)"], env))
            for label, argv in measured.items():
                times[label].append(seconds(argv, env))
    times = {"lightning-rl fit --help (cold cache)": cold, **times}
    width = max(len(label) for label in times)
    print(f"{'command':<{width}}  median s  fastest s   ({options.repeats} runs each, {os.cpu_count()} CPUs)")
    for label, values in sorted(times.items(), key=lambda item: statistics.median(item[1])):
        print(f"{label:<{width}}  {statistics.median(values):8.2f}  {min(values):9.2f}")


if __name__ == "__main__":
    main()
