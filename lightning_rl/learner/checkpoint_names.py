"""Checkpoint file names that say what their step count counts.

Lightning names a ``ModelCheckpoint`` file ``epoch={epoch}-step={step}.ckpt``, ``step`` being
the value logged as ``"step"`` (the Learner logs its ``num_env_steps_sampled_lifetime`` under
that name, the loggers' x-axis; see ``lightning_hooks``), else Lightning's ``global_step``
(optimizer steps). "step" then means env steps for an env-sampling run and dataset rows for an
offline one (``step=256000`` after 1,000 gradient steps of 256 rows). A data module says what
its count counts (``DataOffer.step_name``), and ``Learner.setup`` renames the files of every
``ModelCheckpoint`` that has no ``filename`` of its own after it::

    epoch=3-env_steps=20480.ckpt      # OnPolicyDataModule, OffPolicyDataModule, MultiAgentDataModule
    epoch=0-dataset_rows=256000.ckpt  # OfflineDataModule

The number is the same count as before (the x-axis value), only its name changes; ``last.ckpt``
and a ``filename`` the user set are left as they are, and nothing parses the names (a resumed fit
reads whatever path it is given, old ``step=`` names included).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from lightning.pytorch.callbacks import ModelCheckpoint

# The key Lightning's ModelCheckpoint reads the logged step count from (lightning_hooks.STEP_KEY).
_STEP = "step"
# A filename this module wrote: renamed again if a later fit's data counts something else.
_OURS = re.compile(r"epoch=\{epoch\}-\w+=\{step\}")


def checkpoint_filename(step_name: str) -> str:
    """The ``ModelCheckpoint.filename`` template ``epoch={epoch}-{step_name}={step}`` (with ``auto_insert_metric_name=False``).

    Args:
        step_name: What the step count counts (``DataOffer.step_name``), e.g. ``"env_steps"``.
    """
    equals, join = ModelCheckpoint.CHECKPOINT_EQUALS_CHAR, ModelCheckpoint.CHECKPOINT_JOIN_CHAR
    return f"epoch{equals}{{epoch}}{join}{step_name}{equals}{{{_STEP}}}"


def name_checkpoint_files(callbacks: Iterable[object], step_name: str | None) -> None:
    """Name the files of each ``ModelCheckpoint`` in ``callbacks`` without a ``filename`` after ``step_name``.

    Args:
        callbacks: The Trainer's callbacks (``trainer.checkpoint_callbacks``).
        step_name: What the logged step counts (``DataOffer.step_name``); ``None`` leaves
            Lightning's ``epoch=...-step=...`` names.
    """
    if step_name is None:
        return
    for callback in callbacks:
        if not isinstance(callback, ModelCheckpoint):
            continue
        if callback.filename is None or (not callback.auto_insert_metric_name and _OURS.fullmatch(callback.filename)):
            callback.filename = checkpoint_filename(step_name)
            callback.auto_insert_metric_name = False
