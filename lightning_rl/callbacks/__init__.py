"""Lightning callbacks that hook into a Learner's updates."""

from lightning_rl.callbacks.kl_coeff import KLCoeffAdaptation
from lightning_rl.callbacks.learner_callback import LearnerCallback

__all__ = ["KLCoeffAdaptation", "LearnerCallback"]
