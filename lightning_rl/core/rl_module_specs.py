"""RLModuleSpec and MultiRLModuleSpec: how to build RL modules, as plain data.

A spec names the module class, its spaces, ``model_config`` and ``inference_only`` flag.
:meth:`RLModuleSpec.to_dict` turns it into plain data that survives checkpoints
(``torch.load(weights_only=True)``) and config files, storing the class as its import path.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Mapping
from typing import Any

import gymnasium as gym

from lightning_rl.core.checkpoint import class_path, loaded_subclass, to_plain_data
from lightning_rl.core.columns import DEFAULT_MODULE_ID
from lightning_rl.core.module_checks import validate_module_id
from lightning_rl.core.rl_modules import MultiRLModule, RLModule, multi_rl_module_class_of, restore_module_from_path
from lightning_rl.core.spaces import space_from_dict, space_to_dict


@dataclasses.dataclass
class RLModuleSpec:
    """How to build one :class:`RLModule`.

    Args:
        module_class: The RLModule subclass to build.
        observation_space: Passed to the module.
        action_space: Passed to the module.
        model_config: Passed to the module; keep it plain data so :meth:`to_dict` can store it.
            Checked now against ``module_class`` (see ``RLModule.check_model_config``), so
            a typo fails here rather than when the module is built; with an observation
            space, the convolutions are checked against its images too.
        inference_only: Passed to the module.
        load_state_path: A directory written by ``RLModule.save_to_path`` (or one module's
            directory inside a ``MultiRLModule.save_to_path`` one, ``path/<module_id>``):
            :meth:`build` loads its weights into the new module. Read as plain data
            (``weights_only``); its spec is not used, so the module is what this spec says.

    Raises:
        ValueError: If ``module_class`` is not an RLModule subclass, or ``model_config`` or
            ``action_space`` (when given) is not one it accepts (``RLModule.check_action_space``).
    """

    module_class: type[RLModule] | None = None
    observation_space: gym.Space | None = None
    action_space: gym.Space | None = None
    model_config: dict[str, Any] | None = None
    inference_only: bool = False
    load_state_path: str | None = None

    def __post_init__(self) -> None:
        if self.module_class is None:
            return
        if not (isinstance(self.module_class, type) and issubclass(self.module_class, RLModule)):
            raise ValueError(f"module_class must be an RLModule subclass, got {self.module_class!r}")
        self.module_class.check_model_config(self.model_config, self.observation_space)
        if self.action_space is not None:
            self.module_class.check_action_space(self.action_space)

    def build(self) -> RLModule:
        """Build the module.

        Raises:
            ValueError: Naming the first field that is not set.
        """
        for name in ("module_class", "observation_space", "action_space"):
            if getattr(self, name) is None:
                raise ValueError(f"Cannot build RLModule: {name} is not set.")
        module = self.module_class(
            observation_space=self.observation_space,
            action_space=self.action_space,
            model_config=self.model_config,
            inference_only=self.inference_only,
        )
        if self.load_state_path is not None:
            restore_module_from_path(module, self.load_state_path)
        return module

    @classmethod
    def from_module(cls, module: RLModule) -> RLModuleSpec:
        """Describe a live module: its class, spaces, ``model_config`` and inference flag (RLlib's ``from_module``).

        Raises:
            ValueError: For a ``MultiRLModule`` (use ``MultiRLModuleSpec.from_module``).
        """
        if isinstance(module, MultiRLModule):
            raise ValueError("RLModuleSpec.from_module takes one RLModule; use MultiRLModuleSpec.from_module")
        return cls(
            module_class=type(module),
            observation_space=module.observation_space,
            action_space=module.action_space,
            model_config=dict(module.model_config),
            inference_only=module.inference_only,
        )

    def update(self, other: RLModuleSpec, override: bool = True) -> None:
        """Fill in this spec from ``other``, as RLlib's ``RLModuleSpec.update``.

        Args:
            other: The spec to take fields from (its fields that are not ``None``).
            override: Whether ``other``'s fields replace fields already set here; if False,
                only this spec's unset (``None``) fields are filled.

        Raises:
            ValueError: If ``other`` is not an ``RLModuleSpec``.
        """
        if not isinstance(other, RLModuleSpec):
            raise ValueError(f"RLModuleSpec.update takes an RLModuleSpec, got {type(other).__name__}")
        for field in dataclasses.fields(self):
            theirs = getattr(other, field.name)
            if field.name == "inference_only":
                if override:
                    self.inference_only = other.inference_only
                continue
            if theirs is not None and (override or getattr(self, field.name) is None):
                setattr(self, field.name, theirs)
        self.__post_init__()

    def as_multi_rl_module_spec(self) -> MultiRLModuleSpec:
        """Return a :class:`MultiRLModuleSpec` holding this spec under ``DEFAULT_MODULE_ID``."""
        return MultiRLModuleSpec({DEFAULT_MODULE_ID: self})

    def to_dict(self) -> dict[str, Any]:
        """Describe the spec as plain data (see :mod:`lightning_rl.core.spaces`).

        The class is stored as its import path ``"package.module.ClassName"``.

        Raises:
            ValueError: If the class is defined inside a function (it cannot be imported
                back), or ``model_config`` holds anything but plain data.
        """
        return {
            "module_class": None if self.module_class is None else class_path(self.module_class),
            "observation_space": _optional_space_to_dict(self.observation_space),
            "action_space": _optional_space_to_dict(self.action_space),
            "model_config": to_plain_data(self.model_config, "model_config"),
            "inference_only": self.inference_only,
            "load_state_path": None if self.load_state_path is None else os.fspath(self.load_state_path),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RLModuleSpec:
        """Rebuild a spec from :meth:`to_dict`'s output (the module class must be loaded: nothing is imported).

        Args:
            data: A dict made by :meth:`to_dict`.

        Raises:
            ValueError: For unknown keys, or a class path that names no loaded RLModule subclass.
        """
        unknown = sorted(data.keys() - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"Unknown RLModuleSpec keys {unknown}.")
        module_class = data.get("module_class")
        return cls(
            module_class=None if module_class is None else loaded_subclass(module_class, RLModule, "the module spec's module_class"),
            observation_space=_optional_space_from_dict(data.get("observation_space")),
            action_space=_optional_space_from_dict(data.get("action_space")),
            model_config=data.get("model_config"),
            inference_only=data.get("inference_only", False),
            load_state_path=data.get("load_state_path"),
        )


@dataclasses.dataclass
class MultiRLModuleSpec:
    """How to build a :class:`MultiRLModule`: one :class:`RLModuleSpec` per module id.

    Args:
        rl_module_specs: ``{module_id: spec}``. The first positional argument here (RLlib's
            first is ``multi_rl_module_class``: pass that by keyword).
        multi_rl_module_class: The container class: ``MultiRLModule`` or a subclass (a shared
            encoder, say), built as ``cls(rl_module_specs=..., model_config=...)``. Stored as its
            import path; read back, it must be a class already loaded (nothing is imported, as for
            ``RLModuleSpec.module_class``).
        model_config: Settings of the container itself, for a subclass's ``setup``; plain data.
        load_state_path: A directory written by ``MultiRLModule.save_to_path``: :meth:`build`
            loads the weights of the modules it holds (all, or ``modules_to_load``) into the
            new modules. Read as plain data.
        modules_to_load: The module ids to load from ``load_state_path``; ``None`` for every
            module the checkpoint holds.

    Raises:
        ValueError: For an invalid module id, or a ``multi_rl_module_class`` that is not a
            ``MultiRLModule`` subclass.
    """

    rl_module_specs: dict[str, RLModuleSpec] = dataclasses.field(default_factory=dict)
    multi_rl_module_class: type[MultiRLModule] = MultiRLModule
    model_config: dict[str, Any] | None = None
    load_state_path: str | None = None
    modules_to_load: Collection[str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rl_module_specs, type):
            raise ValueError(
                f"MultiRLModuleSpec's first argument is rl_module_specs (a dict), got the class "
                f"{self.rl_module_specs.__name__}: RLlib's MultiRLModuleSpec({self.rl_module_specs.__name__}, ...) is "
                f"MultiRLModuleSpec(multi_rl_module_class={self.rl_module_specs.__name__}, rl_module_specs=...) here"
            )
        if not (isinstance(self.multi_rl_module_class, type) and issubclass(self.multi_rl_module_class, MultiRLModule)):
            raise ValueError(
                f"multi_rl_module_class must be a MultiRLModule subclass, got {self.multi_rl_module_class!r}"
            )
        for module_id in self.rl_module_specs:
            validate_module_id(module_id)

    def build(self) -> MultiRLModule:
        """Build every module and return them in a ``multi_rl_module_class`` (whose ``setup`` then runs)."""
        module = self.multi_rl_module_class(rl_module_specs=dict(self.rl_module_specs), model_config=self.model_config)
        if self.load_state_path is not None:
            restore_module_from_path(module, self.load_state_path, module_ids=self.modules_to_load)
        return module

    def update(self, other: MultiRLModuleSpec, override: bool = False) -> None:
        """Add ``other``'s module specs, as RLlib's ``MultiRLModuleSpec.update``.

        Args:
            other: The specs to add.
            override: Whether ``other``'s spec replaces one already under the same id; if
                False, that spec is updated from it (``RLModuleSpec.update``).

        Raises:
            ValueError: If ``other`` is not a ``MultiRLModuleSpec``.
        """
        if not isinstance(other, MultiRLModuleSpec):
            raise ValueError(
                f"MultiRLModuleSpec.update takes a MultiRLModuleSpec, got {type(other).__name__} "
                "(wrap one spec with spec.as_multi_rl_module_spec())"
            )
        for module_id, spec in other.rl_module_specs.items():
            if override or module_id not in self.rl_module_specs:
                self.add_module_spec(module_id, spec, override=True)
            else:
                self.rl_module_specs[module_id].update(spec)

    def add_module_spec(self, module_id: str, spec: RLModuleSpec, *, override: bool = False) -> None:
        """Add ``spec`` under ``module_id``.

        Args:
            module_id: The new id; see :func:`validate_module_id`.
            spec: The spec of the module.
            override: Whether to replace a spec already under ``module_id``.

        Raises:
            ValueError: If the id is invalid, or taken and ``override`` is False.
        """
        validate_module_id(module_id)
        if module_id in self.rl_module_specs and not override:
            raise ValueError(f"Module id {module_id!r} already has a spec; pass override=True to replace it.")
        self.rl_module_specs[module_id] = spec

    def remove_module_spec(self, module_id: str) -> None:
        """Remove the spec under ``module_id``.

        Args:
            module_id: The id to remove.

        Raises:
            ValueError: If no spec has that id.
        """
        if module_id not in self.rl_module_specs:
            raise ValueError(f"Unknown module id {module_id!r}; known ids: {sorted(self.rl_module_specs)}.")
        del self.rl_module_specs[module_id]

    def as_multi_rl_module_spec(self) -> MultiRLModuleSpec:
        """Return ``self``."""
        return self

    def to_dict(self) -> dict[str, Any]:
        """Describe the spec as plain data; see :meth:`RLModuleSpec.to_dict`."""
        return {
            "rl_module_specs": {module_id: spec.to_dict() for module_id, spec in self.rl_module_specs.items()},
            "multi_rl_module_class": class_path(self.multi_rl_module_class),
            "model_config": to_plain_data(self.model_config, "model_config"),
            "load_state_path": None if self.load_state_path is None else os.fspath(self.load_state_path),
            "modules_to_load": None if self.modules_to_load is None else sorted(self.modules_to_load),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MultiRLModuleSpec:
        """Rebuild a spec from :meth:`to_dict`'s output.

        Args:
            data: A dict made by :meth:`to_dict`. Its ``multi_rl_module_class`` must name a
                loaded class (nothing is imported); without one (older checkpoints) it is
                ``MultiRLModule``.

        Raises:
            ValueError: For unknown keys, or a class path that names no loaded subclass.
        """
        unknown = sorted(data.keys() - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"Unknown MultiRLModuleSpec keys {unknown}.")
        container = data.get("multi_rl_module_class")
        return cls(
            {module_id: RLModuleSpec.from_dict(spec) for module_id, spec in data["rl_module_specs"].items()},
            multi_rl_module_class=MultiRLModule
            if container is None
            else loaded_subclass(container, MultiRLModule, "the module spec's multi_rl_module_class"),
            model_config=data.get("model_config"),
            load_state_path=data.get("load_state_path"),
            modules_to_load=data.get("modules_to_load"),
        )

    @classmethod
    def from_module(cls, multi_module: MultiRLModule) -> MultiRLModuleSpec:
        """Describe live modules: the container's class, and each module's class, spaces, config and inference flag.

        Args:
            multi_module: The modules to describe.
        """
        return cls(
            {module_id: RLModuleSpec.from_module(module) for module_id, module in multi_module.items()},
            multi_rl_module_class=multi_rl_module_class_of(multi_module),
            model_config=dict(multi_module.model_config) or None,
        )


def spec_or_default(
    module_spec: RLModuleSpec | MultiRLModuleSpec | None,
    model_config: dict[str, Any] | None,
    module_class: type[RLModule],
) -> RLModuleSpec | MultiRLModuleSpec:
    """An algorithm Learner's spec: the one given, or a ``module_class`` spec built from ``model_config``.

    The default spec has no spaces yet; ``Trainer.fit`` fills them in from the data module.

    Raises:
        ValueError: If both are given (the spec has its own ``model_config``, and the other
            would be silently ignored), or ``model_config`` is not one ``module_class`` accepts.
    """
    if module_spec is None:
        module_class.check_model_config(model_config)  # before the copy, which needs a dict
        return RLModuleSpec(module_class=module_class, model_config=dict(model_config or {}))
    if model_config is not None:
        raise ValueError("pass either module_spec or model_config, not both (the spec has its own model_config)")
    return module_spec


def _optional_space_to_dict(space: gym.Space | None) -> dict[str, Any] | None:
    return None if space is None else space_to_dict(space)


def _optional_space_from_dict(data: dict[str, Any] | None) -> gym.Space | None:
    return None if data is None else space_from_dict(data)
