"""Off-policy speed and learning: our DQN and SAC beside a hand-written loop and SB3, same sizes.

What it measures: for each algorithm, seed and variant, one training run of ``--max-env-steps``
env steps (default 50k for DQN on CartPole-v1, 15k for SAC on Pendulum-v1), with greedy
evaluation on the same schedule in every variant; per run

  env steps/s   training env steps per second of the training loop: env steps / train s,
                where train s is the loop's wall time *without* evaluation and set-up
                (sampling, replay, gradient steps, target updates, the framework's own work);
  ms/step       1000 / env steps/s;
  cpu st/s      env steps per second of the loop's CPU time (the child process's
                ``time.process_time``, evaluation taken out): time-slicing on a shared
                machine stretches wall time but not this, so its paired ratios (printed
                beside the verdict, which stays on wall time) are the steadier reading there;
  setup s       from launching the process to the first env step (interpreter, imports,
                envs, networks, a Trainer's set-up);
  eval s        the time spent in evaluation, taken out of train s;
  to >=X        the first evaluation's env step count at which the mean evaluation return
                reached X ("-" if no evaluation did within the run);
  final eval    the mean return of the last evaluation (after the last update).

The variants run the same algorithm with the same hyperparameters, all read from the
example config (``examples/dqn_cartpole.yaml``, ``examples/sac_pendulum.yaml``: the model's
and the data module's effective init arguments, defaults included), so they cannot drift:

  ours         ``Trainer.fit`` of the example config through ``LightningRLCLI`` (this file,
               ``--child ours``); logger, checkpoints, progress bar and the config's callbacks
               off, the env seed set to the run's seed;
  handwritten  ``benchmarks/handwritten_dqn.py`` / ``handwritten_sac.py``: plain torch +
               gymnasium loops (their shared env loop and replay in
               ``_handwritten_common.py``) of the same networks, replay (a uniform numpy ring
               buffer, n-step returns if configured), env stepping (a ``SyncVectorEnv`` of
               ``num_envs`` in SAME_STEP autoreset, true final observations stored),
               warm-up (uniform random actions until ``learning_starts``), losses, target
               updates and gradient clipping as the config says;
  sb3          ``benchmarks/_sb3_off_policy.py``: Stable-Baselines3's ``DQN`` / ``SAC`` with
               the same settings, run when ``stable_baselines3`` is installed (the optional
               ``bench`` extra). SB3's DQN is vanilla DQN: no double Q and no dueling heads
               (it has n-step returns); its Huber loss is ``smooth_l1_loss``, the same
               function. How each setting maps, and where SB3 differs, is in that file's
               docstring; it prints the differences of the config at hand as ``NOTE`` lines,
               which this script shows.

Evaluation is the same in all three: after every ``rollouts_per_epoch`` train items (one
item = ``train_freq`` env steps and its gradient steps; ours evaluates at each Lightning
epoch end) and after the last item, ``evaluation_num_episodes`` complete episodes are
played greedily on ``evaluation_num_envs`` (default ``min(num_envs, episodes)``) envs of
their own (seeded ``seed + 1_000_003``, moving on per evaluation), and their mean return is
the evaluation return. Every variant's training envs start from seeds ``seed + i``.

Each run is a fresh subprocess (``sys.executable``), one at a time, variants' order rotated
per seed, with the same thread settings (``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` and
``torch.set_num_threads`` = ``--threads``). A child prints ``TRAINING_START time=<unix
time>`` before its first env step, ``EVAL env_steps=<int> return_mean=<float>
seconds=<float>`` after each evaluation, ``TRAINING_END env_steps=<int> train_s=<float>
eval_s=<float> threads=<int> cpu_s=<float>`` when its loop ends, ``PEAK_RSS_MB=<float>`` at exit, and
``UNAVAILABLE reason=...`` when it cannot run the config (then the variant is left out).

How to read the output: per algorithm one table per seed, then per variant the medians over
seeds, and the verdict on the issue's targets: throughput (env steps/s) of ours >= 0.95x the
hand-written loop's and >= 1.0x SB3's, as the ratio of the medians and, beside it, the
median over seeds of the per-seed ratio (the runs of one seed are seconds apart, so that
one is steadier on a shared machine); and the learning targets (DQN: evaluation return >= 450
within 50,000 env steps; SAC: >= -250 within 6,000 and >= -200 within 15,000), as the
number of seeds of each variant that met them. The variants have their own random streams,
so seed s of one is not seed s of another: compare steps-to-threshold over several seeds.
A shared 2-core machine adds +-25% timing noise: compare within one invocation.

Run::

    python benchmarks/off_policy.py                                   # both algos, seeds 0 1 2
    python benchmarks/off_policy.py --algo dqn --seeds 0 1 2 3 4
    python benchmarks/off_policy.py --algo sac --variants ours handwritten --max-env-steps 3000
    python benchmarks/off_policy.py --algo dqn --print-hparams        # what the children get
    python benchmarks/off_policy.py --algo dqn --device cuda          # every variant on the GPU

``--device`` (``cpu``, the default, or ``cuda``) puts every variant's networks and gradient
steps on that device: ours through the Trainer (``--trainer.accelerator gpu|cpu
--trainer.devices 1``), the hand-written loops by moving their networks and each replay
minibatch there, SB3 through its ``device=``. Envs, replay buffers and acting's env-side
work stay on the CPU in all three. ``--device cuda`` exits with one line where CUDA is
absent. The clocks wait for queued CUDA work before reading the time.
"""

from __future__ import annotations

import time

START_TIME = time.time()  # a child's clock (``--child ours``) starts with the script

import argparse
import json
import math
import resource
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

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
    synchronize_device,
    trainer_device_args,
    write_json,
)

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
VARIANTS = ("ours", "handwritten", "sb3")
ALGOS: dict[str, dict[str, Any]] = {
    "dqn": {
        "config": "examples/dqn_cartpole.yaml",
        "max_env_steps": 50_000,
        "thresholds": [(450.0, 50_000)],  # (evaluation return, within this many env steps)
        "handwritten": "handwritten_dqn.py",
    },
    "sac": {
        "config": "examples/sac_pendulum.yaml",
        "max_env_steps": 15_000,
        "thresholds": [(-250.0, 6_000), (-200.0, 15_000)],
        "handwritten": "handwritten_sac.py",
    },
}
TARGETS = {"handwritten": 0.95, "sb3": 1.00}  # ours' env steps/s / the variant's, at least
# The data modules seed their evaluation envs this far from the training envs.
EVALUATION_SEED_OFFSET = 1_000_003


# ----------------------------------------------------------------------------------------
# Shared by the children (handwritten_dqn.py, handwritten_sac.py, _sb3_off_policy.py, ours)
# ----------------------------------------------------------------------------------------


def child_parser(description: str) -> argparse.ArgumentParser:
    """The command line every child takes: the parent's hyperparameters as JSON, seed, budget, threads."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--hparams", required=True, help="JSON {'algo', 'model': {...}, 'data': {...}} (off_policy.py --print-hparams)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-env-steps", type=int, required=True, help="train until this many env steps")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    add_device_argument(parser)
    return parser


class ChildClock:
    """A child's timing and protocol lines: set-up, training loop, evaluation time apart.

    ``train_s`` is the wall time from ``training_start`` to ``training_end`` minus the time
    between each ``evaluation_started`` / ``evaluation_finished`` pair; ``cpu_s`` the same
    span in this process's CPU time (``time.process_time``, all its threads), which time-slicing
    on a shared machine does not stretch as it stretches wall time.
    """

    def __init__(self) -> None:
        self.start = self.cpu_start = math.nan
        self.eval_seconds = self.eval_cpu_seconds = 0.0
        self._eval_started: float | None = None
        self._eval_cpu_started = math.nan

    def training_start(self) -> None:
        synchronize_device()
        self.start, self.cpu_start = time.perf_counter(), time.process_time()
        print(f"TRAINING_START time={time.time():.6f}", flush=True)

    def evaluation_started(self) -> None:
        synchronize_device()
        self._eval_started, self._eval_cpu_started = time.perf_counter(), time.process_time()

    def evaluation_finished(self, env_steps: int, returns: list[float]) -> float:
        """Print the evaluation's line; return its seconds."""
        if self._eval_started is None:
            raise RuntimeError("evaluation_finished without evaluation_started")
        seconds = time.perf_counter() - self._eval_started
        self._eval_started = None
        self.eval_seconds += seconds
        self.eval_cpu_seconds += time.process_time() - self._eval_cpu_started
        print(f"EVAL env_steps={env_steps} return_mean={float(np.mean(returns)):.3f} seconds={seconds:.3f}", flush=True)
        return seconds

    def train_seconds(self) -> float:
        """Seconds since ``training_start``, evaluations left out."""
        synchronize_device()
        return time.perf_counter() - self.start - self.eval_seconds

    def training_end(self, env_steps: int, threads: int) -> None:
        train_s = self.train_seconds()
        cpu_s = time.process_time() - self.cpu_start - self.eval_cpu_seconds
        print(
            f"TRAINING_END env_steps={env_steps} train_s={train_s:.3f} eval_s={self.eval_seconds:.3f} "
            f"threads={threads} cpu_s={cpu_s:.3f}",
            flush=True,
        )

    @staticmethod
    def finish() -> None:
        print(f"PEAK_RSS_MB={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}", flush=True)


def unavailable(reason: str) -> None:
    """Tell the parent this variant cannot run the config (it is then left out)."""
    print(f"UNAVAILABLE reason={reason}", flush=True)


class GreedyEvaluation:
    """Plays complete greedy episodes as ``OffPolicyDataModule``'s evaluation does.

    ``evaluation_num_episodes`` episodes on ``evaluation_num_envs`` (default ``min(num_envs,
    episodes)``) envs of their own in SAME_STEP autoreset, reset at the start of every
    evaluation with seeds ``seed + 1_000_003 + k * envs`` for the k-th evaluation. The first
    ``evaluation_num_episodes`` episodes to *start* count, each played to its end (the
    ``EpisodeQuota`` rule of ``EnvRunner.sample_episodes``); keeping the first ones to end
    would favour short episodes. Actions of a ``Box`` space are clipped to its bounds, as the
    env runner does.

    Args:
        data: The data module's hyperparameters (``env``, ``env_kwargs``, ``num_envs``,
            ``evaluation_num_episodes``, ``evaluation_num_envs``).
        seed: The run's seed.
        first_seed: The first evaluation's first env seed, instead of ``seed + 1_000_003``
            (``suite.py --final-episodes`` plays on seeds no other run uses).
    """

    def __init__(self, data: dict[str, Any], seed: int, first_seed: int | None = None) -> None:
        self.num_episodes = int(data["evaluation_num_episodes"])
        self.num_envs = int(data["evaluation_num_envs"] or min(data["num_envs"], self.num_episodes))
        env_id, env_kwargs = data["env"], dict(data["env_kwargs"] or {})
        self.envs = gym.vector.SyncVectorEnv(
            [lambda: gym.make(env_id, **env_kwargs)] * self.num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
        space = self.envs.single_action_space
        self.bounds = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
        self.seed = seed + EVALUATION_SEED_OFFSET if first_seed is None else first_seed
        self.num_resets = 0

    def run(self, act: Callable[[np.ndarray], np.ndarray]) -> list[float]:
        """Play the episodes with ``act`` (observations ``[envs, ...]`` -> greedy actions).

        Returns:
            The counted episodes' returns, in the order they ended (episodes ending in the
            same step: in env order), as ``EnvRunner.sample_episodes`` returns its episodes.
        """
        # Imported here, not at the top: the hand-written loops' children would otherwise pay for
        # importing Lightning in their set-up time (this lands in the evaluation's, timed apart).
        from lightning_rl.env.episode_quota import EpisodeQuota

        obs, _ = self.envs.reset(seed=self.seed + self.num_resets * self.num_envs)
        self.num_resets += 1
        quota = EpisodeQuota(self.num_episodes, self.num_envs)
        running = np.zeros(self.num_envs)
        finished: list[float] = []
        while not quota.done:
            actions = act(obs)
            if self.bounds is not None:
                actions = np.clip(actions, *self.bounds)
            obs, rewards, terminated, truncated, _ = self.envs.step(actions)
            running += rewards
            for i in np.flatnonzero(terminated | truncated):
                if quota.counts(i):
                    finished.append(float(running[i]))
                    quota.end(i)
                running[i] = 0.0
        return finished

    def close(self) -> None:
        self.envs.close()


def evaluation_due(items_done: int, data: dict[str, Any]) -> bool:
    """Whether an evaluation follows train item ``items_done`` (1-based): at every epoch end."""
    return items_done % int(data["rollouts_per_epoch"]) == 0


# ----------------------------------------------------------------------------------------
# Hyperparameters: the example config's effective init arguments
# ----------------------------------------------------------------------------------------


def cli_overrides(seed: int, max_env_steps: int) -> list[str]:
    """Our run's CLI flags on top of the example config: quiet, no callbacks of its own, seeded, budgeted."""
    return [
        "--seed_everything", str(seed),
        "--data.init_args.seed", str(seed),          # env i starts at seed + i, as in the other variants
        "--data.init_args.max_env_steps", str(max_env_steps),
        "--trainer.max_epochs", "-1",                # the budget ends the run
        "--trainer.max_steps", "-1",
        "--trainer.num_sanity_val_steps", "0",
        "--trainer.logger", "false",
        "--trainer.enable_checkpointing", "false",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.callbacks", "[]",                 # drop the config's EarlyStopping/ModelCheckpoint on eval
    ]  # fmt: skip


def build_cli(config: Path, seed: int, max_env_steps: int, extra_args: Sequence[str] = ()) -> Any:
    """``LightningRLCLI`` of ``config`` with :func:`cli_overrides`, then ``extra_args``, instantiated but not run."""
    import logging
    import warnings

    from lightning_rl.cli import LightningRLCLI

    for name in ("lightning.pytorch", "lightning.fabric"):  # "Seed set to", "GPU available", tips
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    return LightningRLCLI(
        args=["--config", str(config), *cli_overrides(seed, max_env_steps), *extra_args],
        run=False,
        save_config_callback=None,  # no config.yaml written into the repo
    )


def effective_hparams(algo: str, config: Path, max_env_steps: int, extra_args: Sequence[str] = ()) -> dict[str, Any]:
    """The hyperparameters the other variants copy: what our Learner and data module were built with.

    Read from the instantiated classes (``hparams``), so arguments the config leaves out have
    their defaults; the module's ``model_config`` gets the module class's own defaults
    (``model_config_keys``) for the keys it leaves out.

    Args:
        algo: A name stored with the hyperparameters (``"dqn"``, ``"sac"``, ``"ppo"``).
        config: Our config file.
        max_env_steps: The run's budget.
        extra_args: CLI flags applied after the config (``["--data.init_args.num_envs", "2"]``).

    Returns:
        ``{"algo": algo, "model": {...}, "data": {...}}``, plain JSON data.
    """
    from lightning_rl.core.columns import DEFAULT_MODULE_ID
    from lightning_rl.core.module_checks import model_config_with_defaults

    cli = build_cli(config, 0, max_env_steps, extra_args)
    model = {k: v for k, v in dict(cli.model.hparams).items() if not k.startswith("_")}
    data = {k: v for k, v in dict(cli.datamodule.hparams).items() if not k.startswith("_")}
    spec = cli.model.module_spec.rl_module_specs[DEFAULT_MODULE_ID]
    model["model_config"] = model_config_with_defaults(spec.model_config, spec.module_class.model_config_keys)
    data["max_env_steps"] = max_env_steps
    # Round-trip through JSON: tuples become lists, and anything unserializable fails here.
    return json.loads(json.dumps({"algo": algo, "model": model, "data": data}))


# ----------------------------------------------------------------------------------------
# The `ours` child: Trainer.fit of the example config, timed by a callback
# ----------------------------------------------------------------------------------------


def make_timing_callback(clock: ChildClock, threads: int) -> Any:
    """A Lightning callback that reports training start/end and times every validation (evaluation)."""
    import lightning.pytorch as pl

    class TimeTrainingAndEvaluation(pl.Callback):
        """``on_train_start`` .. ``on_train_end`` is the loop; ``on_validation_start`` .. ``_end`` evaluation."""

        def __init__(self) -> None:
            self.returns: list[float] = []

        def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
            clock.training_start()

        def on_validation_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
            self.returns = []
            clock.evaluation_started()

        def on_validation_batch_end(
            self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
        ) -> None:
            self.returns += [float(episode.get_return()) for episode in batch.data.episodes]

        def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
            clock.evaluation_finished(trainer.datamodule.num_env_steps_sampled_lifetime, self.returns)

        def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
            clock.training_end(trainer.datamodule.num_env_steps_sampled_lifetime, threads)

    return TimeTrainingAndEvaluation()


def run_ours_child(args: argparse.Namespace) -> None:
    """``--child ours``: one Trainer.fit of the example config, in the children's protocol."""
    import torch

    torch.set_num_threads(args.threads)
    config = REPO_ROOT / args.config
    if not config.is_file():
        unavailable(f"no config {config}")
        return
    try:
        cli = build_cli(config, args.seed, args.max_env_steps, trainer_device_args(args.device))
    except ImportError as error:
        unavailable(f"cannot build our run: {error}")
        return
    clock = ChildClock()
    cli.trainer.callbacks.append(make_timing_callback(clock, torch.get_num_threads()))
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    clock.finish()


# ----------------------------------------------------------------------------------------
# The driver: one fresh subprocess per (algo, seed, variant), in sequence
# ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=["dqn", "sac", "both"], default="both")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=1, help="OMP/MKL threads and torch.set_num_threads of every run")
    add_device_argument(parser)
    parser.add_argument("--max-env-steps", type=int, help="env steps per run (default: 50000 for DQN, 15000 for SAC)")
    parser.add_argument("--dqn-config", default=ALGOS["dqn"]["config"], help="our DQN config (relative to the repo)")
    parser.add_argument("--sac-config", default=ALGOS["sac"]["config"], help="our SAC config (relative to the repo)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before a run is killed")
    parser.add_argument("--json", metavar="PATH", help="also write every run and the summary to this JSON file")
    parser.add_argument("--show-output", action="store_true", help="echo the children's other output lines")
    parser.add_argument("--print-hparams", action="store_true", help="print the children's --hparams JSON and exit")
    parser.add_argument("--child", choices=["ours"], help=argparse.SUPPRESS)  # internal: run one variant here
    parser.add_argument("--config", help=argparse.SUPPRESS)  # the --child's config
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # the --child's seed
    args = parser.parse_args(argv)
    if args.child is None and args.print_hparams and args.algo == "both":
        parser.error("--print-hparams needs --algo dqn or --algo sac")
    check_device(args.device)
    return args


def child_command(
    algo: str, variant: str, seed: int, budget: int, config: str, hparams: str, threads: int, device: str = "cpu"
) -> list[str]:
    common = ["--seed", str(seed), "--max-env-steps", str(budget), "--threads", str(threads), "--device", device]
    if variant == "ours":
        return [sys.executable, str(Path(__file__).resolve()), "--child", "ours", "--config", config, *common]
    if variant == "handwritten":
        return [sys.executable, str(BENCH_DIR / ALGOS[algo]["handwritten"]), "--hparams", hparams, *common]
    return [sys.executable, str(BENCH_DIR / "_sb3_off_policy.py"), "--hparams", hparams, *common]


def run_child(command: list[str], variant: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Launch one run, follow its protocol lines, and return its record."""
    record: dict[str, Any] = {"variant": variant, "seed": seed, "status": "ERROR", "env_steps": None, "setup_s": None,
                              "train_s": None, "eval_s": None, "cpu_s": None, "threads": None, "peak_rss_mb": None,
                              "evals": [],
                              "notes": []}  # fmt: skip

    def handle(head: str, line: str, launch: float) -> bool:
        if head == "EVAL":
            fields = parse_fields(line)
            record["evals"].append((int(fields["env_steps"]), float(fields["return_mean"])))
        elif head == "TRAINING_END":
            fields = parse_fields(line)
            record.update(status="DONE", env_steps=int(fields["env_steps"]), train_s=float(fields["train_s"]),
                          eval_s=float(fields["eval_s"]), threads=int(fields["threads"]),
                          cpu_s=float(fields["cpu_s"]) if "cpu_s" in fields else None)  # fmt: skip
        elif head == "UNAVAILABLE":
            record.update(status="UNAVAILABLE", reason=parse_fields(line)["reason"])
        elif head == "NOTE":
            record["notes"].append(line[len("NOTE ") :])
        else:
            return False
        return True

    returncode, other_lines, _ = follow_child(
        command, record, handle, threads=args.threads, timeout=args.timeout, show_output=args.show_output
    )
    record["returncode"] = returncode
    if returncode != 0 and record["status"] != "UNAVAILABLE":
        record["status"] = "ERROR"
        record["error_tail"] = other_lines[-15:]
    return record


def steps_to(record: dict[str, Any], threshold: float) -> int | None:
    """The env steps of the first evaluation whose mean return reached ``threshold``; None if none did."""
    return next((steps for steps, value in record["evals"] if value >= threshold), None)


def steps_per_second(record: dict[str, Any]) -> float | None:
    if record["status"] != "DONE" or not record["train_s"]:
        return None
    return record["env_steps"] / record["train_s"]


def cpu_steps_per_second(record: dict[str, Any]) -> float | None:
    """Env steps per second of the loop's CPU time (``cpu_s``): steadier than wall time on a shared machine."""
    if record["status"] != "DONE" or not record.get("cpu_s"):
        return None
    return record["env_steps"] / record["cpu_s"]


def print_seed_table(algo: str, seed: int, records: list[dict[str, Any]], thresholds: list[tuple[float, int]]) -> None:
    print(f"\n{algo} seed {seed}")
    heads = "".join(f"{f'to >={threshold:g}':>11}" for threshold, _ in thresholds)
    print(
        f"  {'variant':<12}{'result':<8}{'env steps':>10}{'steps/s':>9}{'ms/step':>9}{'setup s':>9}{'train s':>9}"
        f"{'eval s':>8}{heads}{'final eval':>12}{'RSS MB':>8}{'threads':>8}{'cpu st/s':>9}"
    )
    for r in records:
        rate = steps_per_second(r)
        reached = "".join(f"{fmt(steps_to(r, threshold), 'd'):>11}" for threshold, _ in thresholds)
        final = r["evals"][-1][1] if r["evals"] else None
        print(
            f"  {r['variant']:<12}{r['status']:<8}{fmt(r['env_steps'], 'd'):>10}{fmt(rate, '.0f'):>9}"
            f"{fmt(None if rate is None else 1000 / rate, '.3f'):>9}{fmt(r['setup_s'], '.2f'):>9}"
            f"{fmt(r['train_s'], '.2f'):>9}{fmt(r['eval_s'], '.2f'):>8}{reached}{fmt(final, '.1f'):>12}"
            f"{fmt(r['peak_rss_mb'], '.0f'):>8}{fmt(r['threads'], 'd'):>8}{fmt(cpu_steps_per_second(r), '.0f'):>9}"
        )
        if r["status"] == "ERROR":
            print(f"    exit code {r['returncode']}; last output:")
            for line in r.get("error_tail", []):
                print(f"    | {line}")


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(
    records: list[dict[str, Any]], variants: list[str], thresholds: list[tuple[float, int]]
) -> dict[str, Any]:
    """Per variant medians over seeds, the throughput ratios of ours to the others, the learning targets.

    A run that never reached a threshold counts as +inf steps in that median.
    """
    summary: dict[str, Any] = {"variants": {}, "ratios": {}}
    runs_of = {v: [r for r in records if r["variant"] == v and r["status"] != "UNAVAILABLE"] for v in variants}
    for variant, runs in runs_of.items():
        if not runs:
            continue
        done = [r for r in runs if r["status"] == "DONE"]
        rates = [rate for r in done if (rate := steps_per_second(r)) is not None]
        entry: dict[str, Any] = {
            "runs": len(runs),
            "done": len(done),
            "median_steps_per_s": median_or_none(rates),
            "median_cpu_steps_per_s": median_or_none([c for r in done if (c := cpu_steps_per_second(r)) is not None]),
            "median_setup_s": median_or_none([r["setup_s"] for r in runs if r["setup_s"] is not None]),
            "median_final_eval": median_or_none([r["evals"][-1][1] for r in done if r["evals"]]),
            "max_peak_rss_mb": max((r["peak_rss_mb"] for r in runs if r["peak_rss_mb"] is not None), default=None),
            "thresholds": [],
        }
        for threshold, within in thresholds:
            steps = [s if (s := steps_to(r, threshold)) is not None else math.inf for r in done]
            entry["thresholds"].append({
                "threshold": threshold, "within": within, "median_steps": median_or_none(steps),
                "met": sum(s <= within for s in steps), "of": len(done),
            })  # fmt: skip
        summary["variants"][variant] = entry
    ours = summary["variants"].get("ours")
    for other, target in TARGETS.items():
        theirs = summary["variants"].get(other)
        if not ours or not theirs or not ours["median_steps_per_s"] or not theirs["median_steps_per_s"]:
            continue
        ratio = ours["median_steps_per_s"] / theirs["median_steps_per_s"]
        ours_by_seed = {r["seed"]: steps_per_second(r) for r in runs_of["ours"] if steps_per_second(r)}
        paired = [ours_by_seed[r["seed"]] / rate for r in runs_of[other]
                  if (rate := steps_per_second(r)) and r["seed"] in ours_by_seed]  # fmt: skip
        ours_cpu = {r["seed"]: cpu_steps_per_second(r) for r in runs_of["ours"] if cpu_steps_per_second(r)}
        paired_cpu = [ours_cpu[r["seed"]] / rate for r in runs_of[other]
                      if (rate := cpu_steps_per_second(r)) and r["seed"] in ours_cpu]  # fmt: skip
        summary["ratios"][f"ours/{other}"] = {
            "ratio": ratio, "target": target, "pass": bool(ratio >= target), "paired_median": median_or_none(paired),
            "paired_cpu_median": median_or_none(paired_cpu),
        }  # fmt: skip
    return summary


def print_summary(algo: str, summary: dict[str, Any], seeds: list[int], budget: int, threads: int) -> None:
    thresholds = next(iter(summary["variants"].values()))["thresholds"] if summary["variants"] else []
    heads = "".join(
        f"{'med. to >=' + format(t['threshold'], 'g'):>16}{'<=' + str(t['within']):>10}" for t in thresholds
    )
    print(f"\n{algo} summary over seeds {seeds} ({budget} env steps per run, {threads} thread(s) per run)")
    print(f"  {'variant':<12}{'done':>6}{'med. steps/s':>14}{'med. ms/step':>14}{'med. setup s':>14}{heads}"
          f"{'med. final':>12}{'max RSS MB':>12}")  # fmt: skip
    for variant, s in summary["variants"].items():
        rate = s["median_steps_per_s"]
        cells = ""
        for t in s["thresholds"]:
            steps = t["median_steps"]
            text = "-" if steps is None else (f">{budget}" if steps == math.inf else f"{steps:.0f}")
            cells += f"{text:>16}{str(t['met']) + '/' + str(t['of']):>10}"
        print(
            f"  {variant:<12}{s['done']:>3}/{s['runs']:<2}{fmt(rate, '.0f'):>14}"
            f"{fmt(None if not rate else 1000 / rate, '.3f'):>14}{fmt(s['median_setup_s'], '.2f'):>14}{cells}"
            f"{fmt(s['median_final_eval'], '.1f'):>12}{fmt(s['max_peak_rss_mb'], '.0f'):>12}"
        )
    short = [t["within"] for t in thresholds if t["within"] > budget]
    if short:
        print(
            f"  (runs stop at {budget} env steps, before {short}: a run that did not get there is unjudged, not failed)"
        )
    if not summary["ratios"]:
        print(f"{algo} throughput verdict: n/a (needs `ours` and at least one of handwritten / sb3)")
        return
    parts = [
        f"{name} {r['ratio']:.2f}x (target >= {r['target']:.2f}x) {'PASS' if r['pass'] else 'FAIL'}"
        + ("" if r["paired_median"] is None else f" [paired per seed: {r['paired_median']:.2f}x]")
        + ("" if r.get("paired_cpu_median") is None else f" [CPU time, paired: {r['paired_cpu_median']:.2f}x]")
        for name, r in summary["ratios"].items()
    ]
    verdict = "PASS" if all(r["pass"] for r in summary["ratios"].values()) else "FAIL"
    print(f"{algo} throughput verdict (median env steps/s): {verdict}: " + "; ".join(parts))


def run_algo(algo: str, args: argparse.Namespace, variants: list[str]) -> dict[str, Any]:
    """All seeds and variants of one algorithm; prints the tables; returns runs and summary."""
    config = args.dqn_config if algo == "dqn" else args.sac_config
    budget = args.max_env_steps or ALGOS[algo]["max_env_steps"]
    thresholds = ALGOS[algo]["thresholds"]
    if not (REPO_ROOT / config).is_file():
        print(f"\n{algo}: no config {config}; skipped")
        return {"skipped": f"no config {config}"}
    hparams = effective_hparams(algo, REPO_ROOT / config, budget)
    model, data = hparams["model"], hparams["data"]
    print(f"\n{algo}: {config}, {data['env']}, {budget} env steps per run; evaluation every "
          f"{data['rollouts_per_epoch'] * data['train_freq']} env steps, {data['evaluation_num_episodes']} greedy episodes")  # fmt: skip
    print(f"  model: {json.dumps(model, separators=(',', ':'))}")
    print(f"  data:  {json.dumps(data, separators=(',', ':'))}")
    hparams_json = json.dumps(hparams, separators=(",", ":"))

    variants = list(variants)
    records: list[dict[str, Any]] = []
    noted: set[str] = set()
    for index, seed in enumerate(args.seeds):
        seed_records = []
        for variant in rotated(variants, index):
            if variant not in variants:  # became unavailable at an earlier seed
                continue
            command = child_command(algo, variant, seed, budget, config, hparams_json, args.threads, args.device)
            record = run_child(command, variant, seed, args)
            if record["status"] == "UNAVAILABLE":
                print(f"{algo} {variant}: unavailable ({record.get('reason', '')}); going on without it")
                variants.remove(variant)
                continue
            if variant not in noted and record["notes"]:
                noted.add(variant)
                for note in record["notes"]:
                    print(f"  {variant} note: {note}")
            seed_records.append(record)
        records += seed_records
        print_seed_table(algo, seed, sorted(seed_records, key=lambda r: VARIANTS.index(r["variant"])), thresholds)

    summary = summarize(records, variants, thresholds)
    print_summary(algo, summary, args.seeds, budget, args.threads)
    return {"config": config, "max_env_steps": budget, "hparams": hparams, "runs": records, "summary": summary}


def main() -> None:
    args = parse_args()
    if args.child == "ours":
        run_ours_child(args)
        return
    algos = ["dqn", "sac"] if args.algo == "both" else [args.algo]
    if args.print_hparams:
        config = args.dqn_config if args.algo == "dqn" else args.sac_config
        budget = args.max_env_steps or ALGOS[args.algo]["max_env_steps"]
        print(json.dumps(effective_hparams(args.algo, REPO_ROOT / config, budget), separators=(",", ":")))
        return

    variants = available_variants(args.variants)
    info = print_versions()
    print(
        f"algos {algos}, variants {variants}, seeds {args.seeds}; threads: OMP_NUM_THREADS=MKL_NUM_THREADS="
        f"{args.threads}, torch.set_num_threads({args.threads}) in every run; device {args.device}"
    )
    results = {algo: run_algo(algo, args, variants) for algo in algos}
    if args.json:
        payload = {"args": {k: v for k, v in vars(args).items() if k not in ("child", "config", "seed")},
                   "versions": info, "algos": results}  # fmt: skip
        write_json(args.json, payload)


if __name__ == "__main__":
    main()
