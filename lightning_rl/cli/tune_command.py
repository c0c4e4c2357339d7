"""``lightning-rl tune``: an Optuna study over a training config, each trial an ordinary ``lightning-rl fit``.

    lightning-rl tune --config examples/tune_ppo_cartpole.yaml [--output_dir D] [--n_trials N] [--n_jobs J]

The tune file (``tune_settings.py``) names a training config, a search space over its model
and data keys, overrides for every trial, and the study's settings. For each trial this
command asks the study for values, writes ``<output_dir>/trial_<n>/config.yaml`` (the
training config, the trial's overrides and values, ``trainer.default_root_dir`` set to the
trial's directory, and a ``StoredTrialPruning`` callback), and runs
``python -m lightning_rl fit --config`` on it in a process of its own (one intra-op thread,
its output in ``fit.log``); ``n_jobs`` such processes run at once. Every trial's TensorBoard
run stays in its directory. The trials are forked from multiprocessing's fork server, which
imports torch, Lightning and the command line once for the whole study, where a new Python
process would import them again for every trial (~10 s on a 2-core machine); each trial then
runs as that command would, down to the command line a DDP fit relaunches its ranks with.

The callback reports ``eval/episode_return_mean`` at each evaluation's env-step count and
stops the fit when the study's pruner prunes it. A trial's value is the best evaluation
return of its fit: the fit's ``ModelCheckpoint`` keeps the checkpoint of that evaluation, so
the best value is what the trial's run hands over (and the example's ``EarlyStopping`` ends a
fit at its best). A fit that exits with an error is a failed trial; the study goes on, but
stops after ``MAX_FAILURES_IN_A_ROW`` in a row (a broken config would fail them all).

The study lives in a SQLite file (``study.db`` in the output directory). Running the same
command again resumes it: finished trials (complete or pruned) are kept and count toward
``n_trials``; a trial left running by a killed command is marked failed and its values are
queued to run again. A lock file lets one command at a time run a study's trials.

At the end ``<output_dir>/best_config.yaml`` is the config the best trial ran, without the
tuning's callback and directory: ``lightning-rl fit --config best_config.yaml`` runs it.

This process imports neither torch nor Lightning (its fork server does); Optuna is the ``[tune]`` extra.
"""

from __future__ import annotations

import argparse
import atexit
import fcntl
import importlib.util
import multiprocessing
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from lightning_rl.callbacks.optuna_trials import PRUNED_AT_ATTR, make_pruner, open_storage, require_optuna
from lightning_rl.cli._command_line import CommandError, OneLineArgumentParser, positive_int, run_command, tell
from lightning_rl.cli.tune_settings import SearchParameter, TuneSettings, apply_overrides, read_tune_file
from lightning_rl.core.processes import adopt_environment, die_with_parent, main_script_not_rerun, release_fork_server

#: The file the best trial's config is written to, in the output directory.
BEST_CONFIG_FILE = "best_config.yaml"
#: Each trial's config and log, in its directory.
TRIAL_CONFIG_FILE = "config.yaml"
TRIAL_LOG_FILE = "fit.log"
#: The class path of the callback added to each trial's config.
PRUNING_CALLBACK = "lightning_rl.callbacks.pruning.StoredTrialPruning"
#: Failed trials in a row after which the study stops: a broken config or flag fails every trial.
MAX_FAILURES_IN_A_ROW = 3
#: The trial user attribute naming the trial's directory.
TRIAL_DIR_ATTR = "trial_dir"


def build_parser() -> argparse.ArgumentParser:
    """The ``tune`` command's arguments."""
    parser = OneLineArgumentParser(
        prog="lightning-rl tune",
        description="Search a training config's hyperparameters with Optuna; each trial is a lightning-rl fit.",
    )
    parser.add_argument("--config", required=True, type=Path, help="the tune file (see examples/tune_ppo_cartpole.yaml)")
    parser.add_argument("--output_dir", type=Path, default=None, help="default: the tune file's output_dir")
    parser.add_argument("--n_trials", type=positive_int, default=None, help="finished trials the study ends with")
    parser.add_argument("--n_jobs", type=positive_int, default=None, help="trials run at once, one process each")
    return parser


def main(args: list[str]) -> None:
    """Run ``lightning-rl tune`` with ``args`` (the words after ``tune``).

    A bad tune file, a missing Optuna, or a study already being run by another command ends
    with one line on stderr and exit status 2.
    """
    run_command(build_parser(), args, _tune)


def _tune(args: argparse.Namespace) -> None:
    settings = read_tune_file(args.config, args.output_dir, args.n_trials, args.n_jobs)
    # This command prints a line per trial itself; Optuna's own info lines would repeat them.
    require_optuna().logging.set_verbosity(require_optuna().logging.WARNING)
    settings.output_dir.mkdir(parents=True, exist_ok=True)
    with _study_lock(settings.output_dir):
        study = open_study(settings)
        resume_interrupted_trials(study)
        TrialRunner(settings, study).run()
        summarize(settings, study)


@contextmanager
def _study_lock(output_dir: Path) -> Iterator[None]:
    """Hold ``output_dir/.tune.lock`` while the study runs; the system frees it if the process dies."""
    with open(output_dir / ".tune.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CommandError(f"{output_dir}: another lightning-rl tune is running this study") from None
        yield


def open_study(settings: TuneSettings) -> Any:
    """The study in ``settings``' storage, made on the first run and loaded on later ones."""
    optuna = require_optuna()
    study_settings = settings.study
    sampler_class = optuna.samplers.TPESampler if study_settings.sampler == "tpe" else optuna.samplers.RandomSampler
    pruner = make_pruner(study_settings.pruner, study_settings.pruner_args)  # bad pruner_args: before any file
    return optuna.create_study(
        storage=open_storage(study_settings.storage),
        sampler=sampler_class(seed=study_settings.seed),
        pruner=pruner,
        study_name=study_settings.study_name,
        direction=study_settings.direction,
        load_if_exists=True,
    )


def resume_interrupted_trials(study: Any) -> list[int]:
    """Mark the trials a killed command left running as failed, and queue their values again.

    Only one command runs a study's trials at a time (the lock), so every running trial
    found here belongs to a command that is gone. Returns their numbers.
    """
    optuna = require_optuna()
    interrupted = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for trial in interrupted:
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        tell(f"trial {trial.number} was interrupted: marked failed, its values queued again")
    return [trial.number for trial in interrupted]


def finished_trials(study: Any) -> list[Any]:
    """The study's complete and pruned trials: those that count toward ``n_trials``."""
    optuna = require_optuna()
    return study.get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    )


class TrialRunner:
    """Runs trials until the study holds ``n_trials`` finished ones, ``n_jobs`` at a time.

    Each of ``n_jobs`` threads asks the study for a trial, runs its fit in a child process
    and tells the study how it ended; the threads only wait on their children.

    Args:
        settings: The checked tune file.
        study: The study, opened on its storage.
    """

    def __init__(self, settings: TuneSettings, study: Any) -> None:
        self.settings = settings
        self.study = study
        self._lock = threading.Lock()
        self._finished = len(finished_trials(study))
        self._running = 0
        self._failures_in_a_row = 0
        self._children: set[multiprocessing.Process] = set()
        # What the fork server imports once for every trial: the fit command, torch and Lightning.
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(["lightning_rl.cli.lightning_cli", __name__])

    def run(self) -> None:
        """Run the remaining trials; return when the study has ``n_trials`` finished or too many failed."""
        remaining = self.settings.study.n_trials - self._finished
        if remaining <= 0:
            tell(f"the study already has {self._finished} finished trials (n_trials {self.settings.study.n_trials})")
            return
        tell(f"running {remaining} trials, {self.settings.study.n_jobs} at a time, in {self.settings.output_dir}")
        threads = [threading.Thread(target=self._work, daemon=True) for _ in range(self.settings.study.n_jobs)]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        finally:
            # Ctrl-C: end the fits too (kill -9 of this process ends them through PR_SET_PDEATHSIG).
            with self._lock:
                for child in self._children:
                    child.kill()
        if self._failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
            raise CommandError(f"{MAX_FAILURES_IN_A_ROW} trials failed in a row; see their {TRIAL_LOG_FILE}")

    def _work(self) -> None:
        while True:
            with self._lock:
                if self._finished + self._running >= self.settings.study.n_trials:
                    return
                if self._failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
                    return
                self._running += 1
                trial = self.study.ask({p.key: distribution(p) for p in self.settings.search_space})
            try:
                state = self._run_trial(trial)
            except Exception as error:  # noqa: BLE001 (storage trouble): this trial failed, the others go on
                tell(f"trial {trial.number} failed: {type(error).__name__}: {error}")
                self.study.tell(trial, state=require_optuna().trial.TrialState.FAIL, skip_if_finished=True)
                state = "FAIL"
            with self._lock:
                self._running -= 1
                if state == "FAIL":
                    self._failures_in_a_row += 1
                else:
                    self._finished += 1
                    self._failures_in_a_row = 0

    def _run_trial(self, trial: Any) -> str:
        """Run ``trial``'s fit and tell the study its outcome; the outcome's state name."""
        optuna = require_optuna()
        trial_dir = self.settings.output_dir / f"trial_{trial.number}"
        trial_dir.mkdir(parents=True, exist_ok=True)
        trial.set_user_attr(TRIAL_DIR_ATTR, str(trial_dir))
        config_file = trial_dir / TRIAL_CONFIG_FILE
        _write_yaml(config_file, trial_config(self.settings, trial.number, trial.params))
        returncode = self._run_fit(config_file, trial_dir / TRIAL_LOG_FILE)
        stored = self.study.get_trials(deepcopy=False)[trial.number]
        values = stored.intermediate_values
        if returncode != 0 or not values:
            why = f"the fit exited with status {returncode}" if returncode != 0 else "no evaluation ran"
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            tell(f"trial {trial.number} failed: {why}; see {trial_dir / TRIAL_LOG_FILE}")
            return "FAIL"
        best = max(values.values()) if self.settings.study.direction == "maximize" else min(values.values())
        if PRUNED_AT_ATTR in stored.user_attrs:
            # Told as pruned, a trial's value is its last report; its best is kept as an attribute.
            trial.set_user_attr("best_value", best)
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            tell(f"trial {trial.number} pruned at env step {stored.user_attrs[PRUNED_AT_ATTR]}: best {best:.2f}")
            return "PRUNED"
        self.study.tell(trial, best)
        tell(f"trial {trial.number}: {best:.2f} {_format_params(trial.params)}")
        return "COMPLETE"

    def _run_fit(self, config_file: Path, log_file: Path) -> int:
        """Run ``lightning-rl fit --config config_file`` in a child process; its exit status.

        The output goes to ``log_file``. The status is a process's: 0, the fit's own (1 for an
        error), or minus the signal that killed it.
        """
        # One intra-op thread per fit: n_jobs fits share the machine's cores (docs/tutorials/scaling.md, "Threads").
        environment = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        child = self._context.Process(
            target=run_trial_fit, args=(str(config_file), str(log_file), environment), name=log_file.parent.name
        )
        with self._lock:  # one start at a time: main_script_not_rerun hides this process's __main__ while it starts
            with main_script_not_rerun():  # the trial needs nothing from the command's script
                child.start()
            self._children.add(child)
        child.join()
        with self._lock:
            self._children.discard(child)
        return child.exitcode


def run_trial_fit(config_file: str, log_file: str, environment: dict[str, str]) -> None:
    """The body of a trial's process: ``python -m lightning_rl fit --config config_file``, output to ``log_file``.

    Forked from the fork server, the process is made to look like that command: the tune
    command's environment of now (the server's is of when it started) and the torch thread
    count its ``OMP_NUM_THREADS`` gives, stdout and stderr on the log, and ``sys.argv`` and
    ``__main__`` as ``python -m`` sets them, so that a DDP fit relaunches its other ranks with
    that command line. It dies with the tune command (even with a ``kill -9``), and runs the
    ``atexit`` handlers that a process ending normally runs (a forked process skips them).

    Args:
        config_file: The trial's training config.
        log_file: Where the fit's output goes (written anew).
        environment: The environment the fit runs in.
    """
    adopt_environment(environment)
    # A new process's torch reads OMP_NUM_THREADS as it loads, and the fit command then leaves
    # it alone; the server loaded torch without it (two trials on 2 cores at 2 threads each ran
    # 5-20x slower), so the count is set here.
    import torch

    torch.set_num_threads(int(environment["OMP_NUM_THREADS"]))
    # Without the server's pipe the server ends with the tune command, and with it this process
    # (its parent): a kill -9 of the command leaves no fit behind.
    release_fork_server()
    die_with_parent()
    log = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    # As ``python -m lightning_rl`` sets them: Lightning's DDP launcher starts the other ranks
    # with ``python -m <__main__'s module> <sys.argv[1:]>`` (the server's own are ``python -c ...``).
    command_module = importlib.util.find_spec("lightning_rl.__main__")
    sys.argv = [command_module.origin, "fit", "--config", config_file]
    sys.modules["__main__"].__spec__ = command_module
    from lightning_rl.cli import main

    try:
        main()
    finally:
        atexit._run_exitfuncs()


def distribution(parameter: SearchParameter) -> Any:
    """The Optuna distribution of one search-space entry."""
    optuna = require_optuna()
    if parameter.type == "categorical":
        return optuna.distributions.CategoricalDistribution(parameter.choices)
    if parameter.type == "int":
        return optuna.distributions.IntDistribution(
            int(parameter.low), int(parameter.high), log=parameter.log, step=int(parameter.step or 1)
        )
    return optuna.distributions.FloatDistribution(parameter.low, parameter.high, log=parameter.log, step=parameter.step)


def trial_config(settings: TuneSettings, trial_number: int, params: dict[str, Any]) -> dict[str, Any]:
    """The training config that trial ``trial_number`` fits: the trial's overrides and values set, runs in its directory."""
    config = apply_overrides(settings.train_config, {**settings.trial_overrides, **params})
    trainer = config.setdefault("trainer", {})
    trainer["default_root_dir"] = str(settings.output_dir / f"trial_{trial_number}")
    study = settings.study
    pruning = {
        "class_path": PRUNING_CALLBACK,
        "init_args": {
            "storage": study.storage,
            "study_name": study.study_name,
            "trial_number": trial_number,
            "pruner": study.pruner,
            "pruner_args": study.pruner_args,
            "monitor": study.metric,
        },
    }
    trainer["callbacks"] = [*(trainer.get("callbacks") or []), pruning]
    return config


def best_config(settings: TuneSettings, params: dict[str, Any]) -> dict[str, Any]:
    """What the best trial ran, for ``lightning-rl fit``: the training config, the trial overrides and ``params``."""
    return apply_overrides(settings.train_config, {**settings.trial_overrides, **params})


def summarize(settings: TuneSettings, study: Any) -> None:
    """Write ``best_config.yaml`` and print the study's result."""
    finished = finished_trials(study)
    complete = [trial for trial in finished if trial.state.name == "COMPLETE"]
    tell(f"study {settings.study.study_name}: {len(complete)} complete, {len(finished) - len(complete)} pruned trials")
    if not complete:
        tell("no trial completed: no best config")
        return
    best = study.best_trial
    path = settings.output_dir / BEST_CONFIG_FILE
    header = (
        f"# The best trial ({best.number}) of the study {settings.study.study_name}: "
        f"{settings.study.metric} {best.value:.4g}\n"
        f"# from {settings.tune_file} over {settings.train_config_path}; run it with\n"
        f"#   lightning-rl fit --config {path}\n"
    )
    _write_yaml(path, best_config(settings, best.params), header)
    tell(f"best trial {best.number}: {settings.study.metric} {best.value:.2f} {_format_params(best.params)}")
    tell(f"best config: {path}")
    tell(f"trial runs: {settings.output_dir}/trial_*/ (tensorboard --logdir {settings.output_dir})")
    tell(f"study: {settings.study.storage}")


def _format_params(params: dict[str, Any]) -> str:
    """``lr=0.0006 num_epochs=12``: each parameter by the last part of its key."""
    shown = (f"{value:.4g}" if isinstance(value, float) else str(value) for value in params.values())
    return " ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in zip(params, shown))


def _write_yaml(path: Path, content: dict[str, Any], header: str = "") -> None:
    """Write ``content`` to ``path`` whole (a new file renamed over the old one)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(header + yaml.safe_dump(content, sort_keys=False))
    temporary.replace(path)
