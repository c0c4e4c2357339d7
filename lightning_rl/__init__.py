"""lightning_rl: RLlib's Learner API on PyTorch Lightning.

The public names below are imported on first use (PEP 562), not with the package: importing
them pulls in torch and Lightning (seconds), and the ``lightning-rl`` command must answer
``--help`` without them. ``from lightning_rl import Learner`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the module that defines it.
_PUBLIC = {
    "ALL_MODULES": "lightning_rl.core.columns",
    "DEFAULT_MODULE_ID": "lightning_rl.core.columns",
    "Columns": "lightning_rl.core.columns",
    "MetricsLogger": "lightning_rl.core.metrics",
    "ModelConfigKey": "lightning_rl.core.module_checks",
    "MultiRLModuleSpec": "lightning_rl.core.rl_module_specs",
    "RLModuleSpec": "lightning_rl.core.rl_module_specs",
    "MultiRLModule": "lightning_rl.core.rl_modules",
    "RLModule": "lightning_rl.core.rl_modules",
    "Schedule": "lightning_rl.core.schedules",
    "TrainingData": "lightning_rl.core.train_item",
    "TrainItem": "lightning_rl.core.train_item",
    "LearnerCallback": "lightning_rl.learner.callback",
    "AtomicCheckpointIO": "lightning_rl.learner.checkpoint_io",
    "DEFAULT_OPTIMIZER": "lightning_rl.learner.optimizers",
    "Learner": "lightning_rl.learner.learner",
    "LearnerConfig": "lightning_rl.core.learner_config",
    "LearnerGroup": "lightning_rl.learner.group.learner_group",
    "LearnerGroupError": "lightning_rl.learner.group.learner_group",
    "FSDP2Strategy": "lightning_rl.learner.sharding",
    "Policy": "lightning_rl.policy.policy",
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports these
    from lightning_rl.core.columns import ALL_MODULES, DEFAULT_MODULE_ID, Columns
    from lightning_rl.core.learner_config import LearnerConfig
    from lightning_rl.core.metrics import MetricsLogger
    from lightning_rl.core.module_checks import ModelConfigKey
    from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
    from lightning_rl.core.rl_modules import MultiRLModule, RLModule
    from lightning_rl.core.schedules import Schedule
    from lightning_rl.core.train_item import TrainingData, TrainItem
    from lightning_rl.learner.callback import LearnerCallback
    from lightning_rl.learner.checkpoint_io import AtomicCheckpointIO
    from lightning_rl.learner.group.learner_group import LearnerGroup, LearnerGroupError
    from lightning_rl.learner.learner import Learner
    from lightning_rl.learner.optimizers import DEFAULT_OPTIMIZER
    from lightning_rl.learner.sharding import FSDP2Strategy
    from lightning_rl.policy.policy import Policy

__all__ = [
    "ALL_MODULES",
    "AtomicCheckpointIO",
    "DEFAULT_MODULE_ID",
    "DEFAULT_OPTIMIZER",
    "Columns",
    "FSDP2Strategy",
    "Learner",
    "LearnerCallback",
    "LearnerConfig",
    "LearnerGroup",
    "LearnerGroupError",
    "MetricsLogger",
    "ModelConfigKey",
    "MultiRLModule",
    "MultiRLModuleSpec",
    "Policy",
    "RLModule",
    "RLModuleSpec",
    "Schedule",
    "TrainItem",
    "TrainingData",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import a public name on first access and keep it in the package's namespace."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'lightning_rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    # The package's own Learners and RLModules are loaded with any public name, so that
    # ``Learner.from_checkpoint`` finds their classes in a fresh process (a checkpoint's class
    # name is looked up among loaded classes, never imported).
    importlib.import_module("lightning_rl.algorithms")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
