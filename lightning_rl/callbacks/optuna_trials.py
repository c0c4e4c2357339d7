"""The Optuna plumbing that ``lightning-rl tune`` and its pruning callback share, without Lightning.

Optuna is an optional extra (``pip install 'lightning-rl[tune]'``): ``require_optuna`` imports
it when first needed and says how to install it. ``lightning-rl tune`` runs its study in a
process that never imports torch or Lightning, so this module imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

#: The metric a trial is judged by, unless told otherwise.
DEFAULT_MONITOR = "eval/episode_return_mean"
#: The pruners ``lightning-rl tune`` offers, by the name a tune file gives them.
PRUNER_NAMES = ("median", "successive_halving", "none")
#: The user attribute a pruned trial is marked with: the env step of the evaluation that pruned it.
PRUNED_AT_ATTR = "pruned_at_env_step"
INSTALL_HINT = "pip install 'lightning-rl[tune]'"


def require_optuna() -> Any:
    """Import and return ``optuna``; a one-line ``ImportError`` naming the extra when it is missing."""
    try:
        import optuna
    except ImportError as error:
        raise ImportError(f"hyperparameter tuning needs Optuna: {INSTALL_HINT}") from error
    return optuna


def make_pruner(name: str, pruner_args: Mapping[str, Any] | None = None) -> optuna.pruners.BasePruner:
    """The Optuna pruner called ``name`` (one of ``PRUNER_NAMES``).

    Args:
        name: ``"median"`` (``MedianPruner``), ``"successive_halving"``
            (``SuccessiveHalvingPruner``) or ``"none"`` (``NopPruner``).
        pruner_args: Keyword arguments of that pruner, e.g. ``{"n_warmup_steps": 10000}``
            (its steps are env steps).

    Raises:
        ValueError: For an unknown name, or arguments the pruner does not take.
    """
    optuna = require_optuna()
    classes = {
        "median": optuna.pruners.MedianPruner,
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
        "none": optuna.pruners.NopPruner,
    }
    if name not in classes:
        raise ValueError(f"pruner: expected one of {', '.join(PRUNER_NAMES)}, got {name!r}")
    try:
        return classes[name](**dict(pruner_args or {}))
    except TypeError as error:
        raise ValueError(f"pruner_args of the {name} pruner: {error}") from error



def open_storage(url: str) -> optuna.storages.RDBStorage:
    """The RDB storage at ``url``, waiting up to a minute for SQLite's lock (trials write to it at once)."""
    optuna = require_optuna()
    return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})


def load_running_trial(
    storage_url: str, study_name: str, trial_number: int, pruner: optuna.pruners.BasePruner
) -> optuna.trial.Trial:
    """The running trial ``trial_number`` of the study ``study_name``, judged by ``pruner``.

    Raises:
        ValueError: If there is no such study or trial, or the trial is not running.
    """
    optuna = require_optuna()
    storage = open_storage(storage_url)
    try:
        study = optuna.load_study(study_name=study_name, storage=storage, pruner=pruner)
        trial_id = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study_name), trial_number)
    except KeyError as error:
        raise ValueError(f"{storage_url}: no study {study_name!r} with a trial {trial_number}") from error
    state = storage.get_trial(trial_id).state
    if state != optuna.trial.TrialState.RUNNING:
        raise ValueError(f"{storage_url}: trial {trial_number} of {study_name!r} is {state.name}, not running")
    return optuna.trial.Trial(study, trial_id)
