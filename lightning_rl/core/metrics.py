"""The Learner's metrics: values logged during an update, reduced to plain floats.

``MetricsLogger.log_value`` keeps RLlib's meaning of its arguments:

=====================================  ===================================================
``log_value(key, value, ...)``          what ``reduce()`` reports
=====================================  ===================================================
``reduce="mean"`` (no window, no EMA)   an exponential moving average, coefficient 0.01
``reduce="mean", ema_coeff=c``          ``ema = (1 - c) * ema + c * value``; the first value
                                        starts it
``window=n``                            the reduce over the last ``n`` values, which may
                                        span earlier reduces; RLlib's "last value" is
                                        ``window=1``
``window=math.inf``                     the reduce over every value since the last clear
``reduce="sum" | "min" | "max"``        running over every value since the last clear:
                                        lifetime counters keep counting
``clear_on_reduce=True``                each ``reduce`` starts afresh: with
                                        ``window=math.inf``, the mean of one update
=====================================  ===================================================

Logging is cheap on the hot path: ``log_value`` appends a detached tensor (or a number) to a
list, so a minibatch step never waits on the device; a CPU tensor, which has no device to wait
for, is appended as its number (except inside ``recording``, whose replays rewrite it). ``reduce`` reads every pending value of
every key back in one transfer and folds them into plain-float statistics on this rank.
These are plain floats, not torchmetrics objects: an off-policy Learner reduces after every
env step, and torchmetrics' per-key update and reset bookkeeping cost as much as SAC's
backward pass.

When a process group is running, ``reduce`` then folds every rank's statistics into one
result with a fixed, small number of collective calls (the keys, then two packed tensors),
whatever the number of keys: a mean pools the values of all ranks (an EMA counts each rank's
average once), a sum adds, min and max take the extreme. Ranks may have logged different keys
(a rank with no rows of some module logs none of its losses): every key logged anywhere is
reported everywhere, from the ranks that have it, so every rank returns the same numbers.
NaNs propagate instead of being skipped (RLlib skips them): a non-finite loss must show.
"""

from __future__ import annotations

import abc
import contextlib
import math
from collections import defaultdict, deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple, Union

import torch
import torch.distributed as dist

Reduce = Literal["mean", "sum", "min", "max"]
MetricKey = Union[str, tuple[str, ...]]

DEFAULT_EMA_COEFF = 0.01
_REDUCES = ("mean", "sum", "min", "max")
_SEPARATOR = "/"
# Codes of the reduce kinds in the packed cross-rank fold (0: the rank never logged the key).
_REDUCE_CODES: dict[str, int] = {"mean": 1, "sum": 2, "min": 3, "max": 4}
_REDUCES_BY_CODE = {code: reduce for reduce, code in _REDUCE_CODES.items()}
Path = tuple[str, ...]


class _Settings(NamedTuple):
    """How one key's values are reduced; ``ema_coeff`` is resolved (RLlib's 0.01 default)."""

    reduce: str
    window: float | None
    ema_coeff: float | None
    clear_on_reduce: bool

    def describe(self) -> str:
        return (
            f"reduce={self.reduce!r}, window={self.window}, ema_coeff={self.ema_coeff}, "
            f"clear_on_reduce={self.clear_on_reduce}"
        )

    @property
    def adds_over_ranks(self) -> bool:
        """Whether ranks' values add up (a sum, a pooled mean): a restored total goes to one rank."""
        return self.reduce == "sum" or (self.reduce == "mean" and self.ema_coeff is None)


class RecordedValues:
    """Values logged inside ``MetricsLogger.recording``: their keys, and their tensors stacked into one.

    Attributes:
        entries: ``(path, value)`` in the order logged; a tensor value is a placeholder for its
            row of ``values``.
        values: The tensors' values as one float tensor, or ``None`` if none was a tensor.
    """

    def __init__(self) -> None:
        self.entries: list[tuple[Path, Any]] = []
        self.values: torch.Tensor | None = None


class MetricsLogger:
    """Collects named values and reduces them to a nested dict of floats.

    Keys are strings or tuples of strings (``(module_id, "total_loss")``); tuple keys become
    nested dicts in the results. See the module docstring for what each setting reports.
    """

    def __init__(self) -> None:
        self._pending: dict[Path, list[Any]] = {}
        self._stats: dict[Path, _Stat] = {}
        # The arguments each key was last logged with, as given: the hot path compares these
        # and only resolves and validates settings it has not seen.
        self._logged_as: dict[Path, tuple[Any, ...]] = {}
        # Inside ``recording``, CPU tensors stay tensors: a replay writes the values into them.
        self._recording = False

    def log_value(
        self,
        key: MetricKey,
        value: Any,
        *,
        reduce: Reduce = "mean",
        window: float | None = None,
        ema_coeff: float | None = None,
        clear_on_reduce: bool = False,
    ) -> None:
        """Record one value (a number or a non-empty tensor) under ``key``.

        Called from inside an update, this never synchronizes with the device. A tensor with
        several elements is one value: its mean, sum, minimum or maximum (per ``reduce``),
        computed on its device.

        Args:
            key: A string or a tuple of strings (a path in the nested results).
            value: A Python number, numpy value or tensor; tensors are detached (a CPU one is kept as its number).
            reduce: How values combine: ``mean``, ``sum``, ``min`` or ``max``.
            window: Reduce over the last ``window`` values only (an int >= 1), or over all
                values since the last clear (``math.inf``).
            ema_coeff: With ``reduce="mean"`` and no window, the EMA coefficient in (0, 1];
                ``None`` means 0.01.
            clear_on_reduce: Whether the values start afresh after each ``reduce``.

        Raises:
            ValueError: If a setting is invalid, the tensor is empty, or ``key`` was logged
                before with other settings.
        """
        path = key if type(key) is tuple else _as_path(key)
        if self._logged_as.get(path) != (reduce, window, ema_coeff, clear_on_reduce):
            self._register(path, reduce, window, ema_coeff, clear_on_reduce)
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if value.dim():
                value = _tensor_statistic(path, reduce, value)
            if value.device.type == "cpu" and not self._recording:
                # Read at once: a CPU tensor has no device to wait for, and one small tensor kept
                # per step lands between the step's large ones in the allocator's heap, pinning
                # an update's worth of freed pages (about 24 bytes per row of a BC update).
                value = value.item()
        elif not isinstance(value, (int, float)):
            value = _tensor_statistic(path, reduce, torch.as_tensor(value))  # numpy values
        pending = self._pending.get(path)
        if pending is None:
            self._pending[path] = [value]
        else:
            pending.append(value)

    def _register(self, path: Path, reduce: Any, window: Any, ema_coeff: Any, clear_on_reduce: Any) -> None:
        """Validate new settings for ``path``; create its statistic or check they match the known ones."""
        settings = _resolve_settings(reduce, window, ema_coeff, clear_on_reduce)
        known = self._stats.get(path)
        if known is None:
            self._stats[path] = _make_stat(settings)
        elif known.settings != settings:
            raise ValueError(
                f"metric {_SEPARATOR.join(path)!r} was first logged with {known.settings.describe()}; "
                f"cannot log it with {settings.describe()}"
            )
        self._logged_as[path] = (reduce, window, ema_coeff, clear_on_reduce)

    @contextlib.contextmanager
    def recording(self) -> Iterator[RecordedValues]:
        """Take the values logged inside the block out of the pending ones, into the yielded record.

        For code that runs once to be replayed many times (a CUDA graph's capture): the values
        logged at capture are placeholders whose memory the replays overwrite, so they are not
        kept; ``log_recorded`` logs, after each replay, what the replay computed. Tensors are
        gathered into one ``values`` tensor when the block ends (inside the capture, so a replay
        refreshes it too), and numbers are kept as they are.
        """
        before = {path: len(values) for path, values in self._pending.items()}
        record = RecordedValues()
        self._recording = True
        try:
            yield record
        finally:
            self._recording = False
            for path in list(self._pending):
                values = self._pending[path]
                taken = values[before.get(path, 0) :]
                del values[before.get(path, 0) :]
                if not values:
                    del self._pending[path]
                record.entries.extend((path, value) for value in taken)
            tensors = [value.float() for _, value in record.entries if isinstance(value, torch.Tensor)]
            record.values = torch.stack(tensors) if tensors else None

    def log_recorded(self, record: RecordedValues) -> None:
        """Log again the values of ``record`` (``recording``), tensors read from ``record.values`` now.

        One copy of ``record.values`` per call, so later replays cannot change what was logged.
        """
        copies = iter(record.values.clone().unbind() if record.values is not None else ())
        for path, value in record.entries:
            self._pending.setdefault(path, []).append(next(copies) if isinstance(value, torch.Tensor) else value)

    def log_dict(self, values: Mapping[str, Any], *, key: MetricKey = (), **kwargs: Any) -> None:
        """Log every entry of a (nested) dict under the prefix ``key``; ``kwargs`` as in ``log_value``."""
        prefix = _as_path(key) if key else ()
        for name, value in values.items():
            if isinstance(value, Mapping):
                self.log_dict(value, key=prefix + (name,), **kwargs)
            else:
                self.log_value(prefix + (name,), value, **kwargs)

    def reduce(self) -> dict[str, Any]:
        """Fold the values logged since the last call into the statistics and report them.

        Returns:
            A nested dict of Python floats: every key logged since the last call, and every
            key with ``clear_on_reduce=False`` that holds values. Keys with
            ``clear_on_reduce=True`` then start afresh.
        """
        pending = sorted(self._pending)
        for path, values in zip(pending, self._read_pending(pending)):
            self._stats[path].add(values)
        self._pending.clear()
        reported = set(pending)
        reported.update(path for path, stat in self._stats.items() if not stat.settings.clear_on_reduce)
        if _is_distributed():
            reported = _union_over_ranks(reported)
        values = self._fold(sorted(reported), self._stats)
        for path in pending:
            if self._stats[path].settings.clear_on_reduce:
                self._stats[path].reset()

        results: dict[str, Any] = {}
        for path, value in values.items():
            _set_nested(results, path, value)
        return results

    def _read_pending(self, paths: list[Path]) -> list[list[float]]:
        """Each path's pending values as Python numbers; the tensors are read back in one transfer."""
        flat = [value for path in paths for value in self._pending[path]]
        where = [index for index, value in enumerate(flat) if isinstance(value, torch.Tensor)]
        if where:
            for index, number in zip(where, _tensors_to_numbers([flat[i] for i in where])):
                flat[index] = number
        grouped, start = [], 0
        for path in paths:
            end = start + len(self._pending[path])
            grouped.append(flat[start:end])
            start = end
        return grouped

    def peek(self, key: MetricKey, *, across_ranks: bool = False) -> float:
        """The value ``key`` would reduce to now, changing nothing.

        Args:
            key: The metric.
            across_ranks: Reduce over all ranks, as ``reduce`` would (a collective call:
                every rank must peek the same keys in the same order). Otherwise, and in a
                single process, this rank's value alone.

        Raises:
            KeyError: If no rank (or, without ``across_ranks``, not this one) holds a value
                of ``key``: none logged since the last ``reduce`` for a cleared key, or ever.
        """
        path = _as_path(key)
        current = self._current(path)
        if across_ranks and _is_distributed():
            folded = self._fold([path], {path: current} if current is not None else {})
        else:
            folded = {path: current.value} if current is not None else {}
        if path not in folded:
            raise KeyError(f"no metric {_SEPARATOR.join(path)!r} has been logged since the last reduce")
        return folded[path]

    def _current(self, path: Path) -> _Stat | None:
        """A copy of ``path``'s statistic with its pending values added; ``None`` if it holds none."""
        stat = self._stats.get(path)
        if stat is None:
            return None
        current = stat.copy()
        if path in self._pending:
            current.add(self._read_pending([path])[0])
        return current if current.pooled()[1] else None

    def _fold(self, paths: list[Path], stats: Mapping[Path, _Stat]) -> dict[Path, float]:
        """``{path: value}`` of ``stats`` over all ranks (this rank alone without a group).

        Every rank must pass the same ``paths``; a rank may lack some of them in ``stats``,
        or hold no values for them.
        """
        if not _is_distributed():
            folded = {}
            for path in paths:
                total, weight = stats[path].pooled()
                if weight:
                    folded[path] = total / weight if stats[path].settings.reduce == "mean" else float(total)
            return folded
        # Two packed tensors, whatever the number of keys: [mean total, mean weight, sum]
        # added over ranks, and [reduce code, max, -min] maximized over ranks.
        added = torch.zeros(len(paths), 3, dtype=torch.float64)
        maximized = torch.full((len(paths), 3), -math.inf, dtype=torch.float64)
        maximized[:, 0] = 0
        for row, path in enumerate(paths):
            stat = stats.get(path)
            total, weight = stat.pooled() if stat is not None else (0.0, 0.0)
            if not weight:
                continue
            reduce = stat.settings.reduce
            maximized[row, 0] = _REDUCE_CODES[reduce]
            if reduce == "mean":
                added[row, 0], added[row, 1] = total, weight
            elif reduce == "sum":
                added[row, 2] = total
            elif reduce == "max":
                maximized[row, 1] = total
            else:
                maximized[row, 2] = -total
        device = _collective_device()
        added, maximized = added.to(device), maximized.to(device)
        dist.all_reduce(added, op=dist.ReduceOp.SUM)
        dist.all_reduce(maximized, op=dist.ReduceOp.MAX)
        folded = {}
        for path, (total, weight, summed), (code, largest, negated_smallest) in zip(
            paths, added.tolist(), maximized.tolist()
        ):
            reduce = _REDUCES_BY_CODE.get(int(code))
            if reduce == "mean":
                folded[path] = total / weight
            elif reduce == "sum":
                folded[path] = summed
            elif reduce == "max":
                folded[path] = largest
            elif reduce == "min":
                folded[path] = -negated_smallest
        return folded

    def delete(self, prefix: MetricKey) -> None:
        """Forget every metric whose key starts with ``prefix`` (e.g. a removed module's)."""
        prefix_path = _as_path(prefix)
        for table in (self._pending, self._stats, self._logged_as):
            for path in [p for p in table if p[: len(prefix_path)] == prefix_path]:
                del table[path]

    def get_state(self) -> dict[str, Any]:
        """The lasting metrics (``clear_on_reduce=False``), pending values included, as plain data.

        Each entry holds the key's settings and either ``windows`` (a window's values, oldest
        first, in a list per rank) or ``value`` and ``weight`` (a running value or an EMA, and
        the number of values behind it). ``torch.load(weights_only=True)`` reads it.

        On several ranks this is a collective call (like ``reduce``) and every rank returns
        the same state: running values and EMAs combined over ranks as ``reduce`` combines
        them, and every rank's window.
        """
        state = {}
        for path, stat in self._stats.items():
            current = self._current(path) if not stat.settings.clear_on_reduce else None
            if current is not None:
                state[_SEPARATOR.join(path)] = {**current.settings._asdict(), **current.entry()}
        if _is_distributed():
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, state)
            names = sorted({name for rank_state in gathered for name in rank_state})
            state = {name: _merge_rank_entries([s[name] for s in gathered if name in s]) for name in names}
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore what ``get_state`` returned (also in its format before windows and EMAs).

        Values logged but not yet reduced are dropped. Every rank restores the state so that
        ``reduce`` over the ranks reports what it reported when the state was saved: running
        values that add over ranks (a sum or a non-EMA mean) go to rank 0 alone, extremes and
        EMAs to every rank, and rank ``r`` of ``n`` takes the saved windows ``r, r + n, ...``
        (its own window when the number of ranks is unchanged).

        Raises:
            ValueError: If an entry names an unknown reduce or invalid settings.
        """
        rank, world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        self._pending.clear()
        self._stats.clear()
        self._logged_as.clear()
        for name, entry in state.items():
            settings, entry = _upgrade_entry(name, entry)
            stat = self._stats[tuple(name.split(_SEPARATOR))] = _make_stat(settings)
            if "windows" in entry:
                stat.load({"windows": entry["windows"][rank::world_size]})
            elif rank == 0 or not settings.adds_over_ranks:
                stat.load(entry)


class _Stat(abc.ABC):
    """The plain-float statistic of one metric; each subclass keeps one kind of settings.

    ``pooled()`` is ``(total, weight)``: the weight counts the values behind the statistic
    (0: none); for a mean the value is ``total / weight`` and ranks pool by adding both,
    otherwise the value is ``total``.
    """

    __slots__ = ("settings",)

    def __init__(self, settings: _Settings) -> None:
        self.settings = settings
        self.reset()

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget every value."""

    @abc.abstractmethod
    def add(self, values: Sequence[float]) -> None:
        """Take in logged values, oldest first."""

    @abc.abstractmethod
    def pooled(self) -> tuple[float, float]:
        """``(total, weight)`` as the class docstring describes."""

    @abc.abstractmethod
    def entry(self) -> dict[str, Any]:
        """The values part of the saved state (``get_state``)."""

    @abc.abstractmethod
    def load(self, entry: Mapping[str, Any]) -> None:
        """Restore what ``entry`` returned."""

    def copy(self) -> _Stat:
        copied = _make_stat(self.settings)
        if self.pooled()[1]:
            copied.load(self.entry())
        return copied

    @property
    def value(self) -> float:
        total, weight = self.pooled()
        if self.settings.reduce == "mean":
            return total / weight if weight else math.nan
        return float(total)


class _Running(_Stat):
    """A sum, extreme or mean over every value since the last clear (no window, or an infinite one)."""

    __slots__ = ("total", "weight")

    def reset(self) -> None:
        self.total = {"min": math.inf, "max": -math.inf}.get(self.settings.reduce, 0.0)
        self.weight = 0.0

    def add(self, values: Sequence[float]) -> None:
        reduce = self.settings.reduce
        if reduce in ("min", "max"):
            self.total = _extreme(reduce, [self.total, *values])
        else:
            self.total += sum(values)
        self.weight += len(values)

    def pooled(self) -> tuple[float, float]:
        return self.total, self.weight

    def entry(self) -> dict[str, Any]:
        return {"value": self.value, "weight": self.weight}

    def load(self, entry: Mapping[str, Any]) -> None:
        value, self.weight = float(entry["value"]), float(entry["weight"])
        self.total = value * self.weight if self.settings.reduce == "mean" else value


class _Window(_Stat):
    """The last ``window`` values."""

    __slots__ = ("values",)

    def reset(self) -> None:
        self.values: deque[float] = deque(maxlen=int(self.settings.window))

    def add(self, values: Sequence[float]) -> None:
        self.values.extend(values)

    def pooled(self) -> tuple[float, float]:
        if not self.values:
            return 0.0, 0.0
        reduce = self.settings.reduce
        total = sum(self.values) if reduce in ("mean", "sum") else _extreme(reduce, self.values)
        return total, float(len(self.values))

    def entry(self) -> dict[str, Any]:
        return {"windows": [[float(value) for value in self.values]]}

    def load(self, entry: Mapping[str, Any]) -> None:
        for window in entry["windows"]:  # the deque keeps the newest values of the last window
            self.values.extend(float(value) for value in window)


class _Ema(_Stat):
    """An exponential moving average; the first value starts it."""

    __slots__ = ("ema",)

    def reset(self) -> None:
        self.ema: float | None = None

    def add(self, values: Sequence[float]) -> None:
        coeff, ema = self.settings.ema_coeff, self.ema
        for value in values:
            ema = float(value) if ema is None else (1.0 - coeff) * ema + coeff * value
        self.ema = ema

    def pooled(self) -> tuple[float, float]:
        return (0.0, 0.0) if self.ema is None else (self.ema, 1.0)

    def entry(self) -> dict[str, Any]:
        return {"value": self.ema, "weight": 1.0}

    def load(self, entry: Mapping[str, Any]) -> None:
        self.ema = float(entry["value"])


def _make_stat(settings: _Settings) -> _Stat:
    if settings.ema_coeff is not None:
        return _Ema(settings)
    if settings.window is None or settings.window == math.inf:
        return _Running(settings)
    return _Window(settings)


def _resolve_settings(reduce: Any, window: Any, ema_coeff: Any, clear_on_reduce: Any) -> _Settings:
    """Validate ``log_value``'s settings and fill in RLlib's default EMA for a plain mean."""
    if reduce not in _REDUCES:
        hint = " (RLlib's 'last' value is reduce='mean', window=1)" if reduce == "last" else ""
        raise ValueError(f"reduce must be one of {list(_REDUCES)}, got {reduce!r}{hint}")
    valid_window = window is None or window == math.inf or (type(window) is int and window >= 1)
    if not valid_window:
        raise ValueError(f"window must be None, an int >= 1 or math.inf, got {window!r}")
    if ema_coeff is not None:
        if isinstance(ema_coeff, bool) or not isinstance(ema_coeff, (int, float)) or not 0 < ema_coeff <= 1:
            raise ValueError(f"ema_coeff must be a number in (0, 1], got {ema_coeff!r}")
        if reduce != "mean":
            raise ValueError(f"ema_coeff is only allowed with reduce='mean', got reduce={reduce!r}")
        if window is not None:
            raise ValueError(f"give either window or ema_coeff, not both (got window={window}, ema_coeff={ema_coeff})")
    if not isinstance(clear_on_reduce, bool):
        raise ValueError(f"clear_on_reduce must be a bool, got {clear_on_reduce!r}")
    if reduce == "mean" and window is None and ema_coeff is None:
        ema_coeff = DEFAULT_EMA_COEFF
    return _Settings(reduce, window, None if ema_coeff is None else float(ema_coeff), clear_on_reduce)


def _upgrade_entry(name: str, entry: Mapping[str, Any]) -> tuple[_Settings, Mapping[str, Any]]:
    """The settings and values part of one saved metric, in this format or the one before windows and EMAs."""
    reduce = entry.get("reduce")
    if "clear_on_reduce" in entry:
        try:
            return _resolve_settings(reduce, entry["window"], entry["ema_coeff"], entry["clear_on_reduce"]), entry
        except ValueError as error:
            raise ValueError(f"metric {name!r} in the saved state: {error}") from None
    # Before: {"reduce", "value"[, "weight"]} of a metric logged with clear_on_reduce=False,
    # a mean over every value ever logged, or the last one.
    if reduce == "last":
        return _Settings("mean", 1, None, False), {"windows": [[entry["value"]]]}
    if reduce not in _REDUCES:
        raise ValueError(f"metric {name!r}: unknown reduce {reduce!r} in the saved state")
    window = math.inf if reduce == "mean" else None
    return _Settings(reduce, window, None, False), {"value": entry["value"], "weight": entry.get("weight", 1.0)}


def _merge_rank_entries(entries: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One saved entry from every rank's entry of a key, combined as ``reduce`` combines ranks."""
    if "windows" in entries[0]:
        return {**entries[0], "windows": [window for entry in entries for window in entry["windows"]]}
    reduce = entries[0]["reduce"]
    values, weights = [entry["value"] for entry in entries], [entry["weight"] for entry in entries]
    if reduce == "mean":  # pooled; each rank's EMA has weight 1
        value = sum(v * w for v, w in zip(values, weights)) / sum(weights)
    else:
        value = sum(values) if reduce == "sum" else _extreme(reduce, values)
    return {**entries[0], "value": value, "weight": sum(weights)}


def _tensor_statistic(path: Path, reduce: str, value: torch.Tensor) -> torch.Tensor:
    """A tensor with several elements as one value (a 0-d tensor on its device); no device sync."""
    if value.numel() == 0:
        raise ValueError(f"metric {_SEPARATOR.join(path)!r}: cannot log an empty tensor")
    if reduce == "mean":
        return value.float().mean() if not value.is_floating_point() else value.mean()
    return getattr(value, reduce)()


def _tensors_to_numbers(tensors: list[torch.Tensor]) -> list[float]:
    """0-d tensors as Python numbers: one ``torch.stack`` and one read-back per device."""
    by_device: dict[torch.device, list[int]] = defaultdict(list)
    for index, tensor in enumerate(tensors):
        by_device[tensor.device].append(index)
    numbers: list[Any] = [None] * len(tensors)
    for indices in by_device.values():
        # torch.stack promotes mixed dtypes; .tolist() is the device sync.
        for index, number in zip(indices, torch.stack([tensors[i] for i in indices]).tolist()):
            numbers[index] = number
    return numbers


def _extreme(reduce: str, values: Any) -> float:
    """``min`` or ``max`` of ``values``; NaN if any is NaN (Python's min and max would depend on the order)."""
    values = list(values)
    if any(math.isnan(v) for v in values):
        return math.nan
    return float(min(values) if reduce == "min" else max(values))


def _is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _collective_device() -> torch.device:
    # NCCL reduces CUDA tensors only; gloo reduces CPU tensors.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _union_over_ranks(paths: set[Path]) -> set[Path]:
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sorted(paths))
    return {tuple(path) for rank_paths in gathered for path in rank_paths}


def _as_path(key: MetricKey) -> Path:
    return (key,) if isinstance(key, str) else tuple(key)


def _set_nested(results: dict[str, Any], path: Path, value: float) -> None:
    node = results
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
