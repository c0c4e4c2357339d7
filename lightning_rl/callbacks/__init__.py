"""Generic Lightning callbacks that hook into a Learner's updates.

``RecordEpisodes`` writes a fit's training episodes as a Minari dataset.
Algorithm-specific callbacks live with their algorithm (``KLCoeffAdaptation`` in
``lightning_rl.algorithms.ppo``); the ``LearnerCallback`` base class lives with the Learner.
"""

from lightning_rl.callbacks.record_episodes import RecordEpisodes
from lightning_rl.callbacks.self_play import SelfPlayLeague
from lightning_rl.callbacks.target_network import TargetNetworkUpdate

__all__ = ["RecordEpisodes", "SelfPlayLeague", "TargetNetworkUpdate"]
