"""``RaySamplerPool``: the samplers as Ray actors, on this machine or on a Ray cluster (``sampler_backend="ray"``).

The same ``Sampler`` class, made an actor with ``ray.remote``. Each request is one
``sample.remote()`` call (Ray runs an actor's calls in order, one at a time), so the pool's
bound on requests is the bound on rollouts in flight. The weights go to the object store once
per broadcast (``ray.put``) and every actor is told to load them (``set_weights.remote``, with
the data module's normalization statistics when it normalizes), before its next rollout.

Where the actors run: if Ray is not initialized, ``ray.init(address=...)`` is called with the
data module's ``ray_address`` (``None``: a Ray instance of this machine, or the cluster that
``RAY_ADDRESS`` names); a script that called ``ray.init`` itself keeps its cluster. So samplers
on other machines feed this Learner when those machines joined the cluster (``ray start
--head`` on one, ``ray start --address=HEAD:6379`` on the others, ``ray_address="auto"`` here).

Actors are killed when the pool closes; Ray kills them too when the driver exits. A lost actor
(its node or process died) or one that raised is killed and made anew, as in ``SamplerPool``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lightning_rl.core.rl_modules import RLModule
from lightning_rl.env.env_settings import EnvSettings
from lightning_rl.env.sampler import ERROR, READY, ROLLOUT, Sampler
from lightning_rl.env.sampler_pool import DIED, SamplerPool


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        ImportError: ``sampler_backend="ray" needs Ray: pip install "lightning-rl[ray]"``.
    """
    try:
        import ray
    except ImportError as error:
        raise ImportError('sampler_backend="ray" needs Ray: pip install "lightning-rl[ray]"') from error
    return ray


class RaySamplerPool(SamplerPool):
    """Samplers as Ray actors (one CPU each).

    Args:
        settings: One ``EnvSettings`` per sampler (see ``SamplerPool``).
        module: The acting module, a CPU copy (put into Ray's object store once).
        address: ``ray.init``'s ``address`` when Ray is not initialized yet.
        kwargs: ``SamplerPool``'s other arguments.
    """

    _start_hint = (
        " (each Ray actor waits for a free CPU: the cluster needs num_env_runners CPUs per rank; "
        "see ray.cluster_resources())"
    )

    def __init__(
        self, settings: Sequence[EnvSettings], module: RLModule, *, address: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(settings, module, **kwargs)
        ray = self._ray = import_ray()
        if not ray.is_initialized():
            with keeping_signal_handlers():
                ray.init(address=address)
        self._actor_class = ray.remote(num_cpus=1, max_restarts=0)(Sampler)
        self._module_ref = ray.put(module)
        self._weights_seq_no = kwargs["weights_seq_no"]
        self._weights_ref: Any = None  # the last broadcast's weights, for actors started after it
        self._actors: list[Any] = [None] * self.num_samplers
        self._pids: list[int | None] = [None] * self.num_samplers
        self._calls: dict[Any, tuple[int, str]] = {}  # ObjectRef -> (sampler index, READY or ROLLOUT)

    @property
    def pids(self) -> list[int | None]:
        return list(self._pids)

    def broadcast(
        self, state: Mapping[str, torch.Tensor], weights_seq_no: int, statistics: np.ndarray | None = None
    ) -> None:
        self._weights_ref = self._ray.put({name: tensor.detach().cpu() for name, tensor in state.items()})
        self._weights_seq_no = weights_seq_no
        if statistics is not None:
            self.statistics = statistics
        for actor in self._actors:
            if actor is not None:
                actor.set_weights.remote(self._weights_ref, weights_seq_no, statistics)

    def _start(self, index: int) -> None:
        actor = self._actor_class.remote(
            self.settings[index], self._module_ref, index=index, start=self.starts[index],
            weights_seq_no=self._weights_seq_no, statistics=self.statistics,
        )  # fmt: skip
        if self._weights_ref is not None:
            actor.set_weights.remote(self._weights_ref, self._weights_seq_no)
        self._actors[index] = actor
        self._calls[actor.ready.remote()] = (index, READY)

    def _request(self, index: int) -> None:
        self._calls[self._actors[index].sample.remote()] = (index, ROLLOUT)

    def _receive(self, timeout: float) -> list[tuple[int, str, Any]]:
        ray = self._ray
        if not self._calls:
            time.sleep(timeout)
            return []
        ready, _ = ray.wait(list(self._calls), num_returns=1, timeout=timeout)
        if ready:  # and whatever else is done by now
            ready, _ = ray.wait(list(self._calls), num_returns=len(self._calls), timeout=0)
        messages: list[tuple[int, str, Any]] = []
        for ref in ready:
            if ref not in self._calls:
                continue  # its sampler was restarted by an earlier message of this batch
            index, kind = self._calls.pop(ref)
            try:
                value = ray.get(ref)
            except ray.exceptions.RayActorError as error:
                messages.append((index, DIED, f"its Ray actor died ({type(error).__name__})"))
                self._forget(index)
                continue
            except ray.exceptions.RayTaskError as error:
                messages.append((index, ERROR, str(error)))
                self._forget(index)
                continue
            if kind == READY:
                self._pids[index] = value
            messages.append((index, kind, None if kind == READY else value))
        return messages

    def _forget(self, index: int) -> None:
        """Drop the calls in flight to sampler ``index`` (it is restarted; their answers are errors)."""
        for ref in [ref for ref, (i, _) in self._calls.items() if i == index]:
            del self._calls[ref]

    def _kill(self, index: int) -> None:
        actor = self._actors[index]
        if actor is None:
            return
        self._forget(index)
        self._ray.kill(actor, no_restart=True)
        self._actors[index] = None
        self._pids[index] = None


@contextlib.contextmanager
def keeping_signal_handlers() -> Iterator[None]:
    """Restore this process's SIGTERM and SIGINT handlers after the block (around ``ray.init``).

    ``ray.init`` makes the calling process a Ray driver and installs a SIGTERM handler that calls
    ``sys.exit``: under ``Trainer.fit`` that replaced Lightning's graceful stop (finish the step,
    exit 143), and in a test session it outlived ``ray.shutdown`` and ended later fits that send
    themselves SIGTERM. Only the main thread may set handlers; elsewhere nothing is changed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:
                signal.signal(signum, handler)
