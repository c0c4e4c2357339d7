"""Reading and writing Learner checkpoints, safely.

Two formats hold a Learner:

* ``save_to_path(dir)`` writes ``dir/learner_state.pt``: the Learner's class path, its
  hyperparameters and its complete state (``Learner.get_state()``).
* A Lightning checkpoint (``ModelCheckpoint``, ``trainer.save_checkpoint``) keeps the
  weights in ``state_dict`` and the optimizer states in ``optimizer_states`` as usual, and
  everything else under the key ``"lightning_rl"``.

Both hold only tensors and plain Python data, so they load with ``torch.load(weights_only=True)``:
opening a checkpoint never runs code from it. A checkpoint names its Learner and RLModule
classes; those names are looked up among the classes already loaded (``loaded_subclass``),
never imported, so a crafted name cannot make Python import or call anything.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

LEARNER_STATE_FILE = "learner_state.pt"
CHECKPOINT_KEY = "lightning_rl"
FORMAT_VERSION = 1

_PLAIN_TYPES = (str, int, float, bool, type(None), torch.Tensor)


def class_path(cls: type) -> str:
    """The import path of a class, refusing classes that cannot be imported by that path."""
    if "<locals>" in cls.__qualname__:
        raise ValueError(
            f"{cls.__qualname__} is defined inside a function; define it at module level so that "
            "a checkpoint can name it"
        )
    return f"{cls.__module__}.{cls.__qualname__}"


def import_class(path: str, base: type) -> type:
    """Import the class at ``path`` (``"package.module.Class"``) and check it subclasses ``base``."""
    # The split between module path and (possibly nested) class name is unknown, so try the
    # longest importable module prefix first.
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # Only "this prefix is not a module" means try a shorter one; a missing
            # dependency inside an existing module is the real error.
            if error.name is not None and (module_name + ".").startswith(error.name + "."):
                continue
            raise ValueError(f"cannot import class {path!r}: {error}") from error
        try:
            for attribute in parts[split:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            break
        if not (isinstance(obj, type) and issubclass(obj, base)):
            raise ValueError(f"{path!r} is {obj!r}, not a subclass of {base.__name__}")
        return obj
    raise ValueError(f"cannot import class {path!r}; expected 'package.module.ClassName'")


def loaded_subclass(path: str, base: type, what: str) -> type:
    """The subclass of ``base`` (or ``base`` itself) whose import path is ``path``, among the classes loaded.

    Unlike :func:`import_class`, this imports nothing: it is how names read from a
    checkpoint become classes.

    Args:
        path: A class path as :func:`class_path` writes it, read from a checkpoint.
        base: The class the named one must be or derive from.
        what: Names the source in errors, e.g. ``"the checkpoint's Learner class"``.

    Raises:
        ValueError: If no loaded subclass of ``base`` has that path; the message says to
            import the defining module first.
    """
    if not isinstance(path, str):
        raise ValueError(f"{what} must be a class path string, got {type(path).__name__}")
    pending, seen = [base], set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if f"{cls.__module__}.{cls.__qualname__}" == path:
            return cls
        pending.extend(cls.__subclasses__())
    raise ValueError(
        f"{what} is {path!r}, which is not a loaded subclass of {base.__name__}; checkpoints never import "
        f"code, so import the module that defines it before loading"
    )


def check_plain_data(value: Any, where: str) -> None:
    """Raise ``ValueError`` if ``value`` holds anything ``torch.load(weights_only=True)`` refuses.

    Args:
        value: Nested dicts, lists and tuples of tensors, strings, numbers, bools and None.
        where: Names ``value`` in the error, e.g. ``"hyperparameter 'lr'"``.
    """
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise ValueError(f"{where}: key {key!r} is not a string or an int and cannot be saved")
            check_plain_data(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_plain_data(item, f"{where}[{index}]")
    elif not isinstance(value, _PLAIN_TYPES):
        raise ValueError(
            f"{where} is a {type(value).__name__}, which a checkpoint cannot hold safely; "
            "use numbers, strings, lists and dicts"
        )


def write_learner_dir(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path/learner_state.pt``, atomically.

    The file is written beside its final name and moved into place only when complete, so
    an interrupted save never leaves a damaged checkpoint where a good one was.
    """
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"cannot save a Learner to {str(directory)!r}: it is a file, expected a directory")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / LEARNER_STATE_FILE
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{LEARNER_STATE_FILE}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def read_learner_payload(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """Load a Learner checkpoint in either format.

    Returns:
        The file read, and a payload dict with ``learner_class``, ``hparams`` and ``state``;
        a Lightning checkpoint adds ``lightning_state_dict`` (the weights, keyed as in
        ``Learner.state_dict()``) and fills ``state["optimizer"]["optimizers"]`` by name.

    Raises:
        ValueError: naming the file, if it is missing, damaged or not a Learner checkpoint.
    """
    location = Path(path)
    file = location / LEARNER_STATE_FILE if location.is_dir() else location
    if not file.is_file():
        raise ValueError(f"no Learner checkpoint at {str(location)!r} (expected a directory holding {LEARNER_STATE_FILE} or a Lightning .ckpt file)")
    try:
        content = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for damaged or unsafe files
        raise ValueError(f"cannot read Learner checkpoint {str(file)!r}: {error}") from error
    if not isinstance(content, dict):
        raise ValueError(f"{str(file)!r} is not a Learner checkpoint (it holds a {type(content).__name__})")

    if CHECKPOINT_KEY in content:  # a Lightning checkpoint
        payload = dict(content[CHECKPOINT_KEY])
        state = dict(payload["state"])
        optimizer_state = dict(state.get("optimizer", {}))
        order = payload.get("optimizer_order", [])
        saved = content.get("optimizer_states", [])
        if len(order) != len(saved):
            raise ValueError(
                f"Learner checkpoint {str(file)!r} names {len(order)} optimizers but holds {len(saved)} optimizer states"
            )
        optimizer_state["optimizers"] = dict(zip(order, saved))
        state["optimizer"] = optimizer_state
        payload["state"] = state
        payload["lightning_state_dict"] = content["state_dict"]
    else:
        payload = content
    missing = {"format_version", "learner_class", "hparams", "state"} - set(payload)
    if missing:
        raise ValueError(f"{str(file)!r} is not a Learner checkpoint: it lacks {sorted(missing)}")
    if payload["format_version"] > FORMAT_VERSION:
        raise ValueError(
            f"{str(file)!r} was written by a newer lightning_rl (format {payload['format_version']}, "
            f"this one reads up to {FORMAT_VERSION})"
        )
    return file, payload
