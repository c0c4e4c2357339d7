"""Every use of Lightning's private API by lightning_rl, one small function each.

Lightning's public API covers nearly all the Learner needs (``self.optimizers()``,
``trainer.strategy.optimizers = ...``, ``trainer.strategy.model``, ``trainer.state``). The
things below have no public equivalent; each function says why. If Lightning renames
or changes one of them, ``tests/test_lightning_private.py`` fails with the name of the
function, so the breakage shows up as one failing test instead of a wrong training run.
"""

from __future__ import annotations

import os
from argparse import Namespace
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import Strategy
from torch import nn


def attached_trainer(module: LightningModule) -> Trainer | None:
    """The Trainer ``module`` is attached to, or ``None`` for a standalone module.

    The public ``LightningModule.trainer`` property raises ``RuntimeError`` when no Trainer
    is attached; the Learner asks this several times per gradient step, standalone too,
    where raising and catching an exception each time would cost more than the question.
    ``_trainer`` is the attribute that property reads.
    """
    return module._trainer


def wrap_model_for_strategy(strategy: Strategy, model: nn.Module) -> nn.Module:
    """Wrap ``model`` the way ``strategy`` wrapped it at setup (DDP: a new ``DistributedDataParallel``).

    DDP fixes the parameters it synchronizes when it is built, so after the Learner adds or
    removes a module mid-fit it must be wrapped again. Lightning builds the wrapper only
    inside ``Strategy.setup``; ``_setup_model`` is the step of it that builds the wrapper
    with the strategy's own settings (device ids, ``find_unused_parameters``, ...).
    """
    return strategy._setup_model(model)


def trainer_writes_logs_now(trainer: Trainer) -> bool:
    """Whether the Trainer writes logged values to its loggers after the current train item.

    Lightning writes every ``log_every_n_steps`` items (and on the last); the step count it
    decides by lives in its fit loop's private progress counters, and the decision itself
    in the logger connector's ``should_update_logs``, which Lightning's own logging reads.
    Should it ever move, this answers ``True``: logging on every item is still right, only slower.
    """
    connector: Any = getattr(trainer, "_logger_connector", None)
    return bool(getattr(connector, "should_update_logs", True))


def write_step_metrics(trainer: Trainer, metrics: Mapping[str, float], step: float | None) -> bool:
    """Hand one train item's metrics to the Trainer's loggers in one call, at ``step``; ``False`` if it cannot.

    ``step=None`` writes at Lightning's own step (and adds ``epoch``), as ``self.log`` would.

    ``self.log`` costs Lightning about 0.2 ms per key on a quiet CPU (each call re-checks the
    hook, builds the key's metadata and moves its stored state to the value's device through
    ``apply_to_collection``, which deep-copies the metadata dataclass), so an item's ~35 keys
    cost ~7 ms: as much as a DQN item's env steps. The values are already plain floats reduced
    over the ranks, so nothing of that machinery is needed; the logger connector's
    ``log_metrics`` is what Lightning calls after the item with what ``self.log`` collected
    (it pops ``"step"`` as the loggers' step, adds no ``epoch``, writes every logger and saves
    it). The values also go where Lightning puts logged values after the item
    (``_callback_metrics`` and ``_logged_metrics``, read by ``trainer.callback_metrics``,
    ``EarlyStopping``, ``ModelCheckpoint``) as float32 tensors, the type ``self.log`` makes of
    a float. Lightning keeps no public way to do either.

    Returns:
        Whether the metrics were handed over; ``False`` (and nothing done) if the connector
        has moved, so the caller logs through ``self.log`` instead.
    """
    connector: Any = getattr(trainer, "_logger_connector", None)
    stores = [getattr(connector, name, None) for name in ("_callback_metrics", "_logged_metrics")]
    if not callable(getattr(connector, "log_metrics", None)) or not all(isinstance(s, dict) for s in stores):
        return False
    keys = list(metrics)
    values = dict(zip(keys, torch.tensor([float(metrics[key]) for key in keys], dtype=torch.float32).unbind()))
    if step is not None:
        # float64: exact env-step counts beyond 2**24, as log_env_step logs them.
        values["step"] = torch.tensor(float(step), dtype=torch.float64)
    for store in stores:
        store.update(values)
    connector.log_metrics(values)
    return True


def claim_version_directory(logger: Logger) -> Path | None:
    """Create the next free ``version_N`` directory of ``logger`` and make the logger use it.

    TensorBoard and CSV loggers pick their version lazily, as one more than the highest
    ``version_N`` directory they find, so two runs started together in one
    ``default_root_dir`` both pick ``version_0`` and write into each other's logs and
    checkpoints. ``os.mkdir`` succeeds for exactly one process, so the run that creates the
    directory owns it. The version is the logger's private ``_version``: its constructor
    argument, which the ``version`` property fills lazily.

    Returns:
        The claimed directory; ``None`` for other loggers and for a version the user chose.
    """
    if not isinstance(logger, (TensorBoardLogger, CSVLogger)) or logger._version is not None:
        return None
    root = Path(logger.root_dir)
    root.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name[len("version_") :]) for p in root.glob("version_*") if p.name[len("version_") :].isdigit()]
    version = max(taken, default=-1) + 1
    while True:
        try:
            os.mkdir(root / f"version_{version}")
        except FileExistsError:
            version += 1
            continue
        logger._version = version
        return root / f"version_{version}"


def write_hparams_summary(
    logger: TensorBoardLogger, params: dict[str, Any] | Namespace, metric_names: Sequence[str]
) -> None:
    """Write ``params`` as TensorBoard's HParams summary into ``logger``'s event file, naming ``metric_names``.

    The HParams dashboard lists a run once its event file holds this summary (the
    hyperparameters and the names of the metrics to show beside them, no values; it reads
    the values from the scalars of those names). ``TensorBoardLogger.log_hyperparams``
    writes it only together with metric values: by default ``hp_metric = -1`` at step 0, a
    placeholder point on that metric's chart. Writing the summary alone needs what it uses
    to flatten and sanitize the parameters (``_convert_params``, ``_flatten_dict``,
    ``_sanitize_params``) and the writer (``_get_file_writer``), all private.

    Args:
        logger: The TensorBoard logger (with ``tensorboard`` installed, not only ``tensorboardX``).
        params: The hyperparameters, nested as ``log_hyperparams`` takes them.
        metric_names: The scalars the dashboard shows for the run.
    """
    from torch.utils.tensorboard.summary import hparams

    flat = logger._sanitize_params(_flatten_dict(_convert_params(params)))
    writer = logger.experiment._get_file_writer()
    for summary in hparams(flat, dict.fromkeys(metric_names, 0.0)):  # the values are not written
        writer.add_summary(summary)


def run_validation_now(trainer: Trainer) -> None:
    """Run the fit's validation loop once, now, from a hook of the fit (``on_train_start``).

    Lightning runs validation only from inside its training epoch loop, at the points it
    schedules; a resumed fit that owes an evaluation has no public way to ask for one. This
    does what the epoch loop does around its own call (``_TrainingEpochLoop.advance``): mark
    the Trainer as validating, run the loop, and restore the training state and the logger
    connector's first-iteration flag.
    """
    connector: Any = trainer._logger_connector
    first_loop_iter = connector._first_loop_iter
    trainer.validating = True
    trainer.fit_loop.epoch_loop.val_loop.run()
    trainer.training = True
    connector._first_loop_iter = first_loop_iter


def resume_skips_the_epochs_evaluation(checkpoint: dict[str, Any]) -> bool:
    """Whether Lightning, resuming from ``checkpoint``, goes on past an epoch's end without evaluating.

    A checkpoint written after an epoch's last train item (before that epoch's evaluation) is
    resumed in one of two ways, decided by the fit loop's progress counters it holds
    (``_TrainingEpochLoop.update_restart_stage``): if the total counters show exactly that one
    item unfinished (``completed == processed - 1``), the loop counts the item as done and
    moves to the next epoch, skipping the evaluation; otherwise (the counters lag further after
    earlier resumes) it repeats the last item and evaluates after it, as usual. Only in the
    first case does the evaluation need running separately; running it in the second would
    run it twice and leave the restarted epoch without train items. The counters' place in the
    checkpoint (``loops/fit_loop/epoch_loop.batch_progress``) is Lightning's private format.
    """
    try:
        total = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]
        return (
            total["started"] == total["ready"]
            and total["processed"] == total["started"]
            and total["completed"] == total["processed"] - 1
        )
    except (KeyError, TypeError):
        return False


# The hooks Lightning dispatches around every backward pass and optimizer step, by the class
# that defines their default (a subclass that overrides one wants its calls).
_STEP_HOOKS: dict[type, tuple[str, ...]] = {
    Callback: ("on_before_backward", "on_after_backward", "on_before_optimizer_step"),
    LightningModule: ("on_before_backward", "on_after_backward", "on_before_optimizer_step", "backward"),
    Strategy: ("backward", "pre_backward", "post_backward", "optimizer_step"),
    Precision: ("pre_backward", "backward", "post_backward", "optimizer_step", "_wrap_closure", "_after_closure"),
}


def step_hooks_have_listeners(trainer: Trainer, module: LightningModule) -> bool:
    """Whether anything acts on Lightning's dispatch around ``manual_backward`` and the optimizer step.

    ``manual_backward`` and ``LightningOptimizer.step`` pass through the strategy and the
    precision plugin, which call ``on_before_backward``, ``on_after_backward`` and
    ``on_before_optimizer_step`` on every callback and on the module: about 0.05 ms per step
    that changes nothing when no one overrides them. Someone listens when a callback or the
    module overrides one of those hooks (or ``LightningModule.backward``), when the strategy
    or precision plugin overrides a step of the dispatch (DDP prepares its gradient
    reduction there, mixed precision scales and unscales), when a profiler records the
    hooks, or when the module runs under Fabric. The private parts read are the precision
    plugin's two closure helpers and the module's ``_fabric``; should Lightning rename one,
    this answers ``True``: the full dispatch is always right, only slower.
    """
    if getattr(module, "_fabric", True) is not None or type(trainer.profiler) is not PassThroughProfiler:
        return True
    owners = [(callback, Callback) for callback in trainer.callbacks]
    owners += [(module, LightningModule), (trainer.strategy, Strategy), (trainer.strategy.precision_plugin, Precision)]
    return any(
        getattr(type(owner), name, None) is not getattr(base, name, _MISSING)
        for owner, base in owners
        for name in _STEP_HOOKS[base]
    )


_MISSING = object()  # a hook the base class lacks matches nothing: the dispatch is kept


def step_without_dispatch(wrapper: LightningOptimizer, step: Callable[[], Any] | None = None) -> None:
    """Step ``wrapper``'s optimizer as ``wrapper.step()`` does when nothing listens to its hooks.

    ``LightningOptimizer.step`` brackets the step with ``_on_before_step`` / ``_on_after_step``,
    which the fit loop sets to count the step in its progress (``trainer.global_step``) and
    to time it in the profiler; these still run. What is left out is the strategy's and
    precision plugin's ``optimizer_step``, which, with the default strategy and plugin, call
    ``optimizer.step`` with a closure that only dispatches ``on_before_optimizer_step``.
    Should Lightning rename the two brackets, this steps through ``wrapper.step()`` (and
    raises if ``step`` replaces the optimizer's own, which would then go uncounted).

    Args:
        wrapper: The Trainer's wrapper of the optimizer.
        step: What takes the step instead of ``optimizer.step()`` (a CUDA graph's replay).
    """
    before, after = getattr(wrapper, "_on_before_step", None), getattr(wrapper, "_on_after_step", None)
    if before is None or after is None:
        if step is not None:
            raise RuntimeError(
                "this Lightning version's LightningOptimizer has no _on_before_step/_on_after_step: a replayed "
                "optimizer step could not be counted in trainer.global_step; run with cuda_graphs=False"
            )
        wrapper.step()
        return
    before()
    (step or wrapper.optimizer.step)()
    after()
