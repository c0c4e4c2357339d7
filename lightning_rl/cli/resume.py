"""Which hyperparameters a run started with ``--ckpt_path`` uses: the user's, then the checkpoint's.

LightningCLI's own rule parses a checkpoint's hyperparameters over the parsed config. That
has two faults this module replaces:

* The user loses: ``--model.init_args.lr 0.0`` on a resumed fit is overwritten by the
  checkpoint's lr, silently, and ``config.yaml`` records the checkpoint's value.
* The checkpoint becomes code: a callable-typed argument (``policies_to_train``) turns the
  string ``"builtins.print"`` found in a checkpoint into a function that training calls, and
  the checkpoint's ``_class_path`` is imported.

Here a setting the user gave (in a config file or a flag) wins, and each that differs from
the checkpoint is reported in one line, ``old -> new``. A setting the user left out is taken
from the checkpoint only if its type can hold nothing but data (numbers, strings, bools,
``None``, ``Literal`` choices and lists/dicts of them): an argument that jsonargparse would
turn into a function or an object (``Callable``, a class) is only ever set by the user.
The checkpoint's class names are compared as strings, never imported.

Only the Learner's hyperparameters are considered. The data module's (``datamodule_hyper_parameters``)
are never taken from a checkpoint: their strings name code to import (an env factory path,
gymnasium's ``"module:EnvId"``, wrapper classes), so the env always comes from the user's
config and flags.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import types
import typing
from collections.abc import Mapping
from typing import Any

# Container types whose arguments decide whether the whole annotation is data.
_DATA_CONTAINERS = {
    list,
    tuple,
    dict,
    set,
    frozenset,
    collections.abc.Sequence,
    collections.abc.Mapping,
    collections.abc.Collection,
    collections.abc.Set,
    collections.abc.Iterable,
}
_DATA_LEAVES = {int, float, str, bool, type(None), typing.Any}


@dataclasses.dataclass
class ResumePlan:
    """What a resumed run does with the checkpoint's hyperparameters.

    Attributes:
        adopted: ``{name: value}`` taken from the checkpoint (the user did not set them).
        changed: ``(name, checkpoint value, this run's value)`` for settings the user gave
            that differ from the checkpoint's.
        not_adopted: Names the user left out whose type could hold code, so the checkpoint's
            value is not used; those differing from this run's value are reported.
    """

    adopted: dict[str, Any] = dataclasses.field(default_factory=dict)
    changed: list[tuple[str, Any, Any]] = dataclasses.field(default_factory=list)
    not_adopted: list[tuple[str, Any, Any]] = dataclasses.field(default_factory=list)

    def report_lines(self, checkpoint: str) -> list[str]:
        """One line per setting that differs from the checkpoint, for the user to read."""
        lines = [f"{checkpoint}: {name}: {old!r} -> {new!r} (as given)" for name, old, new in self.changed]
        lines += [
            f"{checkpoint}: {name}: {old!r} -> {new!r} (can name code, so only your config or flags set it)"
            for name, old, new in self.not_adopted
        ]
        return lines


def plan_resume(
    learner_class: type,
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    given: set[str],
) -> ResumePlan:
    """Decide, per hyperparameter, whether the checkpoint's value or this run's is used.

    Args:
        learner_class: The Learner class this run builds (the user's choice).
        saved: The checkpoint's hyperparameters (plain data; ``_``-prefixed keys are
            Lightning's own and are ignored).
        current: This run's init arguments after parsing (defaults filled in).
        given: The names the user set in a config file or on the command line.
    """
    plan = ResumePlan()
    for name, old in saved.items():
        if name.startswith("_") or name not in current:
            continue
        new = current[name]
        if name in given:
            if not _same(old, new):
                plan.changed.append((name, old, new))
        elif not holds_only_data(init_annotation(learner_class, name)):
            if not _same(old, new):
                plan.not_adopted.append((name, old, new))
        elif not _same(old, new):
            plan.adopted[name] = old
    return plan


def init_annotation(cls: type, name: str) -> Any:
    """The type annotation of ``cls``'s constructor argument ``name`` (searched up the MRO).

    Returns ``typing.Any``'s opposite, ``object``, when the annotation cannot be resolved,
    so that an unknown type is never treated as data.
    """
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or name not in inspect.signature(init).parameters:
            continue
        try:
            return typing.get_type_hints(init).get(name, object)
        except Exception:  # an annotation naming something only imported for type checking
            return object
    return object


def holds_only_data(annotation: Any) -> bool:
    """Whether every value of type ``annotation`` is plain data, so parsing it can create no code.

    Plain data: ``int``, ``float``, ``str``, ``bool``, ``None``, ``Any`` (jsonargparse keeps
    such values as they are), ``Literal[...]``, unions of these and lists, tuples, sets and
    dicts of them. Everything else (``Callable``, classes, ``type``) is not.
    """
    if annotation in _DATA_LEAVES:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return True
    if origin in (typing.Union, types.UnionType):
        return all(holds_only_data(arg) for arg in typing.get_args(annotation))
    if origin in _DATA_CONTAINERS:
        return all(arg is Ellipsis or holds_only_data(arg) for arg in typing.get_args(annotation))
    return annotation in _DATA_CONTAINERS  # a bare ``list`` or ``dict``


def _same(old: Any, new: Any) -> bool:
    """Equality that sees ``(1, 2)`` and ``[1, 2]``, ``1`` and ``1.0`` as the same setting."""
    return _canonical(old) == _canonical(new)


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _canonical(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(item) for item in value]
    return value
