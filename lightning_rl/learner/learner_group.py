"""LearnerGroup: drive one local Learner, or several data-parallel Learner processes, from Python.

RLlib's ``LearnerGroup`` coordinates n Learner workers (Ray actors) that train copies of the
same modules on shards of each batch and average their gradients. Here the workers are plain
processes, and what joins them is Lightning's own ``DDPStrategy``:

* ``num_learners=0``: the group holds the ``learner`` it was given (built) and calls it in
  this process; async updates run on one background thread.
* ``num_learners=N >= 1``: the group spawns N processes. Each one sets the environment
  variables Lightning reads for processes it did not launch (``MASTER_ADDR``, ``MASTER_PORT``,
  ``WORLD_SIZE``, ``NODE_RANK``, ``LOCAL_RANK``) and runs
  ``Trainer(strategy=DDPStrategy(...), devices=N).fit(learner, train_dataloaders=stream)``
  (a single learner process runs without DDP: it has nothing to synchronize),
  where ``stream`` is an iterable reading that process's command queue. An update command is
  yielded as a ``TrainItem`` (the shard, with the call's timesteps and update settings), so
  ``Learner.training_step`` runs it with ``manual_backward`` and DDP averages the gradients of
  every minibatch step over all learners; a callback's ``on_train_batch_end`` sends the
  results back. Other commands (weights, state, checkpoints, adding modules) run inside the
  stream between two train items, on every rank; shutdown ends the stream, so ``fit``
  returns and the process exits.

The driver cuts each batch into N contiguous, near-equal shards, one per learner. Before a
shard is trained on, every learner checks its own and all of them agree (one collective) to
train or to reject, so bad input changes nothing anywhere. A learner process that raises or
dies breaks the group: the call names the rank and the cause, the other processes are
stopped, and every later call says the group is broken. The driver never waits unbounded.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import pickle
import queue
import socket
import sys
import tempfile
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from lightning.pytorch import Callback

from lightning_rl.core.columns import COMPONENT_RL_MODULE
from lightning_rl.learner.learner import Learner
from lightning_rl.core.rl_module import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.train_item import TrainingData, TrainItem

if TYPE_CHECKING:
    from lightning_rl.env.episode import SingleAgentEpisode

ResultDict = dict[str, dict[str, float]]
Weights = dict[str, dict[str, np.ndarray]]

__all__ = ["LearnerGroup", "LearnerGroupError", "free_local_port", "local_rank_environment"]

# Lightning prefetches one item ahead from an iterable without a length (to know which item is
# the last), which would wait for the next command before the current one is answered.
_STREAM_LENGTH = 2**62
_POLL_S = 0.1  # how often a waiting driver checks that its learner processes are alive
_JOIN_S = 10.0  # how long shutdown waits for a process to exit by itself before killing it
_COLLECTIVE_MARGIN_S = 30.0  # learners' collectives time out this much after the driver stops waiting

_UPDATE_KINDS = ("update_from_batch", "update_from_episodes")
_START, _SHUTDOWN = "start", "shutdown"
# Reply statuses: the command ran / raised / was skipped because another rank rejected it /
# the learner process failed and is exiting.
_OK, _ERROR, _REJECTED, _FATAL = "ok", "error", "rejected", "fatal"


class LearnerGroupError(RuntimeError):
    """A learner process failed, died or stopped answering (or the group was shut down): the group is done."""


class _RemoteTraceback(Exception):
    """Carries a learner process's traceback text as the ``__cause__`` of the error it raised."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n" + self.text


class LearnerGroup:
    """RLlib's ``LearnerGroup``: one local Learner, or N data-parallel Learners under Lightning's DDP.

    Every learner holds the same modules and weights; an update on N learners trains each on
    one of N contiguous shards of the batch and averages their gradients at every minibatch
    step. For a mean-reduced loss and shards of equal size this equals one learner's update on
    the whole batch (without minibatches; with them, each learner cuts its own shard into
    minibatches). Use it as a context manager, or call ``shutdown``. A group is driven from one
    thread.

    With learner processes, a learner built beforehand (``learner.build()``) starts every
    process from its weights; an unbuilt one is built in each process and DDP copies rank 0's
    weights to the others.

    Args:
        learner: The Learner to run (an instance of a ``Learner`` subclass). With
            ``num_learners=0`` the group uses this object itself (and builds it); otherwise
            every learner process receives a pickled copy, so its class and everything it
            holds (e.g. a callable ``policies_to_train``) must be importable by name.
        num_learners: ``0`` for one learner in this process; ``N >= 1`` for N learner processes.
        accelerator: Lightning's accelerator for the learner processes (``"cpu"``, ``"gpu"``,
            ...); each process uses device ``LOCAL_RANK``.
        num_threads_per_learner: torch intra-op threads per learner process; default
            ``max(1, os.cpu_count() // num_learners)``.
        max_requests_in_flight: The most async updates that may be queued or running at once;
            an async call beyond it waits for the oldest one (back-pressure).
        timeout_s: The longest the driver waits for the learner processes to answer one
            request (their DDP collectives time out 30 s later). Learners that do not answer in
            time are taken as hung: the group is broken and its processes killed.
        start_timeout_s: The longest the driver waits for the learner processes to start
            (import, build the modules, join DDP).
        ddp_kwargs: Extra arguments for ``DDPStrategy`` (e.g. ``find_unused_parameters``).

    Raises:
        ValueError: For an invalid argument, or a learner that cannot be pickled to the processes.
        LearnerGroupError: If a learner process fails to start (with its traceback).
    """

    def __init__(
        self,
        learner: Learner,
        *,
        num_learners: int = 0,
        accelerator: str = "cpu",
        num_threads_per_learner: int | None = None,
        max_requests_in_flight: int = 2,
        timeout_s: float = 600.0,
        start_timeout_s: float = 300.0,
        ddp_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(learner, Learner):
            raise ValueError(f"learner must be a lightning_rl Learner instance, got {type(learner).__name__}")
        _check_int("num_learners", num_learners, minimum=0, hint=" (0: one learner in this process)")
        _check_int("max_requests_in_flight", max_requests_in_flight, minimum=1)
        if num_threads_per_learner is not None:
            _check_int("num_threads_per_learner", num_threads_per_learner, minimum=1, hint=" or None")
        for name, value in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not isinstance(accelerator, str):
            raise ValueError(f"accelerator must be a string such as 'cpu' or 'gpu', got {accelerator!r}")
        ddp_kwargs = dict(ddp_kwargs or {})
        if "timeout" in ddp_kwargs:
            raise ValueError("ddp_kwargs must not set 'timeout': the group sets DDP's timeout from timeout_s")

        self._num_learners = num_learners
        self._max_requests_in_flight = max_requests_in_flight
        self._in_flight: deque[Any] = deque()  # handles of async updates, oldest first
        # Finished async updates not yet handed out: (True, results) or (False, exception).
        self._finished: deque[tuple[bool, Any]] = deque()
        self._closed = False
        self._backend: _LocalBackend | _ProcessBackend
        if num_learners == 0:
            self._backend = _LocalBackend(learner)
        else:
            learner_bytes = _pickle_learner(learner, num_learners)
            _dumps(ddp_kwargs, "ddp_kwargs")  # fail here, not inside Process.start
            self._backend = _ProcessBackend(
                learner_bytes,
                num_learners=num_learners,
                accelerator=accelerator,
                num_threads=num_threads_per_learner or max(1, (os.cpu_count() or 1) // num_learners),
                timeout_s=float(timeout_s),
                start_timeout_s=float(start_timeout_s),
                ddp_kwargs=ddp_kwargs,
            )

    # ------------------------------------------------------------------------------------
    # Properties
    # ------------------------------------------------------------------------------------

    @property
    def num_learners(self) -> int:
        """The number of learner processes (``0``: one learner in this process)."""
        return self._num_learners

    @property
    def is_local(self) -> bool:
        """Whether the group's one learner runs in this process (``num_learners=0``)."""
        return self._num_learners == 0

    @property
    def learner_pids(self) -> list[int]:
        """The process ids of the learner processes, by rank (empty for ``num_learners=0``)."""
        return list(getattr(self._backend, "pids", []))

    @property
    def num_requests_in_flight(self) -> int:
        """Async updates submitted whose results have not been collected by the group yet."""
        return len(self._in_flight)

    # ------------------------------------------------------------------------------------
    # Updates
    # ------------------------------------------------------------------------------------

    def update_from_batch(
        self,
        batch: Mapping[str, Any],
        *,
        async_update: bool = False,
        timesteps: Mapping[str, float] | None = None,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
    ) -> ResultDict | list[ResultDict]:
        """Train every learner on its shard of ``batch``; the same as ``Learner.update_from_batch``.

        Args:
            batch: ``{column: array}`` for a single-module Learner, or ``{module_id: {column:
                array}}``; numpy arrays or tensors. With N learners, each module's rows are cut
                into N contiguous near-equal shards (a module with fewer rows than learners is
                missing from some shards). An async update may read ``batch`` later: do not
                modify it until its results are back.
            async_update: ``False``: wait for this update and return its results. ``True``:
                queue it and return, without waiting for it, the results of the async updates
                that finished since the last call (in order; the first call returns ``[]``).
                With ``max_requests_in_flight`` updates queued already, this waits for the oldest.
            timesteps: Lifetime counters such as ``{"num_env_steps_sampled_lifetime": 4000}``
                (they drive the schedules); sent to every learner.
            num_epochs: Passes over the batch.
            minibatch_size: Rows per gradient step on each learner (as in RLlib, per learner);
                ``None`` for its whole shard.
            shuffle_batch_per_epoch: Whether each pass visits a learner's rows in a new order.

        Returns:
            The results, reduced over all learners (``{module_id: {key: float}}``), or with
            ``async_update=True`` a list of such results.

        Raises:
            ValueError: For bad input (unknown module ids, missing columns, columns of unequal
                length, wrong shapes, invalid settings); nothing is trained then, anywhere, and
                the group stays usable. The message names the rank that found the problem. An
                async update's error is raised by the call that would have returned its results.
            LearnerGroupError: If a learner process failed, died or timed out (the group is broken).
        """
        return self._update(
            "update_from_batch",
            batch,
            async_update=async_update,
            settings=_update_settings(timesteps, num_epochs, minibatch_size, shuffle_batch_per_epoch),
        )

    def update_from_episodes(
        self,
        episodes: Sequence[SingleAgentEpisode],
        *,
        async_update: bool = False,
        timesteps: Mapping[str, float] | None = None,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
    ) -> ResultDict | list[ResultDict]:
        """Train on ``episodes``: each learner runs the Learner connector on its share, then updates.

        With N learners the episodes are dealt out in N contiguous groups of about equal env
        steps (an episode is never split); each learner turns its group into a train batch with
        ``episodes_to_train_batch`` and trains on it, as ``Learner.update_from_episodes`` does.

        Args:
            episodes: Single-agent episodes for the Learner's one module.
            async_update: As in ``update_from_batch``.
            timesteps: As in ``update_from_batch``.
            num_epochs: As in ``update_from_batch``.
            minibatch_size: As in ``update_from_batch``.
            shuffle_batch_per_epoch: As in ``update_from_batch``.

        Returns:
            As ``update_from_batch``.

        Raises:
            ValueError: For an empty list or episodes the connector rejects (nothing is trained).
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        if isinstance(episodes, (str, bytes, Mapping)) or not isinstance(episodes, Sequence) or not episodes:
            raise ValueError(f"episodes must be a non-empty list of episodes, got {type(episodes).__name__}")
        return self._update(
            "update_from_episodes",
            list(episodes),
            async_update=async_update,
            settings=_update_settings(timesteps, num_epochs, minibatch_size, shuffle_batch_per_epoch),
        )

    def collect_async_results(self, *, wait: bool = True) -> list[ResultDict]:
        """The results of async updates that finished since the last async call, in order.

        Args:
            wait: Whether to wait for every async update in flight first (so that none is left).

        Returns:
            A list of results, one per finished async update.

        Raises:
            ValueError: If one of those updates was rejected for bad input (the results of
                updates before it are returned by this call, those after it by the next one).
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        self._check_open()
        if wait:
            self._finish_in_flight()
        else:
            self._collect_done()
        return self._pop_finished()

    def _update(self, kind: str, data: Any, *, async_update: bool, settings: dict[str, Any]) -> Any:
        self._check_open()
        payload = self._backend.prepare_update(kind, data)
        if not async_update:
            # In order: an update waits for the async ones before it (their results are kept).
            self._finish_in_flight()
            return self._backend.run_update(kind, payload, settings)
        while len(self._in_flight) >= self._max_requests_in_flight:
            self._finish_oldest()
        self._collect_done()
        self._in_flight.append(self._backend.submit_update(kind, payload, settings))
        return self._pop_finished()

    def _finish_oldest(self) -> None:
        handle = self._in_flight.popleft()
        try:
            self._finished.append((True, handle.result()))
        except LearnerGroupError:
            raise
        except Exception as error:  # a rejected update: raised to the caller that collects it
            self._finished.append((False, error))

    def _finish_in_flight(self) -> None:
        while self._in_flight:
            self._finish_oldest()

    def _collect_done(self) -> None:
        self._backend.poll()
        while self._in_flight and self._in_flight[0].done():
            self._finish_oldest()

    def _pop_finished(self) -> list[ResultDict]:
        results: list[ResultDict] = []
        while self._finished:
            ok, value = self._finished[0]
            if not ok:
                if results:
                    break  # hand out the results before the error first; raise it next time
                self._finished.popleft()
                raise value
            results.append(value)
            self._finished.popleft()
        return results

    # ------------------------------------------------------------------------------------
    # Weights, state, checkpoints, modules
    # ------------------------------------------------------------------------------------

    def get_weights(self, module_ids: Collection[str] | None = None) -> Weights:
        """The modules' weights, as numpy copies (all learners hold the same ones).

        Args:
            module_ids: The modules to include; all when ``None``.

        Returns:
            ``{module_id: {parameter_name: ndarray}}``.

        Raises:
            ValueError: For an unknown module id.
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        module_ids = None if module_ids is None else list(module_ids)
        return self._call("get_weights", module_ids=module_ids)

    def set_weights(self, weights: Mapping[str, Mapping[str, Any]]) -> None:
        """Load module weights into every learner (optimizer states stay as they are).

        Args:
            weights: ``{module_id: {parameter_name: array}}`` (numpy arrays or tensors) for
                some or all modules, each with exactly that module's parameter names and shapes.

        Raises:
            ValueError: For an unknown module, a missing or unexpected name or a wrong shape;
                nothing is loaded then.
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        if not isinstance(weights, Mapping) or not all(isinstance(w, Mapping) for w in weights.values()):
            raise ValueError("weights must be {module_id: {parameter_name: array}}")
        as_numpy = {mid: {name: _to_numpy(value) for name, value in w.items()} for mid, w in weights.items()}
        self._call("set_weights", weights=as_numpy)

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
    ) -> dict[str, Any]:
        """The Learner's state, as ``Learner.get_state`` returns it (tensors on the CPU for N >= 1).

        Args:
            components: ``"rl_module"``, ``"optimizer"``, ``"metrics_logger"`` or a list of
                them; ``None`` for all.
            not_components: Components to leave out.

        Returns:
            The state of the first learner (all hold the same; metrics are totals over all).

        Raises:
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        return self._call("get_state", components=_as_list(components), not_components=_as_list(not_components))

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore ``state`` (from ``get_state``) into every learner.

        Raises:
            ValueError: If it does not fit (unknown modules or optimizers, wrong shapes);
                nothing changes then.
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        if not isinstance(state, Mapping):
            raise ValueError(f"state must be a dict from get_state(), got {type(state).__name__}")
        self._call("set_state", state=dict(state))

    def save_to_path(self, path: str | os.PathLike[str]) -> str:
        """Save the group's Learner to the directory ``path``, in ``Learner.save_to_path``'s format.

        Returns:
            ``path``; ``restore_from_path``, ``Learner.restore_from_path`` and
            ``Learner.from_checkpoint`` read it.

        Raises:
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        path = os.path.abspath(os.fspath(path))
        self._call("save_to_path", path=path)
        return path

    def restore_from_path(self, path: str | os.PathLike[str]) -> None:
        """Restore every learner from ``save_to_path`` output or a Lightning checkpoint.

        Modules are added or removed to match the checkpoint; training then continues exactly
        as it would have from the moment of saving.

        Raises:
            ValueError: If the checkpoint does not fit; the learners are left as they were.
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        self._call("restore_from_path", path=os.path.abspath(os.fspath(path)))

    def add_module(
        self,
        *,
        module_id: str,
        module_spec: RLModuleSpec,
        config_overrides: dict[str, Any] | None = None,
        new_should_module_be_updated: Collection[str] | Callable[[str, Any], bool] | None = None,
    ) -> MultiRLModuleSpec:
        """Add a module to every learner, between two updates (its gradients are averaged like the others').

        Args:
            module_id: The new module's id.
            module_spec: How to build it.
            config_overrides: Hyperparameters of this module that differ from the Learner's.
            new_should_module_be_updated: A new ``policies_to_train``; ``None`` keeps the current one.

        Returns:
            The spec of all modules after adding.

        Raises:
            ValueError: If the id is taken or invalid, the overrides are invalid, or (with
                learner processes) the spec or rule cannot be pickled.
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        return self._call(
            "add_module",
            module_id=module_id,
            module_spec=module_spec,
            config_overrides=config_overrides,
            new_should_module_be_updated=new_should_module_be_updated,
        )

    def remove_module(
        self,
        module_id: str,
        *,
        new_should_module_be_updated: Collection[str] | Callable[[str, Any], bool] | None = None,
    ) -> MultiRLModuleSpec:
        """Remove a module (with its optimizers) from every learner.

        Args:
            module_id: The module to remove.
            new_should_module_be_updated: A new ``policies_to_train``; ``None`` keeps the current one.

        Returns:
            The spec of the remaining modules.

        Raises:
            ValueError: If there is no such module.
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        return self._call(
            "remove_module", module_id=module_id, new_should_module_be_updated=new_should_module_be_updated
        )

    def foreach_learner(self, func: Callable[..., Any], **kwargs: Any) -> list[Any]:
        """Call ``func(learner, **kwargs)`` on every learner, between two updates.

        Args:
            func: A function of the Learner; with learner processes it must be picklable (a
                module-level function) and so must its result.
            **kwargs: Passed on to ``func``.

        Returns:
            ``func``'s results, one per learner, by rank.

        Raises:
            Whatever ``func`` raises (re-raised in this process, naming the rank).
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        if not callable(func):
            raise ValueError(f"func must be callable, got {type(func).__name__}")
        return self._call("foreach_learner", func=func, kwargs=kwargs)

    def _call(self, kind: str, **args: Any) -> Any:
        self._check_open()
        self._finish_in_flight()  # commands keep their order with the async updates before them
        return self._backend.call(kind, args)

    # ------------------------------------------------------------------------------------
    # Life cycle
    # ------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the learners and reap their processes; idempotent.

        Async updates still in flight finish first (their results are discarded). A process
        that does not exit within a few seconds is killed.
        """
        if self._closed:
            return
        self._closed = True
        self._in_flight.clear()
        self._finished.clear()
        self._backend.shutdown()

    def __enter__(self) -> LearnerGroup:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        # Best effort: a group dropped without shutdown() must not leave processes behind.
        backend = getattr(self, "_backend", None)
        if backend is not None and not getattr(self, "_closed", True):
            try:
                backend.kill()
            except Exception:
                pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_learners={self._num_learners})"

    def _check_open(self) -> None:
        if self._closed:
            raise LearnerGroupError("this LearnerGroup was shut down; create a new one")
        self._backend.check_not_broken()


# ----------------------------------------------------------------------------------------
# One learner in this process
# ----------------------------------------------------------------------------------------


class _LocalBackend:
    """Runs everything on ``learner`` itself; async updates on one background thread."""

    def __init__(self, learner: Learner) -> None:
        learner.build()
        self.learner = learner
        self._executor: ThreadPoolExecutor | None = None

    def check_not_broken(self) -> None:
        pass

    def prepare_update(self, kind: str, data: Any) -> Any:
        return data

    def run_update(self, kind: str, data: Any, settings: dict[str, Any]) -> ResultDict:
        return getattr(self.learner, kind)(data, **settings)

    def submit_update(self, kind: str, data: Any, settings: dict[str, Any]) -> Future:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="LearnerGroup-update")
        return self._executor.submit(getattr(self.learner, kind), data, **settings)

    def poll(self) -> None:
        pass

    def call(self, kind: str, args: dict[str, Any]) -> Any:
        learner = self.learner
        if kind == "foreach_learner":
            return [args["func"](learner, **args["kwargs"])]
        if kind == "get_state":
            return learner.get_state(args["components"], not_components=args["not_components"])
        return _run_command(learner, kind, args, rank=0)

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def kill(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)


def _run_command(learner: Learner, kind: str, args: dict[str, Any], *, rank: int) -> Any:
    """Run one non-update command on ``learner`` (in a learner process: on every rank)."""
    if kind == "get_weights":
        state = learner.module.get_state(args["module_ids"])
        return {mid: {name: t.detach().cpu().numpy() for name, t in w.items()} for mid, w in state.items()}
    if kind == "set_weights":
        weights = {
            mid: {name: torch.tensor(np.asarray(v)) for name, v in w.items()} for mid, w in args["weights"].items()
        }
        learner.set_state({COMPONENT_RL_MODULE: weights})
        return None
    if kind == "get_state":
        return _to_cpu(learner.get_state(args["components"], not_components=args["not_components"]))
    if kind == "set_state":
        learner.set_state(args["state"])
        return None
    if kind == "save_to_path":
        if rank == 0:
            return learner.save_to_path(args["path"])
        # get_state is collective (metrics are reduced over ranks): every rank takes part,
        # and only rank 0's copy is kept.
        with tempfile.TemporaryDirectory(prefix="lightning_rl_rank") as scratch:
            learner.save_to_path(os.path.join(scratch, "learner"))
        return None
    if kind == "restore_from_path":
        learner.restore_from_path(args["path"])
        return None
    if kind == "add_module":
        return learner.add_module(**args)
    if kind == "remove_module":
        rule = args["new_should_module_be_updated"]
        return learner.remove_module(args["module_id"], new_should_module_be_updated=rule)
    if kind == "foreach_learner":
        return args["func"](learner, **args["kwargs"])
    raise ValueError(f"unknown LearnerGroup command {kind!r}")


# ----------------------------------------------------------------------------------------
# N learner processes joined by Lightning's DDP
# ----------------------------------------------------------------------------------------


class _ProcessBackend:
    """Starts the learner processes, sends them commands and waits, bounded, for their replies."""

    def __init__(
        self,
        learner_bytes: bytes,
        *,
        num_learners: int,
        accelerator: str,
        num_threads: int,
        timeout_s: float,
        start_timeout_s: float,
        ddp_kwargs: dict[str, Any],
    ) -> None:
        self._n = num_learners
        self._timeout_s = timeout_s
        self._broken: str | None = None
        self._next_id = 1  # request 0 is the start-up
        self._what: dict[int, tuple[str, str]] = {0: (_START, "the start-up")}  # id -> (kind, description)
        self._received: dict[int, dict[int, tuple[str, Any]]] = {}
        self._fatal: dict[int, tuple[int, str]] = {}  # rank -> (request id, traceback), in order of arrival
        context = mp.get_context("spawn")
        self._replies = context.Queue()
        self._commands = [context.Queue() for _ in range(num_learners)]
        port = free_local_port()
        self._processes = [
            context.Process(
                target=_learner_process_main,
                args=(rank, num_learners, port, learner_bytes, self._commands[rank], self._replies),
                kwargs={
                    "accelerator": accelerator,
                    "num_threads": num_threads,
                    "timeout_s": timeout_s,
                    "ddp_kwargs": ddp_kwargs,
                },
                name=f"LearnerGroup-rank{rank}",
                daemon=True,
            )
            for rank in range(num_learners)
        ]
        try:
            for process in self._processes:
                process.start()
        except BaseException:
            self._broken = "it failed to start its learner processes"
            self.kill()
            raise
        self._wait(0, timeout_s=start_timeout_s)

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self._processes]

    # -- requests --------------------------------------------------------------------------

    def prepare_update(self, kind: str, data: Any) -> list[Any]:
        if kind == "update_from_episodes":
            return _split_episodes(data, self._n)
        return _split_batch(data, self._n)

    def run_update(self, kind: str, shards: list[Any], settings: dict[str, Any]) -> ResultDict:
        return self._wait(self._submit(kind, [{"data": shard, "settings": settings} for shard in shards]))

    def submit_update(self, kind: str, shards: list[Any], settings: dict[str, Any]) -> _Request:
        request_id = self._submit(kind, [{"data": shard, "settings": settings} for shard in shards])
        return _Request(self, request_id)

    def call(self, kind: str, args: dict[str, Any]) -> Any:
        return self._wait(self._submit(kind, [args] * self._n))

    def _submit(self, kind: str, args_per_rank: list[dict[str, Any]]) -> int:
        payloads: list[bytes] = []
        for args in args_per_rank:
            if payloads and args is args_per_rank[0]:
                payloads.append(payloads[0])  # the same arguments for every rank: pickled once
            else:
                payloads.append(_dumps(args, f"the arguments of {kind}"))
        request_id = self._next_id
        self._next_id += 1
        self._what[request_id] = (kind, f"{kind} (request {request_id})")
        for command_queue, payload in zip(self._commands, payloads):
            command_queue.put((request_id, kind, payload))
        return request_id

    def done(self, request_id: int) -> bool:
        return len(self._received.get(request_id, {})) == self._n

    def poll(self) -> None:
        """Take every reply that has arrived, without waiting."""
        while True:
            try:
                self._record(self._replies.get_nowait())
            except queue.Empty:
                break
        if self._fatal:
            raise self._failure("the async updates in flight")

    def _wait(self, request_id: int, timeout_s: float | None = None) -> Any:
        kind, what = self._what[request_id]
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while not self.done(request_id):
            self.check_not_broken()
            if self._fatal:
                raise self._failure(what)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [rank for rank in range(self._n) if rank not in self._received.get(request_id, {})]
                raise self._break(
                    f"learner rank(s) {missing} did not answer {what} within {timeout_s:g} s (hung in a "
                    "collective or a long computation?); raise timeout_s if the work needs longer"
                )
            try:
                message = self._replies.get(timeout=min(_POLL_S, remaining))
            except queue.Empty:
                if not all(process.is_alive() for process in self._processes):
                    raise self._failure(what) from None
                continue
            self._record(message)
        replies = self._received.pop(request_id)
        self._what.pop(request_id, None)
        return self._combine(kind, what, replies)

    def _record(self, message: tuple[int, int, str, Any]) -> None:
        rank, request_id, status, payload = message
        if status == _FATAL:
            self._fatal.setdefault(rank, (request_id, payload))
        else:
            self._received.setdefault(request_id, {})[rank] = (status, payload)

    def _failure(self, waited_for: str) -> LearnerGroupError:
        """Describe every learner that raised or died (the root cause may not be the first to report), then break."""
        end = time.monotonic() + 1.0  # others' reports, and the exits of failing processes, arrive within moments
        while time.monotonic() < end:
            try:
                self._record(self._replies.get(timeout=_POLL_S))
            except queue.Empty:
                if all(not p.is_alive() for rank, p in enumerate(self._processes) if rank in self._fatal):
                    break
        summary, tracebacks = [], []
        for rank, process in enumerate(self._processes):
            if rank not in self._fatal and not process.is_alive():
                summary.append(
                    f"learner rank {rank} (pid {process.pid}) died with exit code {process.exitcode} "
                    f"while the group waited for {waited_for}"
                )
        for rank, (request_id, text) in self._fatal.items():
            what = self._what.get(request_id, (None, f"request {request_id}"))[1]
            last_line = text.strip().splitlines()[-1] if text.strip() else "no traceback"
            summary.append(f"learner rank {rank} raised while running {what}: {last_line}")
            tracebacks.append(f"--- traceback of learner rank {rank} ---\n{text.rstrip()}")
        return self._break("; ".join(summary) + ("\n" + "\n".join(tracebacks) if tracebacks else ""))

    def _combine(self, kind: str, what: str, replies: dict[int, tuple[str, Any]]) -> Any:
        if all(status == _OK for status, _ in replies.values()):
            if kind == "foreach_learner":
                return [pickle.loads(replies[rank][1]) for rank in range(self._n)]
            payload = replies[0][1]
            return None if payload is None else pickle.loads(payload)
        errors = {rank: pickle.loads(reply) for rank, (status, reply) in sorted(replies.items()) if status == _ERROR}
        succeeded = sorted(rank for rank, (status, _) in replies.items() if status == _OK)
        detail = "; ".join(f"rank {rank}: {type(error).__name__}: {error}" for rank, (error, _) in errors.items())
        if succeeded:
            raise self._break(
                f"{what} succeeded on learner rank(s) {succeeded} but failed on rank(s) {sorted(errors)}, so the "
                f"learners no longer hold the same state ({detail})"
            )
        if not errors:
            raise self._break(f"{what}: every learner rank reports another rank's rejection, but none says why")
        first_error, first_traceback = next(iter(errors.values()))
        if kind in _UPDATE_KINDS:
            message = f"{what} was rejected by learner rank(s) {sorted(errors)}; no learner trained on it ({detail})"
        else:
            message = f"{what} failed on learner rank(s) {sorted(errors)} ({detail})"
        raise _like(first_error, message) from _RemoteTraceback(first_traceback)

    # -- failure and shutdown ----------------------------------------------------------------

    def check_not_broken(self) -> None:
        if self._broken is not None:
            raise LearnerGroupError(
                f"this LearnerGroup is broken and its learner processes are stopped: {self._broken}"
            )

    def _break(self, reason: str) -> LearnerGroupError:
        """Mark the group broken, stop every learner process, and return the error to raise."""
        self._broken = reason
        self.kill()
        return LearnerGroupError(reason)

    def kill(self) -> None:
        """Kill the learner processes that still run and reap all of them."""
        started = [process for process in self._processes if process.pid is not None]
        for process in started:
            if process.is_alive():
                process.kill()
        for process in started:
            process.join(timeout=_JOIN_S)
        self._close_queues()

    def shutdown(self) -> None:
        """Ask every learner to finish (its ``fit`` returns), wait a bounded time, kill what remains."""
        if self._broken is None:
            request_id = self._submit(_SHUTDOWN, [{}] * self._n)
            end = time.monotonic() + min(self._timeout_s, 60.0)
            while not self.done(request_id) and time.monotonic() < end and not self._fatal:
                try:
                    self._record(self._replies.get(timeout=_POLL_S))
                except queue.Empty:
                    if not all(process.is_alive() for process in self._processes):
                        break
            deadline = time.monotonic() + _JOIN_S
            for process in self._processes:
                process.join(timeout=max(0.0, deadline - time.monotonic()))
            self._broken = "it was shut down"
        self.kill()

    def _close_queues(self) -> None:
        for q in [*self._commands, self._replies]:
            q.cancel_join_thread()  # never block this process's exit on commands nobody will read
            q.close()


class _Request:
    """The handle of one async update sent to the learner processes."""

    def __init__(self, backend: _ProcessBackend, request_id: int) -> None:
        self._backend = backend
        self._id = request_id

    def done(self) -> bool:
        return self._backend.done(self._id)

    def result(self) -> ResultDict:
        return self._backend._wait(self._id)


# ----------------------------------------------------------------------------------------
# Inside a learner process
# ----------------------------------------------------------------------------------------


def _learner_process_main(
    rank: int,
    world_size: int,
    port: int,
    learner_bytes: bytes,
    commands: Any,
    replies: Any,
    *,
    accelerator: str,
    num_threads: int,
    timeout_s: float,
    ddp_kwargs: dict[str, Any],
) -> None:
    """Join the other learners under Lightning's DDP and train on the commands that arrive."""
    torch.set_num_threads(num_threads)
    os.environ.update(local_rank_environment(rank, world_size, port, num_threads=num_threads))
    stream = _CommandStream(rank, commands, replies)
    try:
        from lightning.pytorch import Trainer
        from lightning.pytorch.plugins.environments import LightningEnvironment
        from lightning.pytorch.strategies import DDPStrategy

        # One banner per process would be noise; the driver reports what matters.
        logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
        logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
        warnings.filterwarnings(
            "ignore", message=".*(validation_step|val_dataloader|does not have many workers|LeafSpec).*"
        )
        learner = pickle.loads(learner_bytes)
        trainer = Trainer(
            accelerator=accelerator,
            devices=world_size,
            num_nodes=1,
            # Explicit, so that a SLURM or torchelastic environment around the driver is not
            # mistaken for this group's.
            plugins=[LightningEnvironment()],
            # Collectives time out a little after the driver gives up, so that the driver's
            # message (which ranks did not answer) is the one the user sees. One learner has
            # nothing to synchronize: DDP would only add a gradient copy and a one-rank
            # all-reduce to every backward pass.
            strategy=(
                DDPStrategy(timeout=timedelta(seconds=timeout_s + _COLLECTIVE_MARGIN_S), **ddp_kwargs)
                if world_size > 1
                else "auto"
            ),
            callbacks=[_ReplyCallback(stream)],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            max_epochs=1,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            use_distributed_sampler=False,
        )
        stream.trainer, stream.learner = trainer, learner
        trainer.fit(learner, train_dataloaders=stream)
        exit_code = 0
    except BaseException:
        replies.put((rank, stream.current_request, _FATAL, traceback.format_exc()))
        exit_code = 1
    # Everything this process owes the driver is in the reply queue: deliver it, then exit at
    # once (tearing down torch, gloo and Lightning at interpreter exit takes seconds).
    replies.close()
    replies.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


class _CommandStream:
    """The train dataloader of a learner process: yields update commands, runs the others inline."""

    def __init__(self, rank: int, commands: Any, replies: Any) -> None:
        self.rank = rank
        self.commands = commands
        self.replies = replies
        self.trainer: Any = None
        self.learner: Any = None
        self.current_request = 0  # the start-up until the first command
        self.update_request: int | None = None

    def __len__(self) -> int:
        return _STREAM_LENGTH

    def __iter__(self) -> Any:
        self.reply(0, _OK, None)  # set up: modules built, DDP joined
        while True:
            request_id, kind, payload = self._receive()
            self.current_request = request_id
            if kind == _SHUTDOWN:
                self.reply(request_id, _OK, None)
                return
            if kind in _UPDATE_KINDS:
                item = self._checked_update(request_id, kind, payload)
                if item is not None:
                    self.update_request = request_id
                    yield item  # Learner.training_step runs it; _ReplyCallback answers
            else:
                self._run_inline(request_id, kind, payload)

    def _receive(self) -> tuple[int, str, bytes]:
        parent = mp.parent_process()
        while True:
            try:
                return self.commands.get(timeout=1.0)
            except queue.Empty:
                if parent is not None and not parent.is_alive():
                    os._exit(0)  # the driver is gone: nobody will send a shutdown

    def _checked_update(self, request_id: int, kind: str, payload: bytes) -> dict[str, Any] | None:
        """Check this rank's shard; all ranks agree to train on it, or none does."""
        error: Exception | None = None
        item = None
        try:
            args = pickle.loads(payload)
            data = args["data"]
            if not data:
                batch = {}  # fewer rows than learners: this rank still takes part in every step
            elif kind == "update_from_episodes":
                # The connector's batch is checked like any other before anyone trains on it.
                batch = self.learner._prepare_batch(self.learner.episodes_to_train_batch(data))
            else:
                batch = self.learner._prepare_batch(data)
            settings = dict(args["settings"])
            timesteps = settings.pop("timesteps") or {}
            item = TrainItem(TrainingData(batch=batch), timesteps=timesteps, update_settings=settings)
        except Exception as caught:
            error = caught
        verdict = torch.tensor(0.0 if error is not None else 1.0, device=self.trainer.strategy.root_device)
        verdict = self.trainer.strategy.reduce(verdict, reduce_op="min")
        if float(verdict) < 1.0:
            if error is not None:
                self.reply(request_id, _ERROR, _error_payload(error))
            else:
                self.reply(request_id, _REJECTED, None)
            return None
        return item

    def _run_inline(self, request_id: int, kind: str, payload: bytes) -> None:
        try:
            result = _run_command(self.learner, kind, pickle.loads(payload), rank=self.rank)
            send = self.rank == 0 or kind == "foreach_learner"
            self.reply(request_id, _OK, pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL) if send else None)
        except Exception as error:
            self.reply(request_id, _ERROR, _error_payload(error))

    def reply_update(self, results: Any) -> None:
        payload = pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL) if self.rank == 0 else None
        self.reply(self.update_request, _OK, payload)

    def reply(self, request_id: int | None, status: str, payload: Any) -> None:
        self.replies.put((self.rank, request_id, status, payload))


class _ReplyCallback(Callback):
    """Sends each update's results (``training_step``'s output) back to the driver."""

    def __init__(self, stream: _CommandStream) -> None:
        self.stream = stream

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        results = outputs.get("results") if isinstance(outputs, Mapping) else None
        self.stream.reply_update(results)


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------


def local_rank_environment(rank: int, world_size: int, port: int, *, num_threads: int) -> dict[str, str]:
    """The environment variables that make this process rank ``rank`` of a one-machine DDP group.

    What Lightning reads for processes it did not launch itself (as ``torchrun`` sets them):
    with ``LOCAL_RANK`` set, its environment reports ``creates_processes_externally`` and
    the Trainer joins the group instead of starting processes. Set them with
    ``os.environ.update(...)`` in each of ``world_size`` processes before building the Trainer.

    Args:
        rank: This process's rank (``0 .. world_size - 1``); also its device index.
        world_size: The number of processes.
        port: A free TCP port on this machine, the same for all processes (rank 0 listens on it).
        num_threads: The torch thread count this process set (``torch.set_num_threads``).
            Passed on as ``OMP_NUM_THREADS``: without it Lightning's DDP launcher resets
            the count to ``cpu_count // world_size``.
    """
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world_size),
        "NODE_RANK": "0",
        "LOCAL_RANK": str(rank),
        "OMP_NUM_THREADS": str(num_threads),
    }


def _check_int(name: str, value: Any, *, minimum: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}{hint}, got {value!r}")


def _update_settings(
    timesteps: Mapping[str, float] | None, num_epochs: int, minibatch_size: int | None, shuffle_batch_per_epoch: bool
) -> dict[str, Any]:
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1, got {num_epochs!r}")
    if minibatch_size is not None and (
        isinstance(minibatch_size, bool) or not isinstance(minibatch_size, int) or minibatch_size < 1
    ):
        raise ValueError(f"minibatch_size must be >= 1 or None, got {minibatch_size!r}")
    if timesteps is not None and not isinstance(timesteps, Mapping):
        raise ValueError(f"timesteps must be a dict of counters, got {type(timesteps).__name__}")
    return dict(
        timesteps=None if timesteps is None else {key: float(value) for key, value in timesteps.items()},
        num_epochs=num_epochs,
        minibatch_size=minibatch_size,
        shuffle_batch_per_epoch=bool(shuffle_batch_per_epoch),
    )


def _split_batch(batch: Any, n: int) -> list[dict[str, Any]]:
    """Cut every module's rows into ``n`` contiguous near-equal shards (numpy); empty ones are left out."""
    if not isinstance(batch, Mapping) or not batch:
        raise ValueError(
            f"a batch must be a non-empty dict of columns or of module batches, got {type(batch).__name__}"
        )
    nested = [isinstance(value, Mapping) for value in batch.values()]
    if any(nested) and not all(nested):
        raise ValueError("a batch must map either columns to arrays or module ids to column dicts, not both")
    if not all(nested):
        return [part or {} for part in _split_columns(batch, n, "the batch")]
    shards: list[dict[str, Any]] = [{} for _ in range(n)]
    for module_id, module_batch in batch.items():
        for shard, part in zip(shards, _split_columns(module_batch, n, f"module {module_id!r}")):
            if part:
                shard[module_id] = part
    return shards


def _split_columns(columns: Mapping[str, Any], n: int, where: str) -> list[dict[str, np.ndarray] | None]:
    if not columns:
        raise ValueError(f"{where} has no columns")
    arrays = {column: _to_numpy(values) for column, values in columns.items()}
    lengths = {column: (len(values) if values.ndim > 0 else 0) for column, values in arrays.items()}
    if len(set(lengths.values())) != 1 or 0 in lengths.values():
        raise ValueError(f"{where}: columns must have the same, non-zero number of rows; got {lengths}")
    rows = next(iter(lengths.values()))
    bounds = _bounds([1] * rows, n)
    return [
        {column: values[start:stop] for column, values in arrays.items()} if stop > start else None
        for start, stop in itertools.pairwise(bounds)
    ]


def _split_episodes(episodes: list[Any], n: int) -> list[list[Any]]:
    """Deal ``episodes`` out in ``n`` contiguous groups of about equal env steps."""
    lengths = [max(len(episode), 0) for episode in episodes]
    bounds = _bounds(lengths if sum(lengths) > 0 else [1] * len(lengths), n)
    return [episodes[start:stop] for start, stop in itertools.pairwise(bounds)]


def _bounds(weights: list[int], n: int) -> list[int]:
    """``n + 1`` cut points that split items of these weights into contiguous, near-equal parts.

    For unit weights, the first ``len % n`` parts hold one item more (as ``np.array_split``).
    Otherwise each item goes to the part that contains its middle.
    """
    count = len(weights)
    if all(weight == 1 for weight in weights):
        sizes = [count // n + (1 if part < count % n else 0) for part in range(n)]
        return [0, *np.cumsum(sizes).tolist()]
    total = float(sum(weights))
    parts, before = [], 0.0
    for weight in weights:
        parts.append(min(n - 1, int(n * (before + weight / 2) / total)))
        before += weight
    return [0, *[int(np.searchsorted(parts, part, side="right")) for part in range(n)]]


def _to_numpy(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return np.asarray(values)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, Mapping):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(item) for item in value)
    return value


def _as_list(value: str | Collection[str] | None) -> str | list[str] | None:
    return value if value is None or isinstance(value, str) else list(value)


def _dumps(value: Any, what: str) -> bytes:
    """Pickle for a learner process; fails here, with a clear message, rather than in a queue's thread."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        raise ValueError(
            f"{what} cannot be pickled to send to the learner processes ({type(error).__name__}: {error}); "
            "use module-level classes and functions (no lambdas or local definitions)"
        ) from error


def _pickle_learner(learner: Learner, num_learners: int) -> bytes:
    rule = getattr(learner, "_should_module_be_updated", None)
    if callable(rule):
        try:
            pickle.dumps(rule)
        except Exception as error:
            raise ValueError(
                f"LearnerGroup(num_learners={num_learners}) sends the learner to its processes by pickling it, but "
                f"its policies_to_train {rule!r} cannot be pickled ({error}); pass a list of module ids or a "
                "module-level function"
            ) from error
    return _dumps(learner, f"the learner ({type(learner).__name__})")


def _error_payload(error: BaseException) -> bytes:
    text = "".join(traceback.format_exception(error))
    try:
        return pickle.dumps((error, text))
    except Exception:
        return pickle.dumps((RuntimeError(f"{type(error).__name__}: {error}"), text))


def _like(error: BaseException, message: str) -> BaseException:
    """An exception of ``error``'s nearest built-in type, with ``message``."""
    for cls in type(error).__mro__:
        if cls.__module__ == "builtins" and issubclass(cls, Exception):
            try:
                return cls(message)
            except Exception:
                break
    return RuntimeError(message)


def free_local_port() -> int:
    """A TCP port that is free on this machine now, for ``local_rank_environment``'s ``port``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

