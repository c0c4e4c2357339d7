"""A callback the GPU lane (tests/test_gpu.py) adds to ``lightning-rl fit`` runs: what a fit ran on.

Added with ``--trainer.callbacks+=_gpu_probe.DeviceProbe`` (tests/ on ``PYTHONPATH``), it writes
to the JSON file ``$LIGHTNING_RL_GPU_PROBE``, at the first train batch's end (weights in place,
one update done) and again at the end of fit: the devices and dtypes of the Learner's parameters
during fit, the strategy and precision, the graphs ``torch.compile`` made, the minibatch shapes
``cuda_graphs=True`` captured, and the scalar metrics at the end.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

PROBE_FILE = "LIGHTNING_RL_GPU_PROBE"


class DeviceProbe(Callback):
    def __init__(self) -> None:
        self.record: dict[str, Any] = {}

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any, **kwargs: Any) -> None:
        if "param_devices" in self.record:
            return
        parameters = list(pl_module.parameters())
        self.record.update(
            param_devices=sorted({parameter.device.type for parameter in parameters}),
            param_dtypes=sorted({str(parameter.dtype) for parameter in parameters}),
            num_parameters=len(parameters),
            root_device=trainer.strategy.root_device.type,
            strategy=type(trainer.strategy).__name__,
            precision=str(trainer.precision),
            cuda_memory_allocated=torch.cuda.memory_allocated() if torch.cuda.is_available() else 0,
        )
        self._write()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        metrics = {}
        for key, value in trainer.callback_metrics.items():
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = float(value)
            if isinstance(value, (int, float)):
                metrics[key] = value if math.isfinite(value) else str(value)  # JSON has no nan/inf
        dynamo = sys.modules.get("torch._dynamo.utils")
        graphs = getattr(getattr(pl_module, "step_runner", None), "cuda_graphs", None)  # Learner(cuda_graphs=True)
        self.record.update(
            metrics=metrics,
            global_step=trainer.global_step,
            compiled_graphs=int(dynamo.counters["stats"]["unique_graphs"]) if dynamo is not None else 0,
            cuda_graphs_captured=graphs.num_captured if graphs is not None else None,
        )
        self._write()

    def _write(self) -> None:
        path = os.environ.get(PROBE_FILE)
        if path:
            with open(path, "w") as file:
                json.dump(self.record, file)
