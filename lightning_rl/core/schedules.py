"""Values that change with training progress: RLlib's piecewise-linear schedules.

A schedule setting is either a constant number or a list of ``[timestep, value]`` pairs.
Between two pairs the value is interpolated linearly; after the last pair it stays at the
last value. The first pair must start at timestep 0 so the value is defined from the start.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any, Union

ScheduleSetting = Union[float, Sequence[Sequence[float]]]


class Schedule:
    """A constant or piecewise-linear function of the timestep.

    Args:
        setting: A number, or RLlib's piecewise list ``[[timestep, value], ...]`` with
            strictly increasing timesteps that starts at timestep 0.
        name: What the schedule sets (used in error messages), e.g. ``"lr"``.
        allow_negative: Whether values below zero are valid (learning rates are not).

    Raises:
        ValueError: If the setting is not a number or a well-formed piecewise list.
    """

    def __init__(self, setting: ScheduleSetting, *, name: str = "value", allow_negative: bool = False) -> None:
        self.name = name
        self._timesteps, self._values = _parse_setting(setting, name, allow_negative)

    @property
    def is_constant(self) -> bool:
        return len(self._values) == 1

    def value(self, timestep: float) -> float:
        """The scheduled value at ``timestep`` (clamped to the first and last pair)."""
        if self.is_constant or timestep <= self._timesteps[0]:
            return self._values[0]
        if timestep >= self._timesteps[-1]:
            return self._values[-1]
        right = bisect.bisect_right(self._timesteps, timestep)
        t0, t1 = self._timesteps[right - 1], self._timesteps[right]
        v0, v1 = self._values[right - 1], self._values[right]
        return v0 + (timestep - t0) / (t1 - t0) * (v1 - v0)

    def __repr__(self) -> str:
        if self.is_constant:
            return f"Schedule({self._values[0]!r}, name={self.name!r})"
        pairs = [[t, v] for t, v in zip(self._timesteps, self._values)]
        return f"Schedule({pairs!r}, name={self.name!r})"


def check_schedule(
    name: str, value: Any, *, optional: bool = False, high: float | None = None, where: str = ""
) -> None:
    """Raise unless ``value`` is a schedule setting (a number >= 0 or well-formed pairs), as ``Schedule`` reads it.

    Takes the arguments of ``lightning_rl.core.arguments``' checks, so tables of them can hold it.

    Args:
        name: The argument's name, for the error.
        value: What was given.
        optional: Whether ``None`` is allowed (e.g. an actor's ``lr`` that falls back to the Learner's).
        high: The largest value the schedule may reach (1 for a probability), ``None`` for no bound.
        where: Where the value came from, put before the message.
    """
    if optional and value is None:
        return
    Schedule(value, name=f"{where}: {name}" if where else name)
    values = [value] if isinstance(value, (int, float)) else [pair[1] for pair in value]
    if high is not None and any(number > high for number in values):
        prefix = f"{where}: " if where else ""
        raise ValueError(f"{prefix}{name} must stay in [0, {high:g}], got {value!r}")


def _parse_setting(setting: ScheduleSetting, name: str, allow_negative: bool) -> tuple[list[float], list[float]]:
    if isinstance(setting, bool):
        raise ValueError(f"{name}: expected a number or a list of [timestep, value] pairs, got {setting!r}")
    if isinstance(setting, (int, float)):
        pairs = [[0, setting]]
    elif isinstance(setting, Sequence) and not isinstance(setting, str) and len(setting) > 0:
        pairs = setting
    else:
        raise ValueError(f"{name}: expected a number or a non-empty list of [timestep, value] pairs, got {setting!r}")

    timesteps: list[float] = []
    values: list[float] = []
    for pair in pairs:
        if (
            not isinstance(pair, Sequence)
            or isinstance(pair, str)
            or len(pair) != 2
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in pair)
        ):
            raise ValueError(f"{name}: every schedule entry must be a [timestep, value] pair of numbers, got {pair!r}")
        timestep, value = float(pair[0]), float(pair[1])
        if not (math.isfinite(timestep) and math.isfinite(value)):
            raise ValueError(f"{name}: schedule entries must be finite, got {list(pair)!r}")
        if value < 0 and not allow_negative:
            raise ValueError(f"{name}: values must be >= 0, got {value} at timestep {pair[0]}")
        if timesteps and timestep <= timesteps[-1]:
            raise ValueError(
                f"{name}: schedule timesteps must be strictly increasing, got {pair[0]} after {timesteps[-1]:g}"
            )
        timesteps.append(timestep)
        values.append(value)
    if timesteps[0] != 0:
        raise ValueError(f"{name}: a schedule must start at timestep 0, got {pairs[0][0]}")
    return timesteps, values
