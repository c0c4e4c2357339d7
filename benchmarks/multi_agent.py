"""Cooperative multi-agent PPO on mpe2's simple_spread_v3: our ``Trainer.fit`` versus a hand-written IPPO.

What it measures, per seed, at the same env-step budget: the mean per-agent training return
over the last 100 completed episodes, and the training loop's env steps per second. Both
variants run the same algorithm with the same settings (MAPPO's MPE settings as the starting
point, see ``benchmarks/handwritten_ippo.py``): one policy shared by the 3 agents, 8 env copies
x 100 steps per rollout (2400 agent steps), 10 epochs of minibatches of 800 agent steps, lr
7e-4, gamma 0.99, GAE lambda 0.95 along each agent's own trajectory, clip 0.2, vf_coef 0.5
(unclipped MSE), entropy 0.01, global-norm clip 0.5, separate [64, 64] tanh policy and value
MLPs, Adam eps 1e-5, per-minibatch advantage normalization, truncations bootstrapped.

  ours         ``Trainer.fit`` of ``examples/ppo_simple_spread.yaml`` through ``LightningRLCLI``
               (this file, ``--child ours``), validation off (``limit_val_batches 0``), env copy
               i seeded with ``seed + i``;
  handwritten  ``benchmarks/handwritten_ippo.py``: single-file plain torch + PettingZoo IPPO;
  random       the hand-written loop with uniform random actions and no updates (``--random``),
               for ``--random-env-steps`` env steps: the baseline the returns must clear.

"Per-agent return": the hand-written loop divides each completed episode's return summed over
agents by the number of agents; ours is the mean over agents of the train item's
``agent_episode_return_mean/<agent>`` statistics (each over the runner's window of the last 100
completed episodes), read from the last train item in ``on_train_batch_start``, i.e. after the
last rollout and before its update, as the hand-written loop reads it. (Ours'
``episode_return_mean`` is RLlib's sum over agents, 3x the per-agent number.)

"env steps/s": env steps sampled / seconds of the training loop (first rollout to the end of
the last update; ours from ``on_train_start`` to ``on_train_end``), so start-up is left out.

Each run is a fresh subprocess, one at a time, ``--threads`` torch/OMP/MKL threads each; per
seed the variants' order rotates. The children print ``TRAINING_START time=<unix time>`` when
set-up is done and one JSON line with their result (``UNAVAILABLE reason=...`` when they cannot
run). The verdict is the issue's targets on the medians over seeds: ours' per-agent return >=
the hand-written one's and above random, and ours' env steps/s >= 0.85x the hand-written
loop's; ``gain`` is (ours - random) / (handwritten - random), how much of the hand-written
loop's improvement over random ours gets. Timings on a shared machine drift by +-25%: compare
within one invocation, and repeat it.

``--game connect_four`` measures self-play instead: ``Trainer.fit`` of
``examples/ppo_connect_four_selfplay.yaml`` (the league with PFSP, fixed opponents and the CNN;
``--config`` for another), one run per seed, validation on (it is what measures): at each of
the data module's evaluations (every epoch, ``evaluation_num_episodes`` games per fixed opponent,
half in each seat, greedy) the win rates ``eval/win_rate_vs_random`` and
``eval/win_rate_vs_heuristic``, and the league's state (size, snapshots added, main's mean and
lowest win rate over the league, its win rates against the fixed opponents, the share of
training games against them). The verdict is the issue's targets on every seed's final
evaluation: >= 0.95 against random and >= 0.6 against the heuristic. "env steps/s" is over the
whole training loop, evaluations included.

A final evaluation of 100 games per opponent has a standard error of 0.02-0.05, as large as the
misses it decides. ``--final-eval-games N`` saves the weights at the end of training and plays N
more games per fixed opponent with them (``lightning-rl evaluate --module_id main --opponent
random|heuristic --num_episodes N``: its held-out seeds, main in each seat N/2 times), reported
beside the in-training evaluation as ``final_eval`` (wins, draws, losses overall and per seat);
the verdict is then on these N games. ``--checkpoint-dir DIR`` keeps that checkpoint as
``DIR/connect_four_seed<S>.ckpt`` (otherwise it lives in a temporary directory), so that a run
can be evaluated again later.

Run::

    python benchmarks/multi_agent.py                                   # seeds 0 1 2, all variants
    python benchmarks/multi_agent.py --game connect_four --seeds 0 1 --env-steps 1000000 --json c4.json
    python benchmarks/multi_agent.py --game connect_four --seeds 0 1 --env-steps 1000000 --final-eval-games 400
    python benchmarks/multi_agent.py --variants handwritten random --seeds 0 1 2
    python benchmarks/multi_agent.py --env-steps 200000 --json multi_agent.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from _children import fmt, follow_child, parse_fields, print_versions, rotated, write_json

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
VARIANTS = ("ours", "handwritten", "random")
DEFAULT_CONFIG = "examples/ppo_simple_spread.yaml"
DEFAULT_ENV_STEPS = 100_000  # the example's max_env_steps
GAMES = ("simple_spread", "connect_four")
SELFPLAY_CONFIG = "examples/ppo_connect_four_selfplay.yaml"
SELFPLAY_TARGETS = {"win_rate_vs_random": 0.95, "win_rate_vs_heuristic": 0.6}  # the issue's, at the final evaluation
AGENT_RETURN_PREFIX = "agent_episode_return_mean/"
STEPS_PER_S_TARGET = 0.85  # ours' env steps/s / the hand-written loop's, at least


def default_config(game: str) -> str:
    """Our run's config when ``--config`` is not given: the example of ``game``."""
    return SELFPLAY_CONFIG if game == "connect_four" else DEFAULT_CONFIG


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=GAMES, default="simple_spread", help="connect_four: self-play (see above)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--env-steps", type=int, default=DEFAULT_ENV_STEPS, help="training budget of every run")
    parser.add_argument("--random-env-steps", type=int, default=8000, help="env steps of the random baseline")
    parser.add_argument("--threads", type=int, default=1, help="OMP/MKL threads and torch.set_num_threads of every run")
    parser.add_argument("--config", help=f"our run's config (relative to the repo root; default {DEFAULT_CONFIG}, "
                        f"for connect_four {SELFPLAY_CONFIG})")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before a run is killed")
    parser.add_argument(
        "--json", metavar="PATH", help="also write every run and the summary to this JSON file (after each run)"
    )
    parser.add_argument("--show-output", action="store_true", help="echo the children's other output lines")
    parser.add_argument("--rollouts-per-epoch", type=int, help="connect_four: evaluate every this many rollouts "
                        "(the data module's epoch; the config's 20 when unset)")  # fmt: skip
    parser.add_argument("--final-eval-games", type=int, default=0, metavar="N", help="connect_four: after training, "
                        "also play N games (even) per fixed opponent with the final weights; the verdict uses them")  # fmt: skip
    parser.add_argument("--checkpoint-dir", metavar="DIR", help="connect_four: keep each run's final checkpoint "
                        "here as connect_four_seed<S>.ckpt")  # fmt: skip
    parser.add_argument("--child", choices=["ours", "selfplay"], help=argparse.SUPPRESS)  # internal: run it here
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # the --child's seed
    args = parser.parse_args(argv)
    if args.config is None:
        args.config = default_config(args.game)
    for name in ("env_steps", "random_env_steps", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    # Even, so that main plays first and second equally often (evaluate seats it by turns).
    if args.final_eval_games < 0 or args.final_eval_games % 2:
        parser.error(f"--final-eval-games must be an even number >= 0, got {args.final_eval_games}")
    if args.child is None and args.game != "connect_four" and (args.final_eval_games or args.checkpoint_dir):
        parser.error("--final-eval-games and --checkpoint-dir are for --game connect_four")
    return args


# ----------------------------------------------------------------------------------------
# The `ours` child: Trainer.fit of the example config, reporting like the hand-written loop
# ----------------------------------------------------------------------------------------


def make_report_callback() -> Any:
    """A Lightning callback that times the training loop and keeps the last train item's statistics."""
    import lightning.pytorch as pl

    class ReportTrainingStats(pl.Callback):
        """Prints ``TRAINING_START`` when fit's loop starts; keeps what the result line needs.

        ``on_train_batch_start`` sees each train item after its rollout and before its update:
        its ``env_runners`` statistics hold the lifetime counters and the per-agent returns.
        """

        def __init__(self) -> None:
            self.stats: dict[str, Any] = {}
            self.start = self.end = math.nan

        def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
            self.start = time.time()
            print(f"TRAINING_START time={self.start:.6f}", flush=True)

        def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
            stats = getattr(batch, "env_runners", None)
            if stats:
                self.stats = dict(stats)

        def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
            self.end = time.time()

    return ReportTrainingStats()


def ours_result(stats: dict[str, Any], wall_s: float, seed: int) -> dict[str, Any]:
    """The hand-written loop's result fields, from the last train item's ``env_runners`` statistics.

    Raises:
        KeyError: When the statistics lack the lifetime counters or the per-agent returns.
    """
    agent_returns = [float(v) for k, v in stats.items() if k.startswith(AGENT_RETURN_PREFIX)]
    missing = [k for k in ("num_env_steps_sampled_lifetime", "num_agent_steps_sampled_lifetime") if k not in stats]
    if missing or not agent_returns:
        raise KeyError(f"the train item's env_runners lack {missing or AGENT_RETURN_PREFIX + '*'}; got {sorted(stats)}")
    env_steps = int(stats["num_env_steps_sampled_lifetime"])
    return {
        "env_steps": env_steps,
        "agent_steps": int(stats["num_agent_steps_sampled_lifetime"]),
        "wall_s": round(wall_s, 3),
        "env_steps_per_s": round(env_steps / wall_s, 1),
        "return_mean_per_agent": round(statistics.fmean(agent_returns), 3),
        "seed": seed,
        "random": False,
    }


def run_ours_child(args: argparse.Namespace) -> None:
    """``--child ours``: one Trainer.fit of the example config, ending with the result's JSON line."""
    import logging
    import warnings

    import torch

    torch.set_num_threads(args.threads)
    config = REPO_ROOT / args.config
    # Benchmark the checkout this file is in, whatever lightning_rl is installed (or not).
    sys.path.insert(0, str(REPO_ROOT))
    try:
        from lightning_rl.cli import LightningRLCLI
        from lightning_rl.data import MultiAgentDataModule  # noqa: F401  (the config needs it)
    except ImportError as error:
        print(f"UNAVAILABLE reason={error}", flush=True)
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
            "--data.init_args.seed", str(args.seed),       # env copy i starts from seed + i, as the hand-written loop
            "--data.init_args.max_env_steps", str(args.env_steps),
            "--trainer.logger", "false",
            "--trainer.enable_checkpointing", "false",
            "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false",
            "--trainer.limit_val_batches", "0",            # time training only, like the hand-written loop
            "--trainer.callbacks", "[]",
        ],
        run=False,
        save_config_callback=None,                          # no config.yaml written into the repo
    )  # fmt: skip
    report = make_report_callback()
    cli.trainer.callbacks.append(report)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    result = ours_result(report.stats, report.end - report.start, args.seed)
    result["threads"] = torch.get_num_threads()
    print(json.dumps(result), flush=True)


# ----------------------------------------------------------------------------------------
# The `selfplay` child: Trainer.fit of the connect-four example, its win rates at each evaluation
# ----------------------------------------------------------------------------------------


def make_selfplay_callback() -> Any:
    """A Lightning callback that times the training loop and keeps every evaluation's win rates and league state."""
    import lightning.pytorch as pl

    class ReportSelfPlay(pl.Callback):
        """Prints ``TRAINING_START``; after each validation, one history row of the metrics logged so far."""

        def __init__(self) -> None:
            self.history: list[dict[str, Any]] = []
            self.start = self.end = math.nan

        def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
            self.start = time.time()
            print(f"TRAINING_START time={self.start:.6f}", flush=True)

        def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
            metrics = trainer.callback_metrics
            row = {"env_steps": trainer.datamodule.num_env_steps_sampled_lifetime,
                   "wall_s": round(time.time() - self.start, 1)}  # fmt: skip
            for key, value in sorted(metrics.items()):
                if key.startswith(("eval/win_rate_vs_", "league/")):
                    row[key] = round(float(value), 4)
            self.history.append(row)
            print(f"EVALUATION {json.dumps(row)}", flush=True)

        def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
            self.end = time.time()

    return ReportSelfPlay()


def final_evaluation(ckpt_path: Path, num_games: int, seed: int, threads: int) -> dict[str, dict[str, Any]]:
    """``lightning-rl evaluate`` of ``ckpt_path``'s ``main`` against each fixed opponent, ``num_games`` games each.

    The command as a user runs it (in this process): its held-out seeds (the run's seed +
    5,000,000 on), greedy, main in each seat ``num_games / 2`` times.

    Args:
        ckpt_path: The run's final checkpoint; the ``--json`` records are written beside it.
        num_games: Games per opponent (even).
        seed: The run's seed, for the progress line.
        threads: ``evaluate --threads``.

    Returns:
        Per opponent name, from the command's ``--json`` record: ``num_episodes``, ``win_rate``,
        ``wins``, ``draws``, ``losses`` and per seat (``seats``).

    Raises:
        SystemExit: When the command refuses the checkpoint (its one-line error is on stderr).
    """
    import contextlib
    import io

    from lightning_rl.cli import evaluate_command

    results = {}
    for name in SELFPLAY_TARGETS:
        opponent = name.removeprefix("win_rate_vs_")
        out = ckpt_path.with_name(f"{ckpt_path.stem}_vs_{opponent}.json")
        # Its report would mix with the lines the driver parses; the same numbers are in the JSON.
        with contextlib.redirect_stdout(io.StringIO()):
            evaluate_command.main(
                ["--ckpt_path", str(ckpt_path), "--module_id", "main", "--opponent", opponent,
                 "--num_episodes", str(num_games), "--json", str(out), "--threads", str(threads)]
            )  # fmt: skip
        record = json.loads(out.read_text())
        results[opponent] = {key: record[key] for key in ("num_episodes", "win_rate", "wins", "draws", "losses")}
        results[opponent]["seats"] = {
            agent: {key: seat[key] for key in ("wins", "draws", "losses", "win_rate")}
            for agent, seat in record["seats"].items()
        }
        print(f"FINAL_EVAL seed={seed} opponent={opponent} win_rate={record['win_rate']:.4f}", flush=True)
    return results


def run_selfplay_child(args: argparse.Namespace) -> None:
    """``--child selfplay``: one Trainer.fit of the self-play config, ending with the result's JSON line."""
    import logging
    import tempfile
    import warnings

    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(REPO_ROOT))
    try:
        from lightning_rl.cli import LightningRLCLI
        from lightning_rl.data import MultiAgentDataModule  # noqa: F401  (the config needs it)
    except ImportError as error:
        print(f"UNAVAILABLE reason={error}", flush=True)
        return
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as root:  # the example's ModelCheckpoint writes here, not into the repo
        cli = LightningRLCLI(
            args=[
                "--config", str(REPO_ROOT / args.config),
                "--seed_everything", str(args.seed),
                "--data.init_args.seed", str(args.seed),
                "--data.init_args.max_env_steps", str(args.env_steps),
                "--trainer.logger", "false",
                "--trainer.default_root_dir", root,
                "--trainer.enable_progress_bar", "false",
                "--trainer.enable_model_summary", "false",
                *(["--data.init_args.rollouts_per_epoch", str(args.rollouts_per_epoch)] if args.rollouts_per_epoch else []),
            ],
            run=False,
            save_config_callback=None,
        )  # fmt: skip
        report = make_selfplay_callback()
        cli.trainer.callbacks.append(report)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        final_eval = None
        if args.final_eval_games or args.checkpoint_dir:
            ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else Path(root)
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            # The weights as training left them (ModelCheckpoint's last.ckpt may predate the last update).
            ckpt_path = ckpt_dir / f"connect_four_seed{args.seed}.ckpt"
            cli.trainer.save_checkpoint(ckpt_path)
            if args.final_eval_games:
                final_eval = final_evaluation(ckpt_path, args.final_eval_games, args.seed, args.threads)
    env_steps = cli.datamodule.num_env_steps_sampled_lifetime
    wall_s = report.end - report.start
    final = report.history[-1] if report.history else {}
    result = {
        "env_steps": env_steps,
        "agent_steps": cli.datamodule.num_agent_steps_sampled_lifetime,
        "wall_s": round(wall_s, 1),
        "env_steps_per_s": round(env_steps / wall_s, 1),
        "seed": args.seed,
        "threads": torch.get_num_threads(),
        "history": report.history,
    }
    for name in SELFPLAY_TARGETS:
        values = [row[f"eval/{name}"] for row in report.history if f"eval/{name}" in row]
        result[name] = final.get(f"eval/{name}")
        result[f"best_{name}"] = max(values) if values else None
    result["snapshots_added"] = final.get("league/snapshots_added")
    if final_eval is not None:
        result["final_eval"] = final_eval
    print(json.dumps(result), flush=True)


def selfplay_main(args: argparse.Namespace) -> None:
    """The connect-four driver: one self-play run per seed, a table, and the verdict on the final win rates."""
    info = print_versions()
    print(f"connect-four self-play ({args.config}), seeds {args.seeds}, {args.env_steps} env steps, {args.threads} threads")
    records = []
    for seed in args.seeds:
        record: dict[str, Any] = {"variant": "selfplay", "seed": seed, "status": "ERROR", "setup_s": None}

        def handle(head: str, line: str, launch: float, record: dict[str, Any] = record) -> bool:
            if head == "UNAVAILABLE":
                record.update(status="UNAVAILABLE", reason=parse_fields(line).get("reason", ""))
                return True
            if head == "EVALUATION":
                print(f"seed {seed}: {line.split(' ', 1)[1]}", flush=True)
                return True
            if head == "FINAL_EVAL":
                print(f"seed {seed}: {line}", flush=True)
                return True
            if not line.startswith("{"):
                return False
            record.update(json.loads(line), status="OK")
            return True

        command = [sys.executable, str(Path(__file__).resolve()), "--child", "selfplay", "--config", args.config,
                   "--env-steps", str(args.env_steps), "--seed", str(seed), "--threads", str(args.threads),
                   *(["--rollouts-per-epoch", str(args.rollouts_per_epoch)] if args.rollouts_per_epoch else []),
                   *(["--final-eval-games", str(args.final_eval_games)] if args.final_eval_games else []),
                   *(["--checkpoint-dir", str(Path(args.checkpoint_dir).resolve())] if args.checkpoint_dir else [])]  # fmt: skip
        returncode, other_lines, _ = follow_child(
            command, record, handle, threads=args.threads, timeout=args.timeout, show_output=args.show_output
        )
        record["returncode"] = returncode
        if returncode != 0 or record["status"] != "OK":
            record["status"] = "ERROR" if record["status"] != "UNAVAILABLE" else record["status"]
            record["error_tail"] = other_lines[-15:]
            print(f"seed {seed}: {record['status']}; last output:", *record["error_tail"], sep="\n    | ")
        records.append(record)
        save_runs(args, info, records, announce=False)

    games = args.final_eval_games
    print(f"\n{'seed':<6}{'vs random (final/best)':>24}{'vs heuristic (final/best)':>27}"
          + (f"{f'{games} games: random':>20}{'heuristic':>11}" if games else "")
          + f"{'snapshots':>11}{'env steps':>11}{'steps/s':>9}")  # fmt: skip
    checks = []
    for record in records:
        if record["status"] != "OK":
            continue
        rnd, heu = record["win_rate_vs_random"], record["win_rate_vs_heuristic"]
        final_eval = record.get("final_eval")
        big = {name: final_eval[name.removeprefix("win_rate_vs_")]["win_rate"] for name in SELFPLAY_TARGETS} if final_eval else {}
        print(f"{record['seed']:<6}{fmt(rnd, '.2f') + ' / ' + fmt(record['best_win_rate_vs_random'], '.2f'):>24}"
              f"{fmt(heu, '.2f') + ' / ' + fmt(record['best_win_rate_vs_heuristic'], '.2f'):>27}"
              + (f"{fmt(big['win_rate_vs_random'], '.3f'):>20}{fmt(big['win_rate_vs_heuristic'], '.3f'):>11}" if big else "")
              + f"{fmt(record['snapshots_added'], '.0f'):>11}{record['env_steps']:>11}{record['env_steps_per_s']:>9.0f}")  # fmt: skip
        # The verdict is on the larger final evaluation when there is one: 100 games decide 0.01-0.04 by noise.
        for name, target in SELFPLAY_TARGETS.items():
            value = big.get(name, record[name])
            label = f"{games} games" if big else "final evaluation"
            checks.append((f"seed {record['seed']} {name} {fmt(value, '.3f' if big else '.2f')} ({label}) >= {target}",
                           value is not None and value >= target))  # fmt: skip
    ok = bool(checks) and all(passed for _, passed in checks) and all(r["status"] == "OK" for r in records)
    print(f"verdict: {'PASS' if ok else 'FAIL'}: " + "; ".join(f"{t} {'PASS' if p else 'FAIL'}" for t, p in checks))
    save_runs(args, info, records)


# ----------------------------------------------------------------------------------------
# The driver: one fresh subprocess per (seed, variant), in sequence
# ----------------------------------------------------------------------------------------


def child_command(variant: str, seed: int, args: argparse.Namespace) -> list[str]:
    common = ["--seed", str(seed), "--threads", str(args.threads)]
    if variant == "ours":
        return [sys.executable, str(Path(__file__).resolve()), "--child", "ours", "--config", args.config,
                "--env-steps", str(args.env_steps), *common]  # fmt: skip
    hand_written = [sys.executable, str(BENCH_DIR / "handwritten_ippo.py"), *common]
    if variant == "random":
        return [*hand_written, "--random", "--env-steps", str(args.random_env_steps)]
    return [*hand_written, "--env-steps", str(args.env_steps)]


def run_child(variant: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Launch one run, follow its lines, and return its record (``status`` OK, UNAVAILABLE or ERROR)."""
    record: dict[str, Any] = {"variant": variant, "seed": seed, "status": "ERROR", "setup_s": None}

    def handle(head: str, line: str, launch: float) -> bool:
        if head == "UNAVAILABLE":
            record.update(status="UNAVAILABLE", reason=parse_fields(line).get("reason", ""))
            return True
        if not line.startswith("{"):
            return False
        result = json.loads(line)
        result.pop("setup_s", None)  # the driver measures it from the launch, for every variant alike
        record.update(result, status="OK")
        return True

    returncode, other_lines, _ = follow_child(
        child_command(variant, seed, args), record, handle,
        threads=args.threads, timeout=args.timeout, show_output=args.show_output,
    )  # fmt: skip
    record["returncode"] = returncode
    if returncode != 0 or record["status"] == "ERROR":
        record["status"] = "ERROR"
        record["error_tail"] = other_lines[-15:]
    return record


def value_of(records: dict[str, dict[str, Any]], variant: str, key: str) -> float | None:
    record = records.get(variant)
    return record[key] if record is not None and record["status"] == "OK" else None


def gain(ours: float | None, handwritten: float | None, random: float | None) -> float | None:
    """(ours - random) / (handwritten - random): the share of the hand-written loop's gain over random that ours gets."""
    if None in (ours, handwritten, random) or handwritten == random:
        return None
    return (ours - random) / (handwritten - random)


def ratio(ours: float | None, handwritten: float | None) -> float | None:
    return None if ours is None or not handwritten else ours / handwritten


def print_table(rows: list[tuple[str, dict[str, dict[str, Any]]]]) -> None:
    """One line per seed (and the medians): per-agent returns, env steps/s, and ours against the hand-written loop."""
    print(
        f"\n{'seed':<8}{'ours return':>12}{'hw return':>11}{'random':>9}{'ours - hw':>11}{'gain':>7}"
        f"{'ours steps/s':>14}{'hw steps/s':>12}{'ours/hw':>9}{'env steps':>11}"
    )
    for label, by_variant in rows:
        ours, hw, rnd = (value_of(by_variant, v, "return_mean_per_agent") for v in VARIANTS)
        ours_sps, hw_sps = (value_of(by_variant, v, "env_steps_per_s") for v in ("ours", "handwritten"))
        diff = None if ours is None or hw is None else ours - hw
        steps = value_of(by_variant, "handwritten", "env_steps") or value_of(by_variant, "ours", "env_steps")
        print(
            f"{label:<8}{fmt(ours, '.2f'):>12}{fmt(hw, '.2f'):>11}{fmt(rnd, '.2f'):>9}{fmt(diff, '+.2f'):>11}"
            f"{fmt(gain(ours, hw, rnd), '.2f'):>7}{fmt(ours_sps, '.0f'):>14}{fmt(hw_sps, '.0f'):>12}"
            f"{fmt(ratio(ours_sps, hw_sps), '.2f'):>9}{fmt(steps, '.0f'):>11}"
        )
    for _, by_variant in rows:
        for record in by_variant.values():
            if record["status"] == "ERROR":
                print(f"{record['variant']} seed {record['seed']}: exit code {record['returncode']}; last output:")
                for line in record.get("error_tail", []):
                    print(f"    | {line}")


def medians(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant, a record of the medians over its successful runs (absent: no successful run)."""
    summary: dict[str, dict[str, Any]] = {}
    for variant in VARIANTS:
        runs = [r for r in records if r["variant"] == variant and r["status"] == "OK"]
        if runs:
            summary[variant] = {"variant": variant, "status": "OK", "runs": len(runs)}
            for key in ("return_mean_per_agent", "env_steps_per_s", "env_steps"):
                summary[variant][key] = statistics.median(r[key] for r in runs)
    return summary


def verdict(summary: dict[str, dict[str, Any]]) -> str:
    """The issue's targets on the medians, as one line."""
    ours, hw, rnd = (value_of(summary, v, "return_mean_per_agent") for v in VARIANTS)
    if ours is None or hw is None:
        return "verdict: n/a (needs ours and handwritten)"
    speed = ratio(value_of(summary, "ours", "env_steps_per_s"), value_of(summary, "handwritten", "env_steps_per_s"))
    checks = [
        (f"return ours {ours:.2f} >= hand-written {hw:.2f}", ours >= hw),
        (
            f"env steps/s ours/hw {speed:.2f}x >= {STEPS_PER_S_TARGET}x",
            speed is not None and speed >= STEPS_PER_S_TARGET,
        ),
    ]
    if rnd is not None:
        checks.append((f"above random {rnd:.2f}", ours > rnd))
    parts = [f"{text} {'PASS' if ok else 'FAIL'}" for text, ok in checks]
    return f"verdict: {'PASS' if all(ok for _, ok in checks) else 'FAIL'}: " + "; ".join(parts)


def main() -> None:
    args = parse_args()
    if args.child == "ours":
        run_ours_child(args)
        return
    if args.child == "selfplay":
        run_selfplay_child(args)
        return
    if args.game == "connect_four":
        selfplay_main(args)
        return

    variants = list(dict.fromkeys(args.variants))
    info = print_versions()
    print(
        f"variants {variants}, seeds {args.seeds}, {args.env_steps} env steps (random: {args.random_env_steps}); "
        f"threads: OMP_NUM_THREADS=MKL_NUM_THREADS={args.threads}, torch.set_num_threads({args.threads}) in every run"
    )
    records: list[dict[str, Any]] = []
    rows: list[tuple[str, dict[str, dict[str, Any]]]] = []
    for index, seed in enumerate(args.seeds):
        by_variant: dict[str, dict[str, Any]] = {}
        for variant in rotated(variants, index):
            if variant not in variants:  # became unavailable at an earlier seed
                continue
            record = run_child(variant, seed, args)
            if record["status"] == "UNAVAILABLE":
                print(f"{variant}: unavailable ({record.get('reason', '')}); going on without it")
                variants.remove(variant)
                continue
            print(f"seed {seed} {variant}: {record['status']} {fmt(record.get('return_mean_per_agent'), '.2f')} "
                  f"per agent, {fmt(record.get('env_steps_per_s'), '.0f')} env steps/s", flush=True)  # fmt: skip
            by_variant[variant] = record
            records.append(record)
            save_runs(args, info, records, summary=medians(records), announce=False)
        rows.append((str(seed), by_variant))

    summary = medians(records)
    print_table([*rows, ("median", summary)])
    print(verdict(summary))
    save_runs(args, info, records, summary=summary)


def save_runs(
    args: argparse.Namespace,
    info: dict[str, Any],
    records: list[dict[str, Any]],
    *,
    summary: dict[str, dict[str, Any]] | None = None,
    announce: bool = True,
) -> None:
    """Write ``--json`` (if given) with the runs so far: after every run, so a stopped benchmark keeps what finished."""
    if not args.json:
        return
    payload = {"config": {k: v for k, v in vars(args).items() if k not in ("child", "seed")},
               "versions": info, "runs": records}  # fmt: skip
    if summary is not None:
        payload["summary"] = summary
    write_json(args.json, payload, announce=announce)


if __name__ == "__main__":
    main()
