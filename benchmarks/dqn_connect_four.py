"""Masked DQN on connect four against a fixed random opponent: the win rate it reaches, and how fast.

The issue's target: ">= 0.9 win rate against random at 500k agent steps". This trains
``examples/dqn_connect_four.yaml`` (``AgainstOpponentEnv``, the learner's seat alternating per
game) through ``LightningRLCLI`` for ``--env-steps`` moves of the learner, then plays the trained
module greedily (masked argmax) against the random opponent and the connect-four heuristic (win
now, else block, else random), ``--eval-games`` games each, half of them in each seat, from seeds
apart from training's.

Reported: win / draw / loss rates against each opponent (overall and per seat), the curve of the
config's own evaluations during training (``eval/episode_return_mean`` against random, which is
2 x win rate - 1 when no game is drawn) with the first env step it reached 0.8, the training
loop's env steps per second (``on_train_start`` to ``on_train_end``, evaluations included) and the
wall time. Timings on a shared machine drift: they say what one run took, on the machine named.

``--max-minutes`` stops training after that much wall time (a loaded machine's run is then
evaluated where it got to; ``stopped_by_max_minutes`` says so).

Run::

    python benchmarks/dqn_connect_four.py --env-steps 50000                     # a quick check
    nice -n 19 python benchmarks/dqn_connect_four.py --env-steps 500000 \\
        --json benchmarks/results/2026-11-27/dqn_connect_four.json
    python benchmarks/dqn_connect_four.py --env-steps 100000 \\
        --model.init_args.n_step 1   # a variant: arguments it does not know go to lightning-rl fit
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from lightning_rl.cli import LightningRLCLI
from lightning_rl.core.acting import compute_actions
from lightning_rl.core.action_masks import ACTION_MASK, OBSERVATION
from lightning_rl.core.rl_modules import RLModule
from lightning_rl.env.against_opponent import AgainstOpponentEnv

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = REPO_ROOT / "examples" / "dqn_connect_four.yaml"
TARGET_WIN_RATE = 0.9
# Evaluation games are seeded from here on, apart from the training envs' seeds.
EVAL_SEED_OFFSET = 1_000_000


class _TrainingClock(Callback):
    """The training loop's wall time and the config's evaluation curve, written to ``progress`` after each evaluation.

    So a long run that is stopped early still leaves what it measured.
    """

    def __init__(self, progress: Path | None, max_seconds: float | None) -> None:
        self.progress = progress
        self.max_seconds = max_seconds
        self.started = self.ended = 0.0
        self.curve: list[tuple[int, float]] = []

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.started = time.perf_counter()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        # A budget in wall time: on a loaded machine the run stops where it got to, and is evaluated there.
        if self.max_seconds is not None and time.perf_counter() - self.started > self.max_seconds:
            trainer.should_stop = True

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.ended = time.perf_counter()

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        value = trainer.callback_metrics.get("eval/episode_return_mean")
        if value is None:
            return
        env_steps = int(trainer.datamodule.num_env_steps_sampled_lifetime)
        self.curve.append((env_steps, round(float(value), 4)))
        if self.progress is not None:
            seconds = time.perf_counter() - self.started
            partial = {
                "finished": False,
                "env_steps": env_steps,
                "train_seconds": round(seconds, 1),
                "env_steps_per_s": round(env_steps / seconds, 1),
                "eval_during_training_vs_random": self.curve,
            }
            self.progress.parent.mkdir(parents=True, exist_ok=True)
            self.progress.write_text(json.dumps(partial, indent=1) + "\n")


def play(module: RLModule, opponent: str, games: int, seed: int) -> dict[str, Any]:
    """Greedy games of ``module`` against ``opponent``, seats alternating; win/draw/loss rates overall and per seat."""
    env = AgainstOpponentEnv(opponent, seat="alternate")
    results = {0: [], 1: []}
    for game in range(games):
        obs, info = env.reset(seed=seed + game)
        done, outcome = False, 0.0
        while not done:
            with torch.no_grad():
                _, action = compute_actions(
                    module,
                    torch.as_tensor(obs[OBSERVATION])[None],
                    explore=False,
                    with_logp=False,
                    action_mask=torch.as_tensor(obs[ACTION_MASK])[None],
                )
            obs, reward, terminated, truncated, _ = env.step(int(action[0]))
            outcome += reward
            done = terminated or truncated
        results[info["seat"]].append(outcome)

    def rates(outcomes: list[float]) -> dict[str, float]:
        count = max(len(outcomes), 1)
        return {
            "games": len(outcomes),
            "win_rate": sum(o > 0 for o in outcomes) / count,
            "draw_rate": sum(o == 0 for o in outcomes) / count,
            "loss_rate": sum(o < 0 for o in outcomes) / count,
        }

    return {**rates(results[0] + results[1]), "first_seat": rates(results[0]), "second_seat": rates(results[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-steps", type=int, default=500_000, help="learner moves to train for")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-games", type=int, default=400, help="games against each opponent after training")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--max-minutes", type=float, default=None, help="stop training after this wall time; evaluate what it reached"
    )
    parser.add_argument("--json", type=Path, default=None, help="the result (the curve so far after each evaluation)")
    # Any other arguments go to lightning-rl fit: a variant of the config.
    args, fit_args = parser.parse_known_args()
    torch.set_num_threads(args.threads)

    clock = _TrainingClock(args.json, None if args.max_minutes is None else 60 * args.max_minutes)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        cli = LightningRLCLI(
            args=[
                "fit", "--config", str(EXAMPLE),
                "--seed_everything", str(args.seed),
                "--trainer.default_root_dir", root,
                "--trainer.enable_progress_bar", "false",
                "--trainer.logger", "false",
                "--data.init_args.max_env_steps", str(args.env_steps),
                *fit_args,
            ],
            trainer_defaults={"callbacks": [clock]},
        )  # fmt: skip
    wall = time.perf_counter() - started
    module = cli.model.module["default_policy"].eval()
    env_steps = int(cli.datamodule.num_env_steps_sampled_lifetime)
    train_seconds = clock.ended - clock.started
    reached = next((step for step, value in clock.curve if value >= 2 * TARGET_WIN_RATE - 1), None)
    vs = {
        name: play(module, name, args.eval_games, EVAL_SEED_OFFSET + 10_000 * index)
        for index, name in enumerate(("random", "heuristic"))
    }
    result = {
        "benchmark": "dqn_connect_four",
        "finished": True,
        "config": str(EXAMPLE.relative_to(REPO_ROOT)),
        "fit_args": fit_args,
        "seed": args.seed,
        "env_steps": env_steps,
        "train_seconds": round(train_seconds, 1),
        "env_steps_per_s": round(env_steps / train_seconds, 1),
        "wall_seconds": round(wall, 1),
        "eval_during_training_vs_random": clock.curve,
        "first_env_step_with_eval_return_ge_0.8": reached,
        "vs": vs,
        "stopped_by_max_minutes": env_steps < args.env_steps,
        "target": f"win rate >= {TARGET_WIN_RATE} against random at {args.env_steps} env steps",
        "target_met": vs["random"]["win_rate"] >= TARGET_WIN_RATE,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": args.threads,
            "torch": torch.__version__,
        },
    }
    print(json.dumps(result, indent=1))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
