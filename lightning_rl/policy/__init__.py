"""Acting with a trained policy, and exporting it: the layer between the command line and the algorithms."""

from lightning_rl.policy.policy import Policy, PolicyNet

__all__ = ["Policy", "PolicyNet"]
