"""An update's batch shards through shared memory: the driver writes each shard once, the learners map it.

Pickling a shard's arrays into a queue made copies on both sides (the pickled bytes in the
driver, the bytes received and the arrays unpickled from them in each learner): about 4x the
batch at the peak of an update. Instead the driver copies each shard's arrays into one
``multiprocessing.shared_memory`` block and sends a :class:`SharedArray` (block name, offset,
dtype, shape) in place of each array; the learner maps the block and builds numpy arrays on
it without copying (``torch.from_numpy`` keeps sharing those pages). Summed over the
processes (PSS, shared pages counted once) an update then holds the driver's batch and one
copy of its shards: about 2x the batch.

Lifetime: the driver owns the blocks (``SharedShards``) and unlinks them as soon as every rank
has answered the update, and on every error, kill and shutdown path. Creating a block registers
it with Python's resource tracker, a helper process that unlinks what a killed driver left
behind once the driver and its learners are gone. A learner never registers or unlinks a
block: it only maps it, and its mapping ends when its last array on it is freed (an unlinked
block's pages are freed by the kernel once no process maps it).

Arrays of Python objects, and anything that is not a numpy array, stay in the pickled payload.
Where ``/dev/shm`` has no room for the shards (a container's default is 64 MB), writing to a
block would kill the driver with SIGBUS: ``fits`` says so beforehand, and the driver sends
that update pickled, as before.
"""

from __future__ import annotations

import mmap
import os
import shutil
from collections.abc import Mapping
from multiprocessing import shared_memory
from typing import Any, NamedTuple

import numpy as np

_ALIGN = 64  # each array starts at a multiple of this (cache line; any dtype's alignment)
_SHM_DIR = "/dev/shm"  # where POSIX shared memory lives on Linux
_HEADROOM = 1.1  # leave others (and the rounding to pages) a margin of the free space


class SharedArray(NamedTuple):
    """Where a learner finds one array of its shard: ``shape`` of ``dtype`` at ``offset`` in block ``name``."""

    name: str
    offset: int
    dtype: str
    shape: tuple[int, ...]


class SharedShards:
    """The driver's shared-memory blocks of one update: one per shard that holds arrays.

    Args:
        shards: The update's shards (``split_batch``'s dicts of columns, or of module batches).

    Raises:
        OSError: When a block cannot be created (e.g. ``/dev/shm`` is full); nothing is left behind.
    """

    def __init__(self, shards: list[Any]) -> None:
        self.blocks: list[shared_memory.SharedMemory] = []
        try:
            self.shards = [self._share(shard) for shard in shards]
        except BaseException:
            self.release()
            raise

    @staticmethod
    def fits(shards: list[Any]) -> bool:
        """Whether shared memory has room for the shards' arrays (False where it cannot be measured)."""
        needed = sum(_layout(_arrays(shard))[1] for shard in shards)
        try:
            return shutil.disk_usage(_SHM_DIR).free >= needed * _HEADROOM
        except OSError:
            return False

    def _share(self, shard: Any) -> Any:
        arrays = _arrays(shard)
        if not arrays:
            return shard
        offsets, size = _layout(arrays)
        block = shared_memory.SharedMemory(create=True, size=size)
        self.blocks.append(block)
        where = {}
        for array, offset in zip(arrays, offsets):
            np.ndarray(array.shape, array.dtype, buffer=block.buf, offset=offset)[...] = array
            where[id(array)] = SharedArray(block.name, offset, array.dtype.str, tuple(array.shape))
        return _walk(shard, lambda value: where.get(id(value), value))

    def release(self) -> None:
        """Unmap and unlink every block (idempotent): the learners' mappings keep the pages until they drop them."""
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


def attach_shared(data: Any) -> Any:
    """``data`` with each :class:`SharedArray` replaced by a numpy array on the driver's block (no copy).

    Raises:
        FileNotFoundError: When a block is gone (the driver released the update).
    """
    mappings: dict[str, mmap.mmap] = {}

    def attach(value: Any) -> Any:
        if not isinstance(value, SharedArray):
            return value
        if value.name not in mappings:
            mappings[value.name] = _map(value.name)
        return np.ndarray(value.shape, np.dtype(value.dtype), buffer=mappings[value.name], offset=value.offset)

    return _walk(data, attach)


def _map(name: str) -> mmap.mmap:
    """Map block ``name`` without ``SharedMemory``: attaching one would register it with the resource
    tracker (Python < 3.13), and its ``close`` fails while arrays on it live; an ``mmap`` lives as long
    as its arrays."""
    import _posixshmem  # what SharedMemory opens blocks with on POSIX

    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


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
