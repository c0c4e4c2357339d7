"""``soak.py kill``: kill -9 / resume cycles of a PPO fit, with every checkpoint checked after each.

The fit is ``lightning-rl fit --config examples/ppo_cartpole.yaml`` (run as ``python -m
lightning_rl``, with ``OMP_NUM_THREADS=1``, so torch uses one thread) with a second config
layered over it: a ``ModelCheckpoint(every_n_train_steps=1, save_last=True)`` instead of the
config's callbacks, so a checkpoint (``epoch=..-env_steps=...ckpt``, the previous one removed) and
``last.ckpt`` are written after every train item; 4 train items per epoch with 2 evaluation
episodes (``--no-evaluate``: none, ``limit_val_batches: 0``); no env-step limit.
``--trainer.default_root_dir`` is on another filesystem than
the fit's ``$TMPDIR`` (``/dev/shm`` unless ``--root-dir`` says otherwise): the case where a
checkpoint moved from a temporary file in ``$TMPDIR`` is a copy that a kill can cut short.
The fit's ``$TMPDIR`` is a fresh directory on ``$TMPDIR``'s filesystem, so whatever is left
in it was left by these fits.

A cycle: start the fit (resuming with ``--ckpt_path`` from the newest ``last.ckpt``: the one
in the highest ``version_N`` that has one, since every resumed run gets a new version
directory), wait for its first checkpoint, wait a further random time (seeded by ``--seed``,
up to ``--max-wait`` seconds), and SIGKILL its process group. Then check:

  checkpoints   every ``*.ckpt`` under the root loads with
                ``lightning_rl.core.checkpoint.read_checkpoint_file`` (checksum included): an
                empty, truncated or damaged file is named with the problem (files are checked
                again whenever they change);
  temp files    no ``.lightning_rl-partial.*`` (``TEMPORARY_PREFIX``) or other non-``.ckpt``
                file in a ``checkpoints`` directory, no ``*.tmp`` under the root, nothing new
                in the fit's ``$TMPDIR``. A kill during a save may leave one for a while (the
                next save into that directory removes it); those still there after the last
                cycle are the orphans;
  monotone      ``global_step`` and the data module's ``num_env_steps_sampled_lifetime`` of
                the newest ``last.ckpt`` never go back from one cycle to the next, and every
                checkpoint a resumed run wrote is at or past the one it resumed from.

The command fails (exit code 1) on any bad checkpoint, orphan, counter that went back, or a
fit that ended by itself or never saved; after ``--max-failures`` such cycles in a row it
stops (every later cycle would resume from the same checkpoint).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_rl.core.checkpoint import TEMPORARY_PREFIX, read_checkpoint_file

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG = "examples/ppo_cartpole.yaml"
ENV_STEPS_KEY = "num_env_steps_sampled_lifetime"
OVERRIDES = """\
trainer:
  limit_val_batches: {limit_val_batches}
  enable_progress_bar: false
  enable_model_summary: false
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        every_n_train_steps: 1
        save_last: true
data:
  init_args:
    rollouts_per_epoch: 4
    evaluation_num_episodes: 2
    max_env_steps: null
"""
_VERSION = re.compile(r"version_(\d+)$")


class CycleError(RuntimeError):
    """A cycle that could not do its part: the fit ended by itself, or never saved in time."""


@dataclass
class Places:
    """Where the cycles write: the fit's root (checkpoints), its ``$TMPDIR``, and the fits' output logs."""

    root: Path
    tmp: Path
    logs: Path


@dataclass
class Verdict:
    """What the checks found so far, over all cycles."""

    checked: dict[tuple[str, int, int, int], tuple[int, int]] = field(default_factory=dict)  # file version -> counters
    bad: dict[str, str] = field(default_factory=dict)  # file -> problem
    temporary: dict[str, int] = field(default_factory=dict)  # temp file -> cycle that first saw it
    backwards: list[str] = field(default_factory=list)  # counters that went back, described
    failures: list[str] = field(default_factory=list)  # cycles that could not run


# ----------------------------------------------------------------------------------------
# Directories
# ----------------------------------------------------------------------------------------


def choose_places(args: argparse.Namespace) -> Places:
    """Make the three directories; the root on another filesystem than ``$TMPDIR`` when one is found."""
    tmp_parent = Path(tempfile.gettempdir())
    if args.root_dir:
        root_parent = Path(args.root_dir)
    elif Path("/dev/shm").is_dir() and os.stat("/dev/shm").st_dev != os.stat(tmp_parent).st_dev:
        root_parent = Path("/dev/shm")
    else:
        root_parent = tmp_parent
    root_parent.mkdir(parents=True, exist_ok=True)
    places = Places(
        root=Path(tempfile.mkdtemp(prefix="soak-kill-root-", dir=root_parent)),
        tmp=Path(tempfile.mkdtemp(prefix="soak-kill-tmpdir-", dir=tmp_parent)),
        logs=Path(tempfile.mkdtemp(prefix="soak-kill-logs-", dir=tmp_parent)),
    )
    root_dev, tmp_dev = os.stat(places.root).st_dev, os.stat(places.tmp).st_dev
    print(f"checkpoints (default_root_dir): {places.root}  st_dev {root_dev}")
    print(f"the fit's $TMPDIR:              {places.tmp}  st_dev {tmp_dev}")
    if root_dev == tmp_dev:
        print("WARNING: the same filesystem: this run does not test cross-filesystem saves (see --root-dir)")
    return places


def version_dirs(root: Path) -> dict[int, Path]:
    """The fit's version directories, by number."""
    logs = root / "lightning_logs"
    found = {}
    if logs.is_dir():
        for entry in logs.iterdir():
            match = _VERSION.match(entry.name)
            if match and entry.is_dir():
                found[int(match.group(1))] = entry
    return found


def newest_last(root: Path) -> Path | None:
    """``last.ckpt`` of the highest version directory that has one (each resumed run gets a new one)."""
    for _, directory in sorted(version_dirs(root).items(), reverse=True):
        last = directory / "checkpoints" / "last.ckpt"
        if last.is_file():
            return last
    return None


def temporary_files(places: Places) -> set[str]:
    """Files a save may leave behind: see the module docstring's "temp files"."""
    found = {str(path) for path in places.tmp.rglob("*")}
    for path in places.root.rglob("*"):
        in_checkpoints = path.parent.name == "checkpoints" and path.suffix != ".ckpt"
        if path.name.startswith(TEMPORARY_PREFIX) or path.suffix == ".tmp" or in_checkpoints:
            found.add(str(path))
    return found


# ----------------------------------------------------------------------------------------
# One cycle
# ----------------------------------------------------------------------------------------


def start_fit(places: Places, cycle: int, resume_from: Path | None) -> subprocess.Popen:
    """Start the fit in a new process group, its output in ``logs/cycle_<n>.log``."""
    command = [sys.executable, "-m", "lightning_rl", "fit", "--config", CONFIG,
               "--config", str(places.logs / "overrides.yaml"), "--trainer.default_root_dir", str(places.root)]  # fmt: skip
    if resume_from is not None:
        command += ["--ckpt_path", str(resume_from)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TMPDIR=str(places.tmp), PYTHONUNBUFFERED="1")
    with open(places.logs / f"cycle_{cycle}.log", "wb") as log:
        return subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def wait_for_first_save(proc: subprocess.Popen, places: Places, before: set[int], timeout: float) -> Path:
    """The new version directory, once a checkpoint is in it.

    Raises:
        CycleError: If the fit exits, or writes no checkpoint within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CycleError(f"the fit exited by itself with code {proc.returncode} before its first save")
        for number, directory in version_dirs(places.root).items():
            if number not in before and any((directory / "checkpoints").glob("*.ckpt")):
                return directory
        time.sleep(0.05)
    raise CycleError(f"no checkpoint within {timeout:.0f} s")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the fit's process group and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_cycle(places: Places, cycle: int, resume_from: Path | None, wait: float, timeout: float) -> tuple[Path, bool]:
    """One start / wait / kill; returns (the run's version directory, whether it ended by itself before the kill)."""
    before = set(version_dirs(places.root))
    proc = start_fit(places, cycle, resume_from)
    try:
        version = wait_for_first_save(proc, places, before, timeout)
        time.sleep(wait)
        ended = proc.poll() is not None
    finally:
        kill_group(proc)
    return version, ended


# ----------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------


def counters(content: dict[str, Any]) -> tuple[int, int]:
    """A loaded checkpoint's (``global_step``, the data module's ``num_env_steps_sampled_lifetime``)."""
    data_states = [value for value in content.values() if isinstance(value, dict) and ENV_STEPS_KEY in value]
    if len(data_states) != 1:
        raise ValueError(f"expected one data module state holding {ENV_STEPS_KEY!r}, found {len(data_states)}")
    return int(content["global_step"]), int(data_states[0][ENV_STEPS_KEY])


def check_file(path: Path, verdict: Verdict) -> tuple[int, int] | None:
    """Load ``path`` (unless this very version of it was checked) and return its counters; ``None`` if it is bad."""
    stat = path.stat()
    key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key in verdict.checked:
        return verdict.checked[key]
    try:
        found = counters(read_checkpoint_file(path))
    except ValueError as error:
        problem = str(error)
        verdict.bad[str(path)] = problem if problem.startswith(str(path)) else f"{path}: {problem}"
        return None
    verdict.checked[key] = found
    return found


def check_after_cycle(
    places: Places, cycle: int, resume_from: Path | None, version: Path | None, verdict: Verdict
) -> tuple[int, int] | None:
    """Check every checkpoint, the temporary files and the counters; return the newest ``last.ckpt``'s counters."""
    of_file = {}
    for path in sorted(places.root.rglob("*.ckpt")):
        if path.is_file() and not path.name.startswith(TEMPORARY_PREFIX):
            of_file[path] = check_file(path, verdict)
    for path in temporary_files(places):
        verdict.temporary.setdefault(path, cycle)
    start = of_file.get(resume_from, (0, 0)) if resume_from is not None else (0, 0)
    if version is not None:
        for path, found in of_file.items():
            if found is not None and path.is_relative_to(version) and (found[0] < start[0] or found[1] < start[1]):
                verdict.backwards.append(f"cycle {cycle}: {path.name} has (step, env steps) {found}, "
                                         f"behind {start} of {resume_from}")  # fmt: skip
    newest = newest_last(places.root)
    return of_file.get(newest) if newest is not None else None


# ----------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------


def run_kill(args: argparse.Namespace) -> int:
    """The ``kill`` command: ``args.cycles`` cycles, a line each, then the summary; 1 on any failure."""
    if args.cycles < 1 or args.max_wait < 0:
        raise SystemExit(f"--cycles must be >= 1 and --max-wait >= 0, got {args.cycles} and {args.max_wait}")
    places = choose_places(args)
    (places.logs / "overrides.yaml").write_text(OVERRIDES.format(limit_val_batches=1.0 if args.evaluate else 0))
    print("evaluation at every epoch end" if args.evaluate else "no evaluation (--no-evaluate)")
    rng = random.Random(args.seed)
    verdict, previous, start, failed_in_a_row = Verdict(), (0, 0), time.monotonic(), 0
    cycles_run, exit_code = 0, 1
    print(f"{'cycle':>5} {'resumed from':<28} {'killed after save +s':>20} {'files':>6} {'bad':>4} {'temp':>5} "
          f"{'last.ckpt step':>15} {'env steps':>10}")  # fmt: skip
    try:
        for cycle in range(1, args.cycles + 1):
            cycles_run, wait, resume_from = cycle, rng.uniform(0.0, args.max_wait), newest_last(places.root)
            version: Path | None = None
            try:
                version, ended = run_cycle(places, cycle, resume_from, wait, args.start_timeout)
            except CycleError as error:
                verdict.failures.append(f"cycle {cycle}: {error}; see {places.logs / f'cycle_{cycle}.log'}")
                ended = False
            if ended:
                verdict.failures.append(f"cycle {cycle}: the fit ended by itself before the kill")
            failed_in_a_row = failed_in_a_row + 1 if version is None or ended else 0
            newest = check_after_cycle(places, cycle, resume_from, version, verdict) or previous
            if newest[0] < previous[0] or newest[1] < previous[1]:
                verdict.backwards.append(f"cycle {cycle}: newest last.ckpt at {newest}, after {previous}")
            previous = newest
            source = "-" if resume_from is None else str(resume_from.relative_to(places.root / "lightning_logs"))
            print(f"{cycle:>5} {source[:28]:<28} {wait:>20.2f} {len(verdict.checked):>6} {len(verdict.bad):>4} "
                  f"{len(temporary_files(places)):>5} {newest[0]:>15} {newest[1]:>10}", flush=True)  # fmt: skip
            if failed_in_a_row >= args.max_failures:
                verdict.failures.append(f"stopped after {failed_in_a_row} failed cycles in a row")
                break
        exit_code = report(cycles_run, verdict, time.monotonic() - start)
        return exit_code
    finally:
        clean_up(places, args.keep, keep_logs=exit_code != 0)


def clean_up(places: Places, keep: bool, keep_logs: bool) -> None:
    """Remove the run's directories, except with ``--keep``; the fits' logs stay after a failure."""
    kept = [places.root, places.tmp, places.logs] if keep else [places.logs] if keep_logs else []
    for directory in (places.root, places.tmp, places.logs):
        if directory not in kept:
            shutil.rmtree(directory, ignore_errors=True)
    if kept:
        print(f"kept: {' '.join(map(str, kept))}")


def report(cycles_run: int, verdict: Verdict, wall_s: float) -> int:
    """Print the problems found and the summary table; 0 if every check passed."""
    orphans = sorted(path for path in verdict.temporary if os.path.lexists(path))
    removed = len(verdict.temporary) - len(orphans)
    for path, problem in sorted(verdict.bad.items()):
        print(f"BAD {problem}")
    for path in orphans:
        print(f"ORPHAN {path} (first seen after cycle {verdict.temporary[path]}, {_size(path)} bytes)")
    for line in verdict.backwards + verdict.failures:
        print(f"FAIL {line}")
    monotone = not verdict.backwards
    print(
        "\n| cycles run | checkpoint files checked | bad | temp files seen (removed later) | orphans | monotone | wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    print(f"| {cycles_run} | {len(verdict.checked)} | {len(verdict.bad)} | {len(verdict.temporary)} ({removed}) | "
          f"{len(orphans)} | {'yes' if monotone else 'NO'} | {wall_s:.0f} |")  # fmt: skip
    failed = verdict.bad or orphans or not monotone or verdict.failures
    return 1 if failed else 0


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0
