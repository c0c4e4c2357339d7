"""Run a test function on several CPU ranks at once, as ``torchrun`` would start them.

Each rank is a fresh process with the test's environment plus the variables Lightning reads
for processes it did not launch itself (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``,
``NODE_RANK``, ``LOCAL_RANK``), one intra-op thread, and a bounded wait: a rank that hangs
fails the test instead of hanging CI, while ranks that are only slow (a busy machine) finish.

Ranks are forked from multiprocessing's fork server, not spawned: a spawned rank imports torch
and Lightning again, and on this project's 2-core machine ``import torch`` alone took 5 s,
``import lightning.pytorch`` 13-15 s (a busy machine), for each rank of every test that runs
ranks (ten such tests: 237 s spawned, 45 s forked, on the same busy machine). The server is
one per test process, shared with the package's LearnerGroup, sampler pool and env workers, and
imports only what its first user asked for; so ``tests/conftest.py`` starts it when the test
session starts (:func:`start_fork_server`), with ``_PRELOADED``, before any sampler test could
start it with less. A forked rank starts with the server's environment, so the test's own
(``os.environ`` at the call, ``monkeypatch.setenv`` included) is handed to it and set before
``fn`` runs.
"""

from __future__ import annotations

import contextlib
import multiprocessing.forkserver
import os
import pickle
import queue
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from lightning_rl.core.processes import adopt_environment
from lightning_rl.learner.group.learner_group import free_local_port

#: What the fork server imports once, before it forks any rank: the imports every rank makes.
_PRELOADED = ["torch", "lightning.pytorch", "lightning_rl"]

#: How far past ``timeout`` a rank may run, not counting its waits for a CPU: a busy machine only makes it wait.
SLOW_MACHINE_FACTOR = 10


def start_fork_server() -> None:
    """Start this process's fork server now, importing ``_PRELOADED`` once for every process it will fork.

    Call it once, before any test starts a process from it (``tests/conftest.py`` does, when the
    session starts). The server imports in the background; a fork waits until it is done. Ranks,
    LearnerGroup learners, samplers and env workers started later fork from it and skip those
    imports. Its environment is this process's now: ranks and learners get the test's own (see
    ``run_on_ranks``; ``LearnerGroup`` hands over its driver's); a sampler or env worker sees the
    session's start, as it would have seen whichever test started the server.
    """
    mp.get_context("forkserver").set_forkserver_preload(_PRELOADED)
    multiprocessing.forkserver.ensure_running()


def run_on_ranks(fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout: float = 180.0) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return the results by rank.

    ``fn`` must be a module-level function, and its result picklable (numpy, not tensors:
    a tensor's shared memory dies with the process that made it).

    The deadline holds on a loaded machine and still catches a hang: ranks fail the test when
    none of them (nor their children) used any CPU for ``timeout`` seconds (a hang: a collective
    no one joins, a lock, a dead peer), or once a rank ran ``SLOW_MACHINE_FACTOR * timeout``
    seconds not counting the time it waited for a CPU (a loop that never ends, spinning or
    polling). A starved rank (a load of 12 on 2 cores, or a test run under ``nice``) uses little
    CPU per second, but some in every few, and most of its time is spent waiting for a CPU,
    which the ceiling does not count; so slow work is never mistaken for a hang. The waits are
    read from ``/proc/<pid>/schedstat``; without it the ceiling is wall time. Where ``/proc`` is
    missing (not Linux), ``timeout`` is a plain wall-clock limit.

    Raises:
        AssertionError: naming the rank, if a rank raised, died, or made no progress as above;
            the ranks still running print their Python stacks first.
    """
    context = mp.get_context("forkserver")
    results = context.Queue()
    port = free_local_port()
    environment = dict(os.environ)
    processes = [
        context.Process(target=_rank_main, args=(fn, rank, world_size, port, environment, args, results), daemon=True)
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    by_rank: dict[int, Any] = {}
    watch = _Progress(processes, timeout)
    try:
        while len(by_rank) < world_size:
            try:
                rank, ok, payload = results.get(timeout=1.0)
            except queue.Empty:
                stuck = watch.stuck([rank for rank in range(world_size) if rank not in by_rank])
                dead = [r for r, p in enumerate(processes) if r not in by_rank and not p.is_alive()]
                # A rank that died put nothing more on the queue: fail once the queue had a second to deliver.
                stuck = stuck or (f"died without a result: {dead}" if watch.dead_twice(dead) else None)
                if stuck is None:
                    continue
                dead = [(r, p.exitcode) for r, p in enumerate(processes) if r not in by_rank and not p.is_alive()]
                _dump_stacks([p for r, p in enumerate(processes) if r not in by_rank and p.is_alive()])
                raise AssertionError(f"ranks {stuck} (exited without a result: {dead})") from None
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{payload}")
            by_rank[rank] = pickle.loads(payload)
    finally:
        finished = len(by_rank) == world_size
        for process in processes:
            process.join(timeout=10 if finished else 0)  # a failed test's ranks are not waited for
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    return [by_rank[rank] for rank in range(world_size)]


class _Progress:
    """Whether ranks still make progress: CPU time used, read from ``/proc``."""

    def __init__(self, processes: list[Any], timeout: float) -> None:
        self.processes = processes
        self.timeout = timeout
        self.started = self.last_progress = time.monotonic()
        self.cpu = -1.0
        self.dead: set[int] = set()
        self.measured = os.path.exists(f"/proc/{os.getpid()}/stat")

    def dead_twice(self, dead: list[int]) -> bool:
        """Whether ranks ``dead`` were dead without a result at the previous poll too."""
        twice = bool(dead) and set(dead) <= self.dead
        self.dead = set(dead)
        return twice

    def stuck(self, running: list[int]) -> str | None:
        """Why the ``running`` ranks count as hung, or ``None`` while they make progress."""
        now = time.monotonic()
        if not self.measured:
            return None if now - self.started < self.timeout else f"did not finish within {self.timeout} s"
        for rank in running:
            ran = now - self.started - _seconds_waiting_for_a_cpu(self.processes[rank].pid)
            if ran > SLOW_MACHINE_FACTOR * self.timeout:
                return (
                    f"did not finish: rank {rank} ran {ran:.0f} s (its waits for a CPU not counted), more than "
                    f"{SLOW_MACHINE_FACTOR} x {self.timeout} s: a loop that never ends"
                )
        cpu = sum(_cpu_seconds(self.processes[rank].pid) for rank in running)
        if cpu > self.cpu:
            self.cpu, self.last_progress = cpu, now
        if now - self.last_progress > self.timeout:
            return f"made no progress (used no CPU) for {self.timeout} s: a hang"
        return None


def _cpu_seconds(pid: int | None) -> float:
    """CPU seconds of process ``pid`` and of its children, living (``/proc/.../children``) or waited for."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        # utime, stime, cutime, cstime: fields 14-17 of stat(5), 12-15 after the name.
        total = sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        children: list[str] = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                children += listing.read().split()
    except (OSError, ValueError):
        return 0.0  # exited: its results (or its exit code) tell the rest
    return total + sum(_cpu_seconds(int(child)) for child in children)


def _seconds_waiting_for_a_cpu(pid: int | None) -> float:
    """Seconds process ``pid``'s main thread has waited, runnable, for a CPU; 0 where unknown (or it exited)."""
    try:
        with open(f"/proc/{pid}/schedstat") as schedstat:
            # Nanoseconds on a CPU, nanoseconds waiting on a run queue, time slices (kernel's sched-stats.rst).
            return int(schedstat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _dump_stacks(processes: list[Any]) -> None:
    """Have the ranks still running print their Python stacks (``faulthandler`` on SIGUSR1) before they are killed."""
    if not hasattr(signal, "SIGUSR1"):
        return
    for process in processes:
        with contextlib.suppress(OSError):
            os.kill(process.pid, signal.SIGUSR1)
    time.sleep(1.0)


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    environment: dict[str, str],
    args: tuple,
    results: Any,
) -> None:
    # The test's environment, not the fork server's (started by an earlier test), before this
    # rank imports anything that may read it.
    adopt_environment(environment)

    import faulthandler

    import torch

    # A rank still running when the test gives up prints where it is stuck (run_on_ranks sends SIGUSR1).
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    from lightning_rl.learner.group.learner_group import local_rank_environment

    os.environ.update(local_rank_environment(rank, world_size, port, num_threads=1))
    try:
        results.put((rank, True, pickle.dumps(fn(rank, world_size, *args))))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
