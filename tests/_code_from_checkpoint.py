"""A module a crafted checkpoint names, to prove that loading never imports or calls it.

Importing this module, or calling ``touch_marker``, creates the file named by the
``LIGHTNING_RL_TEST_MARKER`` environment variable. Tests assert the file never appears.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def touch_marker(*args: Any, **kwargs: Any) -> bool:
    if "LIGHTNING_RL_TEST_MARKER" in os.environ:
        Path(os.environ["LIGHTNING_RL_TEST_MARKER"]).touch()
    return True


touch_marker()  # importing is already running code
