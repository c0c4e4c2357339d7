"""Logging a Learner's scalars at the env-step count, and its best evaluation return as ``hp_metric``.

Lightning writes logged values to every logger at a step it picks (the number of optimizer
steps taken), unless a value named ``"step"`` is logged with them: that value is then the
step, for every logger that takes one (TensorBoard, CSV, ...); see
``_LoggerConnector.log_metrics``. The Learner logs ``num_env_steps_sampled_lifetime`` (summed
over all ranks) under that name beside its training and evaluation scalars, so runs with
different ``num_envs``, ``rollout_fragment_length`` or ``train_freq`` share one x-axis, as
CleanRL's ``global_step`` charts do. (Lightning then adds no ``epoch`` value to those rows,
as it does when it picks the step itself.)

``hp_metric`` is the value TensorBoard's HParams dashboard shows for a run
(``TensorBoardLogger`` writes -1 at the start of a fit); the Learner logs the best evaluation
return so far under that name after every evaluation.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule

# The name under which a logged value becomes the loggers' step.
STEP_KEY = "step"
# The scalar TensorBoard's HParams dashboard reads as the run's metric.
HP_METRIC_KEY = "hp_metric"


def log_env_step(module: LightningModule, env_steps: float, *, on_step: bool) -> None:
    """Log ``env_steps`` as the step of the values ``module`` logs in the same hook.

    Args:
        module: The Learner, inside a Lightning hook that may log.
        env_steps: ``num_env_steps_sampled_lifetime`` of what is being logged.
        on_step: ``True`` from ``training_step`` (the values are written after the item),
            ``False`` from evaluation hooks (written at the end of the evaluation epoch).
    """
    # float64: Lightning keeps a logged Python number as float32, exact only up to 2**24
    # (about 16.8M) env steps; a float64 tensor stays float64 up to the loggers.
    # On CUDA the value lives on the device: NCCL reduces device tensors only (sync_dist below).
    # (MPS has no float64; CPU and MPS runs reduce over gloo, on the CPU.)
    device = module.device if module.device.type == "cuda" else torch.device("cpu")
    value = torch.tensor(float(env_steps), dtype=torch.float64, device=device)
    # Every rank holds the same global count: "max" over the epoch's items and the ranks is it.
    module.log(
        STEP_KEY, value, on_step=on_step, on_epoch=not on_step, reduce_fx="max", batch_size=1, sync_dist=not on_step
    )


def best_return(best_so_far: float | None, evaluation_return: Any) -> float | None:
    """The better of ``best_so_far`` and ``evaluation_return``; a NaN return (no episodes) is not counted.

    Args:
        best_so_far: The best return of earlier evaluations, ``None`` before the first.
        evaluation_return: This evaluation's mean return (a number or a one-element tensor).
    """
    value = float(evaluation_return)
    if value != value:  # NaN
        return best_so_far
    return value if best_so_far is None else max(best_so_far, value)
