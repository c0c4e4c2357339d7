"""The intra-op thread count the ``lightning-rl`` commands give torch (``--threads``).

torch's default is one intra-op thread per core. For RL-sized networks (a few layers of 64-256
units, minibatches of a few hundred rows) that pool costs more in hand-offs than it gains, and
on a busy machine (DDP ranks, env workers, other jobs) its threads wait on each other: a short
BC fit on a loaded 2-core machine ran about 4x faster with one thread. So the commands run
with one thread unless told otherwise:

- ``--threads N`` (N >= 1): N threads;
- ``--threads 0``: leave torch's own default;
- neither, with ``OMP_NUM_THREADS`` set in the environment: leave torch alone (it read that);
- neither: one thread.

The count chosen is also put into ``OMP_NUM_THREADS``, so that processes started from this one
(DDP ranks, whose launcher otherwise gives each ``cpu_count // ranks``) run with it too.
This module imports torch only when it applies a count.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

# The count when neither --threads nor OMP_NUM_THREADS says otherwise.
DEFAULT_THREADS = 1
# --threads 0: leave torch's default.
TORCH_DEFAULT = 0

HELP = (
    "torch intra-op threads for this process and each DDP rank. Default: 1 (right for RL-sized "
    "networks, and on a busy machine), unless OMP_NUM_THREADS is set, which is then left to torch. "
    "0 leaves torch's own default (one thread per core)."
)


def chosen_threads(requested: int | None, environ: MutableMapping[str, str] | None = None) -> int | None:
    """The thread count to set, or ``None`` to leave torch alone.

    Args:
        requested: ``--threads``: ``None`` when not given, ``0`` for torch's default, else the count.
        environ: The environment (``os.environ`` by default).

    Raises:
        ValueError: For a negative count.
    """
    environ = os.environ if environ is None else environ
    if requested is None:
        return None if "OMP_NUM_THREADS" in environ else DEFAULT_THREADS
    if requested < 0:
        raise ValueError(f"--threads must be 0 (torch's default) or a positive count, got {requested}")
    return None if requested == TORCH_DEFAULT else requested


def apply_threads(requested: int | None, environ: MutableMapping[str, str] | None = None) -> int | None:
    """Set torch's intra-op thread count as ``--threads`` and the environment say; the count set, or ``None``.

    Also sets ``OMP_NUM_THREADS`` to that count, for the processes this one starts.
    """
    environ = os.environ if environ is None else environ
    count = chosen_threads(requested, environ)
    if count is None:
        return None
    import torch

    torch.set_num_threads(count)
    environ["OMP_NUM_THREADS"] = str(count)
    return count
