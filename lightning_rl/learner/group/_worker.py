"""Inside a learner process: join the other learners under Lightning's DDP or FSDP2 and run the driver's commands.

Each learner process runs ``Trainer(strategy=...).fit(learner, train_dataloaders=stream)``,
with ``DDPStrategy`` (``"ddp"``) or ``FSDP2Strategy`` (``"fsdp2"``: the Learner's
``configure_model`` shards its modules over the processes), where ``stream`` (a
``CommandStream``) reads the process's command queue. An update command is yielded as a
``TrainItem``, so ``Learner.training_step`` runs it with ``manual_backward`` and the strategy
averages (DDP) or reduce-scatters (FSDP2) the gradients of every minibatch step;
``ReplyCallback.on_train_batch_end`` sends the results back. Other commands run inside the
stream between two train items, on every rank. A shutdown ends the stream, so ``fit`` returns
and the process exits. A daemon thread answers the driver's status probes meanwhile
(``serve_status_probes``), also while the main thread hangs; when the driver is killed, the
probe pipe closes and that thread ends the process within a moment, whatever it was running.

Under FSDP2 whatever reads whole weights (the weights after an update, ``get_weights``,
``get_state``, checkpoints) or runs the modules outside a train step (the Learner connector
on episodes) gathers them from every rank: a collective call. So every rank runs every
command, also when only rank 0's answer is sent back.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import pickle
import queue
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator, Mapping
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import lightning
import torch
from lightning.pytorch import Callback

from lightning_rl.core.processes import adopt_environment, release_fork_server
from lightning_rl.core.sharding import gathered
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.learner.group._episodes import episodes_from_wire
from lightning_rl.learner.group._protocol import (
    ERROR,
    FATAL,
    OK,
    REJECTED,
    SHUTDOWN,
    UPDATE_KINDS,
    Activity,
    error_payload,
    local_rank_environment,
    run_command,
    weights_of,
)
from lightning_rl.learner.group._shared import attach_shared

# Lightning prefetches one item ahead from an iterable without a length (to know which item is
# the last), which would wait for the next command before the current one is answered.
_STREAM_LENGTH = 2**62
#: A learner's exit code when its driver died (its status-probe pipe closed) and it ended itself.
DRIVER_GONE_EXIT_CODE = 75
# Learners' collectives time out this much after the driver stops waiting, so that the
# driver's message (which ranks did not answer) is the one the user sees.
COLLECTIVE_MARGIN_S = 30.0
# Frames under these directories are library code rather than the learner's own; a main
# thread whose innermost library frames include torch.distributed or torch.autograd (where
# DDP all-reduces the gradients) waits for the other ranks.
_LIBRARY_DIRS = tuple(os.path.dirname(module.__file__) + os.sep for module in (torch, lightning))
_COLLECTIVE_DIRS = tuple(
    os.path.join(os.path.dirname(torch.__file__), name) + os.sep for name in ("distributed", "autograd")
)


def learner_process_main(
    rank: int,
    world_size: int,
    port: int,
    learner_bytes: bytes,
    commands: Any,
    replies: Any,
    status_probe: Connection,
    *,
    environment: dict[str, str],
    accelerator: str,
    num_threads: int,
    timeout_s: float,
    strategy: str,
    ddp_kwargs: dict[str, Any],
) -> None:
    """The target of every learner process: train on the commands that arrive until shutdown.

    Args:
        rank: This learner's rank (and device index).
        world_size: The number of learner processes.
        port: The free port rank 0 listens on for the process group's rendezvous.
        learner_bytes: The cloudpickled Learner (built or not).
        commands: This rank's command queue.
        replies: The reply queue all ranks share.
        status_probe: This rank's end of the pipe on which the driver asks what it is doing.
        environment: The driver's ``os.environ`` when it started the group (a forked learner
            would otherwise have the fork server's).
        accelerator: Lightning's accelerator name.
        num_threads: torch intra-op threads for this process.
        timeout_s: The driver's wait per request; collectives wait ``COLLECTIVE_MARGIN_S`` longer.
        strategy: ``"ddp"`` or ``"fsdp2"``.
        ddp_kwargs: Extra ``DDPStrategy`` arguments (``"ddp"`` only).
    """
    adopt_environment(environment)
    release_fork_server()  # a learner starts no processes; the server may end with the driver
    torch.set_num_threads(num_threads)
    os.environ.update(local_rank_environment(rank, world_size, port, num_threads=num_threads))
    serve_status_probes(status_probe)
    stream = CommandStream(rank, commands, replies, sharded=strategy == "fsdp2")
    try:
        learner = pickle.loads(learner_bytes)  # cloudpickle's output loads with pickle
        trainer = _make_trainer(
            stream, world_size, accelerator=accelerator, timeout_s=timeout_s, strategy=strategy, ddp_kwargs=ddp_kwargs
        )
        stream.trainer, stream.learner = trainer, learner
        trainer.fit(learner, train_dataloaders=stream)
        exit_code = 0
    except BaseException:
        replies.put((rank, stream.current_request, FATAL, traceback.format_exc()))
        exit_code = 1
    # Everything this process owes the driver is in the reply queue: deliver it, then exit at
    # once (tearing down torch, gloo and Lightning at interpreter exit takes seconds).
    replies.close()
    replies.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def serve_status_probes(probe: Connection) -> None:
    """Answer each message on ``probe`` with the main thread's :class:`Activity`, from a daemon thread.

    The thread runs while the main thread is blocked in a collective, a sleep or any call
    that releases the GIL, which is when the driver asks (after a timeout).
    """
    main_ident = threading.main_thread().ident

    def answer() -> None:
        while True:
            try:
                probe.recv()
                probe.send(main_thread_activity(main_ident))
            except (EOFError, OSError):
                break
        # The driver's end closed: the driver is gone (killed, or it exited without shutdown();
        # its shutdown() and kill() close the pipes only once the learners ended). Nobody will
        # read what this process computes: end it now, not after its update (minutes, GBs).
        print(f"LearnerGroup learner (pid {os.getpid()}): the driver is gone; exiting", file=sys.stderr, flush=True)
        os._exit(DRIVER_GONE_EXIT_CODE)

    threading.Thread(target=answer, name="LearnerGroup-status", daemon=True).start()


def main_thread_activity(main_ident: int | None) -> Activity:
    """Where the thread ``main_ident`` is, and whether it waits for the other ranks there."""
    frame = sys._current_frames().get(main_ident)
    if frame is None:
        return Activity(waiting_for_ranks=False, where="no Python frame")
    stack = traceback.extract_stack(frame)
    # The library frames the thread is in now (innermost first), up to the code that called them.
    library_calls = []
    for entry in reversed(stack):
        if not entry.filename.startswith(_LIBRARY_DIRS):
            break
        library_calls.append(entry)
    waiting = any(entry.filename.startswith(_COLLECTIVE_DIRS) for entry in library_calls)
    where = _frame_text(stack[-1])
    if library_calls and len(library_calls) < len(stack):
        where += f", called from {_frame_text(stack[-1 - len(library_calls)])}"
    return Activity(waiting_for_ranks=waiting, where=where)


def _frame_text(entry: traceback.FrameSummary) -> str:
    return f"{entry.name} ({entry.filename}:{entry.lineno})"


def _make_trainer(
    stream: CommandStream,
    world_size: int,
    *,
    accelerator: str,
    timeout_s: float,
    strategy: str,
    ddp_kwargs: dict[str, Any],
) -> Any:
    from lightning.pytorch import Trainer
    from lightning.pytorch.plugins.environments import LightningEnvironment

    # One banner per process would be noise; the driver reports what matters.
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    warnings.filterwarnings(
        "ignore", message=".*(validation_step|val_dataloader|does not have many workers|LeafSpec).*"
    )
    return Trainer(
        accelerator=accelerator,
        devices=world_size,
        num_nodes=1,
        # Explicit, so that a SLURM or torchelastic environment around the driver is not
        # mistaken for this group's.
        plugins=[LightningEnvironment()],
        strategy=_strategy(strategy, world_size, timedelta(seconds=timeout_s + COLLECTIVE_MARGIN_S), ddp_kwargs),
        callbacks=[ReplyCallback(stream)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_epochs=1,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        use_distributed_sampler=False,
    )


def _strategy(name: str, world_size: int, timeout: timedelta, ddp_kwargs: dict[str, Any]) -> Any:
    """The Trainer's strategy for ``name`` (``"ddp"`` or ``"fsdp2"``)."""
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_rl.learner.sharding import FSDP2Strategy

    if name == "fsdp2":
        # Also for one learner: it asked for sharded modules, and gets their code paths.
        return FSDP2Strategy(timeout=timeout)
    # One learner has nothing to synchronize: DDP would only add a gradient copy and a
    # one-rank all-reduce to every backward pass.
    return DDPStrategy(timeout=timeout, **ddp_kwargs) if world_size > 1 else "auto"


class CommandStream:
    """The train dataloader of a learner process: yields update commands, runs the others inline.

    Args:
        rank: This learner's rank.
        commands: This rank's command queue.
        replies: The reply queue all ranks share.
        sharded: Whether the learners shard their modules (FSDP2): then reading whole weights
            is a collective call that every rank makes, also where only rank 0 answers.
    """

    def __init__(self, rank: int, commands: Any, replies: Any, *, sharded: bool = False) -> None:
        self.rank = rank
        self.sharded = sharded
        self.commands = commands
        self.replies = replies
        self.trainer: Any = None
        self.learner: Any = None
        self.current_request = 0  # the start-up until the first command
        self.update_request: int | None = None
        self.return_state = False  # whether the update being trained on sends its weights back

    def __len__(self) -> int:
        return _STREAM_LENGTH

    def __iter__(self) -> Iterator[TrainItem]:
        self.reply(0, OK, None)  # set up: modules built (and sharded), process group joined
        while True:
            request_id, kind, payload = self._receive()
            self.current_request = request_id
            if kind == SHUTDOWN:
                self.reply(request_id, OK, None)
                return
            if kind in UPDATE_KINDS:
                item = self._checked_update(request_id, kind, payload)
                if item is not None:
                    self.update_request = request_id
                    yield item  # Learner.training_step runs it; ReplyCallback answers
                # Drop this frame's reference while it waits for the next command: the item holds
                # the batch's tensors (on the driver's shared memory), which would stay mapped.
                item = None
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

    def _checked_update(self, request_id: int, kind: str, payload: bytes) -> TrainItem | None:
        """Check this rank's shard; all ranks agree to train on it, or none does (one collective)."""
        error: Exception | None = None
        item = None
        try:
            args = pickle.loads(payload)
            # The Learner connector may run the modules (GAE's values): sharded ones are gathered
            # on every rank here, also on a rank dealt no episodes, so all make the same collectives.
            with gathered(self.learner.module) if kind == "update_from_episodes" else contextlib.nullcontext():
                item = self._train_item(kind, args)
            self.return_state = bool(args["return_state"])
        except Exception as caught:
            error = caught
        verdict = torch.tensor(0.0 if error is not None else 1.0, device=self.trainer.strategy.root_device)
        verdict = self.trainer.strategy.reduce(verdict, reduce_op="min")
        if float(verdict) < 1.0:
            if error is not None:
                self.reply(request_id, ERROR, error_payload(error))
            else:
                self.reply(request_id, REJECTED, None)
            return None
        return item

    def _train_item(self, kind: str, args: Mapping[str, Any]) -> TrainItem:
        data = attach_shared(args["data"])  # the shard's arrays, mapped from the driver's shared memory
        if not data:
            batch = {}  # fewer rows (or episodes) than learners: this rank still takes part in every step
        elif kind == "update_from_episodes":
            # The connector's batch is checked like any other before anyone trains on it.
            episodes = episodes_from_wire(data)
            batch = self.learner._prepare_batch(self.learner.episodes_to_train_batch(episodes))
        else:
            batch = self.learner._prepare_batch(data)
        settings = dict(args["settings"])
        timesteps = settings.pop("timesteps") or {}
        return TrainItem(TrainingData(batch=batch), timesteps=timesteps, update_settings=settings)

    def _run_inline(self, request_id: int, kind: str, payload: bytes) -> None:
        try:
            result = run_command(self.learner, kind, pickle.loads(payload), rank=self.rank)
            send = self.rank == 0 or kind == "foreach_learner"
            self.reply(request_id, OK, pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL) if send else None)
        except Exception as error:
            self.reply(request_id, ERROR, error_payload(error))

    def reply_update(self, results: Any) -> None:
        """Answer the update just trained on: rank 0 sends the results (and the weights if asked).

        Sharded weights are gathered by every rank (a collective call); rank 0 sends them.
        """
        payload = None
        weights = weights_of(self.learner) if self.return_state and (self.rank == 0 or self.sharded) else None
        if self.rank == 0:
            answer = (results, weights) if self.return_state else results
            payload = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        self.reply(self.update_request, OK, payload)

    def reply(self, request_id: int | None, status: str, payload: Any) -> None:
        """Put one reply on the shared queue."""
        self.replies.put((self.rank, request_id, status, payload))


class ReplyCallback(Callback):
    """Sends each update's results (``training_step``'s output) back to the driver."""

    def __init__(self, stream: CommandStream) -> None:
        self.stream = stream

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Called by Lightning after ``training_step``, once the optimizers have stepped."""
        results = outputs.get("results") if isinstance(outputs, Mapping) else None
        self.stream.reply_update(results)
