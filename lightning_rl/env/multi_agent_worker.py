"""``EnvWorker``: a PettingZoo env copy in a worker process of its own (``MultiAgentEnvRunner``'s ``vectorize_mode="async"``).

Each env copy steps in its own process, so that the copies step in parallel, and so that a
copy that hangs, even in C code that never returns to Python, can be ended: the runner waits
for a worker's answer on its pipe until the deadline of the current sample call
(:class:`SampleDeadline`, the runner's ``sample_timeout_s``), and kills a worker that did not
answer by then. A wait is cut into slices of :data:`WAIT_SLICE_S`, between which the deadline's
``check_interrupt`` runs: the data module's raises Lightning's stop once the Trainer received
SIGTERM, so a fit stops promptly even while a worker hangs.

Workers come from a fork server that imported this module once (a start costs a fork, not an
interpreter's imports) and get their env factory by value (cloudpickle). Each dies with the
runner's process (``die_with_parent``, through the fork server), leaves Ctrl-C to the runner,
keeps SIGTERM's default action (so terminating a worker ends it whatever it is doing), uses one
torch thread, and only steps its env: the modules act in the runner's process.

The pipe protocol: the runner sends ``(call, argument)``; the worker answers ``(OK, result)``,
or ``(RAISED, "TypeName: message")`` when the env raised (it goes on serving, as an env in the
runner's process would). Its first answer, unasked, is ``(OK, AgentSpaces)`` once the env is
built, or ``(RAISED, ...)`` if building it failed, after which it exits.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import pickle
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import cloudpickle

from lightning_rl.core.processes import die_with_parent, main_script_not_rerun, release_fork_server
from lightning_rl.env.env_errors import SampleTimeoutError, SubEnvError
from lightning_rl.env.pettingzoo_env import PettingZooEnvCreator, make_pettingzoo_env
from lightning_rl.env.pettingzoo_stepper import RESET, STEP, AgentSpaces, PettingZooStepper

# The longest a wait for a worker goes without running the deadline's check_interrupt.
WAIT_SLICE_S = 0.1
# The least time a worker gets to start and build its env (imports included), whatever sample_timeout_s.
_BUILD_TIMEOUT_S = 60.0
# A worker asked to close gets this long to close its env and exit before it is killed.
_CLOSE_GRACE_S = 5.0
# The worker's answers, and the runner's last call.
OK = "ok"
RAISED = "raised"
_CLOSE = "close"


class WorkerRaised(Exception):
    """The env raised in its worker process; the message is ``"TypeName: message"`` of what it raised."""


class WorkerDied(Exception):
    """The worker process exited (killed, crashed) before it answered; the message says how."""


class SampleDeadline:
    """The end of the runner's current sample call, which every wait for a worker keeps to.

    Args:
        seconds: ``sample_timeout_s``; ``None`` for no end.
        check_interrupt: Called at least every :data:`WAIT_SLICE_S` while a worker is waited
            for; what it raises ends the wait (and the call).
        limit: The limit as errors name it; ``"sample_timeout_s=<seconds>"`` by default.
    """

    def __init__(
        self, seconds: float | None, check_interrupt: Callable[[], None] | None = None, limit: str | None = None
    ) -> None:
        self.seconds = seconds
        self.check_interrupt = check_interrupt
        self.limit = f"sample_timeout_s={seconds}" if limit is None else limit
        self._end: float | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Bound the waits inside this block to ``seconds`` from now, in all."""
        self._end = None if self.seconds is None else time.monotonic() + self.seconds
        try:
            yield
        finally:
            self._end = None

    def renew(self) -> None:
        """Give the rest of the block ``seconds`` again (a hung worker was replaced: its hang used up the time)."""
        if self._end is not None:
            self._end = time.monotonic() + self.seconds

    def remaining(self) -> float | None:
        """Seconds left in the block (``seconds`` outside one); ``None`` for no end."""
        if self._end is None:
            return self.seconds
        return max(self._end - time.monotonic(), 0.0)


class EnvWorker:
    """The runner's side of one env copy in a worker process; :meth:`wait_ready` once before the first call.

    Args:
        payload: ``cloudpickle.dumps((env, env_kwargs))``, what the worker builds its env from.
        deadline: The runner's deadline, which every wait keeps to.

    Attributes:
        spaces: The env's agents and spaces (set by :meth:`wait_ready`).
        in_worker: ``True``: a hang is ended by killing the worker.
    """

    in_worker = True

    def __init__(self, payload: bytes, deadline: SampleDeadline) -> None:
        self._deadline = deadline
        context = multiprocessing.get_context("forkserver")
        # Imported once in the fork server (it applies when the server starts): what every worker runs.
        context.set_forkserver_preload([__name__])
        self._connection, worker_end = context.Pipe(duplex=True)
        self._process = context.Process(target=_worker_main, args=(payload, worker_end), daemon=True)
        with main_script_not_rerun():
            self._process.start()
        worker_end.close()  # the worker holds it now; closed here, the worker's death reads as EOF
        self._pending = True  # its first answer: the spaces
        self.spaces: AgentSpaces | None = None

    @property
    def pid(self) -> int | None:
        """The worker's process id."""
        return self._process.pid

    def wait_ready(self) -> None:
        """Wait for the worker to build its env; read its spaces.

        Building gets ``sample_timeout_s`` but at least 60 s: a worker's first imports may take
        longer than a sample call should.

        Raises:
            WorkerRaised: If building the env raised (the worker exits).
            WorkerDied: If the worker exited first.
            SampleTimeoutError: If it did not answer in that time (it is killed).
        """
        seconds = None if self._deadline.seconds is None else max(self._deadline.seconds, _BUILD_TIMEOUT_S)
        limit = f"{seconds} s (the time a worker gets to build its env: sample_timeout_s, at least {_BUILD_TIMEOUT_S} s)"
        building = SampleDeadline(seconds, self._deadline.check_interrupt, limit=limit)
        with building.running():
            self.spaces = self.receive(building)

    def send(self, call: str, argument: Any) -> None:
        """Ask the worker for ``reset(seed)`` (``RESET``) or ``step(env_actions)`` (``STEP``).

        An answer still owed from a call that was cut short (another copy's error ended the
        sample call before this one's answer was read) is read first and dropped.

        Raises:
            As :meth:`receive`, for the owed answer; :class:`WorkerDied` if the worker is gone.
        """
        if not self.alive:
            raise WorkerDied(f"its worker process (pid {self.pid}) was ended after an earlier fault")
        if self._pending:
            with contextlib.suppress(WorkerRaised):
                self.receive()
        try:
            self._connection.send((call, argument))
        except OSError:
            raise self._died() from None
        self._pending = True

    def receive(self, deadline: SampleDeadline | None = None) -> Any:
        """Wait for the answer to the last call, until the deadline (the runner's, unless given); return it.

        Raises:
            WorkerRaised: What the env raised, as ``"TypeName: message"``.
            WorkerDied: If the worker exited without answering.
            SampleTimeoutError: If it did not answer before the deadline; the worker is killed.
        """
        deadline = self._deadline if deadline is None else deadline
        waited_from = time.monotonic()
        while True:
            remaining = deadline.remaining()
            wait_s = WAIT_SLICE_S if remaining is None else min(remaining, WAIT_SLICE_S)
            ready = multiprocessing.connection.wait([self._connection, self._process.sentinel], timeout=wait_s)
            if self._connection in ready:
                try:
                    kind, answer = self._connection.recv()
                except (EOFError, OSError):
                    raise self._died() from None
                self._pending = False
                if kind == RAISED:
                    raise WorkerRaised(answer)
                return answer
            if ready:  # only the sentinel: it exited without a word
                raise self._died()
            if deadline.check_interrupt is not None:
                deadline.check_interrupt()
            if remaining is not None and remaining <= WAIT_SLICE_S:
                self.kill()
                raise SampleTimeoutError(
                    f"its worker process did not answer within {deadline.limit} "
                    f"(waited {time.monotonic() - waited_from:.1f} s for it; it was killed)"
                )

    @property
    def alive(self) -> bool:
        """Whether the worker can still take calls (it was neither killed nor seen dead)."""
        return not self._connection.closed

    def kill(self) -> None:
        """End the worker now (``SIGKILL``), whatever it is doing."""
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._connection.close()
        self._pending = False

    def discard(self) -> None:
        """Drop a worker that failed: kill it."""
        self.kill()

    def close(self) -> None:
        """Ask the worker to close its env and exit; kill it if it still owes an answer or lingers."""
        if not self.alive:
            return
        if self._pending or not self._process.is_alive():
            self.kill()
            return
        with contextlib.suppress(OSError):
            self._connection.send((_CLOSE, None))
        self._process.join(_CLOSE_GRACE_S)
        self.kill()

    def _died(self) -> WorkerDied:
        self._process.join(1.0)  # a broken pipe can be seen before the exit is
        self._pending = False
        code = self._process.exitcode
        if code is None:
            how = "closed its pipe"
        elif code < 0:
            how = f"died of signal {-code} ({signal.Signals(-code).name})"
        else:
            how = f"exited with code {code}"
        self.kill()
        return WorkerDied(f"its worker process (pid {self.pid}) {how}")


def start_env_workers(
    env: str | PettingZooEnvCreator, env_kwargs: Mapping[str, Any] | None, indices: list[int], deadline: SampleDeadline
) -> list[EnvWorker]:
    """Start a worker for each env copy in ``indices``, and wait until each has built its env.

    The workers build their envs at the same time. If one fails, every one is killed.

    Raises:
        SubEnvError: Naming the copy, if building its env raised or its worker died.
        SampleTimeoutError: Naming the copy, if its worker did not build the env before the deadline.
    """
    payload = cloudpickle.dumps((env, None if env_kwargs is None else dict(env_kwargs)))
    workers: list[EnvWorker] = []
    try:
        for _ in indices:
            workers.append(EnvWorker(payload, deadline))
        for index, worker in zip(indices, workers):
            try:
                worker.wait_ready()
            except (WorkerRaised, WorkerDied) as error:
                raise SubEnvError(f"env copy {index} could not be built in its worker process: {error}") from None
            except SampleTimeoutError as error:
                raise SampleTimeoutError(f"env copy {index} was not built in time: {error}") from None
    except BaseException:
        for worker in workers:
            worker.kill()
        raise
    return workers


def _worker_main(payload: bytes, connection: multiprocessing.connection.Connection) -> None:
    """The target of a worker process: build the env, then answer the runner's calls until it closes or goes."""
    die_with_parent()
    release_fork_server()
    # A worker forked from the runner would inherit its Python handlers: Lightning's SIGTERM
    # handler only records the signal, so terminating the worker would not end it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the runner stops the workers
    import torch

    torch.set_num_threads(1)
    try:
        env, env_kwargs = pickle.loads(payload)  # cloudpickle's output loads with pickle
        stepper = PettingZooStepper(make_pettingzoo_env(env, env_kwargs))
        connection.send((OK, AgentSpaces.of(stepper.env)))
    except Exception as error:
        connection.send((RAISED, _describe(error)))
        return
    calls = {RESET: stepper.reset, STEP: stepper.step}
    try:
        while True:
            call, argument = connection.recv()
            if call == _CLOSE:
                stepper.close()
                return
            try:
                answer = (OK, calls[call](argument))
                connection.send(answer)
            except Exception as error:  # the env raised, or its answer does not pickle
                connection.send((RAISED, _describe(error)))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the runner closed the pipe or is gone


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"
