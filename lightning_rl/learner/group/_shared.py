"""An update's batch shards through shared memory: each shard's arrays written once, or none, and mapped by the learners.

Pickling a shard's arrays into a queue made copies on both sides (the pickled bytes in the
driver, the bytes received and the arrays unpickled from them in each learner): about 4x the
batch at the peak of an update. Instead each array reaches the learners as a
:class:`SharedArray` (a file, an offset, dtype, shape) in place of the array; the learner maps
the file and builds numpy arrays on it without copying (``torch.from_numpy`` keeps sharing
those pages). The file is one of two kinds:

- **The caller's own shared memory.** A tensor already in torch's shared memory
  (``Tensor.share_memory_()``, or received from a ``DataLoader`` worker), or a numpy view of
  one (``tensor.numpy()``), lives in a file that torch keeps open in this process and has
  unlinked from ``/dev/shm`` (its default ``"file_descriptor"`` strategy on Linux); a learner
  opens it as ``/proc/<driver pid>/fd/<fd>`` (``caller_shared_memory``). Nothing is copied:
  summed over the processes (PSS, shared pages counted once) an update holds the batch once.
  The group never moves a caller's private tensors there itself: a numpy view taken of a
  tensor before its storage moves keeps pointing at the freed private memory.
- **A block of the update.** Every other array (numpy, private tensors, a tensor view that
  is not contiguous, storages torch shares by name) is copied into one
  ``multiprocessing.shared_memory`` block per shard: the batch and one copy, about 2x.

Either way the learners map the file copy-on-write: a Learner that writes into its batch in
place gets its own pages and never changes the caller's tensors or the other learners' rows.

Lifetime: the driver owns the update's blocks (``SharedShards``), and holds the caller's
shared storages (so their files stay open), until every rank has answered the update; blocks
are unlinked then, and on every error, kill and shutdown path. Creating a block registers it
with Python's resource tracker, a helper process that unlinks what a killed driver left behind
once the driver and its learners are gone; the caller's files have no name to leave behind. A
learner never registers or unlinks anything: it only maps, and its mapping ends when its last
array on it is freed (an unlinked file's pages are freed by the kernel once no process maps
or holds it open).

Arrays of Python objects, and anything that is not a numpy array, stay in the pickled payload.
Where ``/dev/shm`` has no room for the blocks (a container's default is 64 MB), writing to a
block would kill the driver with SIGBUS: ``fits`` says so beforehand, and the driver sends
that update pickled, as before.
"""

from __future__ import annotations

import mmap
import os
import shutil
from collections.abc import Mapping, Sequence
from multiprocessing import shared_memory
from typing import Any, NamedTuple

import numpy as np
import torch

_ALIGN = 64  # each array starts at a multiple of this (cache line; any dtype's alignment)
_SHM_DIR = "/dev/shm"  # where POSIX shared memory lives on Linux
_HEADROOM = 1.1  # leave others (and the rounding to pages) a margin of the free space


class SharedArray(NamedTuple):
    """Where a learner finds one array of its shard: ``shape`` of ``dtype`` at ``offset`` in the file at ``path``."""

    path: str
    offset: int
    dtype: str
    shape: tuple[int, ...]


class CallerMemory(NamedTuple):
    """One storage of the caller's tensors in torch's shared memory: bytes ``start:stop`` of the driver's address
    space are bytes ``0:stop - start`` of the file a learner opens at ``path``."""

    path: str
    start: int
    stop: int
    storage: torch.UntypedStorage  # held until every rank has answered: its file stays open that long


def caller_shared_memory(batch: Any) -> list[CallerMemory]:
    """The storages of ``batch``'s tensors (or numpy views of tensors) in torch's shared memory that a learner can open.

    A storage torch shares with its ``"file_descriptor"`` strategy (Linux's default) keeps its
    file open here, so a learner opens ``/proc/<this pid>/fd/<fd>``. Storages shared by name
    (the ``"file_system"`` strategy) have no such file and are left out: their tensors are
    copied, as private ones are.
    """
    found: dict[int, CallerMemory] = {}

    def visit(value: Any) -> None:
        while isinstance(value, np.ndarray):  # a view's base, down to the tensor that holds the memory (if any)
            value = value.base
        if not (isinstance(value, torch.Tensor) and value.layout == torch.strided and value.device.type == "cpu"):
            return
        storage = value.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in found or not storage.is_shared():
            return
        try:
            # torch's own accessor (private): the storage's open file under the "file_descriptor"
            # strategy. Shared by name, mapped from a file, or a torch without it: copied instead.
            fd = storage._get_shared_fd()
        except (RuntimeError, AttributeError):
            return
        start = storage.data_ptr()
        found[start] = CallerMemory(f"/proc/{os.getpid()}/fd/{fd}", start, start + storage.nbytes(), storage)

    _walk(batch, visit)
    return list(found.values())


def can_open(learner: Any, path: str) -> bool:
    """Whether this process can open ``path`` for reading (a learner asked about the driver's shared-memory file).

    ``learner`` is there for ``LearnerGroup.foreach_learner``, which passes it first; it is not used.
    """
    try:
        os.close(os.open(path, os.O_RDONLY))
    except OSError:
        return False
    return True


class SharedShards:
    """The shared memory of one update: the caller's storages it points into, and a block per shard for the rest.

    Args:
        shards: The update's shards (``split_batch``'s dicts of columns, or of module batches).
        caller_memory: The caller's shared storages (``caller_shared_memory``): arrays that lie
            whole and contiguous inside one of them are sent as a place in it, not copied.

    Raises:
        OSError: When a block cannot be created (e.g. ``/dev/shm`` is full); nothing is left behind.
    """

    def __init__(self, shards: list[Any], caller_memory: Sequence[CallerMemory] = ()) -> None:
        self.blocks: list[shared_memory.SharedMemory] = []
        self.caller_memory = list(caller_memory)
        try:
            self.shards = [self._share(shard) for shard in shards]
        except BaseException:
            self.release()
            raise

    @staticmethod
    def fits(shards: list[Any], caller_memory: Sequence[CallerMemory] = ()) -> bool:
        """Whether shared memory has room for the arrays to copy (False where it cannot be measured)."""
        return has_room(sum(_layout(_to_copy(_arrays(shard), caller_memory))[1] for shard in shards))

    def _share(self, shard: Any) -> Any:
        arrays = _arrays(shard)
        where = {id(array): place for array in arrays if (place := _place_in(array, self.caller_memory)) is not None}
        copied = [array for array in arrays if id(array) not in where]
        if copied:
            offsets, size = _layout(copied)
            block = shared_memory.SharedMemory(create=True, size=size)
            self.blocks.append(block)
            path = os.path.join(_SHM_DIR, block.name)
            for array, offset in zip(copied, offsets):
                np.ndarray(array.shape, array.dtype, buffer=block.buf, offset=offset)[...] = array
                where[id(array)] = SharedArray(path, offset, array.dtype.str, tuple(array.shape))
        return _walk(shard, lambda value: where.get(id(value), value))

    def release(self) -> None:
        """Unmap and unlink every block and let go of the caller's storages (idempotent); the learners' mappings
        keep the pages until they drop them."""
        for block in self.blocks:
            try:
                block.close()
            except BufferError:  # an array on it is still alive here; the unlink below still frees the name
                pass
            try:
                block.unlink()
            except FileNotFoundError:
                pass
        self.blocks = []
        self.caller_memory = []


def has_room(nbytes: int) -> bool:
    """Whether ``/dev/shm`` has room for ``nbytes`` more (False where it cannot be measured).

    Writing past its size kills the writer with SIGBUS, so every write there asks first.
    """
    try:
        return shutil.disk_usage(_SHM_DIR).free >= nbytes * _HEADROOM
    except OSError:
        return False


def can_build_in_place() -> bool:
    """Whether a tensor ``shared_empty`` makes is one the learners can read in place (torch's sharing strategy)."""
    return torch.multiprocessing.get_sharing_strategy() == "file_descriptor"


def shared_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized CPU tensor in torch's shared memory, for data the group builds itself (``update(batches=...)``
    joins them here): the learners then read it where it is, and no private copy of it ever exists.

    Moving a fresh ``torch.empty`` there reads only pages never written (no private memory is
    allocated for them) and writes the shared pages once.
    """
    return torch.empty(shape, dtype=dtype).share_memory_()


def attach_shared(data: Any) -> Any:
    """``data`` with each :class:`SharedArray` replaced by a numpy array on its file (no copy).

    Raises:
        FileNotFoundError: When a file is gone (the driver released the update).
    """
    mappings: dict[str, mmap.mmap] = {}

    def attach(value: Any) -> Any:
        if not isinstance(value, SharedArray):
            return value
        if value.path not in mappings:
            mappings[value.path] = _map(value.path)
        return np.ndarray(value.shape, np.dtype(value.dtype), buffer=mappings[value.path], offset=value.offset)

    return _walk(data, attach)


def _map(path: str) -> mmap.mmap:
    """Map the file at ``path`` copy-on-write, read from the driver's pages until written.

    Copy-on-write because the file may be the caller's own tensors: a Learner that changes its
    batch in place must not change them. Opened by path, not with ``SharedMemory``: attaching one
    would register it with the resource tracker (Python < 3.13), and its ``close`` fails while
    arrays on it live; an ``mmap`` lives as long as its arrays.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)


def _place_in(array: np.ndarray, caller_memory: Sequence[CallerMemory]) -> SharedArray | None:
    """Where ``array`` lies in the caller's shared memory, if it lies whole and contiguous in one storage."""
    if not array.flags.c_contiguous:
        return None
    start = array.ctypes.data
    for memory in caller_memory:
        if memory.start <= start and start + array.nbytes <= memory.stop:
            return SharedArray(memory.path, start - memory.start, array.dtype.str, tuple(array.shape))
    return None


def _to_copy(arrays: list[np.ndarray], caller_memory: Sequence[CallerMemory]) -> list[np.ndarray]:
    return [array for array in arrays if _place_in(array, caller_memory) is None]


def _arrays(shard: Any) -> list[np.ndarray]:
    """The arrays of a shard that travel in shared memory."""
    arrays: list[np.ndarray] = []
    _walk(shard, lambda value: arrays.append(value) if _shareable(value) else None)
    return arrays


def _layout(arrays: list[np.ndarray]) -> tuple[list[int], int]:
    """Each array's offset in its shard's block, and the block's size."""
    offsets, size = [], 0
    for array in arrays:
        offsets.append(size)
        size += -(-array.nbytes // _ALIGN) * _ALIGN
    return offsets, size


def _shareable(value: Any) -> bool:
    return isinstance(value, np.ndarray) and not value.dtype.hasobject and value.nbytes > 0


def _walk(value: Any, visit: Any) -> Any:
    """``value`` with ``visit`` applied to every leaf of its nested dicts."""
    if isinstance(value, Mapping):
        return {key: _walk(item, visit) for key, item in value.items()}
    return visit(value)
