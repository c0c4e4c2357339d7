"""Every use of Lightning's private API by the Learner, one small function each.

Lightning's public API covers nearly all the Learner needs (``self.optimizers()``,
``trainer.strategy.optimizers = ...``, ``trainer.strategy.model``, ``trainer.state``). The
three things below have no public equivalent; each function says why. If Lightning renames
or changes one of them, ``tests/test_lightning_private.py`` fails with the name of the
function, so the breakage shows up as one failing test instead of a wrong training run.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
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
