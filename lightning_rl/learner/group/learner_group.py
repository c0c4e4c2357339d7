"""LearnerGroup: drive one local Learner, or several data-parallel Learner processes, from Python.

RLlib's ``LearnerGroup`` coordinates n Learner workers (Ray actors) that train copies of the
same modules on shards of each batch and average their gradients. Here the workers are plain
processes, and what joins them is a Lightning strategy: ``DDPStrategy`` (``strategy="ddp"``,
every learner holds the whole modules) or ``FSDP2Strategy`` (``strategy="fsdp2"``, every
learner holds a slice of each weight and optimizer state; the results are DDP's):

* ``num_learners=0``: the group holds the ``learner`` it was given (built) and calls it in
  this process; async updates run on one background thread (``_local``).
* ``num_learners=N >= 1``: the group starts N processes (forked from multiprocessing's fork
  server, which imports Lightning once), each running ``Trainer.fit`` on a
  stream of commands (``_worker``), driven from here (``_processes``). Every
  update's batch is cut into N shards (``_data``); every learner checks its shard and
  all agree to train or to reject, so bad input changes nothing anywhere.

Weights, state and checkpoints are whole tensors under either strategy (sharded learners
gather them, every rank taking part), so they move freely between ``"ddp"`` and ``"fsdp2"``
groups, a local Learner and ``Learner.from_checkpoint``.

This file is the public surface: the constructor, the update calls and their async
bookkeeping, weights, state, checkpoints and modules.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Union, get_args

from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.train_item import TrainingData
from lightning_rl.learner.group._data import (
    iterator_settings,
    update_settings,
    update_source,
)
from lightning_rl.learner.group._local import LocalBackend
from lightning_rl.learner.group._processes import ProcessBackend, pickle_learner
from lightning_rl.learner.group._protocol import (
    LearnerGroupError,
    ResultDict,
    Weights,
    dumps_data,
    free_local_port,
    local_rank_environment,
    to_numpy,
)
from lightning_rl.learner.learner import Learner

if TYPE_CHECKING:
    from lightning_rl.env.episode import SingleAgentEpisode
    from lightning_rl.env.multi_agent_episode import MultiAgentEpisode

__all__ = ["LearnerGroup", "LearnerGroupError", "UpdateReturn", "free_local_port", "local_rank_environment"]

# What one update returns: its results, or with ``return_state=True`` its results and the
# weights right after it.
UpdateReturn = Union[ResultDict, tuple[ResultDict, Weights]]
# How the learner processes are joined: Lightning's DDP, or FSDP2 (lightning_rl's FSDP2Strategy).
GroupStrategy = Literal["ddp", "fsdp2"]


class LearnerGroup:
    """RLlib's ``LearnerGroup``: one local Learner, or N data-parallel Learners under Lightning's DDP or FSDP2.

    Every learner holds the same modules and weights; an update on N learners trains each on
    one of N contiguous shards of the batch and averages their gradients at every minibatch
    step, each learner's loss of a module weighted by its share of that module's rows. For a
    mean-reduced loss this equals one learner's update on the whole batch (without
    minibatches; with them, each learner cuts its own shard into minibatches). Use it as a context manager, or call ``shutdown``. A group is driven from one
    thread.

    With learner processes, a learner built beforehand (``learner.build()``) starts every
    process from its weights and optimizer states; an unbuilt one is built in each process and
    rank 0's weights are copied to the others (by DDP, or when FSDP2 shards them).

    With ``strategy="fsdp2"`` each learner process keeps only its slice of every weight, gradient
    and optimizer moment (``FSDP2Strategy``: one FSDP unit over all modules, sharded over the N
    processes). The updates' results and weights are those of ``"ddp"`` (to float rounding);
    every call of the group works alike, and what it returns or saves is whole tensors.

    Args:
        learner: The Learner to run (an instance of a ``Learner`` subclass). With
            ``num_learners=0`` the group uses this object itself (and builds it); otherwise
            every learner process receives a copy sent by value with cloudpickle, so a
            subclass defined in a notebook cell or inside a function works too.
        num_learners: ``0`` for one learner in this process; ``N >= 1`` for N learner processes.
        accelerator: Lightning's accelerator for the learner processes (``"cpu"``, ``"gpu"``,
            ...); each process uses device ``LOCAL_RANK``.
        num_threads_per_learner: torch intra-op threads per learner process; default
            ``max(1, os.cpu_count() // num_learners)``.
        max_requests_in_flight: The most async updates that may be queued or running at once;
            an async call beyond it waits for the oldest one (back-pressure).
        timeout_s: The longest the driver waits for the learner processes to answer one
            request (their collectives time out 30 s later). Learners that do not answer in
            time are taken as hung: the group is broken and its processes killed.
        start_timeout_s: The longest the driver waits for the learner processes to start
            (import, build the modules, join the process group).
        strategy: How the learner processes train together: ``"ddp"`` (Lightning's
            ``DDPStrategy``: whole modules on every learner, gradients all-reduced) or
            ``"fsdp2"`` (``lightning_rl.FSDP2Strategy``: the modules, gradients and optimizer
            states sharded over the learners). Needs ``num_learners >= 1``.
        ddp_kwargs: Extra arguments for ``DDPStrategy`` (e.g. ``find_unused_parameters``);
            only with ``strategy="ddp"``.

    Raises:
        ValueError: For an invalid argument (an unknown ``strategy``, ``"fsdp2"`` without
            learner processes, ``ddp_kwargs`` with ``"fsdp2"``), or a learner that cannot be
            sent to the processes (it holds a lock, an open file or another process-bound object).
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
        strategy: GroupStrategy = "ddp",
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
        _check_strategy(strategy, num_learners, ddp_kwargs)
        ddp_kwargs = dict(ddp_kwargs or {})
        if "timeout" in ddp_kwargs:
            raise ValueError("ddp_kwargs must not set 'timeout': the group sets DDP's timeout from timeout_s")

        self._num_learners = num_learners
        self._strategy = strategy
        self._max_requests_in_flight = max_requests_in_flight
        self._in_flight: deque[Any] = deque()  # handles of async updates, oldest first
        # Finished async updates not yet handed out: (True, return value) or (False, exception).
        self._finished: deque[tuple[bool, Any]] = deque()
        self._closed = False
        self._backend: LocalBackend | ProcessBackend
        if num_learners == 0:
            self._backend = LocalBackend(learner)
        else:
            learner_bytes = pickle_learner(learner, num_learners)
            dumps_data(ddp_kwargs, "ddp_kwargs")  # the process start pickles them: fail here, not there
            self._backend = ProcessBackend(
                learner_bytes,
                num_learners=num_learners,
                accelerator=accelerator,
                num_threads=num_threads_per_learner or max(1, (os.cpu_count() or 1) // num_learners),
                timeout_s=float(timeout_s),
                start_timeout_s=float(start_timeout_s),
                strategy=strategy,
                ddp_kwargs=ddp_kwargs,
            )

    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike[str],
        *,
        learner_class: type[Learner] = Learner,
        learner_overrides: Mapping[str, Any] | None = None,
        **group_kwargs: Any,
    ) -> LearnerGroup:
        """A new group whose learners continue from a checkpoint: weights, optimizer states, counters, modules.

        Args:
            path: A directory written by ``LearnerGroup.save_to_path`` or ``Learner.save_to_path``
                (the same format), or a Lightning checkpoint file of a Learner.
            learner_class: The ``Learner`` subclass whose ``from_checkpoint`` rebuilds the
                learner; the checkpoint's class must be it or a subclass of it.
            learner_overrides: Hyperparameters to change, or what a checkpoint cannot hold (a
                callable ``policies_to_train``), as for ``Learner.from_checkpoint``.
            **group_kwargs: The group's own arguments (``num_learners``, ``strategy``, ...). A
                checkpoint saved by either strategy, or by a Learner alone, loads under either.

        Raises:
            ValueError: If the checkpoint is missing, damaged or of another Learner class, or
                an argument is invalid.
            LearnerGroupError: If a learner process fails to start.
        """
        if not (isinstance(learner_class, type) and issubclass(learner_class, Learner)):
            raise ValueError(f"learner_class must be a Learner subclass, got {learner_class!r}")
        if learner_overrides is not None and not isinstance(learner_overrides, Mapping):
            raise ValueError(f"learner_overrides must be a dict of hyperparameters, got {type(learner_overrides).__name__}")
        learner = learner_class.from_checkpoint(os.fspath(path), **dict(learner_overrides or {}))
        return cls(learner, **group_kwargs)

    # ------------------------------------------------------------------------------------
    # Properties
    # ------------------------------------------------------------------------------------

    @property
    def num_learners(self) -> int:
        """The number of learner processes (``0``: one learner in this process)."""
        return self._num_learners

    @property
    def strategy(self) -> GroupStrategy:
        """How the learner processes train together: ``"ddp"`` or ``"fsdp2"`` (sharded)."""
        return self._strategy

    @property
    def is_local(self) -> bool:
        """Whether the group's one learner runs in this process (``num_learners=0``)."""
        return self._num_learners == 0

    @property
    def is_remote(self) -> bool:
        """Whether the learners run in their own processes (``num_learners >= 1``); RLlib's name."""
        return self._num_learners > 0

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

    def update(
        self,
        batch: Mapping[str, Any] | None = None,
        batches: Sequence[Mapping[str, Any]] | None = None,
        episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode] | None = None,
        data_iterators: Sequence[Any] | None = None,
        training_data: TrainingData | None = None,
        *,
        timesteps: Mapping[str, float] | None = None,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
        async_update: bool = False,
        return_state: bool = False,
    ) -> UpdateReturn | list[UpdateReturn]:
        """Train every learner on its share of one source of data (RLlib's ``LearnerGroup.update``).

        Args:
            batch: ``{column: array}`` for a single-module Learner, or ``{module_id: {column:
                array}}``; numpy arrays or tensors. With N learners, each module's rows are cut
                into N contiguous near-equal shards (a module with fewer rows than learners is
                missing from some shards). With learner processes the learners read the batch
                from shared memory: tensors already there (``tensor.share_memory_()``, torch's
                default ``"file_descriptor"`` strategy on Linux, contiguous rows) are read where
                they are, with no copy; everything else (numpy arrays, private tensors, views
                that are not contiguous) is copied there once per update, which holds the batch
                twice. The learners never change your arrays (their mappings are
                copy-on-write). An async update may read the data later: do not modify it until
                its results are back.
            batches: Several such batches (all flat or all nested), concatenated row-wise into
                one before the update; with learner processes the group writes the
                concatenation into shared memory, where the learners read it (no further copy).
            episodes: Single-agent episodes for the Learner's one module, or multi-agent
                episodes whose agents train the modules their episode maps them to (all of one
                kind). With N learners they are dealt out in N contiguous groups of about equal
                env steps (an episode is never split, a multi-agent one keeps its agents
                together); each learner runs the Learner connector on its group. Their arrays
                travel through shared memory; a multi-agent episode's mapping function stays
                here (the learners get each agent's module).
            data_iterators: One iterable of batches (a ``DataLoader``, a generator) for a group
                with ``num_learners=0``, whose learner runs ``update_from_iterator`` on it
                (``num_epochs`` must be 1). Learner processes refuse it with a ``ValueError``
                (each would need its own iterator in its own process): draw the batches
                yourself and pass them as ``batch`` or ``batches``.
            training_data: A ``TrainingData`` holding one of the sources above, instead of them.
            timesteps: Lifetime counters such as ``{"num_env_steps_sampled_lifetime": 4000}``
                (they drive the schedules); sent to every learner.
            num_epochs: Passes over the data.
            minibatch_size: Rows per gradient step on each learner (as in RLlib, per learner);
                ``None`` for its whole shard.
            shuffle_batch_per_epoch: Whether each pass visits a learner's rows in a new order.
            async_update: ``True``: queue the update and return, without waiting, what the
                async updates finished since the last call returned (in order; at first ``[]``);
                with ``max_requests_in_flight`` queued already, wait for the oldest first.
            return_state: Whether the update also returns the weights right after it.

        Returns:
            The results, reduced over all learners (``{module_id: {key: float}}``); with
            ``return_state=True`` the tuple ``(results, weights)``, where ``weights`` is
            ``{module_id: {parameter_name: ndarray}}`` as ``get_weights()`` would have returned
            it at that moment. With ``async_update=True``, a list of such return values, one
            per finished update, each shaped by its own ``return_state``.

        Raises:
            ValueError: For no data source or several, an unsupported one, bad input (unknown
                module ids, missing columns, unequal lengths, wrong shapes) or invalid settings:
                nothing is trained anywhere, the group stays usable, and the message names the
                rank that found the problem. An async update's error is raised by the call that
                would have returned its results.
            LearnerGroupError: If a learner process failed, died or timed out (the group is broken).
        """
        source, data = update_source(
            batch=batch,
            batches=batches,
            episodes=episodes,
            data_iterators=data_iterators,
            training_data=training_data,
            num_learners=self._num_learners,
            join_in_shared_memory=self._backend.reads_shared_memory,
        )
        settings = update_settings(timesteps, num_epochs, minibatch_size, shuffle_batch_per_epoch)
        if source == "iterator":
            settings = iterator_settings(settings)
        return self._update(
            f"update_from_{source}", data, async_update=async_update, return_state=bool(return_state), settings=settings
        )

    def update_from_batch(
        self,
        batch: Mapping[str, Any],
        *,
        async_update: bool = False,
        return_state: bool = False,
        timesteps: Mapping[str, float] | None = None,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
    ) -> UpdateReturn | list[UpdateReturn]:
        """``update(batch=batch, ...)``: the seed API's name, kept; the arguments are ``update``'s."""
        return self.update(
            batch=batch,
            timesteps=timesteps,
            num_epochs=num_epochs,
            minibatch_size=minibatch_size,
            shuffle_batch_per_epoch=shuffle_batch_per_epoch,
            async_update=async_update,
            return_state=return_state,
        )

    def update_from_episodes(
        self,
        episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode],
        *,
        async_update: bool = False,
        return_state: bool = False,
        timesteps: Mapping[str, float] | None = None,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
    ) -> UpdateReturn | list[UpdateReturn]:
        """``update(episodes=episodes, ...)``: the seed API's name, kept; the arguments are ``update``'s."""
        if episodes is None:
            raise ValueError("episodes must be a non-empty list of episodes, got None")
        return self.update(
            episodes=episodes,
            timesteps=timesteps,
            num_epochs=num_epochs,
            minibatch_size=minibatch_size,
            shuffle_batch_per_epoch=shuffle_batch_per_epoch,
            async_update=async_update,
            return_state=return_state,
        )

    def collect_async_results(self, *, wait: bool = True) -> list[UpdateReturn]:
        """What the async updates finished since the last async call returned, in order.

        Args:
            wait: Whether to wait for every async update in flight first (so that none is left).

        Returns:
            A list with one return value per finished async update (see ``update``).

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

    def _update(
        self, kind: str, data: Any, *, async_update: bool, return_state: bool, settings: dict[str, Any]
    ) -> UpdateReturn | list[UpdateReturn]:
        self._check_open()
        payload = self._backend.prepare_update(kind, data)
        if not async_update:
            # In order: an update waits for the async ones before it (their results are kept).
            self._finish_in_flight()
            return self._backend.run_update(kind, payload, settings, return_state)
        while len(self._in_flight) >= self._max_requests_in_flight:
            self._finish_oldest()
        self._collect_done()
        self._in_flight.append(self._backend.submit_update(kind, payload, settings, return_state))
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

    def _pop_finished(self) -> list[UpdateReturn]:
        returned: list[UpdateReturn] = []
        while self._finished:
            ok, value = self._finished[0]
            if not ok:
                if returned:
                    break  # hand out the results before the error first; raise it next time
                self._finished.popleft()
                raise value
            returned.append(value)
            self._finished.popleft()
        return returned

    # ------------------------------------------------------------------------------------
    # Weights, state, checkpoints, modules
    # ------------------------------------------------------------------------------------

    def get_weights(self, module_ids: Collection[str] | None = None) -> Weights:
        """The modules' whole weights, as numpy copies (all learners hold the same ones, or slices of them).

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
        as_numpy = {mid: {name: to_numpy(value) for name, value in w.items()} for mid, w in weights.items()}
        self._call("set_weights", weights=as_numpy)

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
    ) -> dict[str, Any]:
        """The Learner's state, as ``Learner.get_state`` returns it (tensors on the CPU for N >= 1).

        Weights and optimizer states are whole tensors also under ``strategy="fsdp2"`` (the
        learners gather them), so the state loads into a group of either strategy or a Learner.

        Args:
            components: ``"rl_module"``, ``"rl_module/<module_id>"``, ``"optimizer"``,
                ``"metrics_logger"`` or a list of them; ``None`` for all.
            not_components: Components (or ``"rl_module/<module_id>"``) to leave out.

        Returns:
            The state of the first learner (all hold the same; metrics are totals over all).

        Raises:
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        return self._call("get_state", components=_as_list(components), not_components=_as_list(not_components))

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore ``state`` (from ``get_state``, or RLlib's ``{"learner": state}``) into every learner.

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
            ``path``; ``restore_from_path``, ``LearnerGroup.from_checkpoint``,
            ``Learner.restore_from_path`` and ``Learner.from_checkpoint`` read it.

        Raises:
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        path = os.path.abspath(os.fspath(path))
        self._call("save_to_path", path=path)
        return path

    def restore_from_path(self, path: str | os.PathLike[str], *, component: str | None = None) -> None:
        """Restore every learner from ``save_to_path`` output or a Lightning checkpoint.

        Modules are added or removed to match the checkpoint; training then continues exactly
        as it would have from the moment of saving.

        Args:
            path: The checkpoint (see ``Learner.restore_from_path``).
            component: RLlib's argument: only this part, e.g. ``"learner/rl_module/<module_id>"``
                or ``"rl_module/<module_id>"`` (then ``path`` may also be an ``RLModule.save_to_path``
                directory); see ``Learner.restore_from_path``.

        Raises:
            ValueError: If the checkpoint does not fit; the learners are left as they were.
            LearnerGroupError: If a learner process failed, died or timed out.
        """
        self._call("restore_from_path", path=os.path.abspath(os.fspath(path)), component=component)

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
                learner processes) the spec or rule cannot be sent to them.
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

        Under ``strategy="fsdp2"`` each learner's parameters are its slices (``DTensor`` objects);
        ``func`` runs on every learner, so it may make collective calls such as
        ``learner.get_module_state()``, which gathers whole weights.

        Args:
            func: A function of the Learner; with learner processes it is sent by value
                (a lambda or a local function works) and its result must be picklable.
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
        return f"{type(self).__name__}(num_learners={self._num_learners}, strategy={self._strategy!r})"

    def _check_open(self) -> None:
        if self._closed:
            raise LearnerGroupError("this LearnerGroup was shut down; create a new one")
        self._backend.check_not_broken()


def _check_int(name: str, value: Any, *, minimum: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}{hint}, got {value!r}")


def _check_strategy(strategy: Any, num_learners: int, ddp_kwargs: Mapping[str, Any] | None) -> None:
    """Refuse an unknown strategy, FSDP2 without learner processes, and DDP's arguments for FSDP2."""
    known = get_args(GroupStrategy)
    if not isinstance(strategy, str) or strategy not in known:
        raise ValueError(f"strategy must be one of {list(known)}, got {strategy!r}")
    if strategy == "fsdp2" and num_learners == 0:
        raise ValueError(
            "strategy='fsdp2' shards the modules over learner processes: use num_learners >= 1 "
            "(num_learners=0 runs one whole learner in this process)"
        )
    if strategy != "ddp" and ddp_kwargs:
        raise ValueError(
            f"ddp_kwargs are DDPStrategy's arguments and apply only with strategy='ddp', not {strategy!r} "
            f"(got {sorted(ddp_kwargs)})"
        )


def _as_list(value: str | Collection[str] | None) -> str | list[str] | None:
    return value if value is None or isinstance(value, str) else list(value)
