"""Generic Lightning callbacks that hook into a Learner's updates.

Algorithm-specific callbacks live with their algorithm (``KLCoeffAdaptation`` in
``lightning_rl.algorithms.ppo``); the ``LearnerCallback`` base class lives with the Learner.
"""

from lightning_rl.callbacks.target_network import TargetNetworkUpdate

__all__ = ["TargetNetworkUpdate"]
