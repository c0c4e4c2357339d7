"""The Learner's metrics: values logged during an update, reduced to plain floats.

Logging is cheap on the hot path: ``log_value`` only appends a detached tensor (or a number)
to a list, so a minibatch step never waits on the device. ``reduce`` stacks each key's values
once, reduces them on their device, and reads all keys back in one transfer into plain
running aggregates (sum and weight, or the extreme) on this rank. These are plain floats, not
torchmetrics objects: an off-policy Learner reduces after every env step, and torchmetrics'
per-key update and reset bookkeeping cost as much as SAC's backward pass.

When a process group is running, ``reduce`` then folds every rank's aggregator states into
one result with a fixed, small number of collective calls (the keys, then two packed
tensors), whatever the number of keys. Ranks may have logged different keys (a rank with no
rows of some module logs none of its losses): every key logged anywhere is reported
everywhere, from the ranks that have it, so every rank returns the same numbers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Literal, Union

import torch
import torch.distributed as dist

Reduce = Literal["mean", "sum", "min", "max", "last"]
MetricKey = Union[str, tuple[str, ...]]

# "last" keeps only the newest value of a reduce period; a mean over ranks of that value is
# what a multi-rank learner reports (the ranks agree on such values).
_REDUCES = ("mean", "sum", "min", "max", "last")
_SEPARATOR = "/"
# Codes of the reduce kinds in the packed cross-rank fold (0: the rank never logged the key).
_REDUCE_CODES: dict[str, int] = {"mean": 1, "last": 2, "sum": 3, "min": 4, "max": 5}
_REDUCES_BY_CODE = {code: reduce for reduce, code in _REDUCE_CODES.items()}


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
        self._aggregators: dict[tuple[str, ...], _Aggregate] = {}
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
        if reduce not in _REDUCES:
            raise ValueError(f"reduce must be one of {sorted(_REDUCES)}, got {reduce!r}")
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
        pending = sorted(self._pending)
        for path, (value, weight) in zip(pending, self._reduce_pending(pending)):
            reduce, _ = self._settings[path]
            aggregator = self._aggregators.get(path)
            if aggregator is None:
                aggregator = self._aggregators[path] = _Aggregate(reduce)
            if reduce == "last":
                aggregator.reset()
            aggregator.add(value, weight)
        reported = set(self._pending) | {path for path in self._aggregators if not self._settings[path][1]}
        self._pending.clear()
        if _is_distributed():
            reported = _union_over_ranks(reported)
        values = self._fold(sorted(reported), self._aggregators)

        results: dict[str, Any] = {}
        for path, (_, value, _) in values.items():
            _set_nested(results, path, value)
        for path in reported:
            if path in self._aggregators and self._settings[path][1]:
                self._aggregators[path].reset()
        return results

    def _reduce_pending(self, paths: list[tuple[str, ...]]) -> list[tuple[float, float]]:
        """``(value, weight)`` of each path's pending values, read from the device in one transfer per device.

        For a mean (and ``last``, over the newest value's elements) the value is the sum of
        the elements and the weight their number; otherwise the sum, minimum or maximum, weight 1.
        """
        statistics: list[tuple[torch.Tensor | float, float]] = []
        for path in paths:
            reduce, _ = self._settings[path]
            values = self._pending[path]
            if reduce == "last":
                values = values[-1:]
            if len(values) == 1 and not (isinstance(values[0], torch.Tensor) and values[0].dim() > 0):
                # One scalar (an update of one step): its own statistic, no stacking.
                value = values[0]
                statistics.append((value if isinstance(value, torch.Tensor) else float(value), 1.0))
                continue
            values = _stack(values)
            if reduce in ("mean", "last", "sum"):
                statistics.append((values.sum(), float(values.numel()) if reduce != "sum" else 1.0))
            else:
                statistics.append((values.min() if reduce == "min" else values.max(), 1.0))
        numbers = [value for value, _ in statistics]
        by_device: dict[torch.device, list[int]] = defaultdict(list)
        for index, value in enumerate(numbers):
            if isinstance(value, torch.Tensor):
                by_device[value.device].append(index)
        for indices in by_device.values():
            stacked = torch.stack([numbers[i].float() for i in indices]).tolist()
            for index, number in zip(indices, stacked):
                numbers[index] = number
        return [(number, weight) for number, (_, weight) in zip(numbers, statistics)]

    def peek(self, key: MetricKey, *, across_ranks: bool = False) -> float:
        """The value ``key`` would reduce to now, clearing nothing.

        Args:
            key: The metric.
            across_ranks: Reduce over all ranks, as ``reduce`` would (a collective call:
                every rank must peek the same keys in the same order). Otherwise, and in a
                single process, this rank's value alone.

        Raises:
            KeyError: If no rank (or, without ``across_ranks``, not this one) logged ``key``
                since the last ``reduce`` (or ever, for lasting metrics).
        """
        path = _as_path(key)
        aggregator = self._current(path)
        if across_ranks and _is_distributed():
            folded = self._fold([path], {path: aggregator} if aggregator is not None else {})
            if path in folded:
                return folded[path][1]
        elif aggregator is not None:
            return aggregator.value
        raise KeyError(f"no metric {_SEPARATOR.join(path)!r} has been logged since the last reduce")

    def _current(self, path: tuple[str, ...]) -> _Aggregate | None:
        """A copy of ``path``'s aggregate with the pending values folded in; ``None`` if there is none."""
        if path not in self._settings or (self._settings[path][1] and path not in self._pending):
            return None
        reduce, _ = self._settings[path]
        aggregator = _Aggregate(reduce)
        if path in self._aggregators and not (reduce == "last" and path in self._pending):
            aggregator.add(self._aggregators[path].total, self._aggregators[path].weight)
        if path in self._pending:
            aggregator.add(*self._reduce_pending([path])[0])
        return aggregator

    def _fold(
        self, paths: list[tuple[str, ...]], aggregators: Mapping[tuple[str, ...], _Aggregate]
    ) -> dict[tuple[str, ...], tuple[Reduce, float, float]]:
        """``{path: (reduce, value, weight)}`` of ``aggregators`` over all ranks (this rank alone without a group).

        The weight is that of a mean (values averaged so far), 1 otherwise. Every rank must
        pass the same ``paths``; a rank may lack some of them in ``aggregators``.
        """
        if not _is_distributed():
            return {
                path: (self._settings[path][0], aggregators[path].value, aggregators[path].weight)
                for path in paths
                if path in aggregators
            }
        # Two packed tensors, whatever the number of keys: [mean sum, mean weight, sum] added
        # over ranks, and [reduce code, max, -min] maximized over ranks.
        added = torch.zeros(len(paths), 3, dtype=torch.float64)
        maximized = torch.full((len(paths), 3), -math.inf, dtype=torch.float64)
        maximized[:, 0] = 0
        for row, path in enumerate(paths):
            aggregator = aggregators.get(path)
            if aggregator is None:
                continue
            reduce = self._settings[path][0]
            maximized[row, 0] = _REDUCE_CODES[reduce]
            if reduce in ("mean", "last"):
                added[row, 0], added[row, 1] = aggregator.total, aggregator.weight
            elif reduce == "sum":
                added[row, 2] = aggregator.total
            elif reduce == "max":
                maximized[row, 1] = aggregator.total
            else:
                maximized[row, 2] = -aggregator.total
        device = _collective_device()
        added, maximized = added.to(device), maximized.to(device)
        dist.all_reduce(added, op=dist.ReduceOp.SUM)
        dist.all_reduce(maximized, op=dist.ReduceOp.MAX)
        folded = {}
        for path, (total, weight, summed), (code, largest, negated_smallest) in zip(
            paths, added.tolist(), maximized.tolist()
        ):
            reduce = _REDUCES_BY_CODE.get(int(code))
            if reduce in ("mean", "last"):
                folded[path] = (reduce, total / weight if weight else math.nan, weight)
            elif reduce == "sum":
                folded[path] = (reduce, summed, 1.0)
            elif reduce == "max":
                folded[path] = (reduce, largest, 1.0)
            elif reduce == "min":
                folded[path] = (reduce, -negated_smallest, 1.0)
        return folded

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
        lasting = {path for path, (_, clear_on_reduce) in self._settings.items() if not clear_on_reduce}
        if _is_distributed():
            lasting = _union_over_ranks(lasting)
        paths = sorted(lasting)
        current = {path: aggregator for path in paths if (aggregator := self._current(path)) is not None}
        state = {}
        for path, (reduce, value, weight) in self._fold(paths, current).items():
            entry = {"reduce": reduce, "value": value}
            if reduce == "mean":
                entry["weight"] = weight
            state[_SEPARATOR.join(path)] = entry
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore what ``get_state`` returned; values logged but not yet reduced are dropped.

        A sum or mean is restored on rank 0 only, so that the total (or the weight of the
        mean) over ranks stays what was saved.
        """
        first_rank = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        self._pending.clear()
        self._aggregators.clear()
        self._settings.clear()
        for name, entry in state.items():
            path = tuple(name.split(_SEPARATOR))
            reduce = entry["reduce"]
            if reduce not in _REDUCES:
                raise ValueError(f"metric {name!r}: unknown reduce {reduce!r} in the saved state")
            aggregator = _Aggregate(reduce)
            value = float(entry["value"])
            if reduce == "mean":
                if first_rank:
                    weight = float(entry.get("weight", 1.0))
                    aggregator.add(value * weight, weight)
            elif reduce == "sum":
                aggregator.add(value if first_rank else 0.0, 1.0)
            else:
                aggregator.add(value, 1.0)
            self._aggregators[path] = aggregator
            self._settings[path] = (reduce, False)


class _Aggregate:
    """The running aggregate of one metric, in plain floats.

    ``mean`` and ``last``: ``total`` is the sum of the values, ``weight`` their number (the
    value is their ratio); ``sum``: ``total`` is the sum; ``min`` / ``max``: ``total`` is the
    extreme so far. NaNs propagate: a non-finite loss must show in the results.
    """

    __slots__ = ("reduce", "total", "weight")

    def __init__(self, reduce: Reduce) -> None:
        self.reduce = reduce
        self.reset()

    def reset(self) -> None:
        self.total = {"min": math.inf, "max": -math.inf}.get(self.reduce, 0.0)
        self.weight = 0.0

    def add(self, value: float, weight: float) -> None:
        """Fold in a statistic of new values (as ``MetricsLogger._reduce_pending`` returns it)."""
        if self.reduce == "min":
            self.total = value if math.isnan(value) else min(self.total, value)
        elif self.reduce == "max":
            self.total = value if math.isnan(value) else max(self.total, value)
        else:
            self.total += value
        self.weight += weight

    @property
    def value(self) -> float:
        if self.reduce in ("mean", "last"):
            return self.total / self.weight if self.weight else math.nan
        return self.total


def _is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _collective_device() -> torch.device:
    # NCCL reduces CUDA tensors only; gloo reduces CPU tensors.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _union_over_ranks(paths: set[tuple[str, ...]]) -> set[tuple[str, ...]]:
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sorted(paths))
    return {tuple(path) for rank_paths in gathered for path in rank_paths}


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
