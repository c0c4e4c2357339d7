"""lightning_rl: RLlib's Learner API on PyTorch Lightning."""

from lightning_rl.core.columns import ALL_MODULES, DEFAULT_MODULE_ID, Columns
from lightning_rl.core.metrics import MetricsLogger
from lightning_rl.core.module_checks import ModelConfigKey
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.rl_modules import MultiRLModule, RLModule
from lightning_rl.core.schedules import Schedule
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.learner.callback import LearnerCallback
from lightning_rl.learner.checkpoint_io import AtomicCheckpointIO
from lightning_rl.learner.learner import DEFAULT_OPTIMIZER, Learner, LearnerConfig
from lightning_rl.learner.learner_group import LearnerGroup, LearnerGroupError
from lightning_rl.policy.policy import Policy

__all__ = [
    "ALL_MODULES",
    "AtomicCheckpointIO",
    "DEFAULT_MODULE_ID",
    "DEFAULT_OPTIMIZER",
    "Columns",
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
