"""Make the four Minari datasets the offline examples learn from, with the ``lightning-rl`` commands.

    python examples/make_offline_datasets.py                      # all four, into ~/.minari/datasets
    python examples/make_offline_datasets.py --only cartpole-expert --out /data/minari
    python examples/make_offline_datasets.py --only pendulum-medium-replay pendulum-medium   # one SAC run, both
    python examples/make_offline_datasets.py --quick --out /tmp/minari   # tiny budgets (the test)

Each command is printed before it runs, in this process (``lightning_rl.cli.main``, what the
``lightning-rl`` command calls: torch and Lightning load once, not once per command); run them by
hand to make one dataset yourself:

- ``cartpole/ppo-expert-v0``: PPO trained on CartPole (``examples/ppo_cartpole.yaml``, which
  stops once evaluation reaches 475), then 100 greedy episodes of its checkpoint.
- ``cartpole/mixed-v0``: half the env steps from uniformly random actions, half from that expert
  (greedy): 1,200 episodes, 96% of them random (about 22 steps each) and 48 expert ones (500
  steps each), so at the states both visit the data is a 50/50 mix of good and random actions.
- ``pendulum/sac-medium-replay-v0``: every training episode of a SAC run on Pendulum
  (``examples/sac_pendulum.yaml`` with the ``RecordEpisodes`` callback and one gradient step per 8
  env steps, so that it learns slowly enough for its replay to hold some 80 episodes), stopped by
  ``EarlyStopping`` once its greedy evaluation passes ``--pendulum_threshold`` (-600), or at
  ``--pendulum_max_env_steps``: the random warm-up, then a policy improving from random to medium.
- ``pendulum/sac-medium-v0``: 200 episodes of that run's last checkpoint, sampling from its
  exploration distribution (``--explore``).

Datasets go to ``--out`` (``$MINARI_DATASETS_PATH``, default ``~/.minari/datasets``); the
training runs' logs and checkpoints to ``--runs``. The script ends with each dataset's mean return
and fingerprint (a hash of its episodes), to compare with ``docs/tutorials/offline.md``.

The same data on any x86-64 machine: run as a script, it starts itself again under
``REPRODUCIBLE_KERNELS``, which hold torch, MKL, numpy and glibc's maths library to code paths
that do not depend on the CPU. Left to pick kernels for the CPU (AVX2, AVX-512, FMA), they round
some results differently, and the SAC run turns those last bits into other data (Pendulum medium
at -393 on one machine, -436 on another). The same data also needs the same versions of torch,
numpy and glibc, and one torch thread (the default here).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
DATASETS = ("cartpole-expert", "cartpole-mixed", "pendulum-medium-replay", "pendulum-medium")
IDS = {
    "cartpole-expert": "cartpole/ppo-expert-v0",
    "cartpole-mixed": "cartpole/mixed-v0",
    "pendulum-medium-replay": "pendulum/sac-medium-replay-v0",
    "pendulum-medium": "pendulum/sac-medium-v0",
}

#: Environment variables under which torch, MKL, numpy and libm compute the same bits on every x86-64
#: CPU. They make the four datasets take 99 s instead of 54 s (docs/tutorials/offline.md).
REPRODUCIBLE_KERNELS = {
    "ATEN_CPU_CAPABILITY": "default",  # torch's plain kernels, not its AVX2 or AVX-512 ones
    "MKL_CBWR": "COMPATIBLE",  # MKL's matrix products in one code path whatever the CPU
    "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",  # numpy's baseline loops
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX,-AVX2,-FMA,-FMA4,-AVX512F",  # libm's exp, sin, ... without FMA
}


def main() -> None:
    args = _parse_args()
    chosen = list(args.only or DATASETS)
    # One torch thread unless told otherwise (set before torch loads): these small MLPs gain nothing
    # from more, and threads competing for busy cores slow SAC's one-gradient-step-per-env-step loop
    # many times over.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        os.environ["MINARI_DATASETS_PATH"] = str(args.out.resolve())
    runs = args.runs.resolve()
    os.chdir(REPOSITORY)  # the configs' paths are relative to the checkout
    overwrite = ["--overwrite"] if args.overwrite else []
    episodes = 4 if args.quick else 100

    if {"cartpole-expert", "cartpole-mixed"} & set(chosen):
        run_dir = runs / "ppo_cartpole"
        quick = ["--data.max_env_steps", "512", "--data.rollouts_per_epoch", "2"] if args.quick else []
        _run(["fit", "--config", "examples/ppo_cartpole.yaml", "--trainer.default_root_dir", str(run_dir), *quick])
        expert = _last_checkpoint(run_dir)
        record = ["record", "--config", "examples/ppo_cartpole.yaml", "--ckpt_path", str(expert), *overwrite]
        if "cartpole-expert" in chosen:
            _run([*record, "--num_episodes", str(episodes), "--dataset_id", IDS["cartpole-expert"]])
        if "cartpole-mixed" in chosen:
            mixed = [
                "--num_episodes",
                str(12 * episodes),
                "--random_fraction",
                "0.96",
                "--dataset_id",
                IDS["cartpole-mixed"],
            ]
            _run([*record, *mixed])

    if {"pendulum-medium-replay", "pendulum-medium"} & set(chosen):
        run_dir = runs / "sac_pendulum"
        if args.quick:
            budget = [
                *("--data.max_env_steps", "300", "--data.learning_starts", "100", "--data.rollouts_per_epoch", "150"),
                *("--data.evaluation_num_episodes", "2", "--data.evaluation_num_envs", "2"),
                *("--model.minibatch_size", "32"),
            ]
        else:
            # One gradient step per 8 env steps (train_freq 8, examples/sac_pendulum.yaml takes one per
            # step): SAC then improves slowly enough that the replay holds some 80 episodes, from random
            # to medium, rather than the 11 it holds when it learns Pendulum in 2,000 steps.
            budget = [
                *("--data.max_env_steps", str(args.pendulum_max_env_steps)),
                *("--data.train_freq", "8", "--data.rollouts_per_epoch", "125"),
            ]
        recording = []
        if "pendulum-medium-replay" in chosen:  # --only pendulum-medium leaves an existing replay dataset alone
            recording = [
                "--trainer.callbacks+=lightning_rl.callbacks.RecordEpisodes",
                f"--trainer.callbacks.dataset_id={IDS['pendulum-medium-replay']}",
                f"--trainer.callbacks.overwrite={str(args.overwrite).lower()}",
            ]
        stopping = [
            "--trainer.callbacks+=EarlyStopping",
            "--trainer.callbacks.monitor=eval/episode_return_mean",
            "--trainer.callbacks.mode=max",
            f"--trainer.callbacks.stopping_threshold={args.pendulum_threshold}",
            "--trainer.callbacks.patience=1000",
            "--trainer.callbacks+=ModelCheckpoint",
            "--trainer.callbacks.save_last=true",
        ]
        fit = ["fit", "--config", "examples/sac_pendulum.yaml", "--trainer.default_root_dir", str(run_dir)]
        _run([*fit, *budget, *recording, *stopping])
        if "pendulum-medium" in chosen:
            medium = _last_checkpoint(run_dir)
            record = ["record", "--config", "examples/sac_pendulum.yaml", "--ckpt_path", str(medium), "--explore"]
            pendulum_medium = ["--num_episodes", str(2 * episodes), "--dataset_id", IDS["pendulum-medium"]]
            _run([*record, *pendulum_medium, *overwrite])

    for name in chosen:
        print(_describe(IDS[name]), flush=True)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", nargs="+", choices=DATASETS, default=None, help="make these datasets only (and the runs they need)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny training budgets and few episodes (for tests)")
    parser.add_argument("--out", type=Path, default=None, help="the datasets root (MINARI_DATASETS_PATH)")
    parser.add_argument("--runs", type=Path, default=Path("lightning_logs/offline_datasets"), help="training runs")
    parser.add_argument("--overwrite", action="store_true", help="replace datasets that exist already")
    parser.add_argument("--pendulum_threshold", type=float, default=-600.0, help="stop SAC once evaluation passes it")
    parser.add_argument("--pendulum_max_env_steps", type=int, default=40_000, help="stop SAC here at the latest")
    return parser.parse_args()


def _run(command: list[str]) -> None:
    """Print ``lightning-rl <command>`` and run it; stop here if it fails.

    Raises:
        SystemExit: With the command's status, if it exits with one other than 0.
    """
    from lightning_rl.cli import main as lightning_rl  # here: torch loads after main() set OMP_NUM_THREADS

    print(f"$ lightning-rl {shlex.join(command)}", flush=True)
    script_argv = sys.argv
    sys.argv = ["lightning-rl", *command]  # the command line it reads, as when typed (Lightning's CLI reads sys.argv)
    try:
        lightning_rl()
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            print(f"make_offline_datasets: 'lightning-rl {command[0]}' exited with status {exit_.code}", flush=True)
            raise
    finally:
        sys.argv = script_argv


def _describe(dataset_id: str) -> str:
    """``dataset_id``'s episodes, mean return and fingerprint: a hash of every episode's arrays in order."""
    import minari
    import numpy as np

    digest = hashlib.sha256()
    returns = []
    for episode in minari.load_dataset(dataset_id).iterate_episodes():
        arrays = (episode.observations, episode.actions, episode.rewards, episode.terminations, episode.truncations)
        for array in arrays:
            digest.update(np.ascontiguousarray(array).tobytes())
        returns.append(float(np.sum(episode.rewards)))
    return (
        f"{dataset_id}: {len(returns)} episodes, return mean {np.mean(returns):.3f}, "
        f"fingerprint {digest.hexdigest()[:12]}"
    )


def _restart_with_reproducible_kernels() -> None:
    """Start this script again with ``REPRODUCIBLE_KERNELS`` in its environment, unless it has them.

    A new process, because glibc reads ``GLIBC_TUNABLES`` as the program loads, and MKL and numpy
    theirs as they load. A variable already set is kept (set one yourself to choose otherwise), and
    the process that runs says so on stderr, since its datasets may then differ.
    """
    missing = {name: value for name, value in REPRODUCIBLE_KERNELS.items() if name not in os.environ}
    if missing:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **missing})
    kept = [f"{name}={os.environ[name]!r}" for name, value in REPRODUCIBLE_KERNELS.items() if os.environ[name] != value]
    if kept:
        print(
            f"make_offline_datasets: keeping your {', '.join(kept)}; the datasets may differ from the fingerprints "
            "in docs/tutorials/offline.md",
            file=sys.stderr,
            flush=True,
        )


def _last_checkpoint(run_dir: Path) -> Path:
    """The newest ``last.ckpt`` under ``run_dir`` (the run just made)."""
    checkpoints = sorted(run_dir.rglob("last.ckpt"), key=lambda path: path.stat().st_mtime)
    if not checkpoints:
        raise SystemExit(f"no last.ckpt under {run_dir}: did the fit save a checkpoint?")
    return checkpoints[-1]


if __name__ == "__main__":
    _restart_with_reproducible_kernels()
    main()
