"""``lightning-rl fit`` with its thread default (one intra-op thread) against torch's default (``--threads 0``).

What it measures: short BC (CartPole, a random-action dataset recorded here with
``lightning-rl record``) and SAC (Pendulum-v1) fits run from the command line, each in a fresh
``python -m lightning_rl fit`` process with ``OMP_NUM_THREADS`` removed from the environment,
once with the new default (no ``--threads``: one thread) and once with ``--threads 0`` (torch's
own default, one thread per core: the old behaviour). The two alternate round by round, and the
table gives each one's median fit time and the paired ratio (old time / new time in the same
round; above 1 means the default is faster). Timed is the fit itself, from ``on_train_start``
to ``on_train_end`` (a callback of this module, ``FitTimer``), not the interpreter's start-up;
validation is off (``limit_val_batches 0``). The load average is printed before and after:
run it on a busy machine and on an idle one.

Run::

    python benchmarks/cli_threads.py                       # 3 rounds, BC 300 updates, SAC 300 env steps
    python benchmarks/cli_threads.py --rounds 5 --bc_updates 500 --sac_env_steps 400
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightning.pytorch import Callback

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paired import print_paired_table

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
VARIANTS = {"old": ["--threads", "0"], "new": []}
LABELS = {"old": "(a) --threads 0 (torch's default, before)", "new": "(b) default (1 thread, after)"}


class FitTimer(Callback):
    """Prints the seconds from ``on_train_start`` to ``on_train_end``, the batches and torch's thread count."""

    def on_train_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        import torch

        seconds = time.perf_counter() - self._start
        print(f"FIT_TIMER seconds={seconds:.4f} steps={trainer.global_step} threads={torch.get_num_threads()}", flush=True)


def _environment(datasets: Path) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    paths = [str(HERE), str(REPO), environment.get("PYTHONPATH", "")]
    environment["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    environment["MINARI_DATASETS_PATH"] = str(datasets)
    return environment


def _fit_command(task: str, args: argparse.Namespace, root: Path) -> list[str]:
    common = [
        "--trainer.default_root_dir", str(root),
        "--trainer.logger", "false",
        "--trainer.enable_checkpointing", "false",
        "--trainer.enable_progress_bar", "false",
        "--trainer.limit_val_batches", "0",
        "--trainer.callbacks", "cli_threads.FitTimer",
    ]  # fmt: skip
    if task == "bc":
        return [
            "--config", str(REPO / "examples" / "bc_cartpole.yaml"), *common,
            "--trainer.max_epochs", "1",
            "--data.init_args.dataset_id", "cartpole/random-v0",
            "--data.init_args.updates_per_epoch", str(args.bc_updates),
        ]  # fmt: skip
    return [
        "--config", str(REPO / "examples" / "sac_pendulum.yaml"), *common,
        "--data.init_args.max_env_steps", str(args.sac_env_steps),
        "--data.init_args.learning_starts", "100",
    ]  # fmt: skip


def _run_fit(task: str, variant: str, args: argparse.Namespace, environment: dict[str, str], root: Path) -> tuple[float, int, int]:
    command = [sys.executable, "-m", "lightning_rl", "fit", *_fit_command(task, args, root), *VARIANTS[variant]]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, check=False, cwd=root)
    found = re.search(r"FIT_TIMER seconds=([\d.]+) steps=(\d+) threads=(\d+)", result.stdout)
    if result.returncode != 0 or found is None:
        raise SystemExit(f"{task} {variant} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return float(found[1]), int(found[2]), int(found[3])


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bc_updates", type=int, default=300, help="gradient steps of the BC fit")
    parser.add_argument("--sac_env_steps", type=int, default=300, help="env steps of the SAC fit (100 random first)")
    parser.add_argument("--tasks", nargs="+", default=["bc", "sac"], choices=["bc", "sac"])
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        scratch_path = Path(scratch)
        environment = _environment(scratch_path / "datasets")
        if "bc" in args.tasks:
            record = [sys.executable, "-m", "lightning_rl", "record", "--dataset_id", "cartpole/random-v0",
                      "--env", "CartPole-v1", "--random_fraction", "1", "--num_episodes", "200", "--seed", "0"]  # fmt: skip
            subprocess.run(record, env=environment, check=True, capture_output=True, cwd=scratch)
        print(f"cpus: {os.cpu_count()}  load average (1, 5, 15 min) before: {_loadavg()}", flush=True)
        for task in args.tasks:
            seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
            threads: dict[str, int] = {}
            steps = 0
            for round_ in range(args.rounds):
                order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
                for variant in order:
                    root = scratch_path / f"{task}-{variant}-{round_}"
                    root.mkdir()
                    fit_seconds, steps, threads[variant] = _run_fit(task, variant, args, environment, root)
                    seconds[variant].append(fit_seconds)
                    print(f"  {task} round {round_} {variant}: {fit_seconds:.2f} s ({threads[variant]} threads), load {_loadavg()}", flush=True)
            # BC: one optimizer step per batch; SAC: Lightning counts each of its optimizers' steps, so env steps.
            steps = steps if task == "bc" else args.sac_env_steps
            print(f"\n{task}: {steps} {'gradient' if task == 'bc' else 'env'} steps per fit, {args.rounds} rounds")
            labels = {name: f"{LABELS[name]} [{threads[name]} thr]" for name in VARIANTS}
            print_paired_table(seconds, labels, baseline="old", work=steps, unit="steps/s")
            print()
        print(f"load average (1, 5, 15 min) after: {_loadavg()}")


if __name__ == "__main__":
    main()
