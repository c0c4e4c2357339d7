"""Generic Lightning callbacks that hook into a Learner's updates.

``RecordEpisodes`` writes a fit's training episodes as a Minari dataset; ``OptunaPruning``
reports evaluations to an Optuna trial at the env-step count (``lightning-rl tune``);
``EnvStepProgressBar`` is the progress bar of ``lightning-rl fit``.
Algorithm-specific callbacks live with their algorithm (``KLCoeffAdaptation`` in
``lightning_rl.algorithms.ppo``); the ``LearnerCallback`` base class lives with the Learner.

The names below are imported on first use (PEP 562), as the package's own are: importing one
callback module (``lightning-rl tune`` reads ``optuna_trials`` without Lightning) does not
import them all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the module that defines it.
_PUBLIC = {
    "EnvStepProgressBar": "lightning_rl.callbacks.progress_bar",
    "OptunaPruning": "lightning_rl.callbacks.pruning",
    "RecordEpisodes": "lightning_rl.callbacks.record_episodes",
    "SelfPlayLeague": "lightning_rl.callbacks.self_play",
    "StoredTrialPruning": "lightning_rl.callbacks.pruning",
    "TargetNetworkUpdate": "lightning_rl.callbacks.target_network",
}

if TYPE_CHECKING:
    from lightning_rl.callbacks.progress_bar import EnvStepProgressBar
    from lightning_rl.callbacks.pruning import OptunaPruning, StoredTrialPruning
    from lightning_rl.callbacks.record_episodes import RecordEpisodes
    from lightning_rl.callbacks.self_play import SelfPlayLeague
    from lightning_rl.callbacks.target_network import TargetNetworkUpdate

__all__ = [
    "EnvStepProgressBar",
    "OptunaPruning",
    "RecordEpisodes",
    "SelfPlayLeague",
    "StoredTrialPruning",
    "TargetNetworkUpdate",
]


def __getattr__(name: str) -> Any:
    """``from lightning_rl.callbacks import RecordEpisodes`` (and the others), imported on first use."""
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'lightning_rl.callbacks' has no attribute {name!r}")
