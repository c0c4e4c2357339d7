"""Standard suites side by side: our example configs beside Stable-Baselines3 with the same hyperparameters.

One task per example config (``TASKS`` below): PPO on Hopper-v5 (rl-baselines3-zoo's settings,
and CleanRL's) and HalfCheetah-v5, SAC on HalfCheetah-v5 and Hopper-v5, PPO and DQN on
LunarLander-v3, PPO on MinAtar Breakout. A task is run for each seed and library:

  ours   ``Trainer.fit`` of the example config through ``LightningRLCLI`` (what
         ``lightning-rl fit --config`` runs), with the run's seed (``seed_everything`` and the
         envs' base seed), budget (``data.init_args.max_env_steps``) and any extra flags given
         after ``--``; logger, checkpoints, progress bar and the config's callbacks off.
  sb3    Stable-Baselines3's PPO / SAC / DQN built from *our run's effective hyperparameters*
         (the Learner's and data module's init arguments, defaults and the extra flags
         included), so the two cannot drift: ``benchmarks/_sb3_suite.py`` (PPO) and
         ``benchmarks/_sb3_off_policy.py`` (SAC, DQN) say how each setting maps and where SB3
         differs; such differences are stored with the run as ``notes``. A config SB3 has no
         equivalent for is refused before the run.

Evaluation is the same in both: after every ``rollouts_per_epoch`` train items (ours at each
Lightning epoch end) and after the last one, ``evaluation_num_episodes`` complete greedy
episodes on ``evaluation_num_envs`` envs of their own, seeded ``seed + 1_000_003`` and
moving on per evaluation, the first episodes to start each played to its end
(``off_policy.GreedyEvaluation`` for SB3, with observations normalized by ``VecNormalize``'s
statistics when the config normalizes them; it kept the first episodes to end until
2026-11-30). Episode returns are in the env's own units.

Each run is a fresh subprocess with one thread (``OMP_NUM_THREADS=MKL_NUM_THREADS=1``,
``torch.set_num_threads(1)``; ``--threads`` to change) and writes its own JSON file in
``--out``, ``<task>-<library>-seed<seed>.json``, updated after every evaluation and at the
end (its output goes to the ``.log`` file beside it). A run whose file says ``done`` is
skipped, so runs can be launched separately, in parallel or again after an interruption.
Per run the file holds:

  evals     ``[{env_steps, return_mean, return_std, num_episodes, train_s, eval_s}]``: each
            evaluation, with the training time so far (``train_s``, evaluations left out);
  setup_s   from the child's start to the first env step (imports, envs, networks, Trainer);
  train_s   the training loop's wall time without evaluation; ``env_steps / train_s`` is
            the report's env steps/s, ``setup_s + train_s`` its wall time;
  eval_s, wall_s (everything), env_steps, status (``started``/``running``/``done``/``error``),
  hparams, notes, versions, peak_rss_mb;
  final_evaluation  with ``--final-episodes N`` only: ``{num_episodes, first_seed, returns,
            return_mean, return_std, eval_s}``, the final policy's N greedy episodes, one per
            env, on env seeds ``FINAL_EVALUATION_SEED + seed * N + i`` that no other run plays
            (the periodic evaluations of seeds s and s + 1 share 9 of 10 starts). The model is
            saved beside the file first (ours ``.ckpt``, read back with
            ``Policy.from_checkpoint``; SB3 ``.zip``), so it can be played again later.

``replay`` plays every saved final model in ``--out`` again on its record's final-evaluation
seeds and rewrites ``final_evaluation`` (for when the evaluation itself changed); the reading it
replaces stays in the run file, under ``superseded_final_evaluations`` with ``--reason``.

``report`` reads every run file in ``--out`` and writes ``<out>/suite.md`` (one table per
task: final evaluation return median [min, max] over seeds, median env steps/s and wall time,
ours/SB3 ratios, the final policies' own evaluation when the runs played one, and issue 17's
targets met or not) and ``<out>/<task>.png`` (evaluation
return vs env steps, mean and min-max band over seeds, ours beside SB3).

Run::

    python benchmarks/suite.py list                                       # tasks, budgets, targets
    python benchmarks/suite.py run ppo_hopper                             # the task's seeds, both libraries
    python benchmarks/suite.py run ppo_hopper --library ours --seeds 1    # one run (launch others in parallel)
    python benchmarks/suite.py run dqn_lunarlander --final-episodes 100   # and 100 episodes of each final policy
    python benchmarks/suite.py run ppo_lunarlander --max-env-steps 40000 --out /tmp/suite \\
        -- --data.init_args.rollout_fragment_length 256                    # extra flags for both libraries
    python benchmarks/suite.py report                                     # tables and plots of --out
    python benchmarks/suite.py replay --reason "..." --out DIR             # the saved final models, played again
"""

from __future__ import annotations

import time

START_TIME = time.time()  # a child's clock starts with the script, before its heavy imports

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Siblings: this directory is on sys.path when a benchmark runs as a script.
from _children import available_variants, finite_or_none, fmt, rotated, versions
from off_policy import ChildClock, GreedyEvaluation, build_cli, effective_hparams, make_timing_callback
from seed_noise import exactness, median_gap_p_value

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_OUT = BENCH_DIR / "results" / "suite"
LIBRARIES = ("ours", "sb3")
LIBRARY_LABELS = {"ours": "ours", "sb3": "SB3"}
# ``--final-episodes N``: run seed s plays its final policy on the env seeds
# FINAL_EVALUATION_SEED + s * N + i, i < N, one episode per env. Runs of different seeds never
# share an episode that way, where the periodic evaluations of seeds s and s + 1 start 9 of
# their 10 episodes alike (env i of one is env i + 1 of the other), as both libraries'
# training envs do. Far above every seed the runs' other envs reach.
FINAL_EVALUATION_SEED = 500_000_000


@dataclasses.dataclass(frozen=True)
class Task:
    """One example config and how the suite judges it.

    Args:
        title: What it is, for the report (``"PPO Hopper-v5"``).
        config: Our example config, relative to the repository.
        algo: ``"ppo"``, ``"sac"`` or ``"dqn"``: which SB3 algorithm mirrors it.
        max_env_steps: The default budget per run.
        seeds: The default seeds.
        sb3: Whether SB3 runs it too (default ``--library``).
        min_return: Issue 17's target on the median final evaluation return, or None.
        vs_sb3: Issue 17's targets against SB3's medians: ``"return"`` (ours >= SB3's final
            evaluation return), ``"wall"`` (ours' wall time <= SB3's), ``"speed"`` (ours'
            env steps/s >= SB3's).
    """

    title: str
    config: str
    algo: str
    max_env_steps: int
    seeds: tuple[int, ...]
    sb3: bool = True
    min_return: float | None = None
    vs_sb3: tuple[str, ...] = ()


TASKS: dict[str, Task] = {
    "ppo_hopper": Task("PPO Hopper-v5", "examples/ppo_hopper.yaml", "ppo", 1_000_000, (0, 1, 2),
                       min_return=2000.0, vs_sb3=("return", "wall")),
    "ppo_hopper_cleanrl": Task("PPO Hopper-v5 (CleanRL settings)", "examples/ppo_hopper_cleanrl.yaml", "ppo",
                               1_000_000, (0, 1, 2), min_return=2000.0, vs_sb3=("return", "wall")),
    "ppo_halfcheetah": Task("PPO HalfCheetah-v5", "examples/ppo_halfcheetah.yaml", "ppo", 1_000_000, (0, 1, 2)),
    "sac_halfcheetah": Task("SAC HalfCheetah-v5", "examples/sac_halfcheetah.yaml", "sac", 100_000, (0, 1),
                            vs_sb3=("return", "speed")),
    "sac_hopper": Task("SAC Hopper-v5", "examples/sac_hopper.yaml", "sac", 100_000, (0, 1)),
    "ppo_lunarlander": Task("PPO LunarLander-v3", "examples/ppo_lunarlander.yaml", "ppo", 1_000_000, (0, 1, 2),
                            min_return=200.0, vs_sb3=("wall",)),
    "dqn_lunarlander": Task("DQN LunarLander-v3", "examples/dqn_lunarlander.yaml", "dqn", 300_000, (0, 1),
                            vs_sb3=("return",)),
    # SB3 has no network for 10x10 images (its NatureCNN needs 36x36 and more): ours only.
    "ppo_minatar_breakout": Task("PPO MinAtar Breakout", "examples/ppo_minatar_breakout.yaml", "ppo", 2_000_000,
                                 (0, 1), sb3=False, min_return=10.0),
}  # fmt: skip


# ----------------------------------------------------------------------------------------
# One run's file, kept up to date by the child
# ----------------------------------------------------------------------------------------


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Replace ``path`` with ``record`` as JSON (inf/nan as null), atomically: a reader never sees half a file."""
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(finite_or_none(record), indent=1))
    partial.replace(path)


class RunRecorder(ChildClock):
    """The child's clock (``off_policy.ChildClock``), also writing each step of the run into its file.

    Args:
        path: The run's JSON file; ``record`` is what it holds.
        record: The run's record, as the parent wrote it; updated in place.
    """

    def __init__(self, path: Path, record: dict[str, Any]) -> None:
        super().__init__()
        self.path, self.record = path, record

    def training_start(self) -> None:
        super().training_start()
        self.record.update(status="running", setup_s=time.time() - START_TIME, evals=[])
        write_record(self.path, self.record)

    def evaluation_finished(self, env_steps: int, returns: list[float]) -> float:
        seconds = super().evaluation_finished(env_steps, returns)
        self.record["evals"].append({
            "env_steps": int(env_steps), "return_mean": float(np.mean(returns)), "return_std": float(np.std(returns)),
            "num_episodes": len(returns), "train_s": self.train_seconds(), "eval_s": seconds,
        })  # fmt: skip
        write_record(self.path, self.record)
        return seconds

    def training_end(self, env_steps: int, threads: int) -> None:
        super().training_end(env_steps, threads)
        self.record.update(
            status="done", env_steps=int(env_steps), train_s=self.train_seconds(), eval_s=self.eval_seconds,
            wall_s=time.time() - START_TIME, threads=threads,
            peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        )  # fmt: skip
        write_record(self.path, self.record)


def run_child(path: Path) -> None:
    """``--child PATH``: the run its file describes, in this process (the parent set the threads)."""
    import torch

    record = json.loads(path.read_text())
    torch.set_num_threads(record["threads"])
    recorder = RunRecorder(path, record)
    final_episodes = record.get("final_episodes", 0)
    if record["library"] == "sb3":
        from _sb3_suite import run_sb3

        act = run_sb3(record, recorder, save_to=saved_model(path, "sb3") if final_episodes else None)
    else:
        trainer = run_ours(record, recorder)
        if final_episodes:
            trainer.save_checkpoint(saved_model(path, "ours"))
            act = saved_act(record, path)
    if final_episodes:
        record["final_evaluation"] = final_evaluation(record, act)
        write_record(path, record)


def saved_model(path: Path, library: str) -> Path:
    """Where the run of ``path`` saves its final model: ours a ``.ckpt``, SB3 a ``.zip`` beside the run file."""
    return path.with_suffix(".zip" if library == "sb3" else ".ckpt")


def saved_act(record: dict[str, Any], path: Path) -> Callable[[np.ndarray], np.ndarray]:
    """The final model the run of ``path`` saved beside its file, read back: observations -> greedy actions.

    Ours: the checkpoint a user would evaluate, read back as ``lightning-rl evaluate`` reads it
    (observation normalization included). SB3: ``_sb3_suite.saved_act``.
    """
    if record["library"] == "sb3":
        from _sb3_suite import saved_act as sb3_saved_act

        return sb3_saved_act(record, saved_model(path, "sb3"))
    from lightning_rl.policy import Policy

    policy = Policy.from_checkpoint(saved_model(path, "ours"))
    return lambda obs: policy.act(obs, deterministic=True)


def run_ours(record: dict[str, Any], recorder: RunRecorder, callbacks: Sequence[Any] = ()) -> Any:
    """Fit our config on the run ``record`` describes, timed by ``recorder``, with more Lightning ``callbacks``
    after the timing one (e.g. ``dqn_q_stats.py``'s recorder); the Trainer, after ``fit``."""
    import torch

    cli = build_cli(REPO_ROOT / record["config"], record["seed"], record["max_env_steps"], record["extra_args"])
    cli.trainer.callbacks.append(make_timing_callback(recorder, torch.get_num_threads()))
    cli.trainer.callbacks.extend(callbacks)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli.trainer


def final_evaluation(record: dict[str, Any], act: Callable[[np.ndarray], np.ndarray]) -> dict[str, Any]:
    """The final policy's ``record["final_episodes"]`` greedy episodes, one per env, on seeds of this run's own.

    ``off_policy.GreedyEvaluation``'s protocol (the periodic evaluations'), with as many envs
    as episodes so that every env's first episode counts (none is favoured for ending sooner).
    """
    num_episodes, seed = record["final_episodes"], record["seed"]
    first_seed = FINAL_EVALUATION_SEED + seed * num_episodes
    data = {**record["hparams"]["data"], "evaluation_num_episodes": num_episodes, "evaluation_num_envs": num_episodes}
    evaluation = GreedyEvaluation(data, seed, first_seed=first_seed)
    started = time.time()
    returns = evaluation.run(act)
    evaluation.close()
    return {"num_episodes": num_episodes, "first_seed": first_seed, "return_mean": float(np.mean(returns)),
            "return_std": float(np.std(returns)), "returns": returns, "eval_s": time.time() - started}  # fmt: skip


# ----------------------------------------------------------------------------------------
# run: the parent, one subprocess per (seed, library)
# ----------------------------------------------------------------------------------------


def run_file(out: Path, task: str, library: str, seed: int) -> Path:
    return out / f"{task}-{library}-seed{seed}.json"


def finished_run(path: Path, budget: int, extra_args: list[str], final_episodes: int = 0) -> bool:
    """Whether ``path`` holds a finished run of this budget and these flags (and a final evaluation of
    ``final_episodes`` episodes, if any are asked for: a run without is run again).

    Raises:
        SystemExit: If it holds a finished run of another budget or other flags (it would
            otherwise be mixed into the report as if it were the same task).
    """
    if not path.is_file():
        return False
    record = json.loads(path.read_text())
    if record.get("status") != "done":
        return False
    if record["max_env_steps"] != budget or record["extra_args"] != extra_args:
        raise SystemExit(
            f"{path} is a finished run of {record['max_env_steps']} env steps with flags {record['extra_args']}, "
            f"not {budget} with {extra_args}: delete it or choose another --out"
        )
    return not final_episodes or record.get("final_evaluation", {}).get("num_episodes") == final_episodes


def run_task(args: argparse.Namespace) -> None:
    """``run``: every (seed, library) of a task not finished yet, one fresh subprocess each."""
    task = TASKS[args.task]
    budget = args.max_env_steps or task.max_env_steps
    seeds = args.seeds or list(task.seeds)
    requested = args.library or (list(LIBRARIES) if task.sb3 else ["ours"])
    if "sb3" in requested and not task.sb3:
        raise SystemExit(f"{args.task} runs ours only (see TASKS in {Path(__file__).name})")
    libraries = available_variants(requested)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra_args = list(args.extra_args)
    runs = [(seed, library) for index, seed in enumerate(seeds) for library in rotated(libraries, index)]
    finished = {
        run for run in runs
        if finished_run(run_file(out, args.task, run[1], run[0]), budget, extra_args, args.final_episodes)
    }  # fmt: skip
    print(f"{args.task}: {task.config}, {budget} env steps per run, seeds {seeds}, {libraries}, "
          f"{args.threads} thread(s) per run; files in {out}")  # fmt: skip
    if len(finished) == len(runs):
        print("  every run is done already")
        return
    hparams = effective_hparams(task.algo, REPO_ROOT / task.config, budget, extra_args)
    info = versions()
    for seed, library in runs:
        path = run_file(out, args.task, library, seed)
        if (seed, library) in finished:
            print(f"  {path.name}: done already, skipped")
            continue
        run_hparams = {**hparams, "data": {**hparams["data"], "seed": seed}}
        record = {
            "task": args.task, "library": library, "seed": seed, "config": task.config, "algo": task.algo,
            "max_env_steps": budget, "extra_args": extra_args, "final_episodes": args.final_episodes,
            "threads": args.threads, "status": "started",
            "evals": [], "hparams": run_hparams, "notes": [], "versions": info,
        }  # fmt: skip
        write_record(path, record)
        launched = time.time()
        returncode = launch(path, args.threads, args.timeout)
        record = json.loads(path.read_text())
        if returncode != 0 or record["status"] != "done":
            record.update(status="error", returncode=returncode)
            write_record(path, record)
        final = record["evals"][-1]["return_mean"] if record["evals"] else None
        played = record.get("final_evaluation")
        also = f", its {played['num_episodes']} final episodes {played['return_mean']:.1f}" if played else ""
        print(f"  {path.name}: {record['status']} in {time.time() - launched:.0f} s, "
              f"final eval return {fmt(final, '.1f')}{also} (log: {path.with_suffix('.log').name})")  # fmt: skip


def replay(args: argparse.Namespace) -> None:
    """``replay``: play every saved final model in ``--out`` again on its record's final-evaluation seeds.

    For when the evaluation itself changed (2026-11-30: ``GreedyEvaluation`` kept the first
    episodes to end, not to start): the record's ``final_evaluation`` becomes the new reading
    and the one it replaces is kept, with ``--reason``, in ``superseded_final_evaluations``. A
    record whose episodes replay as recorded is left as it is.
    """
    import torch

    out = Path(args.out)
    found = 0
    for path in sorted(out.glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("task") not in args.tasks or record.get("status") != "done" or "final_evaluation" not in record:
            continue
        saved = saved_model(path, record["library"])
        if not saved.is_file():
            print(f"  {path.name}: its saved model {saved.name} is missing, left as it is")
            continue
        found += 1
        torch.set_num_threads(record["threads"])
        before = record["final_evaluation"]
        after = final_evaluation(record, saved_act(record, path))
        if after["returns"] == before["returns"]:
            print(f"  {path.name}: its {before['num_episodes']} final episodes replay as recorded, left as they are")
            continue
        superseded = {key: value for key, value in before.items() if key != "eval_s"}
        record.setdefault("superseded_final_evaluations", []).append({**superseded, "reason": args.reason})
        record["final_evaluation"] = after
        write_record(path, record)
        print(f"  {path.name}: {before['num_episodes']} final episodes {before['return_mean']:.1f} -> "
              f"{after['return_mean']:.1f}")  # fmt: skip
    if not found:
        raise SystemExit(f"no finished run in {out} has a final evaluation and its saved model")


def launch(path: Path, threads: int, timeout: float | None) -> int:
    """Run ``--child path`` in a fresh process with ``threads`` OMP/MKL threads; its output to ``path``'s ``.log``."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(path)]
    with path.with_suffix(".log").open("w") as log:
        try:
            return subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            return -9


# ----------------------------------------------------------------------------------------
# report: a table and a learning-curve plot per task
# ----------------------------------------------------------------------------------------


def final_return(record: dict[str, Any]) -> float | None:
    return record["evals"][-1]["return_mean"] if record["status"] == "done" and record["evals"] else None


def played_return(record: dict[str, Any]) -> float | None:
    """The mean return of the final policy's ``--final-episodes`` episodes, if the run played them."""
    played = record.get("final_evaluation")
    return played["return_mean"] if record["status"] == "done" and played else None


def steps_per_second(record: dict[str, Any]) -> float | None:
    return record["env_steps"] / record["train_s"] if record["status"] == "done" and record["train_s"] else None


def wall_seconds(record: dict[str, Any]) -> float | None:
    return record["setup_s"] + record["train_s"] if record["status"] == "done" else None


def median_of(records: list[dict[str, Any]], measure: Any) -> float | None:
    values = [value for record in records if (value := measure(record)) is not None]
    return statistics.median(values) if values else None


def task_report(name: str, records: list[dict[str, Any]]) -> str:
    """The markdown of one task: its table, its targets and its plot."""
    task = TASKS[name]
    budgets = {record["max_env_steps"] for record in records}
    if len(budgets) > 1:
        raise SystemExit(f"{name}: runs of different budgets {sorted(budgets)} in one directory")
    data = records[0]["hparams"]["data"]
    per_eval = data["rollouts_per_epoch"] * (data.get("train_freq") or data["num_envs"] * data["rollout_fragment_length"])
    runs = {library: [r for r in records if r["library"] == library] for library in LIBRARIES}
    runs = {library: rs for library, rs in runs.items() if rs}
    done = {library: [r for r in rs if r["status"] == "done"] for library, rs in runs.items()}
    sb3_version = next((r["versions"].get("stable-baselines3") for r in runs.get("sb3", [])), None)
    lines = [
        f"### {task.title}",
        "",
        f"`{task.config}`" + (f" beside SB3 {sb3_version} {task.algo.upper()} with the same hyperparameters"
                              if "sb3" in runs else "") + f"; {budgets.pop():,} env steps per run, "
        f"{data['evaluation_num_episodes']} greedy evaluation episodes every {per_eval:,} env steps; "
        f"{records[0]['threads']} thread(s) per run.",
        "",
        "| library | runs done | final eval return: median [min, max] | env steps/s (median) | wall s (median) |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    finals = {library: [value for r in rs if (value := final_return(r)) is not None] for library, rs in done.items()}
    for library, rs in runs.items():
        values = finals[library]
        spread = f"{statistics.median(values):,.1f} [{min(values):,.1f}, {max(values):,.1f}]" if values else "-"
        lines.append(
            f"| {LIBRARY_LABELS[library]} | {len(done[library])}/{len(rs)} (seeds "
            f"{', '.join(str(r['seed']) for r in sorted(rs, key=lambda r: r['seed']))}) | {spread} | "
            f"{fmt(median_of(done[library], steps_per_second), ',.0f')} | {fmt(median_of(done[library], wall_seconds), ',.0f')} |"
        )
    medians = {
        library: {measure.__name__: median_of(rs, measure) for measure in (final_return, steps_per_second, wall_seconds)}
        for library, rs in done.items()
    }  # fmt: skip
    ours, sb3 = medians.get("ours", {}), medians.get("sb3", {})
    if ours and sb3:
        lines.append(
            f"| ours / SB3 | | | {ratio(ours['steps_per_second'], sb3['steps_per_second'])} | "
            f"{ratio(ours['wall_seconds'], sb3['wall_seconds'])} |"
        )
    if min(len(finals.get(library, [])) for library in ("ours", "sb3")) >= 2:
        gap, p_value = median_gap_p_value(finals["ours"], finals["sb3"])
        lines += ["", f"Seed noise: ours' median final return minus SB3's is {gap:,.1f}. Were both libraries' "
                  f"returns from one distribution, a difference of {gap:,.1f} or less would come up in "
                  f"{p_value:.0%} of the ways to split the {len(finals['ours']) + len(finals['sb3'])} runs into "
                  "groups of these sizes (a one-sided permutation test, "
                  f"{exactness(len(finals['ours']), len(finals['sb3']))})."]  # fmt: skip
    lines += final_policy_lines(task, done)
    lines += ["", "Final eval return: the mean over the last evaluation's episodes, after the last update. Env steps/s: "
              "env steps over the training loop's time, evaluation left out; wall: set-up plus that loop. A ratio "
              "above 1 is faster for env steps/s and slower for wall time.", "",
              "Targets (issue 17): " + targets(task, ours, sb3), "",
              f"![{name}: evaluation return vs env steps]({name}.png)", ""]  # fmt: skip
    return "\n".join(lines)


def final_policy_lines(task: Task, done: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The report's lines on the runs' ``--final-episodes`` evaluations (none if no run played them), with the
    task's target on SB3's median return judged on that reading too."""
    played = {library: [r for r in rs if played_return(r) is not None] for library, rs in done.items()}
    played = {library: sorted(rs, key=lambda r: r["seed"]) for library, rs in played.items() if rs}
    if not played:
        return []
    parts = []
    for library, rs in played.items():
        values = [played_return(r) for r in rs]
        episodes = sorted({r["final_evaluation"]["num_episodes"] for r in rs})
        parts.append(f"{LIBRARY_LABELS[library]} {statistics.median(values):,.1f} [{min(values):,.1f}, "
                     f"{max(values):,.1f}] (seeds {', '.join(str(r['seed']) for r in rs)}; "
                     f"{'/'.join(map(str, episodes))} episodes each)")  # fmt: skip
    lines = ["", "Each run's final policy played on env seeds of its own (`--final-episodes`), mean return, median "
             "[min, max] over seeds: " + "; ".join(parts) + "."]  # fmt: skip
    if len(played.get("ours", [])) >= 2 and len(played.get("sb3", [])) >= 2:
        ours, sb3 = ([played_return(r) for r in played[library]] for library in ("ours", "sb3"))
        gap, p_value = median_gap_p_value(ours, sb3)
        lines[-1] += (f" Ours' median minus SB3's: {gap:,.1f} (one-sided permutation p {p_value:.2f}, "
                      f"{exactness(len(ours), len(sb3))}).")  # fmt: skip
        if "return" in task.vs_sb3:
            lines[-1] += f" On this reading, ours' median >= SB3's: {'met' if gap >= 0 else 'NOT met'}."
    return lines


def ratio(numerator: float | None, denominator: float | None) -> str:
    return "-" if numerator is None or not denominator else f"{numerator / denominator:.2f}x"


def targets(task: Task, ours: dict[str, float | None], sb3: dict[str, float | None]) -> str:
    """Each of the task's targets, met or not (or why it cannot be judged yet)."""
    checks = []
    if task.min_return is not None:
        value = ours.get("final_return")
        verdict = "no finished run" if value is None else f"{'met' if value >= task.min_return else 'NOT met'} ({value:,.1f})"
        checks.append(f"ours' median eval return >= {task.min_return:g}: {verdict}")
    wording = {
        "return": ("final_return", "median eval return >= SB3's", lambda a, b: a >= b, ",.1f", ""),
        "wall": ("wall_seconds", "median wall time <= SB3's", lambda a, b: a <= b, ",.0f", " s"),
        "speed": ("steps_per_second", "median env steps/s >= SB3's", lambda a, b: a >= b, ",.0f", ""),
    }
    for what in task.vs_sb3:
        key, text, passes, spec, unit = wording[what]
        a, b = ours.get(key), sb3.get(key)
        if a is None or b is None:
            checks.append(f"{text}: needs finished runs of both")
        else:
            checks.append(f"{text}: {'met' if passes(a, b) else 'NOT met'} ({a:{spec}}{unit} vs {b:{spec}}{unit})")
    return "; ".join(checks) if checks else "none in issue 17 for this task."


def plot_task(name: str, records: list[dict[str, Any]], path: Path) -> None:
    """Evaluation return vs env steps: per library the mean over seeds and the min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    task = TASKS[name]
    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    for library in LIBRARIES:
        rs = [r for r in records if r["library"] == library and r["evals"]]
        if not rs:
            continue
        by_step: dict[int, list[float]] = defaultdict(list)
        for r in rs:
            for point in r["evals"]:
                by_step[point["env_steps"]].append(point["return_mean"])
        steps = np.array(sorted(by_step))
        values = [by_step[s] for s in steps]
        line = axes.plot(steps, [np.mean(v) for v in values], label=f"{LIBRARY_LABELS[library]} ({len(rs)} seeds)")
        axes.fill_between(steps, [min(v) for v in values], [max(v) for v in values], alpha=0.25,
                          color=line[0].get_color(), linewidth=0)  # fmt: skip
    if task.min_return is not None:
        axes.axhline(task.min_return, color="gray", linestyle="--", linewidth=1, label=f"target {task.min_return:g}")
    axes.set_xlabel("env steps")
    axes.set_ylabel("evaluation return (greedy)")
    axes.set_title(f"{task.title}: mean and min-max over seeds")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def report(args: argparse.Namespace) -> None:
    """``report``: ``suite.md`` and one PNG per task from the run files in ``--out``."""
    out = Path(args.out)
    records: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(out.glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("task") in TASKS:
            records[record["task"]].append(record)
    names = [name for name in (args.tasks or TASKS) if records.get(name)]
    if not names:
        raise SystemExit(f"no run files in {out}")
    sections = []
    for name in names:
        sections.append(task_report(name, records[name]))
        plot_task(name, records[name], out / f"{name}.png")
    text = "\n".join(sections)
    (out / "suite.md").write_text(text)
    print(text)
    print(f"wrote {out / 'suite.md'} and {', '.join(f'{name}.png' for name in names)}")


def list_tasks() -> None:
    for name, task in TASKS.items():
        target = targets(task, {}, {}).replace(": no finished run", "").replace(": needs finished runs of both", "")
        print(f"{name:<22}{task.config:<36}{task.max_env_steps:>11,} env steps x seeds {list(task.seeds)}; "
              f"{'ours and SB3' if task.sb3 else 'ours only'}; targets: {target}")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", metavar="PATH", help=argparse.SUPPRESS)  # internal: the run in PATH, here
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("list", help="the tasks, their budgets and targets")
    run = commands.add_parser("run", help="run a task's seeds and libraries (finished runs are skipped)")
    run.add_argument("task", choices=list(TASKS))
    run.add_argument("--library", nargs="+", choices=LIBRARIES, help="default: ours and sb3 (ours only for MinAtar)")
    run.add_argument("--seeds", type=int, nargs="+", help="default: the task's")
    run.add_argument("--max-env-steps", type=int, help="env steps per run (default: the task's)")
    run.add_argument("--threads", type=int, default=1, help="OMP/MKL threads and torch.set_num_threads per run")
    run.add_argument("--timeout", type=float, help="seconds before a run is killed (default: none)")
    run.add_argument("--final-episodes", type=int, default=0, metavar="N",
                     help="after training, save the model beside the run file and play N greedy episodes with it, "
                          "on env seeds no other run uses (default: 0, none)")  # fmt: skip
    run.add_argument("--out", default=str(DEFAULT_OUT), help="directory of the run files (default: %(default)s)")
    run.epilog = "Flags after -- go to our CLI on top of the config, and SB3 copies what they change."
    rep = commands.add_parser("report", help="tables (suite.md) and plots (<task>.png) of the run files in --out")
    rep.add_argument("--tasks", nargs="+", choices=list(TASKS), help="default: every task with run files")
    rep.add_argument("--out", default=str(DEFAULT_OUT), help="directory of the run files (default: %(default)s)")
    rerun = commands.add_parser("replay", help="play the saved final models in --out again, rewriting their "
                                "final evaluations (the earlier ones are kept in the run files)")  # fmt: skip
    rerun.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS),
                       help="default: every task")  # fmt: skip
    rerun.add_argument("--reason", required=True, help="why, kept with each superseded reading")
    rerun.add_argument("--out", default=str(DEFAULT_OUT), help="directory of the run files (default: %(default)s)")
    argv = sys.argv[1:] if argv is None else argv
    # After "--": flags on top of the config, for both libraries (argparse's "--" does not reach a subcommand).
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.extra_args = argv[cut + 1 :]
    if args.child is None and args.command is None:
        parser.error("choose a command: list, run, report or replay")
    if args.extra_args and args.command != "run":
        parser.error("flags after -- are for the run command")
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        run_child(Path(args.child))
    elif args.command == "list":
        list_tasks()
    elif args.command == "run":
        run_task(args)
    elif args.command == "replay":
        replay(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
