"""The Learner's state plumbing: which components a state holds, and checkpoints in and out.

A Learner's state (``Learner.get_state``) is a dict of plain data and tensors: the
components ``"rl_module"`` (weights, ``{module_id: {name: tensor}}``), ``"optimizer"`` and
``"metrics_logger"``, plus the bookkeeping that rebuilds the Learner (module spec, per-module
overrides, ``policies_to_train``, ``weights_seq_no``, timesteps). This module chooses the
components (``select_components``), writes the payload a checkpoint carries, matches a
Learner's modules to a checkpoint's and restores one, checked before anything changes.
The functions work on a Learner (typed as its base, ``LightningModule``: this part is imported by
``learner.py``) through its public methods and its optimizer registry.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningModule

from lightning_rl.core.checkpoint import (
    CHECKPOINT_KEY,
    FORMAT_VERSION,
    add_learner_checksum,
    check_plain_data,
    class_path,
    loaded_subclass,
    read_learner_payload,
    verify_learner_checksum,
    write_learner_dir,
)
from lightning_rl.core.columns import (
    COMPONENT_METRICS_LOGGER,
    COMPONENT_OPTIMIZER,
    COMPONENT_RL_MODULE,
)
from lightning_rl.core.module_checks import check_state_matches
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec
from lightning_rl.core.rl_modules import is_module_checkpoint
from lightning_rl.core.sharding import load_module_state
from lightning_rl.learner._lightning_private import attached_trainer
from lightning_rl.learner.multi_module import check_policies_to_train
from lightning_rl.learner.result_keys import WEIGHTS_SEQ_NO

COMPONENTS = (COMPONENT_RL_MODULE, COMPONENT_OPTIMIZER, COMPONENT_METRICS_LOGGER)


@dataclasses.dataclass(frozen=True)
class ComponentSelection:
    """The components a ``get_state`` call returns.

    Attributes:
        module_ids: The modules whose weights go under ``"rl_module"``; ``None`` for no
            ``"rl_module"`` entry at all.
        optimizer: Whether the optimizer states go in.
        metrics_logger: Whether the metrics logger's state goes in.
    """

    module_ids: list[str] | None
    optimizer: bool
    metrics_logger: bool


def select_components(
    components: str | Collection[str] | None,
    not_components: str | Collection[str] | None,
    module_ids: Sequence[str],
) -> ComponentSelection:
    """Resolve RLlib's ``components`` / ``not_components`` arguments against a Learner's modules.

    A name is a component (``"rl_module"``, ``"optimizer"``, ``"metrics_logger"``) or one
    module's weights, ``"rl_module/<module_id>"``.

    Args:
        components: What to include (a name or several); ``None`` for everything.
        not_components: What to leave out of that.
        module_ids: The Learner's module ids, in order.

    Raises:
        ValueError: For a name that is neither a component nor ``"rl_module/<id>"`` of a
            module the Learner has, listing the valid names.
    """
    included, excluded = _as_names(components), _as_names(not_components) or set()
    valid = [*COMPONENTS, *(f"{COMPONENT_RL_MODULE}/{module_id}" for module_id in module_ids)]
    unknown = sorted((included or set()) - set(valid)) + sorted(excluded - set(valid))
    if unknown:
        raise ValueError(f"unknown state component(s) {unknown}; valid names are {valid}")

    def wanted(name: str) -> bool:
        return (included is None or name in included) and name not in excluded

    selected = None
    if wanted(COMPONENT_RL_MODULE):
        selected = [m for m in module_ids if f"{COMPONENT_RL_MODULE}/{m}" not in excluded]
    elif COMPONENT_RL_MODULE not in excluded and included:
        # Only some modules were asked for, by "rl_module/<id>".
        selected = [m for m in module_ids if wanted(f"{COMPONENT_RL_MODULE}/{m}")] or None
    return ComponentSelection(selected, wanted(COMPONENT_OPTIMIZER), wanted(COMPONENT_METRICS_LOGGER))


def _as_names(value: str | Collection[str] | None) -> set[str] | None:
    if value is None:
        return None
    return {value} if isinstance(value, str) else set(value)


# ----------------------------------------------------------------------------------------
# Checkpoints (``save_to_path`` directories and Lightning checkpoints)
# ----------------------------------------------------------------------------------------


def checkpoint_payload(learner: LightningModule) -> dict[str, Any]:
    """What every checkpoint carries besides the state: the format, the Learner's class and hyperparameters.

    Raises:
        ValueError: If a hyperparameter is not plain data (checkpoints load with ``weights_only``).
    """
    hparams = dict(learner.hparams)
    check_plain_data(hparams, "hyperparameters")
    return {"format_version": FORMAT_VERSION, "learner_class": class_path(type(learner)), "hparams": hparams}


def match_modules(learner: LightningModule, spec_dict: Mapping[str, Any], overrides: Mapping[str, dict[str, Any]]) -> None:
    """Add and remove modules so that ``learner`` holds those of ``spec_dict`` (a ``MultiRLModuleSpec.to_dict``)."""
    spec = MultiRLModuleSpec.from_dict(spec_dict)
    container = MultiRLModuleSpec.from_module(learner.module).multi_rl_module_class
    if container is not spec.multi_rl_module_class:
        raise ValueError(
            f"its modules are a {spec.multi_rl_module_class.__name__}, this Learner's a {container.__name__}; "
            "load it with from_checkpoint(path), which builds its class"
        )
    for module_id in [m for m in learner.module.keys() if m not in spec.rl_module_specs]:
        learner.remove_module(module_id)
    for module_id, module_spec in spec.rl_module_specs.items():
        if module_id not in learner.module:
            learner.add_module(module_id=module_id, module_spec=module_spec, config_overrides=overrides.get(module_id))


def apply_payload(learner: LightningModule, payload: Mapping[str, Any]) -> None:
    """Match modules to the payload, then restore its weights and state (checked first)."""
    state = dict(payload["state"])
    match_modules(learner, state["module_spec"], state.get("config_overrides_per_module", {}))
    weights = payload.get("lightning_state_dict")
    if weights is not None:
        check_state_matches(learner, weights)
        learner.optimizer_registry.check_state(state.get(COMPONENT_OPTIMIZER, {}))
        # Whole tensors, cut into this rank's slices when the modules are sharded (FSDP2).
        load_module_state(learner, weights)
    learner.set_state(state)


def restore_learner(learner: LightningModule, path: str) -> None:
    """Restore ``learner`` from ``save_to_path`` output or a Lightning checkpoint; on error, undo and raise.

    Raises:
        ValueError: Naming the file and the mismatch; ``learner`` is as it was.
    """
    file, payload = read_learner_payload(path)
    snapshot = learner.get_state()
    try:
        apply_payload(learner, payload)
    except Exception as error:
        match_modules(learner, snapshot["module_spec"], snapshot["config_overrides_per_module"])
        learner.set_state(snapshot)
        raise ValueError(f"{file}: cannot restore from it: {error}") from error


def learner_from_checkpoint(
    cls: type[LightningModule], path: str, device: torch.device | str | None = None, **hparam_overrides: Any
) -> LightningModule:
    """Build the Learner a checkpoint describes (its own class, a subclass of ``cls``) and restore it.

    The checkpoint is read with ``read_checkpoint_file`` (checked, plain data only), its
    Learner class found among the loaded classes (``loaded_subclass``), never imported, and
    its hyperparameters passed as values: nothing in the file becomes code.

    Args:
        cls: The class asked; the checkpoint's class must be it or a subclass.
        path: A ``save_to_path`` directory or a Lightning checkpoint file.
        device: Where the Learner goes, before its weights and optimizer states are loaded
            (so that those follow it); ``None`` for the CPU.
        **hparam_overrides: Hyperparameters replacing the saved ones.

    Raises:
        ValueError: Naming the file, if the checkpoint cannot be read or does not fit.
    """
    file, payload = read_learner_payload(path)
    state = payload["state"]
    try:
        learner_class = loaded_subclass(payload["learner_class"], cls, "the checkpoint's Learner class")
        # Lightning's private keys (LightningCLI saves ``_class_path`` and ``_instantiator``) are
        # no constructor arguments.
        saved = {key: value for key, value in dict(payload["hparams"]).items() if not key.startswith("_")}
        if saved.get("model_config") is not None:
            # Learners that build their default module from model_config save it as a
            # hyperparameter too; the saved spec already holds it, so pass the spec alone.
            saved["model_config"] = None
        hparams = {**saved, "config_overrides_per_module": state.get("config_overrides_per_module"), **hparam_overrides}
        try:
            learner = learner_class(module_spec=MultiRLModuleSpec.from_dict(state["module_spec"]), **hparams)
        except TypeError as error:
            # A saved hyperparameter this class does not take (a checkpoint of another version of it).
            raise ValueError(f"{learner_class.__name__} does not take its saved hyperparameters: {error}") from error
        learner.build()
        if device is not None:
            learner.to(device)
        apply_payload(learner, payload)
    except ValueError as error:
        raise ValueError(f"{file}: cannot load a Learner from it: {error}") from error
    return learner


def add_to_lightning_checkpoint(
    learner: LightningModule,
    checkpoint: dict[str, Any],
    evaluation_owed: bool = False,
    best_evaluation_return: float | None = None,
) -> None:
    """Put what rebuilds ``learner`` into a Lightning checkpoint, beside the weights and optimizer states it has.

    ``evaluation_owed`` records that the checkpoint comes after an epoch's last train item
    but before that epoch's evaluation, which a resumed fit then runs first;
    ``best_evaluation_return`` the best evaluation return of the fit so far (its ``hp_metric``).

    Last, the checksum of the Learner's parts (weights, optimizer states, this entry) is
    added, so that loading finds any change to them (``verify_learner_checksum``).
    """
    payload = checkpoint_payload(learner)
    state = learner.get_state(not_components=[COMPONENT_RL_MODULE, COMPONENT_OPTIMIZER])
    state[COMPONENT_OPTIMIZER] = learner.optimizer_registry.get_state(include_optimizers=False)
    payload["state"] = state
    payload["optimizer_order"] = list(learner.optimizer_registry.named)
    payload["evaluation_owed"] = evaluation_owed
    payload["best_evaluation_return"] = best_evaluation_return
    checkpoint[CHECKPOINT_KEY] = payload
    add_learner_checksum(checkpoint)


def restore_from_lightning_checkpoint(learner: LightningModule, checkpoint: dict[str, Any]) -> None:
    """Rebuild the modules a Lightning checkpoint holds and restore the Learner's state from it.

    Lightning loads the weights (and, when resuming a fit, the optimizer states) afterwards;
    they are checked here first, so that a mismatch names the keys.

    Raises:
        ValueError: For a checkpoint not written by a Learner, one whose Learner parts fail
            their checksum, or one whose optimizers or weights do not fit.
    """
    trainer = attached_trainer(learner)
    where = str(trainer.ckpt_path) if trainer is not None and trainer.ckpt_path else "the checkpoint"
    if CHECKPOINT_KEY not in checkpoint:
        raise ValueError(f"{where}: not a lightning_rl checkpoint (no {CHECKPOINT_KEY!r} entry)")
    verify_learner_checksum(checkpoint, where)
    payload = checkpoint[CHECKPOINT_KEY]
    state = payload["state"]
    overrides = state.get("config_overrides_per_module", {})
    if learner.module is None:
        learner.module_spec = MultiRLModuleSpec.from_dict(state["module_spec"])
        for module_id, module_overrides in overrides.items():
            learner.config_overrides_per_module[module_id] = dict(module_overrides)
        learner.build()
    match_modules(learner, state["module_spec"], overrides)
    optimizer_order = list(learner.optimizer_registry.named)
    if optimizer_order != list(payload["optimizer_order"]):
        raise ValueError(
            f"{where}: its optimizers {payload['optimizer_order']} do not match this Learner's {optimizer_order}"
        )
    try:
        check_state_matches(learner, checkpoint["state_dict"])
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from error
    learner.set_state(state)


LEARNER_LEVEL = "learner"
"""RLlib's LearnerGroup state level: ``{"learner": learner_state}`` (``COMPONENT_LEARNER``)."""

_BOOKKEEPING_KEYS = (
    "module_spec",
    "config_overrides_per_module",
    WEIGHTS_SEQ_NO,
    "timesteps",
    "should_module_be_updated",
)


def learner_state_of(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state``, or the Learner state under RLlib's LearnerGroup level ``{"learner": state}``.

    For ``set_state`` overrides that read their own keys: ``state = learner_state_of(state)``.
    """
    if isinstance(state, Mapping) and set(state) == {LEARNER_LEVEL} and isinstance(state[LEARNER_LEVEL], Mapping):
        return state[LEARNER_LEVEL]
    return state


def _without_learner_level(state: Mapping[str, Any], learner: Any) -> Mapping[str, Any]:
    """``state``, or the Learner state under RLlib's ``"learner"`` level; raise for keys no ``get_state`` writes."""
    if not isinstance(state, Mapping):
        raise ValueError(f"set_state takes a dict from get_state(), got {type(state).__name__}")
    if LEARNER_LEVEL in state:
        others = sorted(set(state) - {LEARNER_LEVEL})
        if others:
            raise ValueError(
                f"the state has RLlib's LearnerGroup level {LEARNER_LEVEL!r} beside other keys {others}; "
                f"pass {{{LEARNER_LEVEL!r}: learner_state}} or the learner state alone"
            )
        state = state[LEARNER_LEVEL]
        if not isinstance(state, Mapping):
            raise ValueError(f"state[{LEARNER_LEVEL!r}] must be a dict from get_state(), got {type(state).__name__}")
    known = {*COMPONENTS, *_BOOKKEEPING_KEYS, *learner.get_state(components=[]).keys()}
    unknown = sorted(set(state) - known)
    if unknown:
        raise ValueError(
            f"unknown state key(s) {unknown}: {type(learner).__name__}.set_state takes the keys get_state writes, "
            f"{sorted(known)} (or RLlib's {{{LEARNER_LEVEL!r}: state}})"
        )
    return state


def _strip_group_prefix(component: str) -> str:
    for prefix in ("learner_group/learner/", "learner/"):
        if component.startswith(prefix):
            return component[len(prefix) :]
    return component


def restore_component(learner: LightningModule, path: str, component: str) -> None:
    """Restore one component of ``learner`` (``Learner.restore_from_path(path, component=...)``)."""
    if not isinstance(component, str):
        raise ValueError(f"component must be a string such as 'rl_module/<module_id>', got {component!r}")
    name = _strip_group_prefix(component)
    module = learner.built_module
    directory = os.fspath(path)
    if is_module_checkpoint(directory):
        # A module checkpoint (RLModule.save_to_path), as RLlib's rl_module/<module_id> directories.
        if name == COMPONENT_RL_MODULE:
            module.restore_from_path(directory)
            return
        prefix = f"{COMPONENT_RL_MODULE}/"
        if name.startswith(prefix) and name[len(prefix) :] in module:
            module[name[len(prefix) :]].restore_from_path(directory)
            return
        raise ValueError(
            f"{directory}: a module checkpoint restores component 'rl_module' or 'rl_module/<module_id>' of a module "
            f"this Learner has ({sorted(module.keys())}), not {component!r}"
        )
    file, payload = read_learner_payload(directory)
    state = dict(payload["state"])
    saved_ids = list(MultiRLModuleSpec.from_dict(state["module_spec"]).rl_module_specs)
    if COMPONENT_RL_MODULE not in state and payload.get("lightning_state_dict") is not None:
        state[COMPONENT_RL_MODULE] = _module_weights(payload["lightning_state_dict"], saved_ids)
    try:
        selected = select_components(name, None, saved_ids)
    except ValueError as error:
        raise ValueError(f"{file}: {error}") from error
    part: dict[str, Any] = {}
    if selected.module_ids is not None:
        part[COMPONENT_RL_MODULE] = {mid: state[COMPONENT_RL_MODULE][mid] for mid in selected.module_ids}
    if selected.optimizer:
        part[COMPONENT_OPTIMIZER] = state[COMPONENT_OPTIMIZER]
    if selected.metrics_logger:
        part[COMPONENT_METRICS_LOGGER] = state[COMPONENT_METRICS_LOGGER]
    try:
        learner.set_state(part)
    except ValueError as error:
        raise ValueError(f"{file}: cannot restore {component!r} from it: {error}") from error


def _module_weights(state_dict: Mapping[str, Any], module_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{module_id: {name: tensor}}`` out of a Learner's ``state_dict`` (keys ``_module._rl_modules.<id>.<name>``)."""
    weights: dict[str, dict[str, Any]] = {module_id: {} for module_id in module_ids}
    for key, value in state_dict.items():
        for module_id in module_ids:
            prefix = f"_module._rl_modules.{module_id}."
            if key.startswith(prefix):
                weights[module_id][key[len(prefix) :]] = value
    return weights


class StateMixin:
    """The Learner's state API, RLlib's names (a part of ``Learner``, which inherits it)."""

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
    ) -> dict[str, Any]:
        """A snapshot of the Learner (copies, unaffected by later updates).

        Args:
            components: ``"rl_module"`` (all modules' weights), ``"rl_module/<module_id>"``
                (one module's), ``"optimizer"``, ``"metrics_logger"``, or a list of them;
                ``None`` for all.
            not_components: Components (or ``"rl_module/<module_id>"``) to leave out.

        Returns:
            The chosen components plus the bookkeeping that rebuilds the Learner: the module
            spec, per-module overrides, ``policies_to_train``, ``weights_seq_no`` and the last
            timesteps (which position the schedules).

        Raises:
            ValueError: For an unknown component or module id, naming the valid ones.
        """
        module = self.built_module
        selected = select_components(components, not_components, list(module.keys()))
        state: dict[str, Any] = {
            "module_spec": self.module_spec.to_dict(),
            "config_overrides_per_module": copy.deepcopy(self.config_overrides_per_module),
            WEIGHTS_SEQ_NO: self.weights_seq_no,
            "timesteps": dict(self.timesteps),
        }
        if not callable(self.policies_to_train):
            rule = self.policies_to_train
            state["should_module_be_updated"] = None if rule is None else sorted(rule)
        if selected.module_ids is not None:
            state[COMPONENT_RL_MODULE] = module.get_state(selected.module_ids)
        if selected.optimizer:
            state[COMPONENT_OPTIMIZER] = self.optimizer_registry.get_state(include_optimizers=True)
        if selected.metrics_logger:
            state[COMPONENT_METRICS_LOGGER] = self.metrics.get_state()
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore (part of) what ``get_state`` returned, for the modules this Learner has.

        Everything is checked before anything changes: unknown module or optimizer names,
        missing or unexpected weights and shape mismatches raise ``ValueError`` naming them.
        To restore a checkpoint whose modules differ, use ``restore_from_path`` or
        ``from_checkpoint``, which add and remove modules to match.

        RLlib's LearnerGroup level is taken too: ``{"learner": state}`` restores ``state``.

        Raises:
            ValueError: Also for a key that no ``get_state`` writes (naming the valid ones),
                which would otherwise be ignored.
        """
        module = self.built_module
        state = _without_learner_level(state, self)
        if state.get("should_module_be_updated") is not None:
            check_policies_to_train(state["should_module_be_updated"], "the state's should_module_be_updated")
        if COMPONENT_RL_MODULE in state:
            module.check_state(state[COMPONENT_RL_MODULE])
        if COMPONENT_OPTIMIZER in state:
            self.optimizer_registry.check_state(state[COMPONENT_OPTIMIZER])

        if COMPONENT_RL_MODULE in state:
            module.set_state(state[COMPONENT_RL_MODULE])
        if COMPONENT_OPTIMIZER in state:
            self.optimizer_registry.set_state(state[COMPONENT_OPTIMIZER])
        if COMPONENT_METRICS_LOGGER in state:
            self.metrics.set_state(state[COMPONENT_METRICS_LOGGER])
        for module_id, overrides in state.get("config_overrides_per_module", {}).items():
            if module_id in module:
                self.config_overrides_per_module[module_id] = dict(overrides)
        if state.get("should_module_be_updated", False) is not False:
            self.policies_to_train = state["should_module_be_updated"]
        self.step_runner.weights_seq_no = int(state.get(WEIGHTS_SEQ_NO, self.weights_seq_no))
        self.timesteps.update(state.get("timesteps", {}))

    def get_module_state(self, module_ids: str | Collection[str] | None = None) -> dict[str, dict[str, torch.Tensor]]:
        """The weights of the modules, ``{module_id: {name: tensor}}`` (copies).

        Args:
            module_ids: A module id or several; ``None`` for all modules.

        Raises:
            ValueError: For an unknown module id, naming the known ones.
        """
        module = self.built_module
        if isinstance(module_ids, str):
            module_ids = [module_ids]
        return module.get_state(None if module_ids is None else list(module_ids))

    def set_module_state(self, state: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        """Load module weights as ``get_module_state`` returns them; modules not named stay as they are.

        Every module's weights are checked before any is loaded, so an error changes nothing.

        Raises:
            ValueError: For an unknown module id, or weights with missing or unexpected
                names or wrong shapes, naming them.
        """
        module = self.built_module
        if not isinstance(state, Mapping) or not all(isinstance(value, Mapping) for value in state.values()):
            raise ValueError("set_module_state takes {module_id: {name: tensor}}, as get_module_state returns it")
        module.set_state(state)

    def save_to_path(self, path: str) -> str:
        """Save the complete Learner to the directory ``path`` (written atomically).

        Returns:
            ``path``; ``restore_from_path(path)`` or ``from_checkpoint(path)`` reads it back.
        """
        payload = checkpoint_payload(self)
        payload["state"] = self.get_state()
        write_learner_dir(path, payload)
        return path

    def restore_from_path(self, path: str, *, component: str | None = None) -> None:
        """Restore this Learner from ``save_to_path`` output or a Lightning checkpoint.

        Modules are added or removed to match the checkpoint. If anything does not fit,
        the error names the file and the mismatch, and the Learner is left as it was.

        Args:
            path: A Learner checkpoint; with ``component="rl_module/<module_id>"`` also an
                ``RLModule.save_to_path`` directory, and with ``component="rl_module"`` a
                ``MultiRLModule.save_to_path`` one.
            component: RLlib's argument: restore only this part, ``"rl_module"``,
                ``"rl_module/<module_id>"``, ``"optimizer"`` or ``"metrics_logger"`` (RLlib's
                LearnerGroup prefix ``"learner/"`` is accepted). The modules are not added or
                removed then: the ones named must exist here.
        """
        self.built_module  # raises if not built
        if component is None:
            restore_learner(self, path)
            return
        restore_component(self, path, component)

    @classmethod
    def from_checkpoint(cls, path: str, **hparam_overrides: Any) -> LightningModule:
        """Build a new Learner from a checkpoint alone, added modules included.

        Args:
            path: A ``save_to_path`` directory or a Lightning checkpoint file.
            **hparam_overrides: Hyperparameters to change, or to supply what a checkpoint
                cannot hold (a callable ``policies_to_train``).
        """
        return learner_from_checkpoint(cls, path, **hparam_overrides)
