"""The Learner, the LearnerGroup, the callback hooks fired around every update, and the checkpoint plugin."""

from lightning_rl.learner.callback import LearnerCallback
from lightning_rl.learner.checkpoint_io import AtomicCheckpointIO
from lightning_rl.learner.learner import DEFAULT_OPTIMIZER, Learner, LearnerConfig
from lightning_rl.learner.learner_group import LearnerGroup, LearnerGroupError

__all__ = [
    "DEFAULT_OPTIMIZER",
    "AtomicCheckpointIO",
    "Learner",
    "LearnerCallback",
    "LearnerConfig",
    "LearnerGroup",
    "LearnerGroupError",
]
