"""The Learner, the LearnerGroup, the callback hooks fired around every update, and the checkpoint plugin."""

from lightning_rl.core.learner_config import LearnerConfig
from lightning_rl.learner.callback import LearnerCallback
from lightning_rl.learner.checkpoint_io import AtomicCheckpointIO
from lightning_rl.learner.group import LearnerGroup, LearnerGroupError
from lightning_rl.learner.learner import Learner
from lightning_rl.learner.optimizers import DEFAULT_OPTIMIZER
from lightning_rl.learner.sharding import FSDP2Strategy, register_fsdp2_strategy

# Trainer(strategy="fsdp2") and the CLI's --trainer.strategy fsdp2 find it by name.
register_fsdp2_strategy()

__all__ = [
    "DEFAULT_OPTIMIZER",
    "AtomicCheckpointIO",
    "FSDP2Strategy",
    "Learner",
    "LearnerCallback",
    "LearnerConfig",
    "LearnerGroup",
    "LearnerGroupError",
]
