"""``EnvStepProgressBar``: Lightning's tqdm progress bar, with the env steps sampled so far.

``lightning-rl fit`` uses it unless the config adds a progress bar of its own or sets
``enable_progress_bar: false``. Lightning's own choice, once ``rich`` is installed (the test
extras install it), is ``RichProgressBar``, which reads ``Epoch 1/-2`` for an RL run's
``max_epochs: -1`` (the run ends at the data module's ``max_env_steps``, not at an epoch
count). The tqdm bar names the epoch without a total, counts the epoch's train items, and
shows the Learner's step count (``num_env_steps_sampled_lifetime``, over all ranks) under the
name its data module gives it (``DataOffer.step_name``): ``env_steps`` for a run that samples
envs, ``dataset_rows`` for an offline one. It is the count the run's budget, x-axis and
checkpoint names are in.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar

from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.core.data_contract import data_offer_of
from lightning_rl.learner.learner import Learner

# The progress bar's name for the step count when the data module gives it none.
ENV_STEPS_KEY = "env_steps"


class EnvStepProgressBar(TQDMProgressBar):
    """Lightning's ``TQDMProgressBar``, whose figures also show the env steps sampled so far."""

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        """Lightning's progress bar figures, with the step count (``env_steps``, ``dataset_rows``) once there is one.

        Args:
            trainer: The running Trainer.
            pl_module: The module being trained; only a ``Learner`` counts env steps.

        Returns:
            The figures the bar shows after its description and counts.
        """
        metrics = super().get_metrics(trainer, pl_module)
        env_steps = pl_module.timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME) if isinstance(pl_module, Learner) else None
        if env_steps is not None:
            offer = data_offer_of(getattr(trainer, "datamodule", None))
            metrics[(offer and offer.step_name) or ENV_STEPS_KEY] = int(env_steps)
        return metrics
