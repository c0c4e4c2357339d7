"""Lightning callbacks that hook into a Learner's updates."""

from lightning_rl.callbacks.kl_coeff import KLCoeffAdaptation
from lightning_rl.callbacks.learner_callback import LearnerCallback
from lightning_rl.callbacks.target_network import TargetNetworkUpdate

__all__ = ["KLCoeffAdaptation", "LearnerCallback", "TargetNetworkUpdate"]
