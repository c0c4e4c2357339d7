"""Minari, the optional package behind offline datasets: imported on first use, with an error that says how to install it."""

from __future__ import annotations

import importlib
from types import ModuleType

#: The pip extra that installs Minari with its HDF5 backend.
OFFLINE_EXTRA = "lightning-rl[offline]"


def require_minari() -> ModuleType:
    """The ``minari`` module.

    Raises:
        ImportError: If Minari (or h5py, its HDF5 backend) is not installed, naming the extra
            that installs both.
    """
    try:
        minari = importlib.import_module("minari")
        importlib.import_module("h5py")
    except ImportError as error:
        raise ImportError(
            f"offline datasets need Minari with its HDF5 backend ({error.name} is missing): "
            f'pip install "{OFFLINE_EXTRA}"'
        ) from error
    return minari
