"""Minari, the optional package behind offline datasets: imported on first use, with an error that says how to install it."""

from __future__ import annotations

import importlib
import json
import os
import shutil
from pathlib import Path
from types import ModuleType

from lightning_rl.core.checkpoint import writer_is_gone

#: The pip extra that installs Minari with its HDF5 backend.
OFFLINE_EXTRA = "lightning-rl[offline]"
#: The environment variable that says where Minari keeps local datasets.
DATASETS_PATH_VARIABLE = "MINARI_DATASETS_PATH"
# Beside the datasets (dot names are not dataset ids), each followed by its writer's host and pid
# (``writer_tag``): a dataset being written, an old one being replaced, a replacement's journal.
WRITING_PREFIX = ".lightning_rl-writing-"
REPLACED_PREFIX = ".lightning_rl-replaced-"
SWAP_PREFIX = ".lightning_rl-swap-"


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


def recover_interrupted_writes(root: Path) -> list[str]:
    """Finish the swaps and remove the directories that killed writers left in the datasets ``root``.

    Only what a process of this host that no longer runs left is touched (see
    ``writer_is_gone``): writes in progress, other hosts' and everything else stay.

    Returns:
        One line per thing done (for logs and tests).
    """
    if not root.is_dir():
        return []
    done = []
    for entry in sorted(os.scandir(root), key=lambda entry: entry.name):
        if entry.name.startswith(SWAP_PREFIX) and writer_is_gone(entry.name, SWAP_PREFIX):
            try:
                done.append(_finish_swap(Path(entry.path)))
            except OSError as error:  # another process finishing the same swap got there first
                done.append(f"left {entry.path}: {error}")
    for entry in os.scandir(root):
        if any(writer_is_gone(entry.name, prefix) for prefix in (WRITING_PREFIX, REPLACED_PREFIX)):
            shutil.rmtree(entry.path, ignore_errors=True)
            done.append(f"removed {entry.path} (its writer no longer runs)")
    return done


def _finish_swap(journal: Path) -> str:
    """Finish the ``overwrite`` swap ``journal`` describes; its writer was killed part way."""
    try:
        swap = json.loads(journal.read_text())
        target, replaced, written = (Path(swap[key]) for key in ("target", "replaced", "written"))
    except (OSError, ValueError, KeyError, TypeError):
        journal.unlink(missing_ok=True)  # written atomically, so never half: not ours to read
        return f"removed the unreadable journal {journal}"
    if target.exists():  # the new dataset is in place (or the old one was never moved away)
        outcome = f"{target}: in place; removed what was left of the swap"
    elif written.exists():  # killed between the two renames: the new dataset is complete
        written.rename(target)
        outcome = f"{target}: moved the new dataset into place"
    elif replaced.exists():
        replaced.rename(target)
        outcome = f"{target}: restored the old dataset"
    else:
        outcome = f"{target}: nothing left to restore"
    shutil.rmtree(replaced, ignore_errors=True)
    journal.unlink(missing_ok=True)
    return outcome
