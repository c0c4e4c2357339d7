"""The rules a module must meet: a valid module id, a state that fits its weights, and a
``model_config`` its class accepts.

Each is checked before anything changes, so a bad id, state or config raises and leaves the
modules (and their specs) as they were. A config is checked when a spec or module is made,
long before ``Trainer.fit`` builds anything or creates a log directory.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from lightning_rl.core.columns import ALL_MODULES
from lightning_rl.core.mlp import ACTIVATION_NAMES

# Attribute names of nn.ModuleDict (methods such as "train" or "eval" included): the dict
# refuses them as keys, so they cannot be module ids either.
_MODULE_DICT_ATTRIBUTES = frozenset(dir(nn.ModuleDict()))


def validate_module_id(module_id: str) -> None:
    """Check that ``module_id`` can name a module in a :class:`MultiRLModule`.

    Args:
        module_id: The id to check.

    Raises:
        ValueError: Naming the id and the rule it breaks.
    """
    if not isinstance(module_id, str) or not module_id:
        raise ValueError(f"Module id {module_id!r} must be a non-empty str.")
    if module_id == ALL_MODULES:
        raise ValueError(f"Module id {module_id!r} is reserved for results over all modules.")
    if module_id.startswith("__"):
        raise ValueError(f"Module id {module_id!r} must not start with '__' (reserved).")
    if "." in module_id:
        raise ValueError(f"Module id {module_id!r} must not contain '.' (torch.nn.ModuleDict forbids it).")
    if "/" in module_id:
        raise ValueError(f"Module id {module_id!r} must not contain '/' (it separates log keys).")
    if module_id in _MODULE_DICT_ATTRIBUTES:
        raise ValueError(f"Module id {module_id!r} clashes with an attribute of torch.nn.ModuleDict.")


def check_state_matches(module: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Check that ``state`` has exactly the keys and shapes of ``module.state_dict()``.

    Run it before loading, so a bad state leaves the module untouched.

    Args:
        module: The module the state is meant for.
        state: A ``{name: tensor}`` state dict.

    Raises:
        ValueError: Naming every missing key, unexpected key and shape mismatch.
    """
    expected = module.state_dict()
    problems = []
    missing = sorted(expected.keys() - state.keys())
    if missing:
        problems.append(f"missing keys {missing}")
    unexpected = sorted(state.keys() - expected.keys())
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    for name in sorted(expected.keys() & state.keys()):
        want, got = tuple(expected[name].shape), tuple(state[name].shape)
        if want != got:
            problems.append(f"shape mismatch for {name!r}: module has {want}, state has {got}")
    if problems:
        raise ValueError(f"State does not match {type(module).__name__}: " + "; ".join(problems) + ".")


@dataclasses.dataclass(frozen=True)
class ModelConfigKey:
    """One ``model_config`` key an RLModule class accepts: its default and what a value must be.

    An RLModule subclass lists its keys in ``model_config_keys``; the constructors below
    make the common kinds.

    Args:
        default: The value the module uses when the key is left out.
        expected: What a valid value is, in words, for the error message.
        is_valid: Whether a given value is valid.
    """

    default: Any
    expected: str
    is_valid: Callable[[Any], bool]

    @classmethod
    def layer_sizes(cls, default: Sequence[int]) -> ModelConfigKey:
        """Hidden layer sizes: a list of ints > 0 (empty for no hidden layer)."""
        return cls(list(default), "a list of ints > 0 (the hidden layer sizes)", _is_layer_sizes)

    @classmethod
    def activation(cls, default: str) -> ModelConfigKey:
        """An activation name accepted by :func:`~lightning_rl.core.mlp.build_mlp`."""
        return cls(default, f"one of {sorted(ACTIVATION_NAMES)}", lambda value: value in ACTIVATION_NAMES)

    @classmethod
    def flag(cls, default: bool) -> ModelConfigKey:
        """A switch: ``True`` or ``False``."""
        return cls(default, "True or False", lambda value: isinstance(value, bool))

    @classmethod
    def choice(cls, default: str, choices: Sequence[str]) -> ModelConfigKey:
        """One of a few names, such as ``image_layout``'s."""
        return cls(default, f"one of {list(choices)}", lambda value: isinstance(value, str) and value in choices)

    @classmethod
    def number(cls, default: float, *, minimum: float | None = None) -> ModelConfigKey:
        """A finite int or float, such as ``log_std_init``; with ``minimum``, one at least that."""
        if minimum is None:
            return cls(default, "a finite number", _is_finite_number)
        expected = f"a finite number >= {minimum}"
        return cls(default, expected, lambda value: _is_finite_number(value) and value >= minimum)

    def or_none(self, meaning: str) -> ModelConfigKey:
        """This kind of value, or ``None`` (the default), which means ``meaning``.

        Args:
            meaning: What ``None`` stands for, for the message (``"fcnet_hiddens"``).
        """
        return ModelConfigKey(None, f"{self.expected}, or None for {meaning}", _none_or(self.is_valid))


def check_known_keys(given: Iterable[Any], valid: Iterable[str], what: str, *, where: str = "") -> None:
    """Raise ValueError for the first of ``given`` not in ``valid``, naming the closest valid one.

    Args:
        given: The keys to check, in the order to report them.
        valid: The keys allowed.
        what: What a key is, for the message (``"model_config key"``).
        where: What the keys belong to, put first in the message (``"PPOModule"``); may be empty.

    Raises:
        ValueError: ``"PPOModule: unknown model_config key 'fcnet_hidens'; did you mean
            'fcnet_hiddens'?"``, with the valid keys listed.
    """
    valid = sorted(valid)
    for key in given:
        if key in valid:
            continue
        close = difflib.get_close_matches(str(key), valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        prefix = f"{where}: " if where else ""
        raise ValueError(f"{prefix}unknown {what} {key!r}{hint} Valid keys: {valid}.")


def check_model_config(
    model_config: Mapping[str, Any] | None, accepted: Mapping[str, ModelConfigKey] | None, owner: str
) -> None:
    """Check ``model_config`` against the keys an RLModule class accepts.

    Args:
        model_config: The config given (``None`` is an empty one).
        accepted: ``{key: ModelConfigKey}`` of the class; ``None`` takes any str keys and values.
        owner: The class name, for the message.

    Raises:
        ValueError: For a config that is not a dict, an unknown key (naming the closest
            accepted one) or a value that is not what its key expects.
    """
    if model_config is None:
        return
    if not isinstance(model_config, Mapping):
        raise ValueError(f"{owner}: model_config must be a dict, got {type(model_config).__name__} {model_config!r}")
    if accepted is None:
        for key in model_config:
            if not isinstance(key, str):
                raise ValueError(f"{owner}: model_config keys must be str, got {key!r}")
        return
    check_known_keys(model_config, accepted, "model_config key", where=owner)
    for key, value in model_config.items():
        if not accepted[key].is_valid(value):
            raise ValueError(f"{owner}: model_config[{key!r}] must be {accepted[key].expected}, got {value!r}")


def model_config_with_defaults(
    model_config: Mapping[str, Any] | None, accepted: Mapping[str, ModelConfigKey]
) -> dict[str, Any]:
    """Return a copy of ``model_config`` with every accepted key it leaves out set to its default.

    Args:
        model_config: A config that passed :func:`check_model_config`.
        accepted: ``{key: ModelConfigKey}`` of the class.
    """
    given = dict(model_config or {})
    # Deep copies, so no module shares (and could change) a default list or the caller's lists.
    return {key: copy.deepcopy(given.get(key, spec.default)) for key, spec in accepted.items()}


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _none_or(is_valid: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or is_valid(value)


def _is_layer_sizes(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(
        isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in value
    )
