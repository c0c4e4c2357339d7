"""Minari, the optional package behind offline datasets: imported on first use, with an error that says how to install it."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

#: The pip extra that installs Minari with its HDF5 backend.
OFFLINE_EXTRA = "lightning-rl[offline]"
#: The environment variable that says where Minari keeps local datasets.
DATASETS_PATH_VARIABLE = "MINARI_DATASETS_PATH"


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


def datasets_root() -> Path:
    """The directory Minari keeps local datasets in: ``$MINARI_DATASETS_PATH``, else ``~/.minari/datasets``."""
    root = os.environ.get(DATASETS_PATH_VARIABLE)
    return Path(root) if root else Path.home() / ".minari" / "datasets"
