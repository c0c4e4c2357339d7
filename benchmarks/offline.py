"""Offline RL beside d3rlpy: our CQL and IQL against d3rlpy's on the same Minari dataset, settings and gradient steps.

    python benchmarks/offline.py --d3rlpy-python /path/to/d3rlpy-venv/bin/python \
        --datasets pendulum/sac-medium-v0 pendulum/sac-medium-replay-v0 --algos cql iql --seeds 0 1

What it measures, per (algorithm, dataset, seed) and per variant:

  steps/s       gradient steps per second of the training loop, from the end of the first
                step to the end of the last (batch 256; set-up, the first step's warm-up and
                evaluation left out, alike in both variants);
  eval return   the mean return of ``--eval-episodes`` greedy episodes after training, in the
                dataset's env, episode ``i`` reset with seed ``1_000_000 + i`` in both variants;
                ``--eval-at`` also evaluates after those gradient steps of the run (``evals``
                in the JSON), with the training's random state set aside and its time left
                out of steps/s, so one long run also reports the shorter budgets;
  dataset       the mean episode return of the dataset itself (what offline RL should beat).

The variants:

  ours    ``Trainer.fit`` of ``CQLLearner`` / ``IQLLearner`` on ``OfflineDataModule`` (this file,
          ``--child``), one epoch of ``--steps`` gradient steps; logger, checkpoints, progress bar
          and validation off; evaluated with ``Policy`` (the greedy action) as
          ``lightning-rl evaluate`` does;
  d3rlpy  ``benchmarks/_d3rlpy_offline.py`` under ``--d3rlpy-python``: d3rlpy 2.8's ``CQL`` /
          ``IQL`` on the same rows exported to its ``MDPDataset`` layout (a truncated episode
          keeps its final observation as the next observation of its last step), with the same
          settings (``SETTINGS`` below: network sizes, learning rates, batch size, discount,
          target step, and each algorithm's own coefficients) and a min-max action scaler to
          [-1, 1], the range our modules train in. d3rlpy 2.8 pins gymnasium 1.0, so it lives in
          a virtual environment of its own (``python -m venv d3rlpy-venv && d3rlpy-venv/bin/pip
          install torch==2.13.0 d3rlpy==2.8.1``).

``--cql-update-order critics_first`` runs our CQL in d3rlpy's order (critics, then the actor
against the updated critics); the default is our ``"joint"`` one-pass step.
``--sample-with-replacement`` has our data module draw every minibatch's rows with replacement, as
d3rlpy's replay buffer does; by default ours visits each row once per pass, in a new order each pass.
Two more bring our CQL's last differences from d3rlpy's into a run, for checks (neither is in the
package; see :func:`cql_learner_class`): ``--cql-temperature-loss alpha`` (d3rlpy's temperature loss,
on ``alpha`` instead of ``log_alpha``) and ``--cql-critic-eps 5e-9`` (d3rlpy's critic loss is twice
ours, so its Adam ``eps`` of 1e-8 acts as 5e-9 on ours). Runs with any of these four set are
variants of their own in ``seed_noise.py`` (``OURS_OPTIONS``).

CQL runs without the Lagrangian (d3rlpy: ``alpha_learning_rate=0`` and ``initial_alpha=1``,
which leaves its penalty ``w * (gap - 10)``: the same gradients as our ``cql_weight=w``), with
d3rlpy's weight ``w`` of 5 unless ``--cql-weight`` sets another in both libraries; such runs are a
task of their own in ``seed_noise.py`` (``SHARED_OPTIONS``). ``examples/cql_pendulum.yaml`` trains
with weight 20 for 4,000 steps (``--cql-weight 20 --steps 4000`` here), which the first runs here
found better on Pendulum; the defaults stay those of the earlier runs, whose files predate the flags.
Every child is a fresh process, one at a time, with ``--threads`` intra-op threads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _children import follow_child, print_versions, write_json  # noqa: E402

# d3rlpy's settings with the examples' [64, 64] networks (d3rlpy's default [256, 256] runs CQL at ~4
# gradient steps/s on one CPU thread, in both libraries). IQL's are iql_pendulum.yaml's, and so is its
# budget (max_epochs x updates_per_epoch); examples/cql_pendulum.yaml has weight 20 and 4,000 steps
# (see the module docstring), where CQL's defaults here are d3rlpy's weight 5 and the first runs' 8,000.
HIDDEN = [64, 64]
STEPS = {"cql": 8000, "iql": 5000}
# IQL's advantage temperature (d3rlpy's weight_temp, default 3.0, tuned for rewards of about 1 per
# step); the examples' is lower for Pendulum's rewards of up to -16 per step (see iql_pendulum.yaml).
IQL_BETA = 0.3
# The shared settings, as (ours, d3rlpy's) keyword arguments.
SETTINGS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "cql": (
        dict(actor_lr=1e-4, critic_lr=3e-4, alpha_lr=1e-4, initial_alpha=1.0, cql_weight=5.0, num_cql_actions=10),
        dict(
            actor_learning_rate=1e-4,
            critic_learning_rate=3e-4,
            temp_learning_rate=1e-4,
            initial_temperature=1.0,
            conservative_weight=5.0,
            n_action_samples=10,
            alpha_learning_rate=0.0,
            initial_alpha=1.0,
        ),
    ),
    "iql": (
        dict(actor_lr=3e-4, critic_lr=3e-4, value_lr=3e-4, expectile=0.7, beta=3.0, max_weight=100.0),
        dict(actor_learning_rate=3e-4, critic_learning_rate=3e-4, expectile=0.7, weight_temp=3.0, max_weight=100.0),
    ),
}
COMMON = (dict(gamma=0.99, tau=0.005), dict(gamma=0.99, tau=0.005, batch_size=256))
# The options that change our variant's training, with their defaults (the example's settings): a run
# with another value is a variant of its own when seeds are pooled (seed_noise.py).
OURS_OPTIONS: dict[str, Any] = {
    "cql_update_order": "joint",
    "sample_with_replacement": False,
    "cql_temperature_loss": "log_alpha",
    "cql_critic_eps": None,
}
# The options that change both libraries' training alike (the task, not the variant), with their defaults.
SHARED_OPTIONS: dict[str, Any] = {"cql_weight": SETTINGS["cql"][0]["cql_weight"]}
BATCH_SIZE = 256
EVAL_SEED = 1_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["pendulum/sac-medium-v0", "pendulum/sac-medium-replay-v0"])
    parser.add_argument("--algos", nargs="+", choices=sorted(SETTINGS), default=sorted(SETTINGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--steps", type=int, default=None, help=f"gradient steps per run (default {STEPS})")
    parser.add_argument("--hidden", nargs="+", type=int, default=HIDDEN, help="hidden layer sizes of every network")
    parser.add_argument(
        "--iql-beta", type=float, default=IQL_BETA, help=f"IQL's advantage temperature (d3rlpy weight_temp; {IQL_BETA})"
    )
    parser.add_argument(
        "--cql-weight",
        type=float,
        default=SHARED_OPTIONS["cql_weight"],
        help="CQL's penalty weight in both libraries (d3rlpy conservative_weight, default 5; the example's 20)",
    )
    parser.add_argument(
        "--cql-update-order",
        choices=["joint", "critics_first"],
        default="joint",
        help="our CQL's update_order (d3rlpy's own order is critics_first)",
    )
    parser.add_argument(
        "--sample-with-replacement",
        action="store_true",
        help="our OfflineDataModule draws rows with replacement, as d3rlpy does (default: each row once per pass)",
    )
    parser.add_argument(
        "--cql-temperature-loss",
        choices=["log_alpha", "alpha"],
        default="log_alpha",
        help="our CQL's temperature loss: on log_alpha (ours, SAC's) or on alpha (d3rlpy's)",
    )
    parser.add_argument(
        "--cql-critic-eps", type=float, default=None, help="our CQL critics' Adam eps (default: Adam's 1e-8)"
    )
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument(
        "--eval-at", nargs="+", type=int, default=[], help="also evaluate after these gradient steps of each run"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--d3rlpy-python", default=None, help="a Python with d3rlpy 2.8 (left out: ours only)")
    parser.add_argument("--json", default=None, help="also write the runs to this file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        run_ours(json.loads(args.child))
        return
    print_versions()
    steps = {algo: args.steps or STEPS[algo] for algo in args.algos}
    if any(not 0 < at < min(steps.values()) for at in args.eval_at):
        parser.error(f"--eval-at takes gradient steps between 0 and the run's last ({min(steps.values())}) exclusive")
    print(f"gradient steps {steps} of batch {BATCH_SIZE}, hidden {args.hidden}, {args.threads} thread(s)")
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for dataset_id in args.datasets:
            exported, dataset_mean, env_id = export_for_d3rlpy(dataset_id, Path(scratch))
            for algo in args.algos:
                for index, seed in enumerate(args.seeds):
                    variants = ["ours", "d3rlpy"] if args.d3rlpy_python else ["ours"]
                    for variant in variants[index % len(variants) :] + variants[: index % len(variants)]:
                        run = {"variant": variant, "algo": algo, "dataset": dataset_id, "seed": seed}
                        run["dataset_return_mean"] = dataset_mean
                        run.update(run_child(variant, algo, dataset_id, env_id, exported, seed, steps[algo], args))
                        runs.append(run)
                        earlier = "".join(
                            f", after {at}: {np.mean(run['evals'][str(at)]):.1f}" for at in args.eval_at
                        )
                        print(
                            f"  {algo} {dataset_id} seed {seed} {variant:>6}: {run['steps_per_s']:.1f} steps/s, "
                            f"eval {run['eval_return_mean']:.1f}{earlier}",
                            flush=True,
                        )
    print_table(runs)
    if args.json:
        write_json(args.json, {"args": vars(args), "runs": runs})


def export_for_d3rlpy(dataset_id: str, scratch: Path) -> tuple[Path, float, str]:
    """Write the dataset's rows in d3rlpy's flat ``MDPDataset`` layout.

    Returns:
        The file, the mean episode return, and the env (the id of the dataset's env spec) both
        variants evaluate in.
    """
    import gymnasium as gym

    from lightning_rl.data.dataset_rows import open_dataset

    dataset = open_dataset(dataset_id)  # refuses datasets whose loading would build an env named in the data
    env_id = None if dataset.env_spec is None else dataset.env_spec.id
    if env_id is None or ":" in env_id or env_id not in gym.registry:
        raise SystemExit(f"{dataset_id}: its env {env_id!r} is not a registered gymnasium id to evaluate in")
    columns: dict[str, list[np.ndarray]] = {
        name: [] for name in ("observations", "actions", "rewards", "terminals", "timeouts")
    }
    returns = []
    for episode in dataset.iterate_episodes():
        steps = len(episode.rewards)
        terminated = bool(episode.terminations[-1])
        # A terminated episode ends on its last step; a truncated one keeps its final observation as one
        # more row (its action and reward unused), which d3rlpy reads as that step's next observation.
        rows = steps if terminated else steps + 1
        columns["observations"].append(np.asarray(episode.observations[:rows], dtype=np.float32))
        actions = np.asarray(episode.actions, dtype=np.float32).reshape(steps, -1)
        if not terminated:
            actions = np.concatenate([actions, np.zeros_like(actions[:1])])
        columns["actions"].append(actions)
        columns["rewards"].append(np.concatenate([episode.rewards, np.zeros(rows - steps)]).astype(np.float32))
        ends = np.zeros(rows, dtype=np.float32)
        ends[-1] = 1.0
        columns["terminals"].append(ends if terminated else np.zeros(rows, dtype=np.float32))
        columns["timeouts"].append(np.zeros(rows, dtype=np.float32) if terminated else ends)
        returns.append(float(np.sum(episode.rewards)))
    path = scratch / (dataset_id.replace("/", "__") + ".npz")
    np.savez(path, **{name: np.concatenate(parts) for name, parts in columns.items()})
    return path, float(np.mean(returns)), env_id


def run_child(
    variant: str,
    algo: str,
    dataset_id: str,
    env_id: str,
    exported: Path,
    seed: int,
    steps: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    ours, theirs = SETTINGS[algo]
    if algo == "iql":
        ours, theirs = {**ours, "beta": args.iql_beta}, {**theirs, "weight_temp": args.iql_beta}
    else:
        ours = {**ours, "cql_weight": args.cql_weight, "update_order": args.cql_update_order}
        theirs = {**theirs, "conservative_weight": args.cql_weight}
    if variant == "ours":
        spec = dict(
            algo=algo,
            dataset_id=dataset_id,
            env_id=env_id,
            seed=seed,
            steps=steps,
            hidden=args.hidden,
            eval_episodes=args.eval_episodes,
            eval_at=args.eval_at,
            sample_with_replacement=args.sample_with_replacement,
            temperature_loss=args.cql_temperature_loss,
            critic_eps=args.cql_critic_eps,
            threads=args.threads,
            settings={**COMMON[0], **ours},
        )
        command = [sys.executable, __file__, "--child", json.dumps(spec)]
    else:
        settings = {**COMMON[1], **theirs, "hidden_units": args.hidden}
        command = [
            args.d3rlpy_python,
            str(Path(__file__).with_name("_d3rlpy_offline.py")),
            "--data",
            str(exported),
            "--algo",
            algo,
            "--steps",
            str(steps),
            "--seed",
            str(seed),
            "--settings",
            json.dumps(settings),
            "--eval-episodes",
            str(args.eval_episodes),
            "--eval-seed",
            str(EVAL_SEED),
            "--eval-at",
            *map(str, args.eval_at),
            "--threads",
            str(args.threads),
            "--env",
            env_id,
        ]
    result: dict[str, Any] = {}

    def handle(head: str, line: str, launch: float) -> bool:
        if head == "RESULT":
            result.update(json.loads(line.split(" ", 1)[1]))
            return True
        return False

    record = {"variant": variant}
    returncode, other_lines, _ = follow_child(
        command, record, handle, threads=args.threads, timeout=6 * 3600, show_output=False
    )
    if returncode != 0 or not result:
        raise SystemExit(
            f"{variant} {algo} {dataset_id} seed {seed} failed ({returncode}):\n" + "\n".join(other_lines[-30:])
        )
    return {
        "steps_per_s": result["steps"] / result["seconds"],
        "train_s": result["seconds"],
        "eval_return_mean": float(np.mean(result["eval_returns"])),
        "eval_returns": result["eval_returns"],
        "evals": {**result["evals"], str(steps): result["eval_returns"]},
    }


def run_ours(spec: dict[str, Any]) -> None:
    """The ``ours`` child: train, time the training loop, evaluate greedily; print ``RESULT {...}``."""
    import torch

    torch.set_num_threads(spec["threads"])
    from lightning.pytorch import Callback, Trainer, seed_everything

    from lightning_rl.algorithms.iql import IQLLearner
    from lightning_rl.data import OfflineDataModule
    from lightning_rl.policy import Policy

    def evaluate() -> list[float]:
        return evaluate_greedy(Policy.from_learner(learner), spec["env_id"], spec["eval_episodes"])

    class TrainingTime(Callback):
        """The end of every gradient step (one per train item), less the time of evaluations in between."""

        def __init__(self) -> None:
            self.step_ends: list[float] = []
            self.evals: dict[str, list[float]] = {}
            self.eval_seconds = 0.0

        def on_train_batch_end(self, *args: Any) -> None:
            self.step_ends.append(time.perf_counter() - self.eval_seconds)
            if len(self.step_ends) in spec["eval_at"]:
                start = time.perf_counter()
                with torch.random.fork_rng():  # the training's draws stay those of a run without this evaluation
                    self.evals[str(len(self.step_ends))] = evaluate()
                self.eval_seconds += time.perf_counter() - start

    seed_everything(spec["seed"], verbose=False)
    if spec["algo"] == "cql":
        learner_class = cql_learner_class(spec["temperature_loss"], spec["critic_eps"])
    else:
        learner_class = IQLLearner
    learner = learner_class(model_config={"fcnet_hiddens": spec["hidden"]}, **spec["settings"])
    data = OfflineDataModule(
        spec["dataset_id"],
        batch_size=BATCH_SIZE,
        updates_per_epoch=spec["steps"],
        seed=spec["seed"],
        sample_with_replacement=spec["sample_with_replacement"],
    )
    timer = TrainingTime()
    trainer = Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[timer],
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(learner, datamodule=data)
    seconds = timer.step_ends[-1] - timer.step_ends[0]
    result = {"seconds": seconds, "steps": len(timer.step_ends) - 1, "eval_returns": evaluate(), "evals": timer.evals}
    print("RESULT " + json.dumps(result), flush=True)


def evaluate_greedy(policy: Any, env_id: str, episodes: int, num_envs: int = 10) -> list[float]:
    """The ``ours`` variant's evaluation: the returns of ``episodes`` greedy episodes of ``policy`` in ``env_id``.

    Episode ``i`` resets with seed ``EVAL_SEED + i``; ``num_envs`` episodes step side by side
    (``lightning-rl evaluate``'s ``play_episodes``).
    """
    from lightning_rl.cli.evaluate_command import EnvSource, play_episodes

    source = EnvSource(env_id, {}, [], "the dataset", None)
    return play_episodes(policy, source, episodes, EVAL_SEED, num_envs=num_envs).returns.tolist()


def cql_learner_class(temperature_loss: str = "log_alpha", critic_eps: float | None = None) -> type:
    """``CQLLearner``, or a subclass with d3rlpy's temperature loss and/or critics' Adam ``eps``.

    For checks against d3rlpy only (the package keeps SAC's temperature loss and Adam's default):

    Args:
        temperature_loss: ``"log_alpha"`` for ours, ``-log_alpha * (log pi + target_entropy)``;
            ``"alpha"`` for d3rlpy's, ``-alpha * (log pi + target_entropy)``, whose gradient in
            ``log_alpha`` is ``alpha`` times ours.
        critic_eps: The ``"qf"`` Adam's ``eps``; ``None`` keeps Adam's 1e-8.
    """
    from lightning_rl.algorithms.cql import CQLLearner
    from lightning_rl.algorithms.sac import ACTION_LOGP_RESAMPLED, ALPHA_OPTIMIZER, QF_OPTIMIZER

    if temperature_loss == "log_alpha" and critic_eps is None:
        return CQLLearner

    class D3rlpyMatchedCQLLearner(CQLLearner):
        def configure_optimizers_for_module(self, module_id: str, config: Any) -> None:
            super().configure_optimizers_for_module(module_id, config)
            if critic_eps is not None:
                for group in self.get_optimizer(module_id, QF_OPTIMIZER).param_groups:
                    group["eps"] = critic_eps

        def compute_loss_for_module(self, *, module_id: str, config: Any, batch: Any, fwd_out: Any) -> Any:
            loss = super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
            if temperature_loss == "alpha" and self.in_gradient_phase(ALPHA_OPTIMIZER):
                # SAC's loss holds -log_alpha * c (c = mean(log pi + target_entropy), a constant); adding
                # (log_alpha - alpha) * c leaves d3rlpy's -alpha * c in its place.
                log_alpha = self.module[module_id].log_alpha
                entropy_gap = (fwd_out[ACTION_LOGP_RESAMPLED] + self.target_entropy(module_id)).detach().mean()
                loss = loss + (log_alpha - log_alpha.exp()) * entropy_gap
            return loss

    return D3rlpyMatchedCQLLearner


def print_table(runs: list[dict[str, Any]]) -> None:
    """One row per (algorithm, dataset): each variant's median steps/s and mean eval return over seeds, and the ratios."""
    print()
    print(
        "| algo | dataset | dataset return | ours eval | d3rlpy eval | ours steps/s | d3rlpy steps/s | ours / d3rlpy speed |"
    )
    print("|---|---|---|---|---|---|---|---|")
    keys = dict.fromkeys((run["algo"], run["dataset"]) for run in runs)
    for algo, dataset_id in keys:
        cells = {}
        for variant in ("ours", "d3rlpy"):
            chosen = [
                run for run in runs if (run["algo"], run["dataset"], run["variant"]) == (algo, dataset_id, variant)
            ]
            if not chosen:
                cells[variant] = None
                continue
            returns = [run["eval_return_mean"] for run in chosen]
            spread = f" ± {statistics.stdev(returns):.0f}" if len(returns) > 1 else ""
            cells[variant] = (
                f"{statistics.mean(returns):.0f}{spread}",
                statistics.median(run["steps_per_s"] for run in chosen),
            )
        dataset_mean = next(run["dataset_return_mean"] for run in runs if run["dataset"] == dataset_id)
        ours, theirs = cells["ours"], cells["d3rlpy"]
        ratio = f"{ours[1] / theirs[1]:.2f}x" if ours and theirs else "-"
        print(
            f"| {algo} | {dataset_id} | {dataset_mean:.0f} | {ours[0] if ours else '-'} | {theirs[0] if theirs else '-'} | "
            f"{ours[1] if ours else 0:.1f} | {theirs[1] if theirs else 0:.1f} | {ratio} |"
        )


if __name__ == "__main__":
    main()
