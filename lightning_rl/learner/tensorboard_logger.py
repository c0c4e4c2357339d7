"""``HParamsTensorBoardLogger``: Lightning's TensorBoard logger without the ``hp_metric = -1`` point.

Lightning's ``TensorBoardLogger`` (``default_hp_metric=True``, its default) logs
``hp_metric = -1`` at step 0 when a fit starts, so that TensorBoard's HParams dashboard lists
the run with a metric; a Learner logs the real ``hp_metric`` (the best evaluation return) after
each evaluation, and the -1 is a placeholder point at the start of its chart. With
``default_hp_metric=False`` Lightning writes no point, but no HParams summary either, and the
dashboard leaves the run out. This logger writes the summary, naming ``hp_metric``, and no
point. ``lightning-rl fit`` uses it as its default logger.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from lightning_rl.learner._lightning_private import write_hparams_summary
from lightning_rl.learner.lightning_hooks import HP_METRIC_KEY


class HParamsTensorBoardLogger(TensorBoardLogger):
    """Lightning's ``TensorBoardLogger`` whose HParams entry names ``hp_metric`` without logging -1 for it.

    Takes ``TensorBoardLogger``'s arguments but ``default_hp_metric``, which is always off:
    the HParams summary is written here instead.

    Args:
        *args: ``TensorBoardLogger``'s positional arguments (``save_dir``, ``name``, ``version``, ...).
        **kwargs: Its keyword arguments.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, default_hp_metric=False, **kwargs)

    @rank_zero_only
    def log_hyperparams(
        self, params: dict[str, Any] | Namespace, metrics: dict[str, Any] | None = None, step: int | None = None
    ) -> None:
        """Keep ``params`` (for ``hparams.yaml``) and write them as the HParams summary, naming ``hp_metric``.

        Args:
            params: The hyperparameters (the Learner's and data module's, from Lightning).
            metrics: Values to log with them; given, they are logged as Lightning does,
                summary included.
            step: The step of ``metrics``.
        """
        super().log_hyperparams(params, metrics, step)
        if metrics is None:  # Lightning's call at the start of a fit
            write_hparams_summary(self, params, [HP_METRIC_KEY])
