"""The range checks of plain argument values, shared by every layer that validates its arguments.

Each check raises a one-line ``ValueError`` that names the argument, the range it must be in
and the value it got (``"gamma must be in [0, 1], got 1.5"``), prefixed by ``where`` when the
caller says where the value came from (``"module 'p0': gamma must be in [0, 1], got 1.5"``).
A bool is never a number here, although Python counts it as an int.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def is_real(value: Any) -> bool:
    """Return whether ``value`` is an int or float (numpy ones included), but not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))


def is_int(value: Any) -> bool:
    """Return whether ``value`` is an int (numpy ones included), but not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def check_int(name: str, value: Any, *, minimum: int = 1, optional: bool = False, where: str = "", hint: str = "") -> None:
    """Raise unless ``value`` is an int ``>= minimum`` (or ``None``, when ``optional``).

    Args:
        name: The argument's name, for the error.
        value: What was given.
        minimum: The smallest allowed value.
        optional: Whether ``None`` is allowed.
        where: Where the value came from (``"Learner"``, ``"module 'p0'"``), put before the message.
        hint: Words after the range, before the value (``" (one per rank)"``).
    """
    if optional and value is None:
        return
    if not is_int(value) or value < minimum:
        allowed = f"an int >= {minimum}{hint}" + (" or None" if optional else "")
        raise ValueError(f"{_prefix(where)}{name} must be {allowed}, got {value!r}")


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
    where: str = "",
) -> None:
    """Raise unless ``value`` is a real number in the given range (or ``None``, when ``optional``).

    The error says the range as a user reads it: ``in [0, 1]`` or ``in (0, 1]`` when both
    ends are set, ``a positive number`` for ``low=0, low_open=True``, ``a number >= 0``.

    Args:
        name: The argument's name, for the error.
        value: What was given.
        low: The lower end, ``None`` for none.
        high: The upper end, ``None`` for none.
        low_open: Whether ``low`` itself is excluded.
        high_open: Whether ``high`` itself is excluded.
        optional: Whether ``None`` is allowed.
        where: Where the value came from, put before the message.
    """
    if optional and value is None:
        return
    fits = is_real(value)
    if fits and low is not None:
        fits = value > low if low_open else value >= low
    if fits and high is not None:
        fits = value < high if high_open else value <= high
    if fits:
        return
    raise ValueError(f"{_prefix(where)}{name} must be {_range(low, high, low_open, high_open, optional)}, got {value!r}")


def check_probability(name: str, value: Any, *, where: str = "") -> None:
    """Raise unless ``value`` is a number in ``[0, 1]`` (a discount, a GAE lambda, a quantile)."""
    check_number(name, value, low=0, high=1, where=where)


def _range(low: float | None, high: float | None, low_open: bool, high_open: bool, optional: bool) -> str:
    or_none = " or None" if optional else ""
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{_plain(low)}, {_plain(high)}{')' if high_open else ']'}{or_none}"
    if low == 0 and low_open and high is None:
        return f"a positive number{or_none}"
    if low is not None:
        return f"a number {'>' if low_open else '>='} {_plain(low)}{or_none}"
    if high is not None:
        return f"a number {'<' if high_open else '<='} {_plain(high)}{or_none}"
    return f"a number{or_none}"


def _plain(bound: float) -> str:
    """``1`` rather than ``1.0`` for a whole bound."""
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""
