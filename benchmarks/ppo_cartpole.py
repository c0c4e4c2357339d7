"""Time to solve CartPole-v1 with PPO: our ``Trainer.fit`` versus a hand-written PPO and SB3.

What it measures: for each seed and each variant, the env steps and the wall-clock seconds
from process start to the first time the *training return* reaches ``--threshold`` (450),
and the process's peak memory (max RSS). The three variants run the same algorithm with the
same settings, SB3 rl-zoo's tuned PPO for CartPole-v1:

  8 envs (sequential vector env) x 32 steps = 256 rows per update, 20 epochs of minibatches
  of 256, gamma 0.98, GAE lambda 0.8, lr 1e-3 and clip 0.2 annealed linearly to 0 over 100k
  env steps, ent_coef 0, vf_coef 0.5, global-norm clipping 0.5, separate [64, 64] tanh
  policy and value MLPs (orthogonal init), Adam eps 1e-5, per-minibatch advantage
  normalization, unclipped MSE value loss, time-limit truncations bootstrapped.

  ours         ``Trainer.fit`` of ``examples/ppo_cartpole.yaml`` through ``LightningRLCLI``
               (this file, ``--child ours``), validation off (``limit_val_batches 0``);
  handwritten  ``benchmarks/handwritten_ppo.py``: single-file plain torch + gymnasium PPO;
  sb3          ``benchmarks/_sb3_ppo.py``: Stable-Baselines3's ``PPO("MlpPolicy")``, run
               only when ``stable_baselines3`` is installed (``pip install stable-baselines3``).

"Training return" is SB3's convention (``ep_info_buffer``): the mean undiscounted return of
the last (up to) 100 completed training episodes, checked after every rollout, before its
update (ours reads it from the train item's ``env_runners`` statistics in
``on_train_batch_start``; the Learner also logs it as ``env_runners/episode_return_mean``).

Each run is a fresh subprocess (``sys.executable``), one at a time, with the same thread
settings (``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` and ``torch.set_num_threads`` = ``--threads``).
The child prints ``TRAINING_START time=<unix time>`` when its set-up is done,
``REACHED env_steps=<int> time=<unix time> elapsed=<s> ...`` when it gets there
(``NOT_REACHED env_steps=<int>`` at ``--max-env-steps``) and ``PEAK_RSS_MB=<float>``
(``ru_maxrss`` of its own process) at exit. Columns:

  wall s    the child's REACHED time minus the moment just before the parent launched it
            (interpreter start, imports, set-up and training: the issue's measure);
  setup s   launch to TRAINING_START (imports, envs, networks; a Trainer's set-up);
  train s   wall s - setup s: the training loop alone;
  ms/step   train s per env step, in milliseconds: the loop's speed apart from how many
            env steps the seed needed;
  peak RSS  the child's maximum resident memory, in MB.

Per seed, the variants' order rotates, so no variant always runs first or after the same one.

How to read the output: one table per seed, then per variant the medians over the seeds (a
run that never reaches the threshold counts as slower than any that does), and the verdict
on the issue's targets: ours' median wall time <= 1.15x the hand-written script's and
<= SB3's; beside it the paired ratio (median over seeds of ours / theirs on the same seed).
The env steps a seed needs are deterministic for a given variant (same numbers on every
invocation), but each variant has its own random streams, so seed s of one is not seed s of
another; a change that only moves float rounding (e.g. fused Adam) reshuffles them too. Over
seeds 0-49 the medians were 62.0k env steps (SB3), 64.1k (hand-written) and 64.9k (ours), no
difference beyond luck (docs/benchmarks.md, "PPO on CartPole, end to end"), each ranging over ~50k-97k with
about one run in fifty never getting there; seeds 0-9 happen to be unlucky for ours (70.9k)
and seeds 0-2 to favour SB3 (55-58k). So the wall-time medians of a few seeds carry that luck.
Read ms/step and setup s for the speed of the code, and use 20 or more seeds for the verdict. A shared 2-core machine adds +-25% timing
noise: compare within one invocation, and repeat it.

Run::

    python benchmarks/ppo_cartpole.py                                  # seeds 0 1 2, all variants
    python benchmarks/ppo_cartpole.py --seeds 0 1 2 3 4 5 6 7 8 9     # the verdict (~15 min)
    python benchmarks/ppo_cartpole.py --variants handwritten sb3 --seeds 0 1 2 3 4
    python benchmarks/ppo_cartpole.py --threads 2 --json ppo_cartpole.json
    python benchmarks/ppo_cartpole.py --device cuda                   # every variant's networks on the GPU

``--device`` (``cpu``, the default, or ``cuda``) puts every variant's networks, rollout
tensors and updates on that device: ours through the Trainer (``--trainer.accelerator
gpu|cpu --trainer.devices 1``), the hand-written PPO by moving its agent and buffers there,
SB3 through its ``device=``. The envs stay on the CPU. ``--device cuda`` exits with one line
where CUDA is absent.
"""

from __future__ import annotations

import time

START_TIME = time.time()  # a child's clock (``--child ours``) starts with the script

import argparse
import math
import resource
import statistics
import sys
from pathlib import Path
from typing import Any

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from _children import (
    add_device_argument,
    available_variants,
    check_device,
    fmt,
    follow_child,
    parse_fields,
    print_versions,
    rotated,
    trainer_device_args,
    write_json,
)

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
VARIANTS = ("ours", "handwritten", "sb3")
DEFAULT_CONFIG = "examples/ppo_cartpole.yaml"
RETURN_KEY = "env_runners/episode_return_mean"
STEPS_KEY = "env_runners/num_env_steps_sampled_lifetime"
TARGETS = {"handwritten": 1.15, "sb3": 1.00}  # ours' median wall time / the variant's, at most


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--threshold", type=float, default=450.0, help="training return that counts as solved")
    parser.add_argument("--max-env-steps", type=int, default=100_000, help="a run gives up after this many env steps")
    parser.add_argument("--threads", type=int, default=1, help="OMP/MKL threads and torch.set_num_threads of every run")
    parser.add_argument(
        "--config", default=DEFAULT_CONFIG, help="our run's LightningCLI config (relative to the repo root)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is killed")
    parser.add_argument("--json", metavar="PATH", help="also write every run and the summary to this JSON file")
    parser.add_argument("--show-output", action="store_true", help="echo the children's other output lines")
    parser.add_argument("--child", choices=["ours"], help=argparse.SUPPRESS)  # internal: run one variant here
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # the --child's seed
    add_device_argument(parser)
    args = parser.parse_args(argv)
    check_device(args.device)
    return args


# ----------------------------------------------------------------------------------------
# The `ours` child: Trainer.fit of our PPO config, stopped at the threshold
# ----------------------------------------------------------------------------------------


def make_stop_callback(threshold: float, max_env_steps: int) -> Any:
    """A Lightning callback that reports and stops the run at the threshold (or max env steps)."""
    import lightning.pytorch as pl

    class StopAtTrainingReturn(pl.Callback):
        """Per train item (one rollout, then its update): REACHED / NOT_REACHED, and stop.

        Reads the training return (mean of the last 100 training episodes) and the lifetime env
        steps from the train item's ``"env_runners"`` statistics in ``on_train_batch_start``,
        i.e. right after the rollout and before its update, as SB3 and the hand-written script
        check. For train items without them it falls back to the Learner's on-step logs
        (``env_runners/...`` in ``trainer.callback_metrics``) in ``on_train_batch_end``.
        """

        def __init__(self) -> None:
            self.threshold = threshold
            self.max_env_steps = max_env_steps
            self.reported = False
            self.env_steps = 0
            self.return_mean = math.nan
            self.item_has_stats = False

        def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
            print(f"TRAINING_START time={time.time():.6f}", flush=True)  # set-up done, first rollout next

        def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
            stats = getattr(batch, "env_runners", None)  # a TrainItem's sampling statistics
            self.item_has_stats = bool(stats) and all(
                key in stats for key in ("episode_return_mean", "num_env_steps_sampled_lifetime")
            )
            if self.item_has_stats:
                self._check(
                    trainer, float(stats["num_env_steps_sampled_lifetime"]), float(stats["episode_return_mean"])
                )

        def on_train_batch_end(
            self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            if self.reported or self.item_has_stats:
                return
            metrics = trainer.callback_metrics
            steps, return_mean = (metrics.get(key, metrics.get(f"{key}_step")) for key in (STEPS_KEY, RETURN_KEY))
            if steps is None:
                raise KeyError(f"the Learner logged no {STEPS_KEY!r}; callback_metrics has {sorted(metrics)}")
            self._check(trainer, float(steps), math.nan if return_mean is None else float(return_mean))

        def _check(self, trainer: pl.Trainer, steps: float, return_mean: float) -> None:
            if self.reported:
                return
            self.env_steps, self.return_mean = int(steps), return_mean
            if not math.isnan(return_mean) and return_mean >= self.threshold:
                now = time.time()
                print(
                    f"REACHED env_steps={self.env_steps} time={now:.6f} elapsed={now - START_TIME:.3f} "
                    f"return_mean={return_mean:.2f} threads={_torch_threads()}",
                    flush=True,
                )
            elif self.env_steps >= self.max_env_steps:
                print(f"NOT_REACHED env_steps={self.env_steps} return_mean={return_mean:.2f}", flush=True)
            else:
                return
            self.reported = True
            trainer.should_stop = True  # the update of this item still runs, then the fit ends

    return StopAtTrainingReturn()


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def run_ours_child(args: argparse.Namespace) -> None:
    """``--child ours``: one Trainer.fit of our PPO config, reporting in the children's protocol."""
    import logging
    import warnings

    import torch

    torch.set_num_threads(args.threads)
    config = REPO_ROOT / args.config
    try:
        from lightning_rl.cli import LightningRLCLI
    except ImportError as error:
        print(f"UNAVAILABLE reason=lightning_rl.cli: {error}", flush=True)
        return
    if not config.is_file():
        print(f"UNAVAILABLE reason=no config {config}", flush=True)
        return
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")

    cli = LightningRLCLI(
        args=[
            "--config", str(config),
            "--seed_everything", str(args.seed),
            "--trainer.logger", "false",
            "--trainer.enable_checkpointing", "false",
            "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false",
            "--trainer.limit_val_batches", "0",     # time training only, like the other variants
            "--trainer.callbacks", "[]",            # drop the config's EarlyStopping/ModelCheckpoint on eval
            "--data.init_args.max_env_steps", str(args.max_env_steps),
            *trainer_device_args(args.device),
        ],
        run=False,
        save_config_callback=None,                  # no config.yaml written into the repo
    )  # fmt: skip
    stop = make_stop_callback(args.threshold, args.max_env_steps)
    cli.trainer.callbacks.append(stop)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    if not stop.reported:  # the config's own limits ended the run first
        print(f"NOT_REACHED env_steps={stop.env_steps} return_mean={stop.return_mean:.2f}", flush=True)
    print(f"PEAK_RSS_MB={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}", flush=True)


# ----------------------------------------------------------------------------------------
# The driver: one fresh subprocess per (seed, variant), in sequence
# ----------------------------------------------------------------------------------------


def child_command(variant: str, seed: int, args: argparse.Namespace) -> list[str]:
    common = ["--seed", str(seed), "--threshold", str(args.threshold),
              "--max-env-steps", str(args.max_env_steps), "--threads", str(args.threads),
              "--device", args.device]  # fmt: skip
    if variant == "ours":
        return [sys.executable, str(Path(__file__).resolve()), "--child", "ours", "--config", args.config, *common]
    script = {"handwritten": "handwritten_ppo.py", "sb3": "_sb3_ppo.py"}[variant]
    return [sys.executable, str(BENCH_DIR / script), *common]


def run_child(variant: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Launch one run, follow its protocol lines, and return its record."""
    record: dict[str, Any] = {"variant": variant, "seed": seed, "status": "ERROR", "env_steps": None, "wall_s": None,
                              "setup_s": None, "train_s": None, "child_s": None, "peak_rss_mb": None,
                              "threads": None, "return_mean": None}  # fmt: skip

    def handle(head: str, line: str, launch: float) -> bool:
        if head not in ("REACHED", "NOT_REACHED", "UNAVAILABLE"):
            return False
        fields = parse_fields(line)
        record["status"] = head
        if head == "UNAVAILABLE":
            record["reason"] = fields.get("reason", "")
            return True
        record["env_steps"] = int(fields["env_steps"])
        record["return_mean"] = float(fields.get("return_mean", "nan"))
        if head == "REACHED":
            record["wall_s"] = float(fields["time"]) - launch
            record["child_s"] = float(fields["elapsed"])
            if record["setup_s"] is not None:
                record["train_s"] = record["wall_s"] - record["setup_s"]
            record["threads"] = int(fields["threads"]) if "threads" in fields else None
        return True

    returncode, other_lines, launch = follow_child(
        child_command(variant, seed, args), record, handle,
        threads=args.threads, timeout=args.timeout, show_output=args.show_output,
    )  # fmt: skip
    record["process_s"] = time.time() - launch
    record["returncode"] = returncode
    if returncode != 0:  # a run that reached the threshold and then failed keeps its result
        if record["status"] != "REACHED":
            record["status"] = "ERROR"
        record["error_tail"] = other_lines[-15:]
    return record


def ms_per_step(record: dict[str, Any]) -> float | None:
    """Training-loop milliseconds per env step of a run that reached the threshold."""
    if record["status"] != "REACHED" or record["train_s"] is None:
        return None
    return 1000.0 * record["train_s"] / record["env_steps"]


def print_seed_table(seed: int, records: list[dict[str, Any]]) -> None:
    print(f"\nseed {seed}")
    print(
        f"  {'variant':<12}{'result':<13}{'env steps':>10}{'wall s':>9}{'setup s':>9}{'train s':>9}{'ms/step':>9}"
        f"{'peak RSS MB':>13}{'threads':>9}"
    )
    for r in records:
        print(
            f"  {r['variant']:<12}{r['status']:<13}{fmt(r['env_steps'], 'd'):>10}{fmt(r['wall_s'], '.2f'):>9}"
            f"{fmt(r['setup_s'], '.2f'):>9}{fmt(r['train_s'], '.2f'):>9}{fmt(ms_per_step(r), '.3f'):>9}{fmt(r['peak_rss_mb'], '.1f'):>13}"
            f"{fmt(r['threads'], 'd'):>9}"
        )
        if r["status"] == "ERROR":
            print(f"    exit code {r['returncode']}; last output:")
            for line in r.get("error_tail", []):
                print(f"    | {line}")


def median_or_nan(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def summarize(records: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    """Per variant medians over seeds (a run that did not reach the threshold counts as +inf).

    The verdict compares medians, as the issue states its targets; the paired ratio (median
    over seeds of ours' wall time / the other's on the same seed) is printed beside it.
    """
    summary: dict[str, Any] = {"variants": {}, "ratios": {}}
    runs_of = {v: [r for r in records if r["variant"] == v and r["status"] != "UNAVAILABLE"] for v in variants}
    for variant, runs in runs_of.items():
        if not runs:
            continue
        reached = [r for r in runs if r["status"] == "REACHED"]
        summary["variants"][variant] = {
            "runs": len(runs),
            "reached": len(reached),
            "median_wall_s": median_or_nan([r["wall_s"] if r["status"] == "REACHED" else math.inf for r in runs]),
            "median_setup_s": median_or_nan([r["setup_s"] for r in runs if r["setup_s"] is not None]),
            "median_env_steps": median_or_nan([r["env_steps"] if r["status"] == "REACHED" else math.inf for r in runs]),
            "median_ms_per_step": median_or_nan([ms for r in reached if (ms := ms_per_step(r)) is not None]),
            "max_peak_rss_mb": max((r["peak_rss_mb"] for r in runs if r["peak_rss_mb"] is not None), default=None),
        }
    ours = summary["variants"].get("ours")
    for other, target in TARGETS.items():
        theirs = summary["variants"].get(other)
        if ours is None or theirs is None:
            continue
        # inf / inf (neither's median run got there) is nan, which fails; x / inf = 0 passes.
        ratio = ours["median_wall_s"] / theirs["median_wall_s"]
        ours_by_seed = {r["seed"]: r for r in runs_of["ours"] if r["status"] == "REACHED"}
        paired = [ours_by_seed[r["seed"]]["wall_s"] / r["wall_s"]
                  for r in runs_of[other] if r["status"] == "REACHED" and r["seed"] in ours_by_seed]  # fmt: skip
        summary["ratios"][f"ours/{other}"] = {
            "ratio": ratio, "target": target, "pass": bool(ratio <= target), "paired_median": median_or_nan(paired),
        }  # fmt: skip
    return summary


def print_summary(summary: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\nsummary over seeds {args.seeds} (threshold {args.threshold:g}, at most {args.max_env_steps} env steps)")
    print(
        f"  {'variant':<12}{'reached':>9}{'median wall s':>15}{'median setup s':>16}{'median env steps':>18}"
        f"{'median ms/step':>16}{'max peak RSS MB':>17}"
    )
    for variant, s in summary["variants"].items():
        steps = s["median_env_steps"]
        steps_text = f">{args.max_env_steps}" if steps == math.inf else f"{steps:.0f}"
        wall = "never" if s["median_wall_s"] == math.inf else f"{s['median_wall_s']:.2f}"
        print(
            f"  {variant:<12}{s['reached']:>5}/{s['runs']:<3}{wall:>15}{s['median_setup_s']:>16.2f}{steps_text:>18}"
            f"{s['median_ms_per_step']:>16.3f}{fmt(s['max_peak_rss_mb'], '.1f'):>17}"
        )
    if not summary["ratios"]:
        print("verdict: n/a (needs `ours` and at least one of handwritten / sb3)")
        return
    parts = []
    for name, r in summary["ratios"].items():
        if math.isnan(r["ratio"]) or math.isinf(r["ratio"]) or r["ratio"] == 0:
            ratio = {0: "(only ours got there)", math.inf: "(ours never got there)"}.get(
                r["ratio"], "(neither got there)"
            )
        else:
            ratio = f"{r['ratio']:.2f}x"
        parts.append(
            f"{name} median wall {ratio} (target <= {r['target']:.2f}x) {'PASS' if r['pass'] else 'FAIL'}"
            + ("" if math.isnan(r["paired_median"]) else f" [paired per seed: {r['paired_median']:.2f}x]")
        )
    verdict = "PASS" if all(r["pass"] for r in summary["ratios"].values()) else "FAIL"
    print(f"verdict: {verdict}: " + "; ".join(parts))


def main() -> None:
    args = parse_args()
    if args.child == "ours":
        run_ours_child(args)
        return

    variants = available_variants(args.variants)
    info = print_versions()
    print(
        f"variants {variants}, seeds {args.seeds}, threshold {args.threshold:g}, max env steps {args.max_env_steps}; "
        f"threads: OMP_NUM_THREADS=MKL_NUM_THREADS={args.threads}, torch.set_num_threads({args.threads}) in every run; "
        f"device {args.device}"
    )

    records: list[dict[str, Any]] = []
    for index, seed in enumerate(args.seeds):
        seed_records = []
        for variant in rotated(variants, index):
            if variant not in variants:  # became unavailable at an earlier seed
                continue
            record = run_child(variant, seed, args)
            if record["status"] == "UNAVAILABLE":
                print(f"{variant}: unavailable ({record.get('reason', '')}); going on without it")
                variants.remove(variant)
                continue
            seed_records.append(record)
        records += seed_records
        print_seed_table(seed, sorted(seed_records, key=lambda r: VARIANTS.index(r["variant"])))

    summary = summarize(records, variants)
    print_summary(summary, args)
    if args.json:
        payload = {"config": {k: v for k, v in vars(args).items() if k not in ("child", "seed")},
                   "versions": info, "runs": records, "summary": summary}  # fmt: skip
        write_json(args.json, payload)


if __name__ == "__main__":
    main()
