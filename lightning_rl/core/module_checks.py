"""The rules a module must meet: a valid module id, and a state that fits its weights.

Both are checked before anything changes, so a bad id or state raises and leaves the
modules (and their specs) as they were.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from lightning_rl.core.columns import ALL_MODULES

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
