"""``LearnerCallback``: Lightning callbacks that run around a Learner's gradient updates."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class LearnerCallback(Callback):
    """A Lightning ``Callback`` with two more hooks, fired by the Learner on every update.

    Use them for work that is not a gradient step but must happen in step with them:
    syncing target networks, moving schedules, adapting a KL coefficient. The Learner calls
    them from ``before_gradient_based_update`` / ``after_gradient_based_update`` on every
    ``LearnerCallback`` in ``trainer.callbacks``. A standalone Learner (no Trainer) calls those
    its own ``configure_callbacks()`` returns, with ``trainer=None``.
    """

    def on_before_gradient_based_update(self, trainer: Trainer, learner: LightningModule, timesteps: dict[str, Any]) -> None:
        """Called once per ``update_from_*`` call, before the first minibatch step.

        Args:
            trainer: The Trainer running the Learner, or ``None`` for a standalone Learner.
            learner: The Learner about to update; its modules and optimizers may be changed.
            timesteps: Lifetime counters of the update (``num_env_steps_sampled_lifetime``, ...).
        """

    def on_after_gradient_based_update(self, trainer: Trainer, learner: LightningModule, timesteps: dict[str, Any]) -> None:
        """Called once per ``update_from_*`` call, after the last minibatch step.

        Args:
            trainer: The Trainer running the Learner, or ``None`` for a standalone Learner.
            learner: The Learner that just updated; values it logged in this update can be
                read with ``learner.metrics.peek(...)``.
            timesteps: Lifetime counters of the update.
        """
