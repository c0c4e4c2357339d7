"""The range checks of plain argument values, shared by every layer that validates its arguments.

Each check raises a one-line ``ValueError`` that names the argument, the range it must be in
and the value it got (``"gamma must be in [0, 1], got 1.5"``), prefixed by ``where`` when the
caller says where the value came from (``"module 'p0': gamma must be in [0, 1], got 1.5"``).
A bool is never a number here, although Python counts it as an int.

Every check takes ``(name, value, *, where=...)`` first, so a table of checks per argument name
(``{"gamma": check_probability, "tau": partial(check_number, low=0, high=1, low_open=True)}``,
as ``Learner.hyperparameter_checks``) can run them all the same way (:class:`ArgumentCheck`).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any, Protocol

import numpy as np


class ArgumentCheck(Protocol):
    """A check of one argument: raises a one-line ``ValueError`` naming ``name`` unless ``value`` is allowed."""

    def __call__(self, name: str, value: Any, *, where: str = "") -> None: ...


def is_real(value: Any) -> bool:
    """Return whether ``value`` is an int or float (numpy ones included), but not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))


def is_int(value: Any) -> bool:
    """Return whether ``value`` is an int (numpy ones included), but not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def check_int(
    name: str, value: Any, *, minimum: int = 1, optional: bool = False, where: str = "", hint: str = ""
) -> None:
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


#: The most env copies one runner may step (per rank): a documented ceiling, checked before anything
#: is built, so that a typo (``num_envs 1e12``) is one error rather than memory growing until the
#: kernel's OOM killer ends the run. 4,096 CartPole copies take ~6 MB; Atari frames ~1.2 GB.
MAX_NUM_ENVS = 4096


def check_num_envs(name: str, value: Any, *, optional: bool = False, where: str = "") -> None:
    """Raise unless ``value`` is an env count in ``[1, MAX_NUM_ENVS]`` (or ``None``, when ``optional``)."""
    check_int(name, value, optional=optional, where=where)
    if value is not None and value > MAX_NUM_ENVS:
        raise ValueError(
            f"{_prefix(where)}{name} must be at most MAX_NUM_ENVS = {MAX_NUM_ENVS} (env copies on one rank; "
            f"use more ranks for more), got {value!r}"
        )


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    finite: bool = False,
    optional: bool = False,
    where: str = "",
) -> None:
    """Raise unless ``value`` is a real number in the given range (or ``None``, when ``optional``).

    The error says the range as a user reads it: ``a number in [0, 1]`` or ``a number in (0, 1]``
    when both ends are set, ``a positive number`` for ``low=0, low_open=True``, ``a number >= 0``,
    and with ``finite`` ``a finite number > 0``, ``a finite number >= 0``, ``a finite number``.

    Args:
        name: The argument's name, for the error.
        value: What was given.
        low: The lower end, ``None`` for none.
        high: The upper end, ``None`` for none.
        low_open: Whether ``low`` itself is excluded.
        high_open: Whether ``high`` itself is excluded.
        finite: Whether infinities (and NaN) are refused too; a range with both ends refuses them anyway.
        optional: Whether ``None`` is allowed.
        where: Where the value came from, put before the message.
    """
    if optional and value is None:
        return
    fits = is_real(value) and (math.isfinite(value) or not finite)
    if fits and low is not None:
        fits = value > low if low_open else value >= low
    if fits and high is not None:
        fits = value < high if high_open else value <= high
    if fits:
        return
    expected = _range(low, high, low_open, high_open, finite, optional)
    raise ValueError(f"{_prefix(where)}{name} must be {expected}, got {value!r}")


def check_probability(name: str, value: Any, *, where: str = "") -> None:
    """Raise unless ``value`` is a number in ``[0, 1]`` (a discount, a GAE lambda).

    Says ``"gamma must be in [0, 1]"``, without ``check_number``'s ``a number``: the words
    PPO's and the replay Learners' discount checks have always used (and tests match).
    """
    if not (is_real(value) and 0 <= value <= 1):
        raise ValueError(f"{_prefix(where)}{name} must be in [0, 1], got {value!r}")


def check_bool(name: str, value: Any, *, where: str = "") -> None:
    """Raise unless ``value`` is ``True`` or ``False`` (not ``1``, not ``"yes"``)."""
    if not isinstance(value, bool):
        raise ValueError(f"{_prefix(where)}{name} must be True or False, got {value!r}")


def check_choice(name: str, value: Any, *, choices: Collection[Any], where: str = "") -> None:
    """Raise unless ``value`` is one of ``choices``; the error shows ``choices`` as given (a tuple or a list).

    Args:
        name: The argument's name, for the error.
        value: What was given.
        choices: The allowed values.
        where: Where the value came from, put before the message.
    """
    if value not in choices:
        raise ValueError(f"{_prefix(where)}{name} must be one of {choices}, got {value!r}")


def _range(low: float | None, high: float | None, low_open: bool, high_open: bool, finite: bool, optional: bool) -> str:
    or_none = " or None" if optional else ""
    if low is not None and high is not None:
        interval = f"{'(' if low_open else '['}{_plain(low)}, {_plain(high)}{')' if high_open else ']'}"
        return f"a number in {interval}{or_none}"
    if low == 0 and low_open and high is None and not finite:
        return f"a positive number{or_none}"
    noun = "a finite number" if finite else "a number"
    if low is not None:
        return f"{noun} {'>' if low_open else '>='} {_plain(low)}{or_none}"
    if high is not None:
        return f"{noun} {'<' if high_open else '<='} {_plain(high)}{or_none}"
    return f"{noun}{or_none}"


def _plain(bound: float) -> str:
    """``1`` rather than ``1.0`` for a whole bound."""
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""
