"""Optuna pruning for an RL fit: report the evaluation return at the env-step count, stop when the pruner says so.

Optuna's own Lightning callback reports at validation end keyed by Lightning's epoch, which
means nothing across RL fits (an epoch's size in env steps is a setting) and cannot be compared
between trials that evaluate at different rates. These callbacks report
``eval/episode_return_mean`` at the Learner's ``num_env_steps_sampled_lifetime`` (summed over
ranks, the x-axis of every logged scalar), so a median or successive-halving pruner compares
trials at equal amounts of experience.

``OptunaPruning`` takes an ``optuna.trial.Trial`` (an objective that runs ``Trainer.fit`` in
its own process); ``StoredTrialPruning`` finds a running trial in a study's storage by number,
which is how ``lightning-rl tune`` hands each trial to an ordinary ``lightning-rl fit``.

Under DDP only global rank 0 talks to Optuna; its decision is broadcast, so every rank stops
after the same evaluation. A pruned fit ends normally (``trainer.should_stop``): raising from
a Lightning hook would tear down a DDP job rank by rank. ``check_pruned()`` raises Optuna's
``TrialPruned`` afterwards, for an objective function to pass on.

Optuna is an optional extra, imported only when a callback is set up (``optuna_trials.require_optuna``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from lightning.pytorch import Callback, LightningModule, Trainer

from lightning_rl.callbacks.optuna_trials import (
    DEFAULT_MONITOR,
    PRUNED_AT_ATTR,
    load_running_trial,
    make_pruner,
    require_optuna,
)
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.learner.learner import Learner

if TYPE_CHECKING:
    import optuna


class OptunaPruning(Callback):
    """Report the evaluation return to an Optuna trial at the env-step count; stop the fit when it is pruned.

    After each evaluation (``on_validation_end``; sanity checks excluded) global rank 0 reports
    ``monitor`` at the Learner's ``num_env_steps_sampled_lifetime`` and asks the study's
    pruner; a pruned fit stops at the end of that epoch, on every rank.

    Args:
        trial: The trial to report to; only global rank 0 uses it (other ranks may pass ``None``).
        monitor: The logged metric to report (``eval/episode_return_mean``).
    """

    def __init__(self, trial: optuna.trial.Trial | None = None, monitor: str = DEFAULT_MONITOR) -> None:
        self.trial = trial
        self.monitor = monitor
        #: The env step of the evaluation that pruned the trial; ``None`` while it is not pruned.
        self.pruned_at: int | None = None

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Lightning's hook: report this evaluation and stop every rank if rank 0's trial is pruned."""
        if trainer.sanity_checking:
            return
        pruned_at = self._report(trainer, pl_module) if trainer.is_global_zero else None
        # Every rank must take the same decision, or the others would wait for rank 0 forever.
        pruned_at = trainer.strategy.broadcast(pruned_at, src=0)
        if pruned_at is not None:
            self.pruned_at = pruned_at
            trainer.should_stop = True

    def check_pruned(self) -> None:
        """Raise Optuna's ``TrialPruned`` if the fit was stopped by the pruner (call it after ``Trainer.fit``)."""
        if self.pruned_at is not None:
            raise require_optuna().TrialPruned(f"pruned at env step {self.pruned_at}")

    def _report(self, trainer: Trainer, pl_module: LightningModule) -> int | None:
        """Report to the trial (rank 0 only); the env step if the trial is now pruned, else ``None``."""
        value = trainer.callback_metrics.get(self.monitor)
        env_steps = _env_steps(pl_module)
        if self.trial is None or value is None or env_steps is None:
            return None
        value = float(value)
        if math.isnan(value):  # an evaluation that finished no episode has nothing to report
            return None
        self.trial.report(value, step=env_steps)
        if not self.trial.should_prune():
            return None
        self._mark_pruned(env_steps)
        return env_steps

    def _mark_pruned(self, env_steps: int) -> None:
        """Called on rank 0 when the trial is pruned at ``env_steps``; a subclass records it where it is read."""


class StoredTrialPruning(OptunaPruning):
    """``OptunaPruning`` for a running trial found by number in a study's storage (what ``lightning-rl tune`` adds).

    Every argument is plain data, so a trial's config file sets it like any other callback.
    Only global rank 0 opens the storage, when the fit is set up. A pruned trial is marked with
    the user attribute ``pruned_at_env_step``; the process that asked for the trial reads it and
    tells the study.

    Args:
        storage: The study's storage URL (``sqlite:///path/to/study.db``).
        study_name: The study's name in that storage.
        trial_number: The trial's number in the study; it must be running (asked for, not told).
        pruner: One of ``median``, ``successive_halving``, ``none``: the study's pruner.
        pruner_args: The pruner's keyword arguments (steps are env steps).
        monitor: The logged metric to report.
    """

    def __init__(
        self,
        storage: str,
        study_name: str,
        trial_number: int,
        pruner: Literal["median", "successive_halving", "none"] = "median",
        pruner_args: dict[str, int | float] | None = None,
        monitor: str = DEFAULT_MONITOR,
    ) -> None:
        super().__init__(None, monitor)
        self.storage = storage
        self.study_name = study_name
        self.trial_number = trial_number
        self.pruner = pruner
        self.pruner_args = dict(pruner_args or {})

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Lightning's hook: on global rank 0, load the trial from the storage."""
        if stage == "fit" and trainer.is_global_zero and self.trial is None:
            self.trial = load_running_trial(
                self.storage, self.study_name, self.trial_number, make_pruner(self.pruner, self.pruner_args)
            )

    def _mark_pruned(self, env_steps: int) -> None:
        if self.trial is not None:
            self.trial.set_user_attr(PRUNED_AT_ATTR, env_steps)


def _env_steps(pl_module: LightningModule) -> int | None:
    """The env steps sampled so far (over all ranks), as the Learner last saw them; ``None`` before any."""
    if not isinstance(pl_module, Learner):
        return None
    env_steps = pl_module.timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME)
    return None if env_steps is None else int(env_steps)
