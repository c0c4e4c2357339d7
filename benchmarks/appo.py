"""APPO/IMPALA with decoupled samplers, measured against our synchronous PPO (issue 34's targets).

Three parts, each a fresh subprocess per run, one run at a time (``--parts`` picks them):

``cartpole``  Wall seconds from launch until the *training return* (the mean return of the
              last 100 training episodes) reaches ``--threshold`` (450), for
              ``examples/appo_cartpole.yaml`` and ``examples/ppo_cartpole.yaml`` on each seed,
              through ``ppo_cartpole.py``'s ``--child ours`` (the same child, stop rule and
              protocol as the PPO benchmark). Peak memory is the whole process tree's: the
              sum over the run and every process it started (the sampler processes), read
              from ``/proc`` every 0.2 s, both as resident memory (RSS, which counts a page that
              forked processes share once per process) and as PSS (shared pages divided among
              their sharers: the memory the tree takes). Then the medians, and the
              targets: APPO's median wall time <= PPO's, <= 0.2x RLlib 2.60 APPO's and peak
              memory <= 0.5x RLlib's (RLlib's numbers are the anchor the issue measured on
              this machine, ``RLLIB_APPO``: RLlib is not run here).
``throughput``
              Env steps per second of ``AsyncSamplingDataModule`` with 1 and with 2 sampler
              processes on an env whose step dominates (``Hopper-v5`` with ``frame_skip`` 40:
              40 MuJoCo steps per env step), trained by ``examples/impala_cartpole.yaml``'s
              settings (each rollout trained on once, so the Learner waits for the samplers) for
              ``--throughput-seconds``; the rate counts from the fifth train item on (start-up
              excluded). Target: 2 samplers >= 1.6x 1 sampler.
``breakout``  MinAtar Breakout at a fixed wall-clock budget (``--budget-seconds``, default 600):
              ``examples/appo_minatar_breakout.yaml`` against ``examples/ppo_minatar_breakout.yaml``,
              each stopped by the Trainer's ``max_time``, then evaluated on 20 greedy episodes.
              Target: APPO's return >= PPO's.

Every child runs with ``OMP_NUM_THREADS`` = ``--threads`` (default 1). A shared 2-core
machine adds +-25% timing noise: compare within one invocation.

Run::

    python benchmarks/appo.py --parts cartpole --seeds 0 1 2
    python benchmarks/appo.py --parts throughput
    python benchmarks/appo.py --parts breakout --budget-seconds 600
"""

from __future__ import annotations

import time

START_TIME = time.time()  # a child's clock starts with the script

import argparse
import math
import os
import statistics
import sys
import threading
from pathlib import Path
from typing import Any

from _children import fmt, follow_child, parse_fields, print_versions, write_json

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
PARTS = ("cartpole", "throughput", "breakout")
CARTPOLE_CONFIGS = {"appo": "examples/appo_cartpole.yaml", "ppo": "examples/ppo_cartpole.yaml"}
# IMPALA trains each rollout once (RLlib's 1 x 1 circular buffer), so its Learner waits for the
# samplers instead of reusing rollouts: the env steps/s are the samplers'. (APPO's Learner never
# waits while a rollout has uses left: on 2 cores it keeps one busy, and 2 samplers share the other.)
THROUGHPUT_CONFIG = "examples/impala_cartpole.yaml"
BREAKOUT_CONFIGS = {"appo": "examples/appo_minatar_breakout.yaml", "ppo": "examples/ppo_minatar_breakout.yaml"}
# RLlib 2.60.0's own tuned APPO CartPole example on this 2-core machine, 2 env runners, training
# return 450, seeds 0 and 1 (the issue's anchor): wall seconds and peak memory.
RLLIB_APPO = {"wall_s": [550.0, 500.0], "peak_rss_mb": 2.35 * 1024}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threshold", type=float, default=450.0, help="cartpole: training return that counts as solved")
    parser.add_argument("--max-env-steps", type=int, default=1_000_000, help="cartpole: a run gives up after this many")
    parser.add_argument("--throughput-env", default="Hopper-v5")
    parser.add_argument(
        "--throughput-env-kwargs", default='{"frame_skip": 40}',
        help="JSON env_kwargs of the throughput env: 40 MuJoCo steps per env step, so stepping the env dominates",
    )
    parser.add_argument("--throughput-seconds", type=float, default=60.0)
    parser.add_argument("--budget-seconds", type=int, default=600, help="breakout: each run's wall-clock budget")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before a run is killed")
    parser.add_argument("--json", metavar="PATH", help="also write every run and the summary to this JSON file")
    parser.add_argument("--show-output", action="store_true", help="echo the children's other output lines")
    parser.add_argument("--child", choices=["budget"], help=argparse.SUPPRESS)  # internal: one run here
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--warmup-items", type=int, default=5, help=argparse.SUPPRESS)
    # A child passes the flags it does not know on to the CLI (``--data.init_args.env ...``).
    args, args.cli_flags = parser.parse_known_args(argv)
    if args.cli_flags and args.child is None:
        parser.error(f"unrecognized arguments: {' '.join(args.cli_flags)}")
    return args


# ----------------------------------------------------------------------------------------
# The process tree's memory
# ----------------------------------------------------------------------------------------


def tree_memory_mb(root: int) -> tuple[float, float]:
    """``(RSS, PSS)`` summed over ``root`` and all its descendants, in MB (from ``/proc``; 0 once gone).

    The RSS sum counts a page shared by several processes (a forked sampler's copy-on-write
    pages of torch) once per process; PSS (``smaps_rollup``) divides each shared page among its
    sharers, so its sum is the memory the tree takes.
    """
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                parents[int(entry)] = int(file.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue  # exited meanwhile
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    rss_kb = pss_kb = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as file:
                for line in file:
                    if line.startswith("Rss:"):
                        rss_kb += int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss_kb += int(line.split()[1])
        except OSError:
            continue
    return rss_kb / 1024, pss_kb / 1024


class TreeMemory:
    """Samples a child's process-tree memory every ``interval`` seconds: the largest RSS and PSS sums seen."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak_rss_mb = self.peak_pss_mb = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, proc: Any) -> None:
        def sample() -> None:
            while not self._stop.wait(self.interval) and proc.poll() is None:
                rss, pss = tree_memory_mb(proc.pid)
                self.peak_rss_mb, self.peak_pss_mb = max(self.peak_rss_mb, rss), max(self.peak_pss_mb, pss)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


# ----------------------------------------------------------------------------------------
# The `budget` child: a Trainer.fit of a config for a wall-clock budget, then an evaluation
# ----------------------------------------------------------------------------------------


def run_budget_child(args: argparse.Namespace) -> None:
    """``--child budget``: fit ``--config`` until ``max_time``/``max_env_steps``; print THROUGHPUT and FINAL lines."""
    import logging
    import warnings

    import lightning.pytorch as pl
    import torch

    from lightning_rl.cli import LightningRLCLI

    torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")

    class Throughput(pl.Callback):
        """Env steps per second from the ``warmup_items``-th train item on."""

        def __init__(self) -> None:
            self.items = 0
            self.start: tuple[float, float] | None = None
            self.last: tuple[float, float] | None = None

        def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
            steps = float(batch.timesteps.get("num_env_steps_sampled_lifetime", 0))
            self.items += 1
            if self.items == args.warmup_items:
                self.start = (time.time(), steps)
            self.last = (time.time(), steps)

    cli = LightningRLCLI(
        args=[
            "--config", str(REPO_ROOT / args.config),
            "--seed_everything", str(args.seed),
            "--trainer.logger", "false",
            "--trainer.enable_checkpointing", "false",
            "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false",
            "--trainer.limit_val_batches", "0",
            "--trainer.callbacks", "[]",
            *args.cli_flags,
        ],
        run=False,
        save_config_callback=None,
    )  # fmt: skip
    throughput = Throughput()
    cli.trainer.callbacks.append(throughput)
    print(f"TRAINING_START time={time.time():.6f}", flush=True)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    if throughput.start is not None and throughput.last is not None and throughput.last[0] > throughput.start[0]:
        seconds = throughput.last[0] - throughput.start[0]
        print(f"THROUGHPUT env_steps_per_s={(throughput.last[1] - throughput.start[1]) / seconds:.1f}", flush=True)
    # One evaluation of the weights the budget left: 20 greedy episodes.
    datamodule = cli.datamodule
    datamodule.hparams.evaluation_num_episodes = 20
    episodes = datamodule.sample_eval_item().data.episodes
    returns = [float(episode.get_return()) for episode in episodes]
    env_steps = datamodule.num_env_steps_sampled_lifetime
    print(f"FINAL eval_return={statistics.mean(returns):.3f} env_steps={env_steps}", flush=True)


# ----------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------


def _run(command: list[str], record: dict[str, Any], args: argparse.Namespace, handled: tuple[str, ...]) -> None:
    """Launch one child, fill ``record`` from its lines in ``handled`` and from its tree's memory."""
    memory = TreeMemory()

    def handle(head: str, line: str, launch: float) -> bool:
        if head not in handled:
            return False
        record["status"] = head
        record.update(parse_fields(line))
        if head == "REACHED":
            record["wall_s"] = float(record["time"]) - launch
        return True

    returncode, other_lines, _ = follow_child(
        command, record, handle, threads=args.threads, timeout=args.timeout, show_output=args.show_output,
        on_launch=memory.watch,
    )  # fmt: skip
    memory.stop()
    record["tree_peak_rss_mb"], record["tree_peak_pss_mb"] = memory.peak_rss_mb, memory.peak_pss_mb
    record["returncode"] = returncode
    if returncode != 0:
        record.setdefault("status", "ERROR")
        record["error_tail"] = other_lines[-15:]
        print(f"    {record['variant']} seed {record.get('seed')}: exit {returncode}; last output:")
        for line in other_lines[-15:]:
            print(f"    | {line}")


def cartpole(args: argparse.Namespace) -> dict[str, Any]:
    records = []
    print(f"\ncartpole: wall seconds to training return {args.threshold}")
    print(f"  {'variant':<8}{'seed':>5}{'result':>13}{'env steps':>11}{'wall s':>9}{'tree RSS MB':>13}{'tree PSS MB':>13}")
    for index, seed in enumerate(args.seeds):
        for variant in list(CARTPOLE_CONFIGS)[index % 2 :] + list(CARTPOLE_CONFIGS)[: index % 2]:
            record: dict[str, Any] = {"variant": variant, "seed": seed, "wall_s": None}
            command = [
                sys.executable, str(BENCH_DIR / "ppo_cartpole.py"), "--child", "ours",
                "--config", CARTPOLE_CONFIGS[variant], "--seed", str(seed), "--threshold", str(args.threshold),
                "--max-env-steps", str(args.max_env_steps), "--threads", str(args.threads),
            ]  # fmt: skip
            _run(command, record, args, ("REACHED", "NOT_REACHED", "UNAVAILABLE"))
            records.append(record)
            print(
                f"  {variant:<8}{seed:>5}{record.get('status', 'ERROR'):>13}{record.get('env_steps', '-'):>11}"
                f"{fmt(record['wall_s'], '.1f'):>9}{record['tree_peak_rss_mb']:>13.0f}{record['tree_peak_pss_mb']:>13.0f}",
                flush=True,
            )
    medians = {}
    for variant in CARTPOLE_CONFIGS:
        runs = [r for r in records if r["variant"] == variant]
        walls = [r["wall_s"] if r.get("status") == "REACHED" else math.inf for r in runs]
        medians[variant] = {
            "median_wall_s": statistics.median(walls),
            "max_tree_peak_rss_mb": max(r["tree_peak_rss_mb"] for r in runs),
            "max_tree_peak_pss_mb": max(r["tree_peak_pss_mb"] for r in runs),
        }
    appo, ppo = medians["appo"], medians["ppo"]
    rllib_wall, rllib_memory = statistics.median(RLLIB_APPO["wall_s"]), RLLIB_APPO["peak_rss_mb"]
    verdict = {
        "appo/ppo wall": (appo["median_wall_s"] / ppo["median_wall_s"], 1.0),
        "appo/rllib appo wall": (appo["median_wall_s"] / rllib_wall, 0.2),
        "appo/rllib appo peak memory (tree RSS sum)": (appo["max_tree_peak_rss_mb"] / rllib_memory, 0.5),
        "appo/rllib appo peak memory (tree PSS sum)": (appo["max_tree_peak_pss_mb"] / rllib_memory, 0.5),
    }
    print(f"  medians: APPO {appo['median_wall_s']:.1f} s, PPO {ppo['median_wall_s']:.1f} s (RLlib APPO, the "
          f"issue's anchor: {rllib_wall:.0f} s); peak tree memory RSS/PSS: APPO {appo['max_tree_peak_rss_mb']:.0f}/"
          f"{appo['max_tree_peak_pss_mb']:.0f} MB, PPO {ppo['max_tree_peak_rss_mb']:.0f}/"
          f"{ppo['max_tree_peak_pss_mb']:.0f} MB (RLlib APPO: {rllib_memory:.0f} MB)")  # fmt: skip
    for name, (ratio, target) in verdict.items():
        print(f"  {name}: {ratio:.3f} (target <= {target}) {'PASS' if ratio <= target else 'NOT REACHED'}")
    return {"runs": records, "medians": medians, "verdict": {k: {"ratio": r, "target": t} for k, (r, t) in verdict.items()}}


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    print(f"\nthroughput: env steps/s of AsyncSamplingDataModule on {args.throughput_env}, {args.throughput_seconds:.0f} s each")
    rates = {}
    for runners in (1, 2):
        record: dict[str, Any] = {"variant": f"{runners} sampler(s)"}
        minutes, seconds = divmod(int(args.throughput_seconds), 60)
        command = [
            sys.executable, __file__, "--child", "budget", "--config", THROUGHPUT_CONFIG, "--threads",
            str(args.threads),
            "--data.init_args.env", args.throughput_env, "--data.init_args.env_kwargs", args.throughput_env_kwargs,
            "--data.init_args.num_env_runners", str(runners),
            "--data.init_args.max_env_steps", "null", "--trainer.max_time", f"00:00:{minutes:02d}:{seconds:02d}",
        ]  # fmt: skip
        _run(command, record, args, ("THROUGHPUT", "FINAL"))
        rates[runners] = float(record.get("env_steps_per_s", "nan"))
        print(f"  {runners} sampler(s): {rates[runners]:.0f} env steps/s (tree peak PSS {record['tree_peak_pss_mb']:.0f} MB)")
    ratio = rates[2] / rates[1]
    print(f"  2 / 1 samplers: {ratio:.2f}x (target >= 1.6) {'PASS' if ratio >= 1.6 else 'NOT REACHED'}")
    return {"env_steps_per_s": rates, "ratio": ratio}


def breakout(args: argparse.Namespace) -> dict[str, Any]:
    print(f"\nbreakout: eval return after {args.budget_seconds} s of training")
    results = {}
    for variant, config in BREAKOUT_CONFIGS.items():
        record: dict[str, Any] = {"variant": variant}
        minutes, seconds = divmod(args.budget_seconds, 60)
        command = [
            sys.executable, __file__, "--child", "budget", "--config", config, "--threads", str(args.threads),
            "--trainer.max_time", f"00:00:{minutes:02d}:{seconds:02d}", "--data.init_args.max_env_steps", "null",
        ]  # fmt: skip
        _run(command, record, args, ("THROUGHPUT", "FINAL"))
        results[variant] = record
        print(f"  {variant}: eval return {record.get('eval_return', '-')} after {record.get('env_steps', '-')} env steps")
    appo, ppo = (float(results[v].get("eval_return", "nan")) for v in ("appo", "ppo"))
    print(f"  APPO >= PPO: {'PASS' if appo >= ppo else 'NOT REACHED'} ({appo:.2f} vs {ppo:.2f})")
    return results


def main() -> None:
    args = parse_args()
    if args.child == "budget":
        run_budget_child(args)
        return
    payload: dict[str, Any] = {"versions": print_versions()}
    for part in args.parts:
        payload[part] = {"cartpole": cartpole, "throughput": throughput, "breakout": breakout}[part](args)
    if args.json:
        write_json(args.json, payload)


if __name__ == "__main__":
    main()
