"""Sampler pools: N ``Sampler``\\ s apart from the Learner feeding a bounded queue, restarted when they fail.

``SamplerPool`` holds what both backends share: the bound, the restarts, and the hang watch.
``ProcessSamplerPool`` runs each sampler in a process of its own; ``RaySamplerPool``
(``ray_sampler_pool``) as a Ray actor.

**Back-pressure by requests.** A sampler samples only when asked, one rollout per request, and
the pool never has more than ``max_queued`` rollouts requested or received and not yet taken
(``num_requested - num_taken <= max_queued``). A sampler may hold several requests at once
(``ceil(max_queued / num_samplers)``), so it keeps sampling while the Learner updates; when the
Learner is slow the requests run out and the samplers wait. Memory stays bounded whatever the
speeds.

**Faults.** A sampler that dies (its process killed, its actor lost), that raises (the error
is sent back), or that has held a request for ``sample_timeout_s`` without answering (a hung
env) is killed and started again: same index, same seed, ``start`` one higher (its envs move on
to new seeds). Its requests in flight are lost. Restarts are counted (``num_restarts``). A
sampler that fails ``MAX_FAILURES_IN_A_ROW`` times without one rollout between (an env that
raises on every reset), or more than ``max_restarts`` restarts in all, stops the pool with a
``SamplerFailedError`` naming the sampler and the last cause.

**Stopping.** While ``take`` waits for a rollout it calls ``check_interrupt`` every poll
(:data:`_POLL_S`); what that raises ends the wait (the data module's raises Lightning's stop
once the Trainer received SIGTERM, so a fit stops at once even while every sampler hangs).

The pool is driven from the driver's one thread, in ``take``: no thread of its own.
"""

from __future__ import annotations

import abc
import logging
import math
import multiprocessing as mp
import multiprocessing.connection
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cloudpickle
import numpy as np
import torch

from lightning_rl.core.processes import main_script_not_rerun
from lightning_rl.core.rl_modules import RLModule
from lightning_rl.env.env_settings import EnvSettings
from lightning_rl.env.sampler import ERROR, READY, ROLLOUT, Rollout, sampler_process_main
from lightning_rl.env.shared_weights import SharedWeights

log = logging.getLogger(__name__)

#: Failures of one sampler with no rollout between them after which the pool gives up.
MAX_FAILURES_IN_A_ROW = 3
# The longest a sampler may take to start (import, build its envs) before it counts as hung.
_START_TIMEOUT_S = 120.0
# How long ``take`` waits for messages before it looks for hung samplers again.
_POLL_S = 0.05
# What a backend reports for a sampler that is gone: (index, DIED, cause).
DIED = "died"
# The env-fault counters each sampler's runner reports (``EnvRunner.get_metrics``); summed over samplers.
ENV_FAULT_COUNTERS = ("num_env_restarts", "num_nonfinite_env_steps")


class SamplerFailedError(RuntimeError):
    """A sampler failed again and again (or too often in all): the pool stopped. The message names the cause."""


class SamplerPool(abc.ABC):
    """N samplers, a bounded number of rollouts requested and not yet taken, restarts on faults.

    Args:
        settings: One ``EnvSettings`` per sampler (each with its own seed).
        module: The acting module (a CPU copy, with the weights to start with).
        weights_seq_no: The ``weights_seq_no`` of those weights.
        max_queued: The most rollouts requested or received and not yet taken.
        sample_timeout_s: The longest a sampler may hold a request without answering; ``None`` waits forever.
        max_restarts: The most restarts over the pool's life.
        starts: How many times each sampler was started before (a resumed run); ``None`` for none.
        check_interrupt: Called at every poll while ``take`` waits for a rollout; what it raises
            ends the wait. ``None`` for nothing to check.
        statistics: The normalization statistics the samplers start with
            (``EnvNormalization.statistics_vector``); ``None`` when the data module does not normalize.
    """

    def __init__(
        self,
        settings: Sequence[EnvSettings],
        module: RLModule,
        *,
        weights_seq_no: int,
        max_queued: int,
        sample_timeout_s: float | None,
        max_restarts: int,
        starts: Sequence[int] | None = None,
        check_interrupt: Callable[[], None] | None = None,
        statistics: np.ndarray | None = None,
    ) -> None:
        self.settings = list(settings)
        self.module = module
        self.num_samplers = len(self.settings)
        self.max_queued = max_queued
        self.sample_timeout_s = sample_timeout_s
        self.max_restarts = max_restarts
        self.check_interrupt = check_interrupt
        #: The normalization statistics last sent (``None`` without): a restarted sampler starts from them.
        self.statistics = statistics
        self._per_sampler = math.ceil(max_queued / self.num_samplers)
        self._ready: deque[Rollout] = deque()
        #: How many times each sampler was started (its next start's ``start``).
        self.starts = list(starts or [0] * self.num_samplers)
        self._in_flight = [0] * self.num_samplers
        self._started = [False] * self.num_samplers
        self._since = [time.monotonic()] * self.num_samplers  # when the current wait for each began
        self._failures_in_a_row = [0] * self.num_samplers
        #: Samplers restarted after a fault, over the pool's life.
        self.num_restarts = 0
        #: Rollouts requested from the samplers, and taken by ``take``, over the pool's life.
        self.num_requested = 0
        self.num_taken = 0
        # Each sampler's env-fault counters as last reported, and those of its former lives.
        self._fault_counts = [dict.fromkeys(ENV_FAULT_COUNTERS, 0.0) for _ in range(self.num_samplers)]
        self._retired_fault_counts = dict.fromkeys(ENV_FAULT_COUNTERS, 0.0)
        self._closed = False

    # ------------------------------------------------------------------------------------
    # What a backend defines
    # ------------------------------------------------------------------------------------

    @abc.abstractmethod
    def _start(self, index: int) -> None:
        """Start sampler ``index`` (``self.starts[index]`` starts before), with the weights last broadcast."""

    @abc.abstractmethod
    def _request(self, index: int) -> None:
        """Ask sampler ``index`` for one more rollout."""

    @abc.abstractmethod
    def _receive(self, timeout: float) -> list[tuple[int, str, Any]]:
        """The samplers' messages, waiting up to ``timeout`` s for the first: ``(index, kind, payload)``, kind
        ``READY``, ``ROLLOUT``, ``ERROR`` (payload: the traceback) or ``DIED`` (payload: the cause)."""

    @abc.abstractmethod
    def _kill(self, index: int) -> None:
        """Stop sampler ``index`` now, whatever it is doing, and forget its requests."""

    @abc.abstractmethod
    def broadcast(
        self, state: Mapping[str, torch.Tensor], weights_seq_no: int, statistics: np.ndarray | None = None
    ) -> None:
        """Send the Learner's weights (and the data module's normalization statistics, when it normalizes): every
        sampler acts with them from its next rollout on."""

    #: Appended to the cause of a sampler that did not start in time (a backend's likely reason).
    _start_hint = ""

    @property
    @abc.abstractmethod
    def pids(self) -> list[int | None]:
        """The samplers' process ids, by index (``None`` where unknown)."""

    # ------------------------------------------------------------------------------------
    # The pool
    # ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every sampler (they sample once ``take`` asks them)."""
        for index in range(self.num_samplers):
            self._start(index)
            self._since[index] = time.monotonic()

    @property
    def num_queued(self) -> int:
        """Rollouts received and not yet taken."""
        return len(self._ready)

    @property
    def env_fault_counts(self) -> dict[str, float]:
        """``num_env_restarts`` and ``num_nonfinite_env_steps`` summed over the samplers and their former lives."""
        return {
            name: self._retired_fault_counts[name] + sum(counts[name] for counts in self._fault_counts)
            for name in ENV_FAULT_COUNTERS
        }

    def take(self, block: bool = True) -> Rollout | None:
        """The oldest rollout received; with ``block``, wait for one (restarting samplers that fail meanwhile).

        Returns:
            A rollout, or ``None`` if ``block`` is false and none has arrived.

        Raises:
            SamplerFailedError: If a sampler failed ``MAX_FAILURES_IN_A_ROW`` times in a row, or
                the pool restarted more than ``max_restarts`` samplers.
            BaseException: What ``check_interrupt`` raises while it waits.
        """
        if self._closed:
            raise RuntimeError("this sampler pool is closed")
        self._handle(self._receive(0.0))
        while True:
            if self._ready:
                self.num_taken += 1
                rollout = self._ready.popleft()
                # Its place goes to a new request at once: the samplers work while the Learner updates.
                self._request_up_to_the_bound()
                return rollout
            self._request_up_to_the_bound()
            if not block:
                return None
            if self.check_interrupt is not None:
                self.check_interrupt()
            self._handle(self._receive(_POLL_S))
            self._restart_hung()

    def close(self) -> None:
        """Stop every sampler (what they sampled and was not taken is dropped). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for index in range(self.num_samplers):
            self._kill(index)
        self._ready.clear()

    def _request_up_to_the_bound(self) -> None:
        room = self.max_queued - len(self._ready) - sum(self._in_flight)
        while room > 0:
            # The sampler with the fewest requests (the lowest index among equals) gets the next.
            index = min(range(self.num_samplers), key=lambda i: (self._in_flight[i], i))
            if self._in_flight[index] >= self._per_sampler:
                return
            if self._in_flight[index] == 0 and self._started[index]:
                self._since[index] = time.monotonic()
            self._request(index)
            self._in_flight[index] += 1
            self.num_requested += 1
            room -= 1

    def _handle(self, messages: list[tuple[int, str, Any]]) -> None:
        for index, kind, payload in messages:
            if kind == READY:
                self._started[index] = True
                self._since[index] = time.monotonic()
            elif kind == ROLLOUT:
                self._in_flight[index] = max(0, self._in_flight[index] - 1)
                self._failures_in_a_row[index] = 0
                self._since[index] = time.monotonic()
                self._fault_counts[index] = {name: float(payload.metrics[name]) for name in ENV_FAULT_COUNTERS}
                self._ready.append(payload)
            elif kind == ERROR:
                lines = str(payload).strip().splitlines()
                self._restart(index, f"it raised {lines[-1] if lines else 'an error'}", detail=str(payload))
            else:  # DIED
                self._restart(index, str(payload))

    def _restart_hung(self) -> None:
        now = time.monotonic()
        for index in range(self.num_samplers):
            if not self._started[index]:
                if now - self._since[index] > _START_TIMEOUT_S:
                    self._restart(index, f"it did not start within {_START_TIMEOUT_S:g} s{self._start_hint}")
            elif self._in_flight[index] and self.sample_timeout_s is not None:
                if now - self._since[index] > self.sample_timeout_s:
                    self._restart(index, f"it returned no rollout within sample_timeout_s={self.sample_timeout_s:g} s")

    def _restart(self, index: int, cause: str, detail: str = "") -> None:
        """Kill sampler ``index`` and start it again, or raise ``SamplerFailedError`` when it fails too often."""
        self._kill(index)
        self.num_restarts += 1
        self._failures_in_a_row[index] += 1
        for name in ENV_FAULT_COUNTERS:
            self._retired_fault_counts[name] += self._fault_counts[index][name]
        self._fault_counts[index] = dict.fromkeys(ENV_FAULT_COUNTERS, 0.0)
        failures = self._failures_in_a_row[index]
        problem = None
        if failures >= MAX_FAILURES_IN_A_ROW:
            problem = f"env runner {index} failed {failures} times in a row without a rollout; the last time {cause}"
        elif self.num_restarts > self.max_restarts:
            problem = (
                f"env runners were restarted {self.num_restarts} times, more than max_num_env_runner_restarts="
                f"{self.max_restarts}; the last, env runner {index}: {cause}"
            )
        if problem is not None:
            self.close()
            raise SamplerFailedError(problem + (f"\n{detail.rstrip()}" if detail else ""))
        log.warning("env runner %d restarted (%d restarts so far): %s", index, self.num_restarts, cause)
        self.starts[index] += 1
        self._in_flight[index] = 0
        self._started[index] = False
        self._since[index] = time.monotonic()
        self._start(index)


class ProcessSamplerPool(SamplerPool):
    """Samplers in processes of their own on this machine (``sampler_backend="process"``).

    Processes come from a fork server that has imported this package once, so a (re)start
    takes a fraction of a second rather than an interpreter's import time. They die with the
    driver (``PR_SET_PDEATHSIG`` through the fork server, and when their pipe closes), are
    daemonic (killed at the driver's exit), and ignore Ctrl-C (the driver kills them). Weights
    travel through shared memory (``SharedWeights``), rollouts through one pipe per sampler, so
    a sampler killed mid-message spoils only its own pipe.

    Args:
        settings: One ``EnvSettings`` per sampler (see ``SamplerPool``).
        module: The acting module, a CPU copy (sent to each process once, with cloudpickle).
        kwargs: ``SamplerPool``'s other arguments.
    """

    def __init__(self, settings: Sequence[EnvSettings], module: RLModule, **kwargs: Any) -> None:
        super().__init__(settings, module, **kwargs)
        self._context = mp.get_context("forkserver")
        # What every sampler imports, imported once in the fork server (it applies when the
        # server starts, with the first pool): this module and the acting module's class.
        preload = ["lightning_rl.env.sampler", type(module).__module__]
        self._context.set_forkserver_preload([name for name in preload if name != "__main__"])
        self._weights = SharedWeights(module.state_dict(), kwargs["weights_seq_no"], self.statistics)
        self._processes: list[Any] = [None] * self.num_samplers
        self._connections: list[Any] = [None] * self.num_samplers
        self._payloads = [cloudpickle.dumps((one, module)) for one in self.settings]

    @property
    def pids(self) -> list[int | None]:
        return [None if process is None else process.pid for process in self._processes]

    def broadcast(
        self, state: Mapping[str, torch.Tensor], weights_seq_no: int, statistics: np.ndarray | None = None
    ) -> None:
        self._weights.write(state, weights_seq_no, statistics)
        if statistics is not None:
            self.statistics = statistics

    def _start(self, index: int) -> None:
        driver_end, sampler_end = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=sampler_process_main,
            args=(index, self.starts[index], self._payloads[index], self._weights, sampler_end),
            name=f"env-runner-{index}",
            daemon=True,
        )
        with main_script_not_rerun():
            process.start()
        sampler_end.close()  # the sampler holds it now; closed here, its death reads as EOF
        self._processes[index], self._connections[index] = process, driver_end

    def _request(self, index: int) -> None:
        try:
            self._connections[index].send(None)
        except OSError:
            pass  # it died: its sentinel says so in the next _receive

    def _receive(self, timeout: float) -> list[tuple[int, str, Any]]:
        by_object: dict[Any, tuple[int, str]] = {}
        for index, (process, connection) in enumerate(zip(self._processes, self._connections)):
            if process is not None:
                by_object[connection] = (index, "pipe")
                by_object[process.sentinel] = (index, "sentinel")
        messages: list[tuple[int, str, Any]] = []
        dead: set[int] = set()
        for ready in multiprocessing.connection.wait(list(by_object), timeout=timeout):
            index, what = by_object[ready]
            connection = self._connections[index]
            try:
                while connection.poll():  # everything it sent, also when it has exited since
                    messages.append((index, *connection.recv()))
            except (EOFError, OSError):
                dead.add(index)
            if what == "sentinel":
                dead.add(index)
        for index in sorted(dead):
            if any(kind == ERROR for i, kind, _ in messages if i == index):
                continue  # it said why it exits
            process = self._processes[index]
            process.join(timeout=1.0)
            code = process.exitcode
            cause = f"its process (pid {process.pid}) died" + (
                f" of signal {-code}" if code is not None and code < 0 else f" with exit code {code}"
            )
            messages.append((index, DIED, cause))
        return messages

    def _kill(self, index: int) -> None:
        process, connection = self._processes[index], self._connections[index]
        if process is None:
            return
        if process.is_alive():
            process.kill()
        process.join(timeout=10.0)
        connection.close()
        self._processes[index] = self._connections[index] = None
