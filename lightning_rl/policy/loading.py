"""Reading the policy out of any checkpoint lightning_rl writes, without building a Learner.

A checkpoint holds the spec of every module (class name, spaces, ``model_config``) and their
weights: in a Lightning ``.ckpt`` file under the Learner's ``state_dict``, in a
``save_to_path`` directory (a Learner's or a LearnerGroup's) under ``state["rl_module"]``. Only
the chosen module is built (its class looked up among the loaded classes, never imported) and
its weights loaded, checked key by key. A Lightning checkpoint may also hold the observation
statistics the env runner trained with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

# The package's own Learner and RLModule classes must be loaded before a checkpoint's class
# names are looked up among the loaded classes (``loaded_subclass`` never imports one).
import lightning_rl.algorithms  # noqa: F401
from lightning_rl.core.checkpoint import (
    CHECKPOINT_KEY,
    checkpoint_file,
    read_checkpoint_file,
)
from lightning_rl.core.columns import COMPONENT_RL_MODULE
from lightning_rl.core.normalization import (
    ObservationNormalization,
    find_observation_normalization,
)
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec
from lightning_rl.core.rl_modules import RLModule

# Where a Learner's ``state_dict`` keeps module ``m``'s weights: its ``_module`` attribute (a
# MultiRLModule) holds the modules in ``_rl_modules``.
_LEARNER_WEIGHTS_PREFIX = "_module._rl_modules."


def choose_module_id(module_ids: Sequence[str], module_id: str | None, where: str) -> str:
    """The module a policy acts with: ``module_id``, or the only module there is.

    Args:
        module_ids: The modules available.
        module_id: The one asked for; ``None`` when there must be exactly one.
        where: Names the source in errors (a file, ``"the Learner"``).

    Raises:
        ValueError: For an unknown id, or ``None`` with several modules; both list the ids.
    """
    if module_id is None:
        if len(module_ids) != 1:
            raise ValueError(
                f"{where} holds {len(module_ids)} modules {list(module_ids)}; pass module_id= to choose one"
            )
        return module_ids[0]
    if module_id not in module_ids:
        raise ValueError(f"{where} has no module {module_id!r}; it holds {list(module_ids)}")
    return module_id


def read_policy_checkpoint(
    path: str | os.PathLike, module_id: str | None = None
) -> tuple[RLModule, ObservationNormalization | None, dict[str, Any]]:
    """Build one module of a checkpoint with its trained weights, and the normalization it holds.

    Args:
        path: A Lightning ``.ckpt`` file or a ``save_to_path`` directory (or its ``learner_state.pt``).
        module_id: The module to build; ``None`` for a checkpoint with one module.

    Returns:
        The module (on the CPU), its observation normalization (``None`` if the run used
        none, and always for ``save_to_path`` directories, which hold no data module), and
        the checkpoint's content as read.

    Raises:
        ValueError: One line naming the file: unreadable, damaged or not a lightning_rl
            checkpoint (``read_checkpoint_file``), an unknown or ambiguous module id, a
            module class that is not loaded, or weights that do not fit the module.
    """
    file = checkpoint_file(path)
    content = read_checkpoint_file(file)
    module, normalization = policy_module(content, module_id, file)
    return module, normalization, content


def policy_module(
    content: Mapping[str, Any], module_id: str | None, where: str | os.PathLike
) -> tuple[RLModule, ObservationNormalization | None]:
    """:func:`read_policy_checkpoint` on a checkpoint's content already read (to build several of its modules).

    Args:
        content: What ``read_checkpoint_file`` returned.
        module_id: As in :func:`read_policy_checkpoint`.
        where: The file, named in errors.

    Raises:
        ValueError: One line naming ``where``, as :func:`read_policy_checkpoint`.
    """
    try:
        return _build_module(content, module_id)
    except ValueError as error:
        raise ValueError(f"{os.fspath(where)}: cannot load a policy from it: {error}") from error


def checkpoint_module_ids(content: Mapping[str, Any], where: str | os.PathLike) -> list[str]:
    """The ids of the modules a checkpoint's content holds, in its spec's order (nothing is built).

    Raises:
        ValueError: One line naming ``where``, if the content holds no readable module spec.
    """
    try:
        return list(_module_spec(content).rl_module_specs)
    except ValueError as error:
        raise ValueError(f"{os.fspath(where)}: cannot load a policy from it: {error}") from error


def _module_spec(content: Mapping[str, Any]) -> MultiRLModuleSpec:
    state = (content[CHECKPOINT_KEY] if CHECKPOINT_KEY in content else content)["state"]
    return MultiRLModuleSpec.from_dict(state["module_spec"])


def _build_module(
    content: Mapping[str, Any], module_id: str | None
) -> tuple[RLModule, ObservationNormalization | None]:
    lightning_format = CHECKPOINT_KEY in content
    state = (content[CHECKPOINT_KEY] if lightning_format else content)["state"]
    spec = _module_spec(content)
    module_id = choose_module_id(list(spec.rl_module_specs), module_id, "the checkpoint")
    module = spec.rl_module_specs[module_id].build()
    if lightning_format:
        weights = _module_weights_in_state_dict(content["state_dict"], module_id)
        normalization = find_observation_normalization(content)
    else:
        if COMPONENT_RL_MODULE not in state or module_id not in state[COMPONENT_RL_MODULE]:
            raise ValueError(f"it holds no weights of module {module_id!r}")
        weights = state[COMPONENT_RL_MODULE][module_id]
        normalization = None
    module.set_state(weights)
    return module, normalization


def _module_weights_in_state_dict(state_dict: Mapping[str, torch.Tensor], module_id: str) -> dict[str, torch.Tensor]:
    prefix = f"{_LEARNER_WEIGHTS_PREFIX}{module_id}."
    return {key[len(prefix) :]: value for key, value in state_dict.items() if key.startswith(prefix)}
