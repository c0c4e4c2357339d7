"""Run a test function on several CPU ranks at once, as ``torchrun`` would start them.

Each rank is a fresh (spawned) process with the environment variables Lightning reads for
processes it did not launch itself (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``,
``NODE_RANK``, ``LOCAL_RANK``), one intra-op thread, and a bounded wait: a rank that hangs
fails the test instead of hanging CI.
"""

from __future__ import annotations

import os
import pickle
import queue
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from lightning_rl.learner.group.learner_group import free_local_port


def run_on_ranks(fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout: float = 180.0) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return the results by rank.

    ``fn`` must be a module-level function, and its result picklable (numpy, not tensors:
    a tensor's shared memory dies with the process that made it).

    Raises:
        AssertionError: naming the rank, if a rank raised, died, or did not finish within ``timeout`` seconds.
    """
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_local_port()
    processes = [
        context.Process(target=_rank_main, args=(fn, rank, world_size, port, args, results, timeout), daemon=True)
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    by_rank: dict[int, Any] = {}
    try:
        while len(by_rank) < world_size:
            try:
                rank, ok, payload = results.get(timeout=timeout)
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(processes) if r not in by_rank and not p.is_alive()]
                raise AssertionError(
                    f"ranks did not finish within {timeout} s (exited without a result: {dead})"
                ) from None
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{payload}")
            by_rank[rank] = pickle.loads(payload)
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    return [by_rank[rank] for rank in range(world_size)]


def _rank_main(
    fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple, results: Any, timeout: float
) -> None:
    import faulthandler

    import torch

    # A rank still running shortly before the test gives up prints where it is stuck.
    faulthandler.dump_traceback_later(max(timeout - 5, 1), exit=False)
    torch.set_num_threads(1)
    from lightning_rl.learner.group.learner_group import local_rank_environment

    os.environ.update(local_rank_environment(rank, world_size, port, num_threads=1))
    try:
        results.put((rank, True, pickle.dumps(fn(rank, world_size, *args))))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
