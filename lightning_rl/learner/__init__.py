"""The Learner, the LearnerGroup and the callback hooks fired around every update."""

from lightning_rl.learner.callback import LearnerCallback
from lightning_rl.learner.learner import DEFAULT_OPTIMIZER, Learner, LearnerConfig
from lightning_rl.learner.learner_group import LearnerGroup, LearnerGroupError

__all__ = ["DEFAULT_OPTIMIZER", "Learner", "LearnerCallback", "LearnerConfig", "LearnerGroup", "LearnerGroupError"]
