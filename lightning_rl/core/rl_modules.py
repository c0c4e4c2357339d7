"""RLModule and MultiRLModule: the torch modules that map observations to action-distribution inputs.

An :class:`RLModule` owns the networks of one policy and exposes RLlib's three forward
passes (inference, exploration, train). A :class:`MultiRLModule` holds several of them under
module ids. Both live here because each converts to the other
(:meth:`RLModule.as_multi_rl_module`); how to build them is in :mod:`lightning_rl.core.rl_module_specs`.
"""

from __future__ import annotations

import abc
import os
import sys
from collections.abc import Collection, ItemsView, Iterator, KeysView, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from lightning_rl.core.action_masks import (
    ACTION_MASK,
    apply_action_mask,
    check_maskable_action_space,
    is_action_masked_space,
)
from lightning_rl.core.checkpoint import (
    class_path,
    load_checked,
    loaded_subclass,
    save_checkpoint_file,
    to_plain_data,
)
from lightning_rl.core.columns import DEFAULT_MODULE_ID, Columns
from lightning_rl.core.distributions import Distribution, distribution_class_for_space
from lightning_rl.core.encoders import OBSERVATION_ENCODER_KEYS, check_observation_encoder
from lightning_rl.core.module_checks import (
    ModelConfigKey,
    check_model_config,
    check_state_matches,
    model_config_with_defaults,
    validate_module_id,
)
from lightning_rl.core.sharding import load_module_state, module_state
from lightning_rl.core.spaces import space_from_dict, space_to_dict


def as_tensors(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state`` with each numpy array as a tensor (RLlib's states may hold either); tensors stay as they are."""
    if not any(isinstance(value, np.ndarray) for value in state.values()):
        return state
    return {
        name: torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
        for name, value in state.items()
    }


class ValueFunctionAPI(abc.ABC):
    """What an RLModule implements to have a state-value function (RLlib's API of the same name).

    ``compute_values(batch) -> Tensor[B]``: the value of each row's ``obs`` (no gradient
    needed). Learners that need it (PPO) list it in ``rl_module_required_apis``. A class
    defining ``compute_values`` counts as implementing it without deriving from it.
    """

    @abc.abstractmethod
    def compute_values(self, batch: dict[str, Any]) -> Tensor:
        """The state values of the batch's rows, ``Tensor[B]`` (``[B, T]`` for a stateful module's sequences)."""

    @classmethod
    def __subclasshook__(cls, subclass: type) -> bool:
        if cls is ValueFunctionAPI:
            return any(callable(vars(klass).get("compute_values")) for klass in subclass.__mro__) or NotImplemented
        return NotImplemented


class RLModule(nn.Module):
    """The networks of one policy, with RLlib's forward passes.

    Subclasses build their layers in :meth:`setup` and implement :meth:`_forward` (used by
    all three passes) or override the passes one by one. Batches are ``{column: Tensor}``
    dicts keyed by :class:`~lightning_rl.core.columns.Columns`; the output of each pass
    should hold ``Columns.ACTION_DIST_INPUTS``.

    Action masks: when a batch holds ``action_mask``, the three passes set the
    action-distribution inputs of illegal actions to the lowest float
    (:meth:`mask_action_dist_inputs`), so they are never sampled, never chosen greedily and
    get no gradient. A module on a masked observation space
    (:func:`~lightning_rl.core.action_masks.is_action_masked_space`) takes the observation part
    in ``obs`` and requires the ``action_mask`` column. A subclass that overrides a pass
    calls :meth:`mask_action_dist_inputs` on its outputs itself.

    Recurrent modules: a module whose :meth:`get_initial_state` is not empty is *stateful*. Its
    passes take ``obs`` with a time axis ``[B, T, ...]`` (``T = 1`` when acting), ``state_in``
    (each row's state before its first step) and, if it reads them, ``prev_actions`` and
    ``prev_rewards``; they return outputs ``[B, T, ...]`` and ``state_out``. The acting path
    (:class:`~lightning_rl.core.acting.Acting`) keeps each env's state, and the Learner trains
    on ``max_seq_len`` sequences that start from the states stored while acting (see
    :mod:`lightning_rl.core.recurrent`).

    Args:
        observation_space: The space observations come from. ``None`` only for containers
            such as :class:`MultiRLModule`.
        action_space: The space actions go to. ``None`` only for containers.
        model_config: Settings for :meth:`setup` (e.g. ``fcnet_hiddens``); copied. A class that
            declares ``model_config_keys`` accepts those keys alone and checks their values
            (:meth:`resolved_model_config` adds the defaults of the keys left out);
            otherwise any keys are taken as given.
        inference_only: Whether to build only what acting needs (a subclass may then skip
            e.g. its value head), as for modules on environment runners.

    Raises:
        ValueError: From :meth:`check_model_config` and :meth:`check_action_space`, before any
            layer is built; for a masked observation space with an action space other than
            ``Discrete``.
    """

    model_config_keys: ClassVar[Mapping[str, ModelConfigKey] | None] = None
    """The ``model_config`` keys this class accepts, ``{key: ModelConfigKey(default, ...)}``.

    ``None`` (the base) takes any keys unchecked. A subclass of a class that declares keys
    extends them with ``{**Parent.model_config_keys, "my_key": ModelConfigKey.flag(False)}``.
    """

    def __init__(
        self,
        observation_space: gym.Space | None,
        action_space: gym.Space | None,
        model_config: dict[str, Any] | None = None,
        inference_only: bool = False,
    ) -> None:
        super().__init__()
        self.check_model_config(model_config, observation_space)
        if action_space is not None:
            self.check_action_space(action_space)
        self.observation_space = observation_space
        self.action_space = action_space
        # A copy, so that a config dict shared between modules cannot change this one later.
        # It stays as given (specs and checkpoints store it so): resolved_model_config() adds the defaults.
        self.model_config = dict(model_config or {})
        self.inference_only = inference_only
        # Read once here: the passes check it on every call, also inside torch.compile.
        self._action_masked = is_action_masked_space(observation_space)
        if self._action_masked:
            check_maskable_action_space(action_space, type(self).__name__)
        self._before_setup()
        self.setup()

    def _before_setup(self) -> None:
        # What must exist before a subclass's setup() runs (a MultiRLModule's sub-modules).
        pass

    def resolved_model_config(self) -> dict[str, Any]:
        """Return a copy of ``model_config`` with each declared key it leaves out set to its default.

        What :meth:`setup` reads in a class that declares :attr:`model_config_keys`; in one that
        does not, a copy of ``model_config`` as given.
        """
        if self.model_config_keys is None:
            return dict(self.model_config)
        return model_config_with_defaults(self.model_config, self.model_config_keys)

    @classmethod
    def check_model_config(
        cls, model_config: Mapping[str, Any] | None, observation_space: gym.Space | None = None
    ) -> None:
        """Check ``model_config`` against :attr:`model_config_keys`; called by specs and ``__init__``.

        A class that declares the observation-encoder keys
        (:data:`~lightning_rl.core.encoders.OBSERVATION_ENCODER_KEYS`, as every algorithm module
        does) also gets them checked against ``observation_space`` when it is given: the
        convolutions must fit its images.

        Args:
            model_config: The config to check; ``None`` is an empty one.
            observation_space: The module's observation space, if known yet.

        Raises:
            ValueError: For an unknown key (naming the closest accepted one) or a value that
                is not what its key expects; for a config that is not a dict, on every class;
                from :func:`~lightning_rl.core.encoders.check_observation_encoder`, prefixed
                with the class name.
        """
        keys = cls.model_config_keys
        if keys is not None and isinstance(model_config, Mapping) and "use_lstm" in model_config and "use_lstm" not in keys:
            raise ValueError(
                f"{cls.__name__} has no recurrent version (model_config['use_lstm']): recurrent modules are "
                "PPOModule, BCModule and MARWILModule (PPO, BC, MARWIL)"
            )
        check_model_config(model_config, cls.model_config_keys, cls.__name__)
        if observation_space is None or keys is None or not OBSERVATION_ENCODER_KEYS.keys() <= keys.keys():
            return
        try:
            check_observation_encoder(observation_space, model_config or {})
        except ValueError as error:
            raise ValueError(f"{cls.__name__}: {error}") from error

    @classmethod
    def check_action_space(cls, action_space: gym.Space) -> None:
        """Raise ``ValueError`` if this class cannot act in ``action_space``; called by specs and ``__init__``.

        So that a spec naming a space the module cannot take (DQN on Box actions) fails when it
        is made, or when ``Trainer.fit`` fills in the data module's spaces, not inside
        :meth:`setup`. The base takes any space; the algorithm modules override it.

        Args:
            action_space: The space the module's actions would go to.
        """

    def setup(self) -> None:
        """Build the layers; called at the end of ``__init__``. The base builds nothing."""

    def forward_inference(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Compute outputs for greedy acting (evaluation, deployment).

        Args:
            batch: ``{column: Tensor}``, at least ``Columns.OBS`` (and ``action_mask`` on a
                masked observation space).
        """
        return self.mask_action_dist_inputs(batch, self._forward(batch))

    def forward_exploration(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Compute outputs for exploratory acting (collecting training data).

        Args:
            batch: ``{column: Tensor}``, at least ``Columns.OBS`` (and ``action_mask`` on a
                masked observation space).
        """
        return self.mask_action_dist_inputs(batch, self._forward(batch))

    def forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Compute outputs the loss needs (e.g. value predictions besides action inputs).

        Args:
            batch: A train batch ``{column: Tensor}``.
            **kwargs: Passed on to :meth:`_forward_train`. The Learner passes none, except in a
                minibatch step of several gradient phases (``Learner.gradient_phases``, e.g.
                SAC's ``update_order="critics_first"``), where it passes ``gradient_phase``: the
                names of the optimizers the running phase steps.
        """
        return self.mask_action_dist_inputs(batch, self._forward_train(batch, **kwargs))

    def mask_action_dist_inputs(self, batch: Mapping[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
        """Mask the illegal actions' distribution inputs in ``outputs``; called by the three passes.

        When ``batch`` holds ``action_mask`` and ``outputs`` hold ``action_dist_inputs``, the
        latter go through :func:`~lightning_rl.core.action_masks.apply_action_mask`; otherwise
        ``outputs`` are returned as they are. ``outputs`` is changed in place.

        Args:
            batch: The batch the pass ran on.
            outputs: What the pass computed.

        Raises:
            ValueError: If this module's observation space is masked and ``batch`` lacks
                ``action_mask``, the mask's shape differs from the inputs', or the action
                space is not ``Discrete``.
        """
        mask = batch.get(ACTION_MASK)
        if mask is None:
            if self._action_masked:
                raise ValueError(
                    f"{type(self).__name__} is built on a masked observation space (keys 'action_mask' and "
                    f"'observation'), so its batches need the {ACTION_MASK!r} column; the batch has {sorted(batch)}"
                )
            return outputs
        check_maskable_action_space(self.action_space, type(self).__name__)
        if Columns.ACTION_DIST_INPUTS in outputs:
            outputs[Columns.ACTION_DIST_INPUTS] = apply_action_mask(outputs[Columns.ACTION_DIST_INPUTS], mask)
        return outputs

    def forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Run :meth:`forward_train`, so ``module(batch)`` is the training pass.

        Args:
            batch: A train batch ``{column: Tensor}``.
        """
        return self.forward_train(batch)

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Override for a train pass that differs from :meth:`_forward`; the base calls it.

        Args:
            batch: A train batch ``{column: Tensor}``.
            **kwargs: What :meth:`forward_train` was given; the base ignores them.
        """
        return self._forward(batch)

    def _forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Override with the pass the three public passes share by default.

        Args:
            batch: ``{column: Tensor}``.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement _forward, or override forward_inference, "
            "forward_exploration and forward_train."
        )

    def get_inference_action_dist_cls(self) -> type[Distribution]:
        """Return the distribution class for :meth:`forward_inference`'s outputs."""
        return distribution_class_for_space(self.action_space)

    def get_exploration_action_dist_cls(self) -> type[Distribution]:
        """Return the distribution class for :meth:`forward_exploration`'s outputs."""
        return distribution_class_for_space(self.action_space)

    def get_train_action_dist_cls(self) -> type[Distribution]:
        """Return the distribution class for :meth:`forward_train`'s outputs."""
        return distribution_class_for_space(self.action_space)

    def get_initial_state(self) -> dict[str, Tensor]:
        """Return the recurrent state at an episode's start, ``{name: Tensor}`` without a batch axis.

        Empty (the base) for a feed-forward module. A stateful module returns its state's
        names and shapes here; its passes then take batches with a time axis and a
        ``state_in`` column and return ``state_out`` (see :mod:`lightning_rl.core.recurrent`).
        """
        return {}

    def is_stateful(self) -> bool:
        """Return whether the module carries a recurrent state between steps (a non-empty initial state)."""
        return bool(self.get_initial_state())

    def get_state(self) -> dict[str, Tensor]:
        """Return a detached copy of the ``state_dict`` that later updates do not change.

        The tensors are whole even when the module is sharded (FSDP2); gathering them is then
        a collective call that every rank makes.
        """
        return module_state(self)

    def set_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a state from :meth:`get_state`, after checking it fits.

        Args:
            state: ``{name: tensor}`` with exactly this module's keys and shapes; numpy arrays
                (``LearnerGroup.get_weights()``) are taken too, as in RLlib.

        Raises:
            ValueError: From :func:`check_state_matches`; nothing is loaded then.
        """
        state = as_tensors(state)
        check_state_matches(self, state)
        load_module_state(self, state)

    def save_to_path(self, path: str | os.PathLike[str]) -> str:
        """Save the module (its spec and weights) to the directory ``path``, as RLlib's ``save_to_path``.

        A ``MultiRLModule`` writes its container's class and one such directory per module,
        ``path/<module_id>``, which ``RLModuleSpec(load_state_path=...)`` reads, as in RLlib.
        Files hold plain data and tensors, with checksums.

        Returns:
            ``path``; ``from_checkpoint(path)`` and ``restore_from_path(path)`` read it.
        """
        return save_module_to_path(self, path)

    def restore_from_path(self, path: str | os.PathLike[str]) -> None:
        """Load the weights a ``save_to_path`` directory holds (checked first: on error nothing changes).

        Raises:
            ValueError: For a directory that is no module checkpoint, or weights that do not fit.
        """
        restore_module_from_path(self, path)

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike[str]) -> RLModule:
        """Build the module a ``save_to_path`` directory holds, with its weights.

        The classes it names must be loaded already (a checkpoint never imports code).

        Raises:
            ValueError: For a directory that is no module checkpoint, or one holding a module
                that is not a ``cls``.
        """
        module = module_from_path(path)
        if not isinstance(module, cls):
            raise ValueError(f"{path}: holds a {type(module).__name__}, not a {cls.__name__}")
        return module

    def as_multi_rl_module(self) -> MultiRLModule:
        """Return a :class:`MultiRLModule` holding this module under ``DEFAULT_MODULE_ID``."""
        return MultiRLModule({DEFAULT_MODULE_ID: self})

    def unwrapped(self) -> RLModule:
        """Return the module itself (wrappers such as DDP return what they wrap)."""
        return self


class MultiRLModule(RLModule):
    """Several RLModules under module ids, with a dict-like API.

    The modules live in an ``nn.ModuleDict`` attribute ``_rl_modules``, so this module's
    ``state_dict()`` keys read ``"_rl_modules.{module_id}.{param}"``; :meth:`get_state` and
    :meth:`set_state` use ``{module_id: {param: tensor}}`` instead.

    :meth:`add_module` takes RLModules as modules under an id. Given any other
    ``nn.Module`` it keeps ``nn.Module.add_module``'s meaning (register a plain child), which
    torch utilities rely on, e.g. ``register_module`` or ``SyncBatchNorm.convert_sync_batchnorm``.

    Subclasses (a shared encoder that every policy head reads, as in RLlib) override
    :meth:`setup`, which runs once the sub-modules exist (``self._rl_modules`` or
    ``self[module_id]``), and the passes. Specs and checkpoints record the subclass
    (``MultiRLModuleSpec.multi_rl_module_class``), so it is rebuilt, not a plain
    ``MultiRLModule``; they build it as ``cls(rl_module_specs=..., model_config=...)``.

    Args:
        rl_modules: The modules to start with, ``{module_id: module}``.
        rl_module_specs: RLlib's form: ``{module_id: RLModuleSpec}``, built here. Not with
            ``rl_modules``.
        model_config: Settings of the container itself, for a subclass's :meth:`setup`.
        inference_only: As for :class:`RLModule`.
        observation_space: Unused by the container (RLlib accepts it); kept as an attribute.
        action_space: Unused by the container (RLlib accepts it); kept as an attribute.

    Raises:
        ValueError: For both ``rl_modules`` and ``rl_module_specs``.
        TypeError: For a module that is not an RLModule.
    """

    def __init__(
        self,
        rl_modules: Mapping[str, RLModule] | None = None,
        *,
        rl_module_specs: Mapping[str, Any] | None = None,
        model_config: dict[str, Any] | None = None,
        inference_only: bool = False,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
    ) -> None:
        if rl_modules is not None and rl_module_specs is not None:
            raise ValueError("MultiRLModule takes rl_modules (built modules) or rl_module_specs (specs), not both")
        if rl_module_specs is not None:
            rl_modules = {module_id: spec.build() for module_id, spec in rl_module_specs.items()}
        for module_id, module in (rl_modules or {}).items():
            if not isinstance(module, RLModule):
                raise TypeError(f"Module {module_id!r} is a {type(module).__name__}, not an RLModule.")
        # Read by _before_setup, which RLModule.__init__ calls just before setup(): so a
        # subclass's setup() finds its sub-modules, as in RLlib.
        self.__dict__["_rl_modules_before_setup"] = dict(rl_modules or {})
        super().__init__(
            observation_space=None, action_space=None, model_config=model_config, inference_only=inference_only
        )
        self.observation_space = observation_space
        self.action_space = action_space

    def _before_setup(self) -> None:
        self._rl_modules = nn.ModuleDict()
        for module_id, module in self.__dict__.pop("_rl_modules_before_setup", {}).items():
            self.add_module(module_id, module)

    def keys(self) -> KeysView[str]:
        """Return the module ids."""
        return self._rl_modules.keys()

    def items(self) -> ItemsView[str, RLModule]:
        """Return ``(module_id, module)`` pairs."""
        return self._rl_modules.items()

    def __getitem__(self, module_id: str) -> RLModule:
        if module_id not in self._rl_modules:
            raise KeyError(self._unknown_ids_message([module_id]))
        return self._rl_modules[module_id]

    def __contains__(self, module_id: object) -> bool:
        return module_id in self._rl_modules

    def __len__(self) -> int:
        return len(self._rl_modules)

    def __iter__(self) -> Iterator[str]:
        # Without this, iteration would fall back to __getitem__(0), __getitem__(1), ...
        return iter(self._rl_modules)

    def add_module(self, module_id: str, module: nn.Module | None, *, override: bool = False) -> None:
        """Add ``module`` under ``module_id``.

        Args:
            module_id: The new id; see :func:`validate_module_id`.
            module: The RLModule to add. Anything else is registered as a plain child,
                like ``nn.Module.add_module`` does.
            override: Whether to replace a module already under ``module_id``.

        Raises:
            ValueError: If the id is invalid, or taken and ``override`` is False.
        """
        if not isinstance(module, RLModule):
            nn.Module.add_module(self, module_id, module)
            return
        validate_module_id(module_id)
        if module_id in self._rl_modules and not override:
            raise ValueError(f"Module id {module_id!r} already exists; pass override=True to replace it.")
        self._rl_modules[module_id] = module

    def remove_module(self, module_id: str, *, raise_err_if_not_found: bool = True) -> None:
        """Remove the module under ``module_id``.

        Args:
            module_id: The id to remove.
            raise_err_if_not_found: Whether an unknown id raises, or is ignored.

        Raises:
            ValueError: If the id is unknown and ``raise_err_if_not_found`` is True.
        """
        if module_id not in self._rl_modules:
            if raise_err_if_not_found:
                self._check_known(module_id)
            return
        del self._rl_modules[module_id]

    def forward_train(self, batch: Mapping[str, dict[str, Any]], **kwargs: Any) -> dict[str, dict[str, Any]]:
        """Run each module's train pass on its own batch.

        Args:
            batch: ``{module_id: {column: Tensor}}``; modules without a batch do not run.
            **kwargs: Passed to every module's ``forward_train`` (see ``RLModule.forward_train``).
        """
        self._check_known(*batch)
        return {module_id: self._rl_modules[module_id].forward_train(b, **kwargs) for module_id, b in batch.items()}

    def forward_inference(self, batch: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Run each module's inference pass on its own batch.

        Args:
            batch: ``{module_id: {column: Tensor}}``; modules without a batch do not run.
        """
        self._check_known(*batch)
        return {module_id: self._rl_modules[module_id].forward_inference(b) for module_id, b in batch.items()}

    def forward_exploration(self, batch: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Run each module's exploration pass on its own batch.

        Args:
            batch: ``{module_id: {column: Tensor}}``; modules without a batch do not run.
        """
        self._check_known(*batch)
        return {module_id: self._rl_modules[module_id].forward_exploration(b) for module_id, b in batch.items()}

    def is_stateful(self) -> bool:
        """Return whether any module is stateful."""
        return any(module.is_stateful() for module in self._rl_modules.values())

    def get_state(self, module_ids: Sequence[str] | None = None) -> dict[str, dict[str, Tensor]]:
        """Return ``{module_id: module.get_state()}``.

        Args:
            module_ids: The modules to include; all when ``None``.
        """
        module_ids = list(self._rl_modules) if module_ids is None else list(module_ids)
        self._check_known(*module_ids)
        # In the modules' own order, whatever order (or set) the ids came in: gathering sharded
        # weights is a collective call, which every rank must make for the same tensors in turn.
        return {module_id: module.get_state() for module_id, module in self._rl_modules.items() if module_id in module_ids}

    def set_state(self, state: Mapping[str, Mapping[str, Tensor]]) -> None:
        """Load the states of the modules named in ``state``; others stay as they are.

        Every state is checked before any is loaded, so an error changes nothing.

        Args:
            state: ``{module_id: {name: tensor}}``.

        Raises:
            ValueError: For an unknown module id, or a state that does not fit its module.
        """
        self.check_state(state)
        for module_id, state_of_module in state.items():
            self._rl_modules[module_id].set_state(state_of_module)

    def check_state(self, state: Mapping[str, Mapping[str, Tensor]]) -> None:
        """Raise ``ValueError`` if :meth:`set_state` would reject ``state``; change nothing.

        Args:
            state: ``{module_id: {name: tensor}}``.
        """
        self._check_known(*state)
        for module_id, state_of_module in state.items():
            try:
                check_state_matches(self._rl_modules[module_id], as_tensors(state_of_module))
            except ValueError as err:
                raise ValueError(f"Module {module_id!r}: {err}") from err

    def as_multi_rl_module(self) -> MultiRLModule:
        """Return ``self``."""
        return self

    def _check_known(self, *module_ids: str) -> None:
        unknown = [module_id for module_id in module_ids if module_id not in self._rl_modules]
        if unknown:
            raise ValueError(self._unknown_ids_message(unknown))

    def _unknown_ids_message(self, unknown: list[str]) -> str:
        return f"Unknown module id(s) {unknown}; known ids: {sorted(self._rl_modules)}."


def multi_rl_module_class_of(multi_module: MultiRLModule) -> type[MultiRLModule]:
    """The class of ``multi_module`` as its user wrote it, not the one FSDP2's ``fully_shard`` makes of it."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    for cls in type(multi_module).__mro__:
        if issubclass(cls, MultiRLModule) and not (fsdp is not None and issubclass(cls, fsdp.FSDPModule)):
            return cls
    return MultiRLModule


# ----------------------------------------------------------------------------------------
# Module checkpoints: RLModule.save_to_path / restore_from_path / from_checkpoint
# ----------------------------------------------------------------------------------------

MODULE_STATE_FILE = "module_state.pt"
"""The file in an ``RLModule.save_to_path`` directory: the module's class, spaces, config and weights."""

MULTI_MODULE_STATE_FILE = "multi_module_state.pt"
"""The file in a ``MultiRLModule.save_to_path`` directory: the container's class and module ids;
each module is saved as an ``RLModule`` in the subdirectory named by its id."""

_MODULE_FORMAT_VERSION = 1


def save_module_to_path(module: RLModule, path: str | os.PathLike[str]) -> str:
    """Save ``module`` (class, spaces, config, weights) to the directory ``path``; a ``MultiRLModule`` per module.

    Returns:
        ``path``, as a string.

    Raises:
        ValueError: If ``path`` is a file, or the module's class or config cannot be stored.
    """
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"cannot save a module to {str(directory)!r}: it is a file, expected a directory")
    if isinstance(module, MultiRLModule):
        for module_id, sub_module in module.items():
            save_module_to_path(sub_module, directory / module_id)
        container = {
            "format_version": _MODULE_FORMAT_VERSION,
            "multi_rl_module_class": class_path(multi_rl_module_class_of(module)),
            "model_config": to_plain_data(dict(module.model_config), "model_config"),
            "module_ids": list(module.keys()),
        }
        save_checkpoint_file(container, directory / MULTI_MODULE_STATE_FILE)
        return os.fspath(path)
    payload = {
        "format_version": _MODULE_FORMAT_VERSION,
        "module_class": class_path(type(module)),
        "observation_space": space_to_dict(module.observation_space),
        "action_space": space_to_dict(module.action_space),
        "model_config": to_plain_data(dict(module.model_config), "model_config"),
        "inference_only": bool(module.inference_only),
        "state": module.get_state(),
    }
    save_checkpoint_file(payload, directory / MODULE_STATE_FILE)
    return os.fspath(path)


def _read_module_dir(path: str | os.PathLike[str]) -> tuple[str, dict[str, Any]]:
    """``("single" | "multi", content)`` of a module checkpoint directory, checked and loaded as plain data."""
    directory = Path(path)
    for kind, name in (("single", MODULE_STATE_FILE), ("multi", MULTI_MODULE_STATE_FILE)):
        if (directory / name).is_file():
            content = load_checked(directory / name, map_location="cpu")
            version = content.get("format_version") if isinstance(content, dict) else None
            if not isinstance(version, int) or version > _MODULE_FORMAT_VERSION:
                raise ValueError(f"{directory / name}: not a module checkpoint this lightning_rl reads")
            return kind, content
    raise ValueError(
        f"{directory}: not a module checkpoint (no {MODULE_STATE_FILE} or {MULTI_MODULE_STATE_FILE}); expected a "
        "directory written by RLModule.save_to_path. A Learner checkpoint is read by Learner.from_checkpoint, or "
        "restore_from_path(path, component='rl_module/<module_id>')"
    )


def is_module_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory written by ``RLModule.save_to_path`` (of one module or several)."""
    directory = Path(path)
    return (directory / MODULE_STATE_FILE).is_file() or (directory / MULTI_MODULE_STATE_FILE).is_file()


def _module_ids_of(content: Mapping[str, Any]) -> list[str]:
    module_ids = list(content.get("module_ids", []))
    for module_id in module_ids:
        validate_module_id(module_id)  # also keeps each subdirectory inside the checkpoint (no '/' or '.')
    return module_ids


def module_from_path(path: str | os.PathLike[str]) -> RLModule:
    """Build the module a ``save_to_path`` directory holds, with its weights.

    The classes it names must be loaded already (nothing is imported), as for a Learner checkpoint.
    """
    kind, content = _read_module_dir(path)
    if kind == "single":
        module_class = loaded_subclass(content["module_class"], RLModule, "the checkpoint's module_class")
        module = module_class(
            observation_space=space_from_dict(content["observation_space"]),
            action_space=space_from_dict(content["action_space"]),
            model_config=content.get("model_config"),
            inference_only=bool(content.get("inference_only", False)),
        )
        module.set_state(content["state"])
        return module
    container = loaded_subclass(
        content["multi_rl_module_class"], MultiRLModule, "the checkpoint's multi_rl_module_class"
    )
    modules = {module_id: module_from_path(Path(path) / module_id) for module_id in _module_ids_of(content)}
    return container(rl_modules=modules, model_config=content.get("model_config"))


def restore_module_from_path(
    module: RLModule, path: str | os.PathLike[str], module_ids: Collection[str] | None = None
) -> None:
    """Load the weights a ``save_to_path`` directory holds into ``module`` (checked first: nothing changes on error).

    Args:
        module: An ``RLModule``, or a ``MultiRLModule`` to load (some of) the modules of a
            ``MultiRLModule`` checkpoint into.
        path: The directory.
        module_ids: For a ``MultiRLModule``: the modules to load; ``None`` for all the checkpoint holds.

    Raises:
        ValueError: For a checkpoint of the other kind (one module vs. several), an unknown
            module id, or weights that do not fit.
    """
    kind, content = _read_module_dir(path)
    if isinstance(module, MultiRLModule):
        if kind != "multi":
            raise ValueError(
                f"{path}: holds one RLModule, not a MultiRLModule; load it into one module with "
                "module[module_id].restore_from_path(path), or RLModuleSpec(load_state_path=path)"
            )
        held = _module_ids_of(content)
        wanted = held if module_ids is None else list(module_ids)
        unknown = sorted(set(wanted) - set(held))
        if unknown:
            raise ValueError(f"{path}: holds modules {sorted(held)}, not {unknown}")
        module.set_state({module_id: _read_module_dir(Path(path) / module_id)[1]["state"] for module_id in wanted})
        return
    if kind != "single":
        raise ValueError(
            f"{path}: holds a MultiRLModule; load one of its modules from its subdirectory, path/<module_id>"
        )
    module.set_state(content["state"])

