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

Files are written atomically (``atomic_write``: a temporary file beside the target, fsynced,
then renamed) and carry a checksum of their content (``CHECKSUM_KEY``), checked on load, so
a damaged file is an error rather than wrong weights. ``read_checkpoint_file`` opens either
format and turns every way a file can be bad into one ``ValueError`` line naming it.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import socket
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.core.spaces import space_from_dict, space_to_dict

LEARNER_STATE_FILE = "learner_state.pt"
CHECKPOINT_KEY = "lightning_rl"
FORMAT_VERSION = 1
# The reserved top-level key holding the checksum of everything else in a checkpoint file.
CHECKSUM_KEY = "lightning_rl_checksum"
# The key, inside the ``"lightning_rl"`` entry, of the checksum of the Learner's own parts.
LEARNER_CHECKSUM_KEY = "checksum"
CHECKSUM_METHOD = "sha256-walk-v1"
# Every temporary file a save writes starts with this; nothing else is ever cleaned up.
TEMPORARY_PREFIX = ".lightning_rl-partial."

_PLAIN_TYPES = (str, int, float, bool, type(None), torch.Tensor)
_LEARNER_KEYS = {"format_version", "learner_class", "hparams", "state"}
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive
_CODE_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")


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


# ----------------------------------------------------------------------------------------
# Checksums
# ----------------------------------------------------------------------------------------


def payload_checksum(value: Any) -> dict[str, str]:
    """The checksum of ``value`` as a checkpoint stores it: ``{"method": ..., "digest": hex}``.

    The digest is a SHA-256 hash of a walk over the loaded object: every key and value in
    order, with its type, and every tensor's dtype, shape and bytes (read in place, without
    a copy, when the tensor is contiguous and on the CPU). Hashing the object rather than
    the file's bytes keeps the file a plain ``torch.save`` file that any tool loads, with
    the checksum as one more entry. SHA-256 rather than BLAKE2b: CPUs with SHA instructions
    (recent x86 and ARM) hash it two to three times faster.
    """
    hasher = hashlib.sha256()
    _feed(hasher, value)
    return {"method": CHECKSUM_METHOD, "digest": hasher.hexdigest()}


def _feed(hasher: Any, value: Any) -> None:
    # Every value starts with a type tag, and containers and strings with their length, so
    # that two different objects never feed the same bytes.
    if isinstance(value, torch.Tensor):
        hasher.update(f"T{value.dtype}{tuple(value.shape)}|".encode())
        hasher.update(_tensor_bytes(value))
    elif isinstance(value, np.ndarray):
        hasher.update(f"A{value.dtype.str}{value.shape}|".encode())
        hasher.update(memoryview(np.ascontiguousarray(value)).cast("B"))
    elif isinstance(value, Mapping):
        hasher.update(f"D{len(value)}|".encode())
        for key, item in value.items():
            _feed(hasher, key)
            _feed(hasher, item)
    elif isinstance(value, (list, tuple)):
        hasher.update(f"{'L' if isinstance(value, list) else 'U'}{len(value)}|".encode())
        for item in value:
            _feed(hasher, item)
    elif isinstance(value, (set, frozenset)):
        # A set's order changes between processes (string hashes are salted); its items' digests do not.
        digests = sorted(payload_checksum(item)["digest"] for item in value)
        hasher.update(f"S{len(value)}|{','.join(digests)}|".encode())
    elif isinstance(value, (str, bytes)):
        data = value.encode() if isinstance(value, str) else value
        hasher.update(f"{'s' if isinstance(value, str) else 'b'}{len(data)}|".encode())
        hasher.update(data)
    elif isinstance(value, float):
        hasher.update(f"F{value.hex()}|".encode())
    elif isinstance(value, (bool, int, complex, type(None), torch.dtype, torch.device)):
        hasher.update(f"{type(value).__name__}{value!r}|".encode())
    else:
        # Other types (neither lightning_rl nor Lightning writes any) count by their type
        # alone: a repr may hold a memory address, which would differ on load.
        hasher.update(f"?{type(value).__module__}.{type(value).__qualname__}|".encode())


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A tensor's values as bytes: a view of its own memory when contiguous on the CPU, else of one copy."""
    tensor = tensor.detach()
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    flat = tensor.cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def with_checksum(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """A shallow copy of ``checkpoint`` with the checksum of its content under ``CHECKSUM_KEY`` (added last)."""
    content = {key: value for key, value in checkpoint.items() if key != CHECKSUM_KEY}
    return {**content, CHECKSUM_KEY: payload_checksum(content)}


def add_learner_checksum(checkpoint: dict[str, Any]) -> None:
    """Store in ``checkpoint["lightning_rl"]`` the checksum of a Lightning checkpoint's Learner parts.

    The parts are the weights (``state_dict``), the optimizer states and the
    ``"lightning_rl"`` entry itself. ``Learner.on_save_checkpoint`` adds it, so a Learner's
    weights are checked on load even in files that a plain ``Trainer`` wrote (without
    ``AtomicCheckpointIO``, which checksums the whole file).
    """
    checkpoint[CHECKPOINT_KEY][LEARNER_CHECKSUM_KEY] = payload_checksum(_learner_parts(checkpoint))


def _learner_parts(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    entry = {key: value for key, value in checkpoint[CHECKPOINT_KEY].items() if key != LEARNER_CHECKSUM_KEY}
    return {
        "state_dict": checkpoint.get("state_dict"),
        "optimizer_states": checkpoint.get("optimizer_states"),
        CHECKPOINT_KEY: entry,
    }


def verify_checksum(content: Any, where: str) -> None:
    """Check the checksum a loaded checkpoint carries: the whole file's if it has one, else its Learner parts'.

    Files without a checksum (older ones, or other programs') pass.

    Raises:
        ValueError: ``"<where>: checksum mismatch: the file is damaged"``.
    """
    if isinstance(content, Mapping) and CHECKSUM_KEY in content:
        rest = {key: value for key, value in content.items() if key != CHECKSUM_KEY}
        _check(content[CHECKSUM_KEY], rest, where)
    else:
        verify_learner_checksum(content, where)


def verify_learner_checksum(checkpoint: Any, where: str) -> None:
    """Check the checksum of a Lightning checkpoint's Learner parts (``add_learner_checksum``), if it has one.

    Raises:
        ValueError: ``"<where>: checksum mismatch: the file is damaged"``.
    """
    entry = checkpoint.get(CHECKPOINT_KEY) if isinstance(checkpoint, Mapping) else None
    if isinstance(entry, Mapping) and LEARNER_CHECKSUM_KEY in entry:
        _check(entry[LEARNER_CHECKSUM_KEY], _learner_parts(checkpoint), where)


def _check(stored: Any, content: Any, where: str) -> None:
    if not (isinstance(stored, Mapping) and isinstance(stored.get("method"), str) and "digest" in stored):
        raise ValueError(f"{where}: its checksum entry is not one lightning_rl writes: the file is damaged")
    if stored["method"] != CHECKSUM_METHOD:
        raise ValueError(
            f"{where}: written by a newer lightning_rl (checksum method {stored['method']!r}; "
            f"this one checks {CHECKSUM_METHOD!r})"
        )
    if payload_checksum(content)["digest"] != stored["digest"]:
        raise ValueError(f"{where}: checksum mismatch: the file is damaged")


# ----------------------------------------------------------------------------------------
# Writing files atomically
# ----------------------------------------------------------------------------------------


def atomic_write(target: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> Path:
    """Write ``target`` so that it always holds either its old content or the complete new one.

    The file gets the permissions ``open()`` would give it (``0o666`` less the umask), not the
    ``0o600`` of a temporary file.

    ``write`` fills a temporary file in ``target``'s own directory, so that the final rename
    never crosses filesystems (where it would be a copy that a kill can cut short); the file
    is fsynced, renamed over ``target`` with ``os.replace``, and the directory is fsynced, so
    that the rename survives a crash too. On any error the temporary file is removed. Before
    writing, temporary files that killed saves left in the directory are removed
    (``remove_stale_temporary_files``).

    Args:
        target: The file to write; its directory is created if missing.
        write: Called once with the open binary file.

    Returns:
        ``target`` as a ``Path``.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporary_files(target.parent)
    prefix = f"{writer_tag(TEMPORARY_PREFIX)}{target.name}."
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=prefix, suffix=".tmp")
    try:
        if hasattr(os, "fchmod"):
            # mkstemp makes the file 0600; a file written with open() would get 0666 less the umask.
            os.fchmod(handle, 0o666 & ~current_umask())
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)
    return target


def current_umask() -> int:
    """The process's umask, read without changing it where Linux reports it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)  # elsewhere: set and put back at once
    os.umask(umask)
    return umask


def remove_stale_temporary_files(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporary files that killed saves left in ``directory``.

    A temporary file's name holds its writer's host and process id
    (``.lightning_rl-partial.<host>.<pid>.<target>.<random>.tmp``). Only such files written
    on this host by a process that no longer runs are removed: saves in progress, files of
    other hosts and every file without ``TEMPORARY_PREFIX`` are left alone.

    Returns:
        The files removed.
    """
    removed = []
    for entry in os.scandir(directory):
        if writer_is_gone(entry.name):
            Path(entry.path).unlink(missing_ok=True)
            removed.append(Path(entry.path))
    return removed


def writer_tag(prefix: str) -> str:
    """``<prefix><host>.<pid>.``: how the names of this process's temporary files and directories start.

    :func:`writer_is_gone` reads the host and the process id back, so that a later run can
    sweep what a killed writer left behind (``atomic_write``'s files, the Minari writer's
    directories), and only that.
    """
    return f"{prefix}{_host()}.{os.getpid()}."


def writer_is_gone(name: str, prefix: str = TEMPORARY_PREFIX) -> bool:
    """Whether ``name`` starts with :func:`writer_tag` of a process of this host that no longer runs.

    Names without ``prefix``, of other hosts, or of running processes are never gone.
    """
    writer = _writer_of(name, prefix)
    return writer is not None and writer[0] == _host() and not _is_running(writer[1])


def _host() -> str:
    # Dots separate the fields of a temporary file's name, so the host name has none.
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def _writer_of(name: str, prefix: str = TEMPORARY_PREFIX) -> tuple[str, int] | None:
    """The (host, pid) a temporary file's name holds; ``None`` for any other name."""
    if not name.startswith(prefix):
        return None
    fields = name[len(prefix) :].split(".", 2)
    if len(fields) < 3 or not fields[1].isdigit():
        return None
    return fields[0], int(fields[1])


def _is_running(pid: int) -> bool:
    if os.name != "posix":
        return True  # os.kill(pid, 0) would send CTRL_C there: never remove
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable; a no-op where directories cannot be opened (Windows)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    handle = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def save_checkpoint_file(checkpoint: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """``torch.save`` ``checkpoint`` to ``path`` atomically, with its checksum under ``CHECKSUM_KEY``.

    ``torch.save`` streams into the file, so the checkpoint is never held twice in memory.
    """
    stamped = with_checksum(checkpoint)
    return atomic_write(path, lambda file: torch.save(stamped, file))


def write_learner_dir(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path/learner_state.pt``, atomically and with its checksum."""
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"cannot save a Learner to {str(directory)!r}: it is a file, expected a directory")
    return save_checkpoint_file(payload, directory / LEARNER_STATE_FILE)


# ----------------------------------------------------------------------------------------
# Reading and checking files
# ----------------------------------------------------------------------------------------


def checkpoint_file(path: str | os.PathLike) -> Path:
    """The file a checkpoint path names: ``path`` itself, or ``path/learner_state.pt`` for a directory.

    Raises:
        ValueError: ``"<path>: no such file"``, or for a directory without ``learner_state.pt``.
    """
    location = Path(path)
    if location.is_dir():
        file = location / LEARNER_STATE_FILE
        if not file.is_file():
            raise ValueError(
                f"{location}: a directory without {LEARNER_STATE_FILE}; expected a save_to_path directory "
                "or a Lightning .ckpt file"
            )
        return file
    if not location.is_file():
        raise ValueError(f"{location}: no such file")
    return location


def load_checked(file: str | os.PathLike, map_location: Any = None) -> Any:
    """Load a ``torch.save`` file as plain data (``weights_only=True``) and check its checksum, if it has one.

    Args:
        file: The file (see ``checkpoint_file`` for directories).
        map_location: As ``torch.load``'s.

    Raises:
        ValueError: With one line, ``"<file>: <problem>"``, for an empty, truncated or
            garbage file, one holding code (a class or function), or a checksum mismatch.
    """
    file = Path(file)
    if file.stat().st_size == 0:
        raise ValueError(f"{file}: the file is empty (0 bytes), as a save that never finished leaves it")
    try:
        content = torch.load(file, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises many types for bad files
        raise ValueError(f"{file}: {_load_problem(file, error)}") from error
    verify_checksum(content, str(file))
    return content


def _load_problem(file: Path, error: Exception) -> str:
    """What is wrong with a file ``torch.load(weights_only=True)`` refused (never torch's advice to load it unsafely)."""
    code = _CODE_GLOBAL.search(str(error))
    if code:
        return (
            f"it holds {code.group(1)}, which is code, not data; lightning_rl checkpoints hold only tensors "
            "and plain values, so it was not loaded"
        )
    with open(file, "rb") as handle:
        is_archive = handle.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC
    if is_archive:
        return "the file is truncated or damaged: it is not a complete torch.save archive"
    return "not a checkpoint: the file is not one that torch.save writes"


def read_checkpoint_file(path: str | os.PathLike) -> dict[str, Any]:
    """Open a lightning_rl checkpoint of either format, checked; the one reader of the CLI and every load path.

    Args:
        path: A Lightning ``.ckpt`` file, a ``save_to_path`` directory or its ``learner_state.pt``.

    Returns:
        What the file holds, as ``torch.load`` returns it (its checksum entry included).

    Raises:
        ValueError: With one line, ``"<file>: <problem>"``: a missing file, a directory
            without ``learner_state.pt``, an empty, truncated or garbage file, one holding
            code, a checksum mismatch, a file that is no lightning_rl checkpoint, or one
            written by a newer lightning_rl.
    """
    file = checkpoint_file(path)
    content = load_checked(file, map_location="cpu")
    lightning_format = isinstance(content, dict) and CHECKPOINT_KEY in content
    entry = content[CHECKPOINT_KEY] if lightning_format else content
    version = entry.get("format_version") if isinstance(entry, Mapping) else None
    if not isinstance(version, int):
        raise ValueError(
            f"{file}: not a lightning_rl checkpoint (it has no {CHECKPOINT_KEY!r} entry with a format version)"
        )
    if version > FORMAT_VERSION:
        raise ValueError(
            f"{file}: written by a newer lightning_rl (checkpoint format {version}; "
            f"this one reads up to {FORMAT_VERSION})"
        )
    missing = _LEARNER_KEYS - set(entry)
    if lightning_format:
        missing |= {"optimizer_order"} - set(entry)
        missing |= {"state_dict"} - set(content)
    if missing:
        raise ValueError(f"{file}: not a lightning_rl checkpoint (it lacks {sorted(missing)})")
    return content


def check_checkpoint_fits(
    path: str | os.PathLike,
    checkpoint: Mapping[str, Any],
    learner_class: type,
    observation_space: gym.Space | None = None,
    action_space: gym.Space | None = None,
) -> None:
    """Check that a checkpoint suits the Learner class and env about to use it, before anything is built.

    Args:
        path: Names the checkpoint in errors.
        checkpoint: What ``read_checkpoint_file`` returned.
        learner_class: The Learner class the run builds.
        observation_space: The env's observation space; ``None`` not to check it.
        action_space: The env's action space; ``None`` not to check it.

    Raises:
        ValueError: One line: ``"<path>: wrong algorithm: ..."`` if the checkpoint's Learner
            class is neither ``learner_class``, a loaded subclass of it, nor a class it derives
            from; ``"<path>: wrong env: ..."`` if a module was trained on other spaces.
    """
    entry = checkpoint.get(CHECKPOINT_KEY, checkpoint)
    saved = entry["learner_class"]
    ancestors = {f"{cls.__module__}.{cls.__qualname__}" for cls in learner_class.__mro__}
    if saved not in ancestors:
        try:
            loaded_subclass(saved, learner_class, "the checkpoint's Learner class")
        except ValueError:
            raise ValueError(
                f"{path}: wrong algorithm: it was written by {saved}, which is neither {learner_class.__name__}, "
                "a loaded subclass of it, nor a class it derives from"
            ) from None
    specs = entry["state"].get("module_spec", {}).get("rl_module_specs", {})
    for module_id, spec in specs.items():
        for kind, given in (("observation", observation_space), ("action", action_space)):
            stored = spec.get(f"{kind}_space")
            if given is not None and stored is not None and not _same_space(stored, given):
                raise ValueError(
                    f"{path}: wrong env: module {module_id!r} was trained on the {kind} space "
                    f"{space_from_dict(stored)}, but the env's is {given}"
                )


def _same_space(stored: Mapping[str, Any], space: gym.Space) -> bool:
    try:
        return space_to_dict(space) == stored
    except ValueError:  # a space type no checkpoint can hold
        return False


def read_learner_payload(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """Load a Learner checkpoint in either format (through ``read_checkpoint_file``).

    Returns:
        The file read, and a payload dict with ``learner_class``, ``hparams`` and ``state``;
        a Lightning checkpoint adds ``lightning_state_dict`` (the weights, keyed as in
        ``Learner.state_dict()``) and fills ``state["optimizer"]["optimizers"]`` by name.

    Raises:
        ValueError: As ``read_checkpoint_file``, and for a Lightning checkpoint whose
            optimizer names and states differ in number.
    """
    file = checkpoint_file(path)
    content = read_checkpoint_file(file)
    if CHECKPOINT_KEY not in content:
        return file, content
    payload = dict(content[CHECKPOINT_KEY])
    state = dict(payload["state"])
    optimizer_state = dict(state.get("optimizer", {}))
    order = payload["optimizer_order"]
    saved = content.get("optimizer_states", [])
    if len(order) != len(saved):
        raise ValueError(f"{file}: it names {len(order)} optimizers but holds {len(saved)} optimizer states")
    optimizer_state["optimizers"] = dict(zip(order, saved))
    state["optimizer"] = optimizer_state
    payload["state"] = state
    payload["lightning_state_dict"] = content["state_dict"]
    return file, payload


def to_plain_data(value: Any, path: str) -> Any:
    """A deep copy of ``value`` in plain types (``torch.load(weights_only=True)``, JSON and YAML take it).

    Raises:
        ValueError: Naming ``path`` (the value's place, e.g. ``"model_config['x']"``) for
            anything but str, int, float, bool, None, list, tuple and dict with str keys.
    """
    # A deep copy in plain types only, so the result loads with torch.load(weights_only=True)
    # and writes to JSON/YAML; tuples become lists, which JSON would do anyway.
    # Subclasses such as numpy.float64 become the builtin type, which torch's weights_only
    # loader accepts.
    if value is None or isinstance(value, bool):
        return value
    for plain_type in (str, int, float):
        if isinstance(value, plain_type):
            return plain_type(value)
    if isinstance(value, (list, tuple)):
        return [to_plain_data(item, f"{path}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{path} keys must be str to be stored, got {key!r}.")
            plain[key] = to_plain_data(item, f"{path}[{key!r}]")
        return plain
    raise ValueError(
        f"{path} is a {type(value).__name__}; only str, int, float, bool, None, list, tuple and dict can be stored."
    )
