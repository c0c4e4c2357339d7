"""``SubEnvGuard``: the outermost wrapper of every env copy an ``EnvRunner`` steps.

It knows its index in the vector env and counts its steps, so that when the env inside
raises, returns an observation of the wrong shape, or is still stepping when the rollout's
time runs out, the error names the env and the step. With ``restart=True`` it rebuilds the
env instead of raising and marks the step's infos with :data:`ENV_RESTARTED`, so that the
runner drops the episode the failure cut short.

The guard runs where the env runs: in the runner's process (``vectorize_mode="sync"``) or in
the env's worker process (``"async"``), so a restart costs no new process.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from lightning_rl.core.observation_layout import ObservationLayout
from lightning_rl.env.env_errors import SampleTimeoutError, SubEnvError

# The info key a guard sets on the step (or reset) on which it rebuilt its env. The vector
# env batches it as ``{ENV_RESTARTED: [...], "_" + ENV_RESTARTED: mask}``.
ENV_RESTARTED = "lightning_rl_env_restarted"

_log = logging.getLogger(__name__)


class SubEnvGuard(gym.Wrapper):
    """Names the failures of the env copy ``index``; with ``restart``, rebuilds it instead.

    Args:
        make_env: Builds the env copy (with its wrappers); called again for each rebuild.
        index: The copy's index in the vector env, for messages.
        restart: Rebuild the env when it raises or returns a wrongly shaped observation,
            instead of raising :class:`SubEnvError`.

    Attributes:
        num_steps: Steps taken since the guard was built (a rebuild does not reset it).
        episode_step: Steps taken in the current episode.
    """

    def __init__(self, make_env: Callable[[], gym.Env], index: int, *, restart: bool) -> None:
        super().__init__(make_env())
        self.index = index
        self.num_steps = 0
        self.episode_step = 0
        self._make_env = make_env
        self._restart = restart
        self._obs_shape = self.observation_space.shape
        # Dict and Tuple observations have no one shape: each part is checked.
        self._layout: ObservationLayout | None = None
        if self._obs_shape is None:
            try:
                self._layout = ObservationLayout(self.observation_space)
            except ValueError:
                pass  # make_vector_env refuses the space by name, before any reset or step

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset the env; a failure is named, or (with ``restart``) the env is rebuilt and reset."""
        try:
            obs, info = self.env.reset(seed=seed, options=options)
            self._check_shape(obs, "reset")
        except SampleTimeoutError as error:
            raise self._timed_out(error, "reset") from None
        except Exception as error:
            if not self._restart:
                raise self._failed(error, "reset") from error
            obs, info = self._rebuild(error, "reset", seed=seed, options=options)
        self.episode_step = 0
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the env; a failure is named, or (with ``restart``) the env is rebuilt.

        A rebuilt env's step returns its reset observation, reward 0, neither terminated nor
        truncated, and infos marked with :data:`ENV_RESTARTED`: the runner drops the
        episode the failure cut short and starts a new one from that observation.
        """
        try:
            result = self.env.step(action)
            if getattr(result[0], "shape", ()) != self._obs_shape:
                self._check_shape(result[0], "step")
        except SampleTimeoutError as error:
            raise self._timed_out(error, "step") from None
        except Exception as error:
            if not self._restart:
                raise self._failed(error, "step") from error
            obs, info = self._rebuild(error, "step")
            self.num_steps += 1
            self.episode_step = 0
            return obs, 0.0, False, False, info
        self.num_steps += 1
        self.episode_step += 1
        return result

    def _check_shape(self, obs: Any, during: str) -> None:
        # A wrong shape would otherwise fail later, inside the vector env, naming no env.
        # (step() calls this only when `obs.shape` differs, or is missing, as for a list or a dict.)
        if self._layout is not None:
            try:
                batch_shape = self._layout.batch_shape(obs)
            except ValueError as error:
                raise ValueError(f"{during}() returned an observation that does not fit the space: {error}") from None
            if batch_shape:
                raise ValueError(
                    f"{during}() returned a batch of {batch_shape[0]} observations; the space {self.observation_space} "
                    "describes one"
                )
            return
        if np.shape(obs) != self._obs_shape:
            raise ValueError(
                f"{during}() returned an observation of shape {np.shape(obs)}; the observation space "
                f"{self.observation_space} has shape {self._obs_shape}"
            )

    def _where(self) -> str:
        return f"at env step {self.num_steps} (step {self.episode_step} of its episode)"

    def _failed(self, error: Exception, during: str) -> SubEnvError:
        return SubEnvError(
            f"env {self.index} raised {type(error).__name__}: {error} in {during}() {self._where()}; "
            "restart_failed_sub_environments=True rebuilds a failed env and keeps sampling"
        )

    def _timed_out(self, error: SampleTimeoutError, during: str) -> SampleTimeoutError:
        return SampleTimeoutError(f"env {self.index} did not return from {during}() {self._where()}: {error}")

    def _rebuild(
        self, error: Exception, during: str, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        _log.warning("env %d raised %r in %s() %s; rebuilding it", self.index, error, during, self._where())
        try:
            self.env.close()
        except Exception:  # a broken env may fail to close too; it is dropped either way
            pass
        try:
            self.env = self._make_env()
            obs, info = self.env.reset(seed=seed, options=options)
            self._check_shape(obs, "reset")
        except Exception as again:
            raise SubEnvError(
                f"env {self.index} failed again while being rebuilt after {type(error).__name__}: {error} "
                f"({type(again).__name__}: {again})"
            ) from again
        return obs, {**info, ENV_RESTARTED: True}


def make_guarded_env(
    make_env: Callable[[], gym.Env], index: int, *, restart: bool, runner_pid: int | None = None
) -> SubEnvGuard:
    """Build env copy ``index`` inside a :class:`SubEnvGuard` (module level, so async workers unpickle it).

    Args:
        make_env: Builds the env copy with its wrappers.
        index: The copy's index in the vector env.
        restart: See :class:`SubEnvGuard`.
        runner_pid: For async vector envs, the runner's process id: called in any other
            process (an env worker), the worker's signal handlers are reset first. (The
            async vector env also builds one copy in the runner's process, to read the
            spaces; that one must leave the handlers alone.)
    """
    if runner_pid is not None and os.getpid() != runner_pid:
        # A forked worker inherits the runner's Python signal handlers. Lightning's SIGTERM
        # handler only records the signal, so terminating the worker (or the interpreter's
        # exit, which terminates and joins it) would wait on it forever.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # Ctrl-C reaches the whole process group: the runner's process handles it and
        # terminates the workers.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return SubEnvGuard(make_env, index, restart=restart)
