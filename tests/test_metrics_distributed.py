"""The MetricsLogger reduces across ranks: two gloo processes on this machine agree."""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_rl import MetricsLogger


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, results: dict) -> None:
    torch.set_num_threads(1)
    # A bounded timeout: a broken collective fails the test instead of hanging CI.
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    try:
        metrics = MetricsLogger()
        # Rank 0 logs 1 and 2, rank 1 logs 6: the mean over all values is 3.
        for value in ([1.0, 2.0] if rank == 0 else [6.0]):
            metrics.log_value(("p", "loss"), torch.tensor(value))
        metrics.log_value("steps", 10 * (rank + 1), reduce="sum", clear_on_reduce=False)
        first = metrics.reduce()
        saved = metrics.get_state()
        restored = MetricsLogger()
        restored.set_state(saved)
        restored.log_value("steps", 1, reduce="sum", clear_on_reduce=False)
        results[rank] = (first, saved, restored.reduce())
    finally:
        dist.destroy_process_group()


def test_reduce_and_state_agree_across_two_ranks():
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank_main, args=(2, _free_port(), results), nprocs=2, join=True)
        results = dict(results)
    for rank in (0, 1):
        first, saved, after_restore = results[rank]
        assert first == {"p": {"loss": 3.0}, "steps": 30.0}
        assert saved == {"steps": {"reduce": "sum", "value": 30.0}}
        # The restored total stays 30 over both ranks (not 60), plus one step per rank.
        assert after_restore == {"steps": 32.0}
