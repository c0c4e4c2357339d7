"""``GuardedVectorEnv``: the runner's gymnasium vector env, whose faults end in a named error or a restart.

Three faults a plain gymnasium vector env handles badly:

- **A hang.** A rollout runs under :meth:`GuardedVectorEnv.rollout`, which bounds it to
  ``sample_timeout_s``. In ``"async"`` mode every wait for the workers gets what is left of
  that time (``step_wait(timeout)``), and the envs that did not answer are named. In
  ``"sync"`` mode the env steps in this thread, so nothing can wait beside it: a ``SIGALRM``
  timer (armed once per rollout, so stepping costs nothing extra) raises
  :class:`SampleTimeoutError` in the stuck ``step``, and the env's :class:`SubEnvGuard` adds
  its index. A sync env stuck in C code that never returns to Python cannot be
  interrupted so; run such envs with ``vectorize_mode="async"``.
- **A failed async worker** (its env raised outside the guard, or its process exited):
  gymnasium raises without naming it. Here the error names the worker, or, with
  ``restart=True``, every worker is rebuilt (a dead worker's pipes cannot be mended one by
  one) and :class:`EnvsRebuilt` tells the rollout to drop the episodes that were running.
- **Workers that outlive an error.** :meth:`GuardedVectorEnv.terminate` stops them at once,
  whatever state their pipes are in; their SIGTERM handler is the default one (see
  ``make_guarded_env``), and any that still lives after a grace period is killed.

Every observation leaves it in the stored layout (:mod:`lightning_rl.core.observation_layout`):
Dict and Tuple observations (of resets, steps, and the ``final_obs`` of episodes that ended)
are flattened here, at the one place they come out of the vector env, so that the rest of
the runner sees one array per step whatever the env's observation space.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np

from lightning_rl.core.observation_layout import ObservationLayout
from lightning_rl.env.env_errors import SampleTimeoutError, SubEnvError
from lightning_rl.env.sub_env_guard import ENV_RESTARTED

# A terminated worker gets this long to exit before it is killed.
_TERMINATE_GRACE_S = 5.0
# After a worker's pipe broke, how long to wait for its process to be seen as exited.
_EXIT_NOTICE_S = 1.0

StepResult = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class EnvsRebuilt(Exception):
    """An async worker failed and every env was rebuilt and reset: the step did not happen.

    Args:
        obs: The rebuilt envs' reset observations.
        infos: Their reset infos.
    """

    def __init__(self, obs: Any, infos: dict[str, Any]) -> None:
        super().__init__("every env was rebuilt")
        self.obs = obs
        self.infos = infos


class GuardedVectorEnv:
    """Holds the vector env ``build()`` makes; steps it within ``sample_timeout_s``; rebuilds or names failures.

    Args:
        build: Makes the vector env (its env copies inside ``SubEnvGuard``); called again
            when every async worker is rebuilt.
        sample_timeout_s: The most seconds one :meth:`rollout` block may take; ``None`` for
            no limit.
        restart: Rebuild after an async worker failed, instead of raising.

    Attributes:
        env: The current gymnasium vector env.
        layout: How its observations are stored; what :meth:`reset` and :meth:`step` return is
            in ``layout.stored_space``.
        num_env_steps: Vector steps since ``env`` was built (each env copy's step count).
        num_env_restarts: Env copies rebuilt so far (by their guards or with every worker).
    """

    def __init__(
        self, build: Callable[[], gym.vector.VectorEnv], *, sample_timeout_s: float | None, restart: bool
    ) -> None:
        self._build = build
        self.sample_timeout_s = sample_timeout_s
        self.restart = restart
        self.env = build()
        self.is_async = isinstance(self.env, gym.vector.AsyncVectorEnv)
        self.layout = ObservationLayout(self.env.single_observation_space)
        self.num_env_steps = 0
        self.num_env_restarts = 0
        self._deadline: float | None = None

    @property
    def num_envs(self) -> int:
        """How many env copies step together."""
        return self.env.num_envs

    @contextlib.contextmanager
    def rollout(self) -> Iterator[None]:
        """Bound the steps and resets inside this block to ``sample_timeout_s`` in all.

        Raises:
            SampleTimeoutError: Naming the env that did not return, where known.
        """
        if self.sample_timeout_s is None:
            yield
            return
        self._deadline = time.monotonic() + self.sample_timeout_s
        try:
            if self.is_async:
                yield
            else:
                with rollout_alarm(self.sample_timeout_s):
                    yield
        finally:
            self._deadline = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any], np.ndarray | None]:
        """Reset the envs (those in ``options["reset_mask"]`` only, if given).

        Returns:
            The observations (in the stored layout), the infos, and the mask of env copies
            their guards rebuilt on the way (``None`` if none).
        """
        if self.is_async:
            self.env.reset_async(seed=seed, options=options)
            obs, infos = self._wait(self.env.reset_wait, "reset")
        else:
            obs, infos = self.env.reset(seed=seed, options=options)
        return self.layout.flatten_batch(obs), infos, self._restarted(infos)

    def step(self, actions: np.ndarray) -> tuple[StepResult, np.ndarray | None]:
        """Step every env copy once.

        Returns:
            What the vector env's ``step`` returned, its observations and ``infos["final_obs"]``
            in the stored layout, and the mask of env copies their guards rebuilt on this
            step (``None`` if none).

        Raises:
            SubEnvError: Naming the env, for one that failed (without ``restart``).
            SampleTimeoutError: Naming the envs that did not return in time.
            EnvsRebuilt: With ``restart``, when an async worker failed.
        """
        try:
            if self.is_async:
                self.env.step_async(actions)
                result = self._wait(self.env.step_wait, "step")
            else:
                result = self.env.step(actions)
        except (SubEnvError, SampleTimeoutError):
            raise
        except Exception as error:
            if not self.is_async:
                raise
            self._worker_failed(error)
        self.num_env_steps += 1
        if self.layout.flattens:
            result = self._flattened(result)
        return result, self._restarted(result[4])

    def rebuild(self) -> None:
        """Terminate the vector env if it still runs, and build a new one (``num_env_steps`` starts at 0)."""
        self.terminate()
        self.env = self._build()
        self.num_env_steps = 0

    def terminate(self) -> None:
        """Close the vector env now: async workers are terminated (killed if they linger), not asked to finish."""
        env = self.env
        if env.closed:
            return
        if not self.is_async:
            env.close()
            return
        for process in env.processes:
            if process.is_alive():
                process.terminate()
        for process in env.processes:
            process.join(_TERMINATE_GRACE_S)
            if process.is_alive():
                process.kill()
                process.join()
        try:
            with warnings.catch_warnings():
                # gymnasium warns that a call was pending: that is why the workers were terminated.
                warnings.simplefilter("ignore")
                env.close(terminate=True)
        except (EOFError, OSError):
            # A dead worker's pipe cannot finish the pending call; the processes are gone already.
            for pipe in env.parent_pipes:
                if pipe is not None:
                    pipe.close()
            env.closed = True

    def close(self) -> None:
        """Close the vector env (async workers are asked to close their envs); again is a no-op."""
        if not self.env.closed:
            self.env.close()

    def _flattened(self, result: StepResult) -> StepResult:
        """A step's result with its observations and final observations in the stored layout."""
        obs, rewards, terminateds, truncateds, infos = result
        final_obs = infos.get("final_obs")
        if final_obs is not None:
            # Only the envs whose episode ended have a final observation; the rest hold None.
            flat_final = np.empty(len(final_obs), dtype=object)
            for index in np.flatnonzero(infos["_final_obs"]):
                flat_final[index] = self.layout.flatten_one(final_obs[index])
            infos = {**infos, "final_obs": flat_final}
        return self.layout.flatten_batch(obs), rewards, terminateds, truncateds, infos

    def _restarted(self, infos: dict[str, Any]) -> np.ndarray | None:
        mask = infos.get("_" + ENV_RESTARTED) if infos else None
        if mask is None or not mask.any():
            return None
        self.num_env_restarts += int(mask.sum())
        return mask

    def _wait(self, wait: Callable[[float | None], Any], during: str) -> Any:
        timeout = None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)
        try:
            return wait(timeout)
        except multiprocessing.TimeoutError:
            hung = [i for i, pipe in enumerate(self.env.parent_pipes) if pipe is not None and not pipe.poll()]
            raise SampleTimeoutError(
                f"env {_join(hung)} did not return from {during}() at env step {self.num_env_steps} within "
                f"sample_timeout_s={self.sample_timeout_s}; raise sample_timeout_s if its steps are this slow"
            ) from None

    def _worker_failed(self, error: Exception) -> None:
        """Name the failed async workers, or rebuild every worker and raise :class:`EnvsRebuilt`."""
        failed = self._failed_workers()
        if not failed:
            raise error
        if not self.restart:
            raise SubEnvError(
                f"{'; '.join(failed)} at env step {self.num_env_steps} ({type(error).__name__}: {error}); "
                "restart_failed_sub_environments=True rebuilds the envs and keeps sampling"
            ) from error
        warnings.warn(f"{'; '.join(failed)}: rebuilding all {self.num_envs} async env workers", stacklevel=2)
        self.rebuild()
        self.num_env_restarts += self.num_envs
        obs, infos, _ = self.reset()
        raise EnvsRebuilt(obs, infos)

    def _failed_workers(self) -> list[str]:
        processes = self.env.processes
        pipes = self.env.parent_pipes
        # A worker's broken pipe can be seen before its process exits: wait for the first to
        # exit (unless gymnasium already named a failed one), then for those exiting to be done.
        timeout = 0.0 if any(pipe is None for pipe in pipes) else _EXIT_NOTICE_S
        exiting = multiprocessing.connection.wait([process.sentinel for process in processes], timeout=timeout)
        for process in processes:
            if process.sentinel in exiting:
                process.join(_EXIT_NOTICE_S)
        failed = []
        for index, (pipe, process) in enumerate(zip(pipes, processes)):
            if pipe is None:
                failed.append(f"env {index} failed in its worker process")
            elif not process.is_alive():
                failed.append(f"env {index}'s worker process exited with code {process.exitcode}")
        return failed


def _join(indices: list[int]) -> str:
    return ", ".join(str(index) for index in indices) if indices else "(none identified)"


_warned_no_alarm = False


@contextlib.contextmanager
def rollout_alarm(
    seconds: float, unenforced: str = "use vectorize_mode='async' to bound a rollout here"
) -> Iterator[None]:
    """Raise :class:`SampleTimeoutError` in this thread after ``seconds``; then restore any earlier alarm.

    Outside the main thread (or without ``signal.setitimer``) nothing is enforced: a warning,
    once, ends with ``unenforced``.
    """
    global _warned_no_alarm
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        if not _warned_no_alarm:
            _warned_no_alarm = True
            warnings.warn(
                "sample_timeout_s is not enforced in-process outside the main thread (or without "
                f"signal.setitimer); {unenforced}",
                stacklevel=3,
            )
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise SampleTimeoutError(f"the rollout did not finish within sample_timeout_s={seconds}")

    previous_handler = signal.signal(signal.SIGALRM, fire)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous_handler is None else previous_handler)
        if previous_delay > 0:
            # Someone else's alarm was pending (a test timeout, say): re-arm what is left of it.
            left = max(previous_delay - (time.monotonic() - start), 1e-6)
            signal.setitimer(signal.ITIMER_REAL, left, previous_interval)
