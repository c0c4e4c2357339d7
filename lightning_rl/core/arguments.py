"""Small checks of plain argument values, shared by every layer that validates its arguments."""

from __future__ import annotations

from typing import Any

import numpy as np


def is_real(value: Any) -> bool:
    """Return whether ``value`` is an int or float (numpy ones included), but not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))
