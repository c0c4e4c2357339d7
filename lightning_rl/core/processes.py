"""Child processes that die with their parent, even when the parent is killed with ``kill -9``, and start cleanly.

A process started by this package (a tune trial's fit, a sampler of ``AsyncSamplingDataModule``, a
PettingZoo env worker) must not outlive the process that started it: an orphan keeps its envs,
memory and cores. An ordinary exit is handled by whoever started it (``kill()``, ``atexit``); a
``kill -9`` of the parent runs none of that, so the child asks the kernel to kill it when its
parent dies.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping


def die_with_parent() -> None:
    """Ask the kernel to ``SIGKILL`` this process when its parent dies (``PR_SET_PDEATHSIG``; Linux only).

    Call it first thing in a child process (or as a ``subprocess.Popen`` ``preexec_fn``). The
    signal comes when the *thread* that started the child exits, which for the processes here
    is the parent's main thread, so in effect when the parent process dies. Elsewhere (no
    ``prctl``) it does nothing: such a child finds its parent gone when it next talks to it.
    """
    try:
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def adopt_environment(environment: Mapping[str, str]) -> None:
    """Make this process's ``os.environ`` exactly ``environment``.

    A process forked from the fork server starts with the server's environment: its starter's
    as it was when the server started (for the first process that asked for one), not as it is
    now. So the starter hands over its ``os.environ`` of now (a LearnerGroup's learners, a tune
    trial's fit), and the child calls this first thing, before it imports anything that may
    read the environment.
    """
    os.environ.clear()
    os.environ.update(environment)


def release_fork_server() -> None:
    """Close this child's copy of the pipe by which the fork server knows that its parent lives.

    Call it first thing in a process the fork server started that will not ask this server for
    processes (a sampler of ``AsyncSamplingDataModule``, a PettingZoo env worker, a LearnerGroup
    learner, a tune trial's fit); one that later starts processes through ``forkserver`` gets a
    server of its own (a trial's samplers do).

    ``multiprocessing`` hands every process the fork server starts the write end of that pipe
    (so that it could ask the server for processes of its own). While a child holds it, the
    server does not see a parent killed with ``kill -9``, stays, and so never sets off its
    children's ``PR_SET_PDEATHSIG`` (:func:`die_with_parent`): a child hung in C code would
    outlive the parent. Without the child's copy, the server exits with the parent and takes
    the children with it.
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver  # the module's one server: there is no public handle on this fd
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if alive_fd is not None:
        with contextlib.suppress(OSError):
            os.close(alive_fd)
        server._forkserver_alive_fd = None


@contextlib.contextmanager
def main_script_not_rerun() -> Iterator[None]:
    """Start processes (``multiprocessing``'s spawn or forkserver) without running the parent's ``__main__`` script in them.

    ``multiprocessing`` runs the parent's main script in each new process (as ``__mp_main__``)
    to find functions defined there; a script without an ``if __name__ == "__main__":`` guard
    would then start a fit in every child. The children here need nothing from it: what they
    run comes by value (cloudpickle). So the script's path is hidden while the process starts.
    """
    main = sys.modules.get("__main__")
    spec, path = getattr(main, "__spec__", None), getattr(main, "__file__", None)
    if main is None or path is None or spec is not None:
        yield  # ``python -m ...``: multiprocessing imports a module by name only if it is no __main__ module
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path
