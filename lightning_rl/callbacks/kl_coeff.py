"""``KLCoeffAdaptation``: PPO's adaptive KL penalty coefficient."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.pytorch import Trainer

from lightning_rl.callbacks.learner_callback import LearnerCallback

if TYPE_CHECKING:
    from lightning_rl.algorithms.ppo import PPOLearner


class KLCoeffAdaptation(LearnerCallback):
    """After each update, move every module's KL coefficient towards its ``kl_target``.

    The rule of the PPO paper (and RLlib): if the update's mean KL divergence exceeded twice
    the target, the coefficient grows by half; if it stayed under half the target, the
    coefficient halves. ``PPOLearner(use_kl_loss=True)`` adds this callback itself, to a
    Trainer and to standalone updates alike; the coefficients are part of the Learner's state.

    Args:
        increase: Factor applied when the KL divergence is too large.
        decrease: Factor applied when it is too small.
    """

    def __init__(self, increase: float = 1.5, decrease: float = 0.5) -> None:
        if not (increase >= 1 and 0 < decrease <= 1):
            raise ValueError(f"need increase >= 1 and 0 < decrease <= 1, got increase={increase}, decrease={decrease}")
        self.increase = increase
        self.decrease = decrease

    def on_after_gradient_based_update(self, trainer: Trainer, learner: PPOLearner, timesteps: dict[str, Any]) -> None:
        """Adapt the coefficient of every module that trained with the KL loss in this update."""
        from lightning_rl.algorithms.ppo import CURR_KL_COEFF_KEY, MEAN_KL_KEY

        for module_id in list(learner.module.keys()):
            config = learner.config_for_module(module_id)
            if not config.use_kl_loss:
                continue
            try:
                # The KL over all ranks, so that every data-parallel rank keeps the same coefficient.
                kl = learner.metrics.peek((module_id, MEAN_KL_KEY), across_ranks=True)
            except KeyError:  # the module did not train in this update
                continue
            coeff = learner.curr_kl_coeff(module_id)
            if kl > 2.0 * config.kl_target:
                coeff *= self.increase
            elif kl < 0.5 * config.kl_target:
                coeff *= self.decrease
            learner.set_curr_kl_coeff(module_id, coeff)
            learner.metrics.log_value((module_id, CURR_KL_COEFF_KEY), coeff, reduce="last")
