"""The LearnerGroup backend for ``num_learners=N >= 1``: N learner processes joined by Lightning's DDP or FSDP2.

The driver side: send the Learner by value (``pickle_learner``, cloudpickle), start the
processes (``_worker.learner_process_main``), send every rank its command, and wait, bounded,
for all ranks' replies. An update's batch, or its episodes, is cut into N shards (``_data``),
whose arrays travel in shared memory (``_shared``; episodes as arrays, ``_episodes``): a
batch's tensors already in shared memory as they are, everything else copied once. A learner
that raises or dies breaks the group: the call names the rank and the cause, the other
processes are killed, and every later call says the group is broken. The driver never waits unbounded: on a timeout it asks the silent ranks where they
are (``Activity``), so the error names the rank that hangs apart from those that wait for it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import time
import warnings
from typing import Any, NamedTuple

import torch

from lightning_rl.core.processes import main_script_not_rerun
from lightning_rl.learner.group._data import split_batch, split_episodes
from lightning_rl.learner.group._episodes import episodes_to_wire
from lightning_rl.learner.group._protocol import (
    ERROR,
    FATAL,
    OK,
    SHUTDOWN,
    START,
    UPDATE_KINDS,
    Activity,
    LearnerGroupError,
    RemoteTraceback,
    dumps_by_value,
    dumps_data,
    free_local_port,
    like,
)
from lightning_rl.learner.group._shared import CallerMemory, SharedShards, caller_shared_memory, can_open
from lightning_rl.learner.group._worker import learner_process_main
from lightning_rl.learner.learner import Learner

_POLL_S = 0.1  # how often a waiting driver checks that its learner processes are alive
_JOIN_S = 10.0  # how long shutdown waits for a process to exit by itself before killing it
_PROBE_S = 2.0  # how long a timed-out driver waits for the learners' status answers
# The Learner attributes a user sets under another name, for ``pickle_learner``'s error.
_ATTRIBUTE_NAMES = {"_should_module_be_updated": "policies_to_train"}


class PreparedUpdate(NamedTuple):
    """An update's data, ready to send: one shard per rank, and the caller's shared storages its arrays lie in."""

    shards: list[Any]
    caller_memory: list[CallerMemory]


class ProcessBackend:
    """Starts the learner processes, sends them commands and waits, bounded, for their replies.

    Args:
        learner_bytes: The cloudpickled Learner every process starts from.
        num_learners: The number of processes (ranks).
        accelerator: Lightning's accelerator for the processes.
        num_threads: torch intra-op threads per process.
        timeout_s: The longest wait for one request's replies.
        start_timeout_s: The longest wait for the processes to start and join the process group.
        strategy: ``"ddp"`` or ``"fsdp2"`` (the learners shard their modules).
        ddp_kwargs: Extra ``DDPStrategy`` arguments (``"ddp"`` only).
    """

    def __init__(
        self,
        learner_bytes: bytes,
        *,
        num_learners: int,
        accelerator: str,
        num_threads: int,
        timeout_s: float,
        start_timeout_s: float,
        strategy: str,
        ddp_kwargs: dict[str, Any],
    ) -> None:
        self._n = num_learners
        self._timeout_s = timeout_s
        self._broken: str | None = None
        self._next_id = 1  # request 0 is the start-up
        self._what: dict[int, tuple[str, str]] = {0: (START, "the start-up")}  # id -> (kind, description)
        self._received: dict[int, dict[int, tuple[str, Any]]] = {}
        self._fatal: dict[int, tuple[int, str]] = {}  # rank -> (request id, traceback), in order of arrival
        # request id -> the shared-memory blocks of an update's batch, unlinked once every rank answered.
        self._shared: dict[int, SharedShards] = {}
        self._warned_no_room = False
        # Learners are forked from multiprocessing's fork server, which imports torch, Lightning and
        # the learner's code once (when it starts, with the first group or sampler pool of this
        # process), instead of once per learner as a spawned process would (~10 s each on a 2-core
        # machine). The server has not touched CUDA, so a learner may still use its GPU.
        context = mp.get_context("forkserver")
        context.set_forkserver_preload([learner_process_main.__module__])
        self._replies = context.Queue()
        self._commands = [context.Queue() for _ in range(num_learners)]
        # (driver end, learner end) of each rank's status-probe pipe.
        probe_pipes = [context.Pipe() for _ in range(num_learners)]
        self._probes = [driver_end for driver_end, _ in probe_pipes]
        port = free_local_port()
        self._processes = [
            context.Process(
                target=learner_process_main,
                args=(
                    rank, num_learners, port, learner_bytes, self._commands[rank], self._replies, probe_pipes[rank][1]
                ),
                kwargs={
                    # The driver's environment now, not the fork server's (of when it started).
                    "environment": dict(os.environ),
                    "accelerator": accelerator,
                    "num_threads": num_threads,
                    "timeout_s": timeout_s,
                    "strategy": strategy,
                    "ddp_kwargs": ddp_kwargs,
                },
                name=f"LearnerGroup-rank{rank}",
                daemon=True,
            )
            for rank in range(num_learners)
        ]
        try:
            with main_script_not_rerun():  # the Learner travels by value: the children need nothing from it
                for process in self._processes:
                    process.start()
        except BaseException:
            self._broken = "it failed to start its learner processes"
            self.kill()
            raise
        finally:
            # The learners hold their ends now; closing ours lets a probe see a dead learner.
            for _, learner_end in probe_pipes:
                learner_end.close()
        self.wait(0, timeout_s=start_timeout_s)
        self.reads_shared_memory = self._learners_open_shared_memory()

    def _learners_open_shared_memory(self) -> bool:
        """Whether every learner can open a file of this process's torch shared memory (``/proc/<pid>/fd/<fd>``).

        Asked once, at start, of a one-byte tensor; where some learner cannot (a hardened
        ``/proc``, a sandbox), the caller's shared tensors are copied like private ones, with a
        warning, instead of failing every update. ``False`` also where torch does not share by file
        descriptor (nothing to open, and nothing would be read in place).
        """
        probe = torch.zeros(1, dtype=torch.uint8).share_memory_()
        memory = caller_shared_memory(probe)
        if not memory:
            return False
        if all(self.call("foreach_learner", {"func": can_open, "kwargs": {"path": memory[0].path}})):
            return True
        warnings.warn(
            "LearnerGroup: the learner processes cannot open this process's shared-memory files "
            f"({memory[0].path}), so a batch already in shared memory is copied to them like any other "
            "(about 2x the batch per update)",
            stacklevel=4,
        )
        return False

    @property
    def pids(self) -> list[int]:
        """The learner processes' ids, by rank."""
        return [process.pid for process in self._processes]

    # -- requests --------------------------------------------------------------------------

    def prepare_update(self, kind: str, data: Any) -> PreparedUpdate:
        """One shard of the data per rank (checked here, before anything is sent); episodes as nested dicts of arrays."""
        if kind == "update_from_episodes":
            return PreparedUpdate([episodes_to_wire(shard) for shard in split_episodes(data, self._n)], [])
        caller_memory = caller_shared_memory(data) if self.reads_shared_memory else []
        return PreparedUpdate(split_batch(data, self._n), caller_memory)

    def run_update(self, kind: str, update: PreparedUpdate, settings: dict[str, Any], return_state: bool) -> Any:
        """Train every rank on its shard and wait: rank 0's results, or ``(results, weights)``."""
        return self.wait(self._submit_update(kind, update, settings, return_state))

    def submit_update(self, kind: str, update: PreparedUpdate, settings: dict[str, Any], return_state: bool) -> Request:
        """Send the update and return its handle without waiting."""
        return Request(self, self._submit_update(kind, update, settings, return_state))

    def call(self, kind: str, args: dict[str, Any]) -> Any:
        """Run a non-update command on every rank and wait (``foreach_learner``: all ranks' results)."""
        payload = dumps_by_value(args, f"the arguments of {kind}")  # the same for every rank: pickled once
        return self.wait(self._send(kind, [payload] * self._n))

    def _submit_update(self, kind: str, update: PreparedUpdate, settings: dict[str, Any], return_state: bool) -> int:
        # A batch's arrays, and the episodes' (``episodes_to_wire``), travel in shared memory
        # (the caller's own, or written once; mapped by the learners), not pickled into the queue;
        # data that /dev/shm has no room for is pickled (writing past its size would be a SIGBUS).
        shards = update.shards
        in_shared_memory = SharedShards.fits(shards, update.caller_memory)
        if not in_shared_memory and not self._warned_no_room:
            self._warned_no_room = True
            warnings.warn(
                "LearnerGroup: shared memory (/dev/shm) has no room for this batch (or these episodes), or none was found, so it is pickled to the learners (about 2x "
                "more memory per update); give the machine or container more shared memory (e.g. docker run "
                "--shm-size)",
                stacklevel=4,
            )
        shared = SharedShards(shards, update.caller_memory) if in_shared_memory else SharedShards([])
        try:
            payloads = [
                dumps_data({"data": shard, "settings": settings, "return_state": return_state}, f"the data of {kind}")
                for shard in (shared.shards if in_shared_memory else shards)
            ]
            return self._send(kind, payloads, shared)
        except BaseException:
            shared.release()
            raise

    def _send(self, kind: str, payloads: list[bytes], shared: SharedShards | None = None) -> int:
        request_id = self._next_id
        if shared is not None and (shared.blocks or shared.caller_memory):
            self._shared[request_id] = shared
        self._next_id += 1
        self._what[request_id] = (kind, f"{kind} (request {request_id})")
        for command_queue, payload in zip(self._commands, payloads):
            command_queue.put((request_id, kind, payload))
        return request_id

    def done(self, request_id: int) -> bool:
        """Whether every rank has answered ``request_id``."""
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

    def wait(self, request_id: int, timeout_s: float | None = None) -> Any:
        """Wait (``timeout_s``, default the group's) for every rank's reply to ``request_id``; the combined answer."""
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
                raise self._break(_timeout_message(what, timeout_s, self._probe(missing)))
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

    def _probe(self, ranks: list[int]) -> dict[int, Activity | None]:
        """Ask ``ranks`` what their main threads are doing; ``None`` for a rank that does not say in time."""
        asked = []
        for rank in ranks:
            try:
                self._probes[rank].send(None)
                asked.append(rank)
            except OSError:  # the process is gone
                pass
        end = time.monotonic() + _PROBE_S
        answers: dict[int, Activity | None] = dict.fromkeys(ranks)
        for rank in asked:
            try:
                if self._probes[rank].poll(max(0.0, end - time.monotonic())):
                    answers[rank] = Activity(*self._probes[rank].recv())
            except (EOFError, OSError):
                pass
        return answers

    def _record(self, message: tuple[int, int, str, Any]) -> None:
        rank, request_id, status, payload = message
        if status == FATAL:
            self._fatal.setdefault(rank, (request_id, payload))
        else:
            self._received.setdefault(request_id, {})[rank] = (status, payload)
            if self.done(request_id):
                self._release(request_id)

    def _release(self, request_id: int | None = None) -> None:
        """Unlink the shared-memory blocks of update ``request_id`` (default: of every update)."""
        for rid in list(self._shared) if request_id is None else [request_id]:
            shared = self._shared.pop(rid, None)
            if shared is not None:
                shared.release()

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
        """Rank 0's answer (all ranks' for ``foreach_learner``), or the error the ranks agree on."""
        if all(status == OK for status, _ in replies.values()):
            if kind == "foreach_learner":
                return [pickle.loads(replies[rank][1]) for rank in range(self._n)]
            payload = replies[0][1]
            return None if payload is None else pickle.loads(payload)
        errors = {rank: pickle.loads(reply) for rank, (status, reply) in sorted(replies.items()) if status == ERROR}
        succeeded = sorted(rank for rank, (status, _) in replies.items() if status == OK)
        detail = "; ".join(f"rank {rank}: {type(error).__name__}: {error}" for rank, (error, _) in errors.items())
        if succeeded:
            raise self._break(
                f"{what} succeeded on learner rank(s) {succeeded} but failed on rank(s) {sorted(errors)}, so the "
                f"learners no longer hold the same state ({detail})"
            )
        if not errors:
            raise self._break(f"{what}: every learner rank reports another rank's rejection, but none says why")
        first_error, first_traceback = next(iter(errors.values()))
        if kind in UPDATE_KINDS:
            message = f"{what} was rejected by learner rank(s) {sorted(errors)}; no learner trained on it ({detail})"
        else:
            message = f"{what} failed on learner rank(s) {sorted(errors)} ({detail})"
        raise like(first_error, message) from RemoteTraceback(first_traceback)

    # -- failure and shutdown ----------------------------------------------------------------

    def check_not_broken(self) -> None:
        """Raise ``LearnerGroupError`` if a failure or a shutdown has stopped the processes."""
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
        self._release()  # the learners are gone (or never read them): no block outlives the group
        self._close_queues()

    def shutdown(self) -> None:
        """Ask every learner to finish (its ``fit`` returns), wait a bounded time, kill what remains."""
        if self._broken is None:
            request_id = self._send(SHUTDOWN, [dumps_data({}, SHUTDOWN)] * self._n)
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
        for probe in self._probes:
            probe.close()


class Request:
    """The handle of one async update sent to the learner processes."""

    def __init__(self, backend: ProcessBackend, request_id: int) -> None:
        self._backend = backend
        self._id = request_id

    def done(self) -> bool:
        """Whether every rank has answered."""
        return self._backend.done(self._id)

    def result(self) -> Any:
        """Wait (bounded) for the update; its results, or raise what it raised."""
        return self._backend.wait(self._id)


def _timeout_message(what: str, timeout_s: float, activities: dict[int, Activity | None]) -> str:
    """Name the ranks that did not answer ``what`` in time: those that hang first, then those that wait for them."""
    waiting = {rank: a for rank, a in activities.items() if a is not None and a.waiting_for_ranks}
    hung = {rank: a for rank, a in activities.items() if rank not in waiting}
    advice = "; raise timeout_s if the work needs longer"
    if not hung:
        places = "; ".join(f"rank {rank} in {a.where}" for rank, a in waiting.items())
        return (
            f"learner rank(s) {sorted(waiting)} did not answer {what} within {timeout_s:g} s, every one of them "
            f"waiting in a collective for the others (do the ranks call different collectives?): {places}{advice}"
        )
    places = "; ".join(
        f"rank {rank} is in {a.where}" if a is not None else f"rank {rank} does not answer a status probe either"
        for rank, a in hung.items()
    )
    message = f"learner rank(s) {sorted(hung)} did not answer {what} within {timeout_s:g} s: {places}"
    if waiting:
        places = "; ".join(f"rank {rank} in {a.where}" for rank, a in waiting.items())
        message += f". Rank(s) {sorted(waiting)} wait for them in a collective: {places}"
    return message + advice


def pickle_learner(learner: Learner, num_learners: int) -> bytes:
    """The learner, cloudpickled for its processes; on failure, the error names what cannot travel."""
    try:
        return dumps_by_value(learner, f"the learner ({type(learner).__name__})")
    except ValueError as error:
        culprits = ", ".join(_unpicklable_attributes(learner)) or "an object it holds"
        raise ValueError(
            f"LearnerGroup(num_learners={num_learners}) sends the learner to its processes by pickling it "
            f"(cloudpickle), but {culprits} cannot be pickled ({error.__cause__}); pass policies_to_train as a "
            "list of module ids or a function, and keep locks, open files and sockets out of the Learner"
        ) from error


def _unpicklable_attributes(learner: Learner) -> list[str]:
    """``"name value"`` for each of the learner's attributes that cannot be pickled."""
    found = []
    for name, value in vars(learner).items():
        try:
            dumps_by_value(value, name)
        except ValueError:
            found.append(f"its {_ATTRIBUTE_NAMES.get(name, name)} {value!r}")
    return found
