"""The Learner's metrics: values logged during an update, reduced to plain floats.

Logging is cheap on the hot path: ``log_value`` only appends a detached tensor (or a number)
to a list, so a minibatch step never waits on the device. ``reduce`` stacks each key's values
once, feeds them to a torchmetrics aggregator and computes it; torchmetrics reduces across
ranks when a process group is running, so every rank returns the same numbers.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Literal, Union

import torch
from torchmetrics import MaxMetric, MeanMetric, Metric, MinMetric, SumMetric

Reduce = Literal["mean", "sum", "min", "max", "last"]
MetricKey = Union[str, tuple[str, ...]]

_AGGREGATORS: dict[str, type[Metric]] = {
    "mean": MeanMetric,
    "sum": SumMetric,
    "min": MinMetric,
    "max": MaxMetric,
    # "last" keeps only the newest value of a reduce period; a mean over ranks of that
    # value is what a multi-rank learner reports (the ranks agree on such values).
    "last": MeanMetric,
}
_SEPARATOR = "/"


class MetricsLogger:
    """Collects named values and reduces them to a nested dict of floats.

    Keys are strings or tuples of strings (``(module_id, "total_loss")``); tuple keys become
    nested dicts in the results.

    Args:
        device: Where the aggregators keep their state. Collective backends such as NCCL
            need it on the accelerator; CPU is right for gloo and single-process runs.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._pending: dict[tuple[str, ...], list[Any]] = {}
        self._aggregators: dict[tuple[str, ...], Metric] = {}
        self._settings: dict[tuple[str, ...], tuple[Reduce, bool]] = {}

    def log_value(
        self, key: MetricKey, value: Any, *, reduce: Reduce = "mean", clear_on_reduce: bool = True
    ) -> None:
        """Record one value (a number or a tensor of any shape) under ``key``.

        Called from inside an update, this never synchronizes with the device.

        Args:
            key: A string or a tuple of strings (a path in the nested results).
            value: A Python number or a tensor; tensors are detached.
            reduce: How the values of one reduce period combine: ``mean`` (over all
                elements logged), ``sum``, ``min``, ``max`` or ``last``.
            clear_on_reduce: Whether the value starts afresh after each ``reduce``.
                Lifetime counters use ``reduce="sum", clear_on_reduce=False``.
        """
        if reduce not in _AGGREGATORS:
            raise ValueError(f"reduce must be one of {sorted(_AGGREGATORS)}, got {reduce!r}")
        path = _as_path(key)
        settings = (reduce, clear_on_reduce)
        known = self._settings.setdefault(path, settings)
        if known != settings:
            raise ValueError(
                f"metric {_SEPARATOR.join(path)!r} was first logged with reduce={known[0]!r}, "
                f"clear_on_reduce={known[1]}; cannot log it with reduce={reduce!r}, clear_on_reduce={clear_on_reduce}"
            )
        if isinstance(value, torch.Tensor):
            value = value.detach()
        self._pending.setdefault(path, []).append(value)

    def log_dict(self, values: Mapping[str, Any], *, key: MetricKey = (), **kwargs: Any) -> None:
        """Log every entry of a (nested) dict under the prefix ``key``; ``kwargs`` as in ``log_value``."""
        prefix = _as_path(key) if key else ()
        for name, value in values.items():
            if isinstance(value, Mapping):
                self.log_dict(value, key=prefix + (name,), **kwargs)
            else:
                self.log_value(prefix + (name,), value, **kwargs)

    def reduce(self) -> dict[str, Any]:
        """Fold the values logged since the last call into the aggregators and report them.

        Returns:
            A nested dict of Python floats. Keys logged with ``clear_on_reduce=True`` are
            reported once and then forgotten; the others (lifetime counters) keep counting.
        """
        for path in sorted(self._pending):
            values = self._pending[path]
            reduce, _ = self._settings[path]
            aggregator = self._aggregators.get(path)
            if aggregator is None:
                aggregator = self._aggregators[path] = _new_aggregator(reduce, self.device)
            if reduce == "last":
                aggregator.reset()
                values = values[-1:]
            aggregator.update(_stack(values).to(self.device))
        # Sorted, so that every rank computes (and synchronizes) the same keys in one order.
        reported = sorted(set(self._pending) | {path for path in self._aggregators if not self._settings[path][1]})
        self._pending.clear()

        results: dict[str, Any] = {}
        for path in reported:
            aggregator = self._aggregators[path]
            _set_nested(results, path, float(aggregator.compute()))
            if self._settings[path][1]:
                # Reset rather than rebuilt: constructing a torchmetrics Metric costs far more.
                aggregator.reset()
        return results

    def peek(self, key: MetricKey) -> float:
        """The value ``key`` would reduce to now, on this rank alone (no collective call), clearing nothing."""
        path = _as_path(key)
        if path not in self._settings or (self._settings[path][1] and path not in self._pending):
            raise KeyError(f"no metric {_SEPARATOR.join(path)!r} has been logged since the last reduce")
        reduce, _ = self._settings[path]
        values = self._pending.get(path, [])
        aggregator = _new_aggregator(reduce, self.device, sync=False)
        if reduce == "last" and values:
            values = values[-1:]
        elif path in self._aggregators:
            aggregator.merge_state(self._aggregators[path])
        if values:
            aggregator.update(_stack(values).to(self.device))
        with warnings.catch_warnings():
            # A merged state without an update() call makes torchmetrics warn; the value is right.
            warnings.filterwarnings("ignore", message=".*was called before the ``update`` method")
            return float(aggregator.compute())

    def delete(self, prefix: MetricKey) -> None:
        """Forget every metric whose key starts with ``prefix`` (e.g. a removed module's)."""
        prefix_path = _as_path(prefix)
        for table in (self._pending, self._aggregators, self._settings):
            for path in [p for p in table if p[: len(prefix_path)] == prefix_path]:
                del table[path]

    def get_state(self) -> dict[str, Any]:
        """The lasting metrics (those logged with ``clear_on_reduce=False``), reduced to floats.

        On several ranks this is a collective call (like ``reduce``): the saved values are
        the totals over all ranks.
        """
        state = {}
        for path in sorted(self._aggregators):
            reduce, clear_on_reduce = self._settings[path]
            if not clear_on_reduce:
                aggregator = self._aggregators[path]
                entry = {"reduce": reduce, "value": float(aggregator.compute())}
                if reduce == "mean":
                    entry["weight"] = float(aggregator.weight)
                state[_SEPARATOR.join(path)] = entry
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore what ``get_state`` returned; values logged but not yet reduced are dropped.

        A sum is restored on rank 0 only, so that the total over ranks stays what was saved.
        """
        first_rank = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        self._pending.clear()
        self._aggregators.clear()
        self._settings.clear()
        for name, entry in state.items():
            path = tuple(name.split(_SEPARATOR))
            reduce = entry["reduce"]
            if reduce not in _AGGREGATORS:
                raise ValueError(f"metric {name!r}: unknown reduce {reduce!r} in the saved state")
            aggregator = _new_aggregator(reduce, self.device)
            value = torch.tensor(entry["value"], dtype=torch.float32, device=self.device)
            if reduce == "sum" and not first_rank:
                value = torch.zeros_like(value)
            if reduce == "mean":
                aggregator.update(value, weight=entry.get("weight", 1.0))
            else:
                aggregator.update(value)
            self._aggregators[path] = aggregator
            self._settings[path] = (reduce, False)


def _new_aggregator(reduce: Reduce, device: torch.device | str, sync: bool = True) -> Metric:
    # NaNs are reported, not dropped: a non-finite loss must show in the results.
    return _AGGREGATORS[reduce](nan_strategy="disable", sync_on_compute=sync).to(device)


def _as_path(key: MetricKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _stack(values: list[Any]) -> torch.Tensor:
    if all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in values):
        return torch.stack(values).float()  # the common case (one scalar per step): one op
    device = next((v.device for v in values if isinstance(v, torch.Tensor)), None)
    tensors = [torch.as_tensor(v, dtype=torch.float32, device=device).reshape(-1) for v in values]
    return torch.cat(tensors) if len(tensors) > 1 else tensors[0]


def _set_nested(results: dict[str, Any], path: tuple[str, ...], value: float) -> None:
    node = results
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
