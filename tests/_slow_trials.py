"""A callback for ``tests/test_tune.py``'s ``kill -9`` test: every trial but ``trial_0`` hangs, while asked to.

The first tune command runs with ``HANG_TRIALS_AFTER_THE_FIRST`` set, the second without.

So the trial the test interrupts is surely still running when the tune command is killed (a
tiny trial's fit ends by itself within seconds), and only the kernel's ``PR_SET_PDEATHSIG`` can
end it within the test's wait.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from lightning.pytorch import Callback

HANG_VARIABLE = "HANG_TRIALS_AFTER_THE_FIRST"


class HangAfterTheFirstTrial(Callback):
    def on_fit_start(self, trainer, pl_module) -> None:
        if os.environ.get(HANG_VARIABLE) and Path(trainer.default_root_dir).name != "trial_0":
            time.sleep(600)
