"""A callback for ``tests/test_ddp_fit.py`` and ``tests/test_tune.py``: prints each rank's
torch thread count when its fit starts."""

from __future__ import annotations

import os

import torch
from lightning.pytorch import Callback


class PrintThreads(Callback):
    def on_fit_start(self, trainer, pl_module) -> None:
        print(f"RANK {trainer.global_rank} THREADS {torch.get_num_threads()} OMP {os.environ.get('OMP_NUM_THREADS')}", flush=True)
