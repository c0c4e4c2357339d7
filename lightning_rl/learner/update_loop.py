"""The update loop: epochs of minibatches, one gradient step each, and what they trained.

``run_minibatch_steps`` calls the Learner's one-minibatch step (forward, losses, backward,
clip, optimizer steps) for every minibatch of every epoch and counts the rows trained and
the steps that changed the weights; ``log_steps_trained`` reports those counts with RLlib's
keys once per update. Everything
around the loop (hooks, the data-parallel agreement, the results) is the Learner's ``_update``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Mapping

from lightning_rl.core.batch import MultiModuleBatch, iterate_minibatches, num_rows
from lightning_rl.core.columns import ALL_MODULES
from lightning_rl.core.metrics import MetricsLogger
from lightning_rl.learner.result_keys import (
    MODULE_TRAIN_BATCH_SIZE_MEAN,
    NUM_ENV_STEPS_TRAINED,
    NUM_ENV_STEPS_TRAINED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    NUM_NON_FINITE_UPDATES_SKIPPED,
    WEIGHTS_SEQ_NO,
)


@dataclasses.dataclass
class StepsTrained:
    """What one update trained: rows per module, minibatch steps, env steps (rows of the largest module).

    ``num_steps_applied`` counts the minibatch steps that changed the weights: all of them but
    those whose every optimizer step was skipped for non-finite gradients.
    """

    module_rows: dict[str, int]
    num_steps: int
    env_steps: int
    num_steps_applied: int = 0


def run_minibatch_steps(
    minibatch_step: Callable[[MultiModuleBatch], bool],
    batch: MultiModuleBatch,
    *,
    num_epochs: int,
    minibatch_size: int | None,
    shuffle: bool,
    num_rows_per_pass: int | None,
) -> StepsTrained:
    """Call ``minibatch_step`` on every minibatch of ``num_epochs`` passes over ``batch``.

    Args:
        minibatch_step: One gradient step on one ``{module_id: {column: Tensor}}`` minibatch;
            returns whether it changed the weights.
        batch: The prepared batch; may be ``{}`` on a data-parallel rank without rows, which
            still steps ``num_rows_per_pass`` times in step with the others.
        num_epochs: Passes over the batch.
        minibatch_size: Rows per step; ``None`` for the whole batch.
        shuffle: Whether each pass visits the rows in a new random order.
        num_rows_per_pass: Rows a pass covers when the ranks agreed on it; ``None`` for this batch's own.

    Returns:
        The rows each module trained on, the number of steps (and of those that changed the
        weights) and the env steps trained.
    """
    module_rows: dict[str, int] = defaultdict(int)
    num_steps = num_steps_applied = env_steps = 0
    for minibatch in iterate_minibatches(
        batch,
        num_epochs=num_epochs,
        minibatch_size=minibatch_size,
        shuffle=shuffle,
        num_rows_per_pass=num_rows_per_pass,
    ):
        num_steps_applied += bool(minibatch_step(minibatch))
        rows = {module_id: num_rows(module_batch) for module_id, module_batch in minibatch.items()}
        for module_id, count in rows.items():
            module_rows[module_id] += count
        env_steps += max(rows.values(), default=0)
        num_steps += 1
    return StepsTrained(module_rows, num_steps, env_steps, num_steps_applied)


def log_steps_trained(
    metrics: MetricsLogger, trained: StepsTrained, weights_seq_no: int, timesteps: Mapping[str, float]
) -> None:
    """Log an update's steps trained, per module and over all modules, and the lifetime counters.

    Every trained module also gets a ``num_non_finite_updates_skipped`` of 0 (the skips its
    optimizers logged add to it), so a clean update reports 0 rather than no value, which a
    Trainer's logger would show as the last update's count.

    Args:
        metrics: The Learner's metrics logger.
        trained: What ``run_minibatch_steps`` returned.
        weights_seq_no: The Learner's gradient steps that changed its weights, over its life, after this update.
        timesteps: The last lifetime counters the Learner was given (logged as they are).
    """
    log = metrics.log_value
    num_steps = trained.num_steps
    for module_id, rows in trained.module_rows.items():
        log((module_id, NUM_MODULE_STEPS_TRAINED), rows, reduce="sum", clear_on_reduce=True)
        log((module_id, NUM_MODULE_STEPS_TRAINED_LIFETIME), rows, reduce="sum", clear_on_reduce=False)
        log((module_id, MODULE_TRAIN_BATCH_SIZE_MEAN), rows / max(num_steps, 1), window=math.inf, clear_on_reduce=True)
        log((module_id, WEIGHTS_SEQ_NO), weights_seq_no, window=1, clear_on_reduce=True)
        log((module_id, NUM_NON_FINITE_UPDATES_SKIPPED), 0, reduce="sum", clear_on_reduce=True)
    total_rows = sum(trained.module_rows.values())
    log((ALL_MODULES, NUM_MODULE_STEPS_TRAINED), total_rows, reduce="sum", clear_on_reduce=True)
    log((ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME), total_rows, reduce="sum", clear_on_reduce=False)
    log((ALL_MODULES, NUM_ENV_STEPS_TRAINED), trained.env_steps, reduce="sum", clear_on_reduce=True)
    log((ALL_MODULES, NUM_ENV_STEPS_TRAINED_LIFETIME), trained.env_steps, reduce="sum", clear_on_reduce=False)
    log((ALL_MODULES, WEIGHTS_SEQ_NO), weights_seq_no, window=1, clear_on_reduce=True)
    for key, value in timesteps.items():
        log((ALL_MODULES, key), value, window=1, clear_on_reduce=True)
