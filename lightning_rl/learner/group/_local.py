"""The LearnerGroup backend for ``num_learners=0``: the Learner itself, in this process."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from lightning_rl.learner.group._protocol import run_command, weights_of
from lightning_rl.learner.learner import Learner


class LocalBackend:
    """Runs everything on ``learner`` itself; async updates on one background thread.

    An update returns the Learner's own results, or ``(results, weights)`` when asked for the
    weights after it (``return_state``), exactly as the process backend does.
    """

    #: A batch reaches the learner as it is: nothing gains from joining ``batches`` in shared memory.
    reads_shared_memory = False

    def __init__(self, learner: Learner) -> None:
        learner.build()
        self.learner = learner
        self._executor: ThreadPoolExecutor | None = None

    def check_not_broken(self) -> None:
        """A local learner cannot break the group: its errors are raised to the caller as they are."""

    def prepare_update(self, kind: str, data: Any) -> Any:
        """The data as it is: one learner trains on all of it."""
        return data

    def run_update(self, kind: str, data: Any, settings: dict[str, Any], return_state: bool) -> Any:
        """Run ``Learner.<kind>`` on the data now; with ``return_state``, also the weights after it."""
        results = getattr(self.learner, kind)(data, **settings)
        return (results, weights_of(self.learner)) if return_state else results

    def submit_update(self, kind: str, data: Any, settings: dict[str, Any], return_state: bool) -> Future:
        """Queue the update on the background thread; the future's result is ``run_update``'s."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="LearnerGroup-update")
        return self._executor.submit(self.run_update, kind, data, settings, return_state)

    def poll(self) -> None:
        """Nothing to receive: a future knows when it is done."""

    def call(self, kind: str, args: dict[str, Any]) -> Any:
        """Run a non-update command; ``foreach_learner`` returns a one-element list, as for one rank."""
        learner = self.learner
        if kind == "foreach_learner":
            return [args["func"](learner, **args["kwargs"])]
        if kind == "get_state":
            # In this process the state is handed over as it is (tensors where they live).
            return learner.get_state(args["components"], not_components=args["not_components"])
        return run_command(learner, kind, args, rank=0)

    def shutdown(self) -> None:
        """Wait for the background thread's updates, then stop it."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def kill(self) -> None:
        """Stop the background thread without waiting (a group dropped without ``shutdown``)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
