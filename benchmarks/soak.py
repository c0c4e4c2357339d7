"""Soak tests: memory that stays flat over long runs, and checkpoints that survive kill -9.

Two sub-commands, each printing a table and exiting non-zero when its check fails.

``rss``: long fits whose memory must not grow.
  DQN on CartPole-v1 for ``--dqn-steps`` env steps (default 1M, ``OffPolicyDataModule``) and
  PPO on CartPole-v1 for ``--ppo-steps`` (default 2M, ``OnPolicyDataModule``), one after the
  other, each a ``Trainer.fit`` through ``LightningRLCLI`` of the example config
  (``examples/dqn_cartpole.yaml``, ``examples/ppo_cartpole.yaml``) in a child process of its
  own with ``torch.set_num_threads(1)``. The parent reads the child's resident memory
  (``VmRSS`` in ``/proc/<pid>/status``, so Linux only) every ``--interval`` seconds and the
  child reports its env steps as it goes. Reported per run: RSS after warm-up (at
  ``--warmup`` of the run's env steps, 10% by default), at 50%, at the end, the maximum,
  and the drift ``(end - warm-up) / warm-up``; each of the three points is the median of the
  samples within 1% of the run around it, so a checkpoint save or evaluation that happens
  to coincide with one sample does not decide it. The check: ``|drift| <= --max-drift`` (5%).

  Settings changed from the example configs, to keep the runs affordable on 2 shared CPU
  cores and to measure what the check means:
    * both: the config's ``EarlyStopping`` is dropped (the runs must last), a
      ``ModelCheckpoint(save_last=True)`` saves at every epoch end (so saves are part of what
      is measured), an epoch is 100 train items (DQN and PPO: 25,600 env steps) and each
      evaluation plays 2 episodes; logs and checkpoints go to a temporary directory that is
      removed afterwards.
    * DQN: 8 envs (sampling 8x fewer batched forward passes) and 16 gradient steps per 256
      env steps instead of 128 (target synced once per item as in the config), so 1M env
      steps take minutes rather than an hour; the replay capacity is ``min(50,000, steps /
      20)``, so the buffer is full after 5% of the run, before the warm-up point: the drift
      then measures growth *beyond* a full buffer (a buffer still filling would grow by
      design).
    * PPO: the config's hyperparameters as they are (its lr and clip anneal to 0 at 100k env
      steps; the updates still run, which is what memory sees).

``kill``: ``--cycles`` (50) kill -9 / resume cycles of ``lightning-rl fit --config
  examples/ppo_cartpole.yaml`` with checkpoints saved after every train item, with the
  checkpoint directory on another filesystem than ``$TMPDIR``; every checkpoint left behind
  must load (checked, checksum), no temporary file may be left, and the counters must never go
  back. See ``_soak_kill.py`` for what a cycle does and checks. ``--no-evaluate`` runs the fits
  without evaluation (``limit_val_batches: 0``).

Run::

    python benchmarks/soak.py rss                                     # 1M DQN + 2M PPO (~45 min here)
    python benchmarks/soak.py rss --dqn-steps 20000 --ppo-steps 50000  # a quick run
    python benchmarks/soak.py kill                                    # 50 cycles (~15-25 min here)
    python benchmarks/soak.py kill --no-evaluate
    python benchmarks/soak.py kill --cycles 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from _children import parse_fields, print_versions

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
CONFIGS = {"dqn": "examples/dqn_cartpole.yaml", "ppo": "examples/ppo_cartpole.yaml"}
ITEMS_PER_EPOCH = 100  # train items between evaluations and checkpoint saves
DQN_GRADIENT_STEPS = 16  # per 256-env-step train item (the config has 128)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    rss = commands.add_parser("rss", help="DQN and PPO fits with their memory sampled every second")
    rss.add_argument("--dqn-steps", type=int, default=1_000_000, help="env steps of the DQN run (0: skip it)")
    rss.add_argument("--ppo-steps", type=int, default=2_000_000, help="env steps of the PPO run (0: skip it)")
    rss.add_argument("--warmup", type=float, default=0.10, help="fraction of a run after which memory must stay flat")
    rss.add_argument("--max-drift", type=float, default=0.05, help="largest |end - warm-up| / warm-up that passes")
    rss.add_argument("--interval", type=float, default=1.0, help="seconds between RSS samples")
    rss.add_argument("--timeout", type=float, default=4 * 3600.0, help="seconds before a run is killed")
    kill = commands.add_parser("kill", help="kill -9 / resume cycles of a PPO fit, checkpoints checked after each")
    kill.add_argument("--cycles", type=int, default=50)
    kill.add_argument("--seed", type=int, default=0, help="seeds the random kill times")
    kill.add_argument(
        "--max-wait", type=float, default=4.0, help="a cycle's kill comes up to this many seconds after its first save"
    )
    kill.add_argument(
        "--root-dir", help="where the fit writes (default: /dev/shm when $TMPDIR is on another filesystem)"
    )
    kill.add_argument("--start-timeout", type=float, default=300.0, help="seconds a cycle may take to its first save")
    kill.add_argument("--keep", action="store_true", help="keep the run's directories and print where they are")
    kill.add_argument(
        "--evaluate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="evaluate at every epoch end (--no-evaluate: limit_val_batches 0, no evaluation is ever owed on resume)",
    )
    kill.add_argument(
        "--max-failures", type=int, default=3, help="stop after this many cycles in a row that could not run"
    )
    child = commands.add_parser("child")  # internal: the fit whose memory `rss` samples
    child.add_argument("algo", choices=sorted(CONFIGS))
    child.add_argument("--steps", type=int, required=True)
    child.add_argument("--root-dir", required=True)
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------
# The `rss` child: one Trainer.fit through LightningRLCLI, reporting its env steps
# ----------------------------------------------------------------------------------------


def overrides(algo: str, steps: int) -> dict[str, Any]:
    """The config layered over the example config for a soak run (see the module docstring for why)."""
    checkpoint = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True}}
    data: dict[str, Any] = {"rollouts_per_epoch": ITEMS_PER_EPOCH, "max_env_steps": steps, "evaluation_num_episodes": 2}
    config: dict[str, Any] = {
        "trainer": {"callbacks": [checkpoint], "enable_progress_bar": False, "enable_model_summary": False},
        "data": {"init_args": data},
    }
    if algo == "dqn":
        data.update(num_envs=8, train_freq=256, replay_buffer_capacity=replay_capacity(steps))
        config["model"] = {
            "init_args": {"gradient_steps": DQN_GRADIENT_STEPS, "target_network_update_freq": DQN_GRADIENT_STEPS}
        }
    return config


def replay_capacity(dqn_steps: int) -> int:
    """DQN's replay capacity: full after 5% of the run, before the default warm-up point (10%)."""
    return max(1000, min(50_000, dqn_steps // 20))


def run_child(args: argparse.Namespace) -> None:
    """``child``: fit the example config with the soak's overrides, printing ``PROGRESS env_steps=<int>`` per 1%."""
    import logging
    import warnings

    import lightning.pytorch as pl
    import torch
    import yaml

    from lightning_rl.cli import LightningRLCLI

    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    override_file = Path(args.root_dir) / "soak_overrides.yaml"
    override_file.write_text(yaml.safe_dump(overrides(args.algo, args.steps)))
    cli = LightningRLCLI(
        args=["--config", str(REPO_ROOT / CONFIGS[args.algo]), "--config", str(override_file),
              "--trainer.default_root_dir", args.root_dir],
        run=False,
    )  # fmt: skip

    class Progress(pl.Callback):
        """Prints the lifetime env steps after each train item that crosses another 1% of the run."""

        def __init__(self) -> None:
            self.next_report = 0

        def on_train_batch_end(self, trainer: pl.Trainer, *unused: Any) -> None:
            steps = trainer.datamodule.num_env_steps_sampled_lifetime
            if steps >= self.next_report:
                print(f"PROGRESS env_steps={steps}", flush=True)
                self.next_report = steps + max(1, args.steps // 100)

    cli.trainer.callbacks.append(Progress())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    print(f"DONE env_steps={cli.datamodule.num_env_steps_sampled_lifetime}", flush=True)


# ----------------------------------------------------------------------------------------
# The `rss` driver: sample a child's memory while it runs
# ----------------------------------------------------------------------------------------


@dataclass
class RssRun:
    """One soak run: its memory samples as ``(env steps reported so far, RSS in MB)``."""

    algo: str
    steps: int
    samples: list[tuple[int, float]] = field(default_factory=list)
    env_steps: int = 0
    done: bool = False
    returncode: int | None = None
    wall_s: float = 0.0
    tail: list[str] = field(default_factory=list)


def rss_mb(pid: int) -> float | None:
    """The resident memory of process ``pid`` in MB (``VmRSS``), or ``None`` once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None  # a zombie has no VmRSS line


def sample_run(algo: str, steps: int, args: argparse.Namespace) -> RssRun:
    """Run the ``child`` for ``algo`` in a temporary directory, sampling its RSS until it exits."""
    run = RssRun(algo, steps)
    root = tempfile.mkdtemp(prefix=f"soak-rss-{algo}-")
    command = [sys.executable, str(Path(__file__).resolve()), "child", algo, "--steps", str(steps), "--root-dir", root]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        reader = threading.Thread(target=_follow, args=(proc, run), daemon=True)
        reader.start()
        while proc.poll() is None:
            if time.monotonic() - start > args.timeout:
                proc.kill()
                run.tail.append(f"killed after {args.timeout:.0f} s (--timeout)")
                break
            # Only samples taken during training count: not the start-up, not the exit.
            rss = rss_mb(proc.pid)
            if rss is not None and run.env_steps > 0 and not run.done:
                run.samples.append((run.env_steps, rss))
            time.sleep(args.interval)
        run.returncode = proc.wait()
        reader.join(timeout=10)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    run.wall_s = time.monotonic() - start
    return run


def _follow(proc: subprocess.Popen, run: RssRun) -> None:
    """Read the child's lines: progress into ``run``, the rest kept as the tail for an error report."""
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.rstrip("\n")
        head = line.split(" ", 1)[0]
        if head == "PROGRESS":
            steps = int(parse_fields(line)["env_steps"])
            if steps * 10 // run.steps > run.env_steps * 10 // run.steps:  # another tenth of the run
                latest = f", RSS {run.samples[-1][1]:.0f} MB" if run.samples else ""
                print(f"  {run.algo}: {steps:,} env steps{latest}", flush=True)
            run.env_steps = steps
        elif head == "DONE":
            run.done = True
        else:
            run.tail = (run.tail + [line])[-20:]


def rss_at(run: RssRun, fraction: float) -> float | None:
    """The median RSS of the samples within 1% of the run around ``fraction`` of its env steps."""
    if not run.samples:
        return None
    last_steps = run.samples[-1][0]
    centre = min(fraction * run.steps, last_steps)
    window = [rss for steps, rss in run.samples if abs(steps - centre) <= 0.01 * run.steps]
    if not window:  # sparse samples (a very short run): the one nearest in env steps
        window = [min(run.samples, key=lambda sample: abs(sample[0] - centre))[1]]
    return statistics.median(window)


def rss_row(run: RssRun, args: argparse.Namespace) -> dict[str, Any]:
    """The table row of one run, with ``ok`` the verdict of its drift check."""
    warm, half, end = (rss_at(run, fraction) for fraction in (args.warmup, 0.5, 1.0))
    drift = (end - warm) / warm if warm and end else None
    row = {"run": f"{run.algo.upper()} {run.steps:,}", "samples": len(run.samples), "warm": warm, "half": half,
           "end": end, "max": max((rss for _, rss in run.samples), default=None), "drift": drift,
           "wall_s": run.wall_s}  # fmt: skip
    row["ok"] = run.returncode == 0 and run.done and drift is not None and abs(drift) <= args.max_drift
    return row


def print_rss_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    def mb(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    print(f"\n| run (env steps) | samples | RSS MB at {args.warmup:.0%} | at 50% | at end | max | drift | wall s | "
          f"|drift| <= {args.max_drift:.0%} |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        drift = "-" if row["drift"] is None else f"{row['drift']:+.1%}"
        print(f"| {row['run']} | {row['samples']} | {mb(row['warm'])} | {mb(row['half'])} | {mb(row['end'])} | "
              f"{mb(row['max'])} | {drift} | {row['wall_s']:.0f} | {'yes' if row['ok'] else 'NO'} |")  # fmt: skip


def run_rss(args: argparse.Namespace) -> int:
    """The ``rss`` command: each run in turn, then the table; 1 if any run failed its check or did not finish."""
    if not Path("/proc/self/status").is_file():
        print("rss reads /proc/<pid>/status: Linux only")
        return 2
    runs = [(algo, steps) for algo, steps in (("dqn", args.dqn_steps), ("ppo", args.ppo_steps)) if steps > 0]
    print_versions()
    print(f"1 torch thread per run; RSS sampled every {args.interval:g} s; DQN replay capacity "
          f"{replay_capacity(args.dqn_steps):,}")  # fmt: skip
    rows = []
    for algo, steps in runs:
        print(f"{algo}: {steps:,} env steps ...", flush=True)
        run = sample_run(algo, steps, args)
        rows.append(rss_row(run, args))
        if run.returncode != 0 or not run.done:
            print(f"{algo}: the run did not finish (exit code {run.returncode}); its last lines:")
            for line in run.tail:
                print(f"    | {line}")
    print_rss_table(rows, args)
    return 0 if rows and all(row["ok"] for row in rows) else 1


def main() -> None:
    args = parse_args()
    if args.command == "child":
        run_child(args)
        return
    if args.command == "rss":
        sys.exit(run_rss(args))
    from _soak_kill import run_kill

    sys.exit(run_kill(args))


if __name__ == "__main__":
    main()
