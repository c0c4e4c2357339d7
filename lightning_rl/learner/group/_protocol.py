"""What the LearnerGroup's driver and its learners share: message kinds, errors, pickling, commands.

The driver (``LearnerGroup`` in the user's process) sends each learner process commands
``(request_id, kind, payload)`` on its own queue; every learner answers on one shared reply
queue with ``(rank, request_id, status, payload)``. Payloads are pickled bytes; a batch's
arrays are not in them but in shared memory, named in their place (``_shared``). Apart from
the commands, a thread in each learner answers the driver's status probes on a pipe with an
:class:`Activity`: where the learner's main thread is, so that a timeout can tell the rank
that hangs from the ranks that wait for it in a collective. The Learner
itself and the arguments of non-update commands are pickled with cloudpickle, which sends
classes and functions defined in a notebook cell or inside a function by value; update data
and replies are plain data and use ``pickle``.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import traceback
from collections.abc import Mapping
from typing import Any, NamedTuple

import cloudpickle
import numpy as np
import torch

from lightning_rl.core.columns import COMPONENT_RL_MODULE
from lightning_rl.learner.learner import Learner

ResultDict = dict[str, dict[str, float]]
Weights = dict[str, dict[str, np.ndarray]]

# Command kinds. An update is named after the Learner method that runs it on every learner
# (the name the user reads in an error); the start-up is request 0.
UPDATE_KINDS = ("update_from_batch", "update_from_episodes")
START, SHUTDOWN = "start", "shutdown"
# Reply statuses: the command ran / raised / was skipped because another rank rejected it /
# the learner process failed and is exiting.
OK, ERROR, REJECTED, FATAL = "ok", "error", "rejected", "fatal"


class Activity(NamedTuple):
    """What a learner process's main thread is doing, as its status thread sees it.

    Args:
        waiting_for_ranks: Whether it is inside a collective (``torch.distributed``) or a
            backward pass (where DDP all-reduces the gradients), i.e. waiting for the other ranks.
        where: ``"function (file:line)"`` of its innermost Python frame, and of the innermost
            frame outside torch and Lightning when that is another one.
    """

    waiting_for_ranks: bool
    where: str


class LearnerGroupError(RuntimeError):
    """A learner process failed, died or stopped answering (or the group was shut down): the group is done."""


class RemoteTraceback(Exception):
    """Carries a learner process's traceback text as the ``__cause__`` of the error it raised."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n" + self.text


def dumps_by_value(value: Any, what: str) -> bytes:
    """Cloudpickle ``value`` for the learner processes; fails here, naming ``what``, not in a queue's thread.

    Classes and functions that cannot be imported by name (defined in ``__main__``, a notebook
    cell or a function) travel by value; everything else by reference, as ``pickle`` does.
    """
    try:
        return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        raise ValueError(
            f"{what} cannot be pickled to send to the learner processes ({type(error).__name__}: {error}); "
            "it must not hold locks, open files, sockets, generators or other process-bound objects"
        ) from error


def dumps_data(value: Any, what: str) -> bytes:
    """Plain-pickle update data (arrays, episodes) for the learner processes, with a clear error."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        raise ValueError(f"{what} cannot be pickled to send to the learner processes ({error})") from error


def error_payload(error: BaseException) -> bytes:
    """A learner's exception and its traceback text, pickled for the driver (text alone if need be)."""
    text = "".join(traceback.format_exception(error))
    try:
        return pickle.dumps((error, text))
    except Exception:
        return pickle.dumps((RuntimeError(f"{type(error).__name__}: {error}"), text))


def like(error: BaseException, message: str) -> BaseException:
    """An exception of ``error``'s nearest built-in type, with ``message``."""
    for cls in type(error).__mro__:
        if cls.__module__ == "builtins" and issubclass(cls, Exception):
            try:
                return cls(message)
            except Exception:
                break
    return RuntimeError(message)


def to_numpy(values: Any) -> np.ndarray:
    """An array as numpy (a tensor is detached and copied to the CPU first)."""
    if isinstance(values, np.ndarray):
        return values
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return np.asarray(values)


def weights_of(learner: Learner, module_ids: list[str] | None = None) -> Weights:
    """``{module_id: {parameter_name: ndarray}}``: whole copies of the learner's module weights.

    A collective call when the modules are sharded (FSDP2): every rank must make it.
    """
    state = learner.module.get_state(module_ids)
    return {mid: {name: t.detach().cpu().numpy() for name, t in w.items()} for mid, w in state.items()}


def run_command(learner: Learner, kind: str, args: dict[str, Any], *, rank: int) -> Any:
    """Run one non-update command on ``learner`` (in a learner process: on every rank).

    Every rank runs the same calls in the same order, so that the collective ones (reading
    sharded weights and states, adding or removing modules under FSDP2) meet on all ranks.
    """
    if kind == "get_weights":
        return weights_of(learner, args["module_ids"])
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
        # get_state is collective (metrics are reduced over ranks, sharded weights gathered):
        # every rank takes part, and only rank 0's copy is kept.
        with tempfile.TemporaryDirectory(prefix="lightning_rl_rank") as scratch:
            learner.save_to_path(os.path.join(scratch, "learner"))
        return None
    if kind == "restore_from_path":
        learner.restore_from_path(args["path"], component=args.get("component"))
        return None
    if kind == "add_module":
        return learner.add_module(**args)
    if kind == "remove_module":
        rule = args["new_should_module_be_updated"]
        return learner.remove_module(args["module_id"], new_should_module_be_updated=rule)
    if kind == "foreach_learner":
        return args["func"](learner, **args["kwargs"])
    raise ValueError(f"unknown LearnerGroup command {kind!r}")


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, Mapping):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(item) for item in value)
    return value


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


def free_local_port() -> int:
    """A TCP port that is free on this machine now, for ``local_rank_environment``'s ``port``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
