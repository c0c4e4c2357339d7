"""``TargetNetworkUpdate``: hard or Polyak target-network updates after gradient steps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.pytorch import Trainer

from lightning_rl.core.arguments import check_int, check_number
from lightning_rl.core.target_network import TargetNetworkAPI, update_target_networks
from lightning_rl.learner.callback import LearnerCallback

if TYPE_CHECKING:
    from lightning_rl.learner.learner import Learner


class TargetNetworkUpdate(LearnerCallback):
    """Update the target networks of every trained module that has them.

    After each Learner update whose gradient steps reach a multiple of ``update_interval``
    (counted by the Learner's lifetime ``weights_seq_no``, so a resumed run keeps the
    phase), every module implementing ``TargetNetworkAPI`` and trained by the Learner moves
    its targets by ``tau``: ``tau=1`` copies the online weights (DQN's hard update every N
    steps), a small ``tau`` with ``update_interval=1`` is the Polyak average after every
    step (SAC). An off-policy Learner takes one gradient step per update, so the interval
    counts steps exactly; an update of several steps that crosses a multiple updates once.

    ``DQNLearner`` and ``SACLearner`` add this callback themselves from their
    ``target_network_update_freq`` and ``tau`` settings.

    Args:
        update_interval: Gradient steps between updates (>= 1).
        tau: The Polyak step size in ``(0, 1]``; 1 for hard copies.
    """

    def __init__(self, update_interval: int = 1, tau: float = 1.0) -> None:
        check_int("update_interval", update_interval)
        check_number("tau", tau, low=0, high=1, low_open=True)
        self.update_interval = update_interval
        self.tau = float(tau)
        self._seq_no_before: int | None = None

    def on_before_gradient_based_update(self, trainer: Trainer, learner: Learner, timesteps: dict[str, Any]) -> None:
        """Remember where the Learner's step count stood before this update."""
        self._seq_no_before = learner.weights_seq_no

    def on_after_gradient_based_update(self, trainer: Trainer, learner: Learner, timesteps: dict[str, Any]) -> None:
        """Update the targets if this update's steps reached a multiple of ``update_interval``."""
        before, now = self._seq_no_before, learner.weights_seq_no
        self._seq_no_before = None
        if before is None or now // self.update_interval <= before // self.update_interval:
            return
        for module_id, module in learner.module.items():
            if isinstance(module, TargetNetworkAPI) and learner.should_module_be_updated(module_id):
                update_target_networks(module, self.tau)
