"""RLModule: the torch module that maps observations to action-distribution inputs.

An :class:`RLModule` owns the networks of one policy and exposes RLlib's three forward
passes (inference, exploration, train). A :class:`MultiRLModule` holds several of them under
module ids. :class:`RLModuleSpec` and :class:`MultiRLModuleSpec` describe how to build them,
as plain data that survives checkpoints and config files.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import ItemsView, Iterator, KeysView, Mapping, Sequence
from typing import Any

import gymnasium as gym
from torch import Tensor, nn

from lightning_rl.core.checkpoint import class_path, import_class
from lightning_rl.core.columns import ALL_MODULES, DEFAULT_MODULE_ID
from lightning_rl.core.distributions import Distribution, distribution_class_for_space
from lightning_rl.core.spaces import space_from_dict, space_to_dict

DEFAULT_FCNET_HIDDENS: tuple[int, ...] = (256, 256)
"""Hidden layer sizes :func:`build_mlp_from_config` uses when ``fcnet_hiddens`` is unset."""

DEFAULT_FCNET_ACTIVATION = "tanh"
"""Activation :func:`build_mlp_from_config` uses when ``fcnet_activation`` is unset."""

_ACTIVATIONS: dict[str, type[nn.Module] | None] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "elu": nn.ELU,
    "linear": None,
}

# Attribute names of nn.ModuleDict (methods such as "train" or "eval" included): the dict
# refuses them as keys, so they cannot be module ids either.
_MODULE_DICT_ATTRIBUTES = frozenset(dir(nn.ModuleDict()))


def build_mlp(
    in_dim: int, hiddens: Sequence[int], activation: str, out_dim: int | None = None
) -> nn.Sequential:
    """Build a fully connected network: ``Linear`` + activation per hidden layer.

    Args:
        in_dim: Size of the flat input.
        hiddens: Sizes of the hidden layers, in order; empty for none.
        activation: One of ``"tanh"``, ``"relu"``, ``"silu"`` (or ``"swish"``), ``"elu"``,
            ``"linear"`` (no activation).
        out_dim: Size of a final ``Linear`` layer without activation; ``None`` to end at
            the last hidden layer.

    Raises:
        ValueError: For an unknown activation name.
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"Unknown fcnet_activation {activation!r}; choose one of {sorted(_ACTIVATIONS)}.")
    activation_cls = _ACTIVATIONS[activation]
    layers: list[nn.Module] = []
    for size in hiddens:
        layers.append(nn.Linear(in_dim, size))
        if activation_cls is not None:
            layers.append(activation_cls())
        in_dim = size
    if out_dim is not None:
        layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


def build_mlp_from_config(
    in_dim: int, model_config: Mapping[str, Any], out_dim: int | None = None
) -> nn.Sequential:
    """Build :func:`build_mlp` from ``model_config["fcnet_hiddens"]`` and ``["fcnet_activation"]``.

    Args:
        in_dim: Size of the flat input.
        model_config: The module's model config; missing keys take the module-level defaults.
        out_dim: Size of a final ``Linear`` layer without activation, or ``None``.
    """
    return build_mlp(
        in_dim,
        model_config.get("fcnet_hiddens", DEFAULT_FCNET_HIDDENS),
        model_config.get("fcnet_activation", DEFAULT_FCNET_ACTIVATION),
        out_dim,
    )


def flat_obs_dim(space: gym.Space) -> int:
    """Return the size of one observation after :func:`flatten_obs`.

    Args:
        space: A ``Box`` (flattened) or ``Discrete`` (one-hot encoded) observation space.

    Raises:
        ValueError: For other observation spaces.
    """
    if isinstance(space, gym.spaces.Box):
        return math.prod(space.shape)
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    raise ValueError(f"Unsupported observation space {space}; supported: Box and Discrete.")


def flatten_obs(obs: Tensor, space: gym.Space) -> Tensor:
    """Turn a batch of observations into float vectors ``[B, flat_obs_dim(space)]``.

    Args:
        obs: A batch of observations from ``space``, shape ``[B, *space.shape]``.
        space: A ``Box`` (flattened) or ``Discrete`` (one-hot encoded) observation space.

    Raises:
        ValueError: For other observation spaces.
    """
    if isinstance(space, gym.spaces.Box):
        return obs.reshape(obs.shape[0], -1).float()
    if isinstance(space, gym.spaces.Discrete):
        return nn.functional.one_hot(obs.long() - int(space.start), int(space.n)).float()
    raise ValueError(f"Unsupported observation space {space}; supported: Box and Discrete.")


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


class RLModule(nn.Module):
    """The networks of one policy, with RLlib's forward passes.

    Subclasses build their layers in :meth:`setup` and implement :meth:`_forward` (used by
    all three passes) or override the passes one by one. Batches are ``{column: Tensor}``
    dicts keyed by :class:`~lightning_rl.core.columns.Columns`; the output of each pass
    should hold ``Columns.ACTION_DIST_INPUTS``.

    Args:
        observation_space: The space observations come from. ``None`` only for containers
            such as :class:`MultiRLModule`.
        action_space: The space actions go to. ``None`` only for containers.
        model_config: Free-form settings for :meth:`setup` (e.g. ``fcnet_hiddens``); copied.
        inference_only: Whether to build only what acting needs (a subclass may then skip
            e.g. its value head), as for modules on environment runners.
    """

    def __init__(
        self,
        observation_space: gym.Space | None,
        action_space: gym.Space | None,
        model_config: dict[str, Any] | None = None,
        inference_only: bool = False,
    ) -> None:
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space
        # A copy, so that a config dict shared between modules cannot change this one later.
        self.model_config = dict(model_config or {})
        self.inference_only = inference_only
        self.setup()

    def setup(self) -> None:
        """Build the layers; called at the end of ``__init__``. The base builds nothing."""

    def forward_inference(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Compute outputs for greedy acting (evaluation, deployment).

        Args:
            batch: ``{column: Tensor}``, at least ``Columns.OBS``.
        """
        return self._forward(batch)

    def forward_exploration(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Compute outputs for exploratory acting (collecting training data).

        Args:
            batch: ``{column: Tensor}``, at least ``Columns.OBS``.
        """
        return self._forward(batch)

    def forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Compute outputs the loss needs (e.g. value predictions besides action inputs).

        Args:
            batch: A train batch ``{column: Tensor}``.
        """
        return self._forward_train(batch)

    def forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Run :meth:`forward_train`, so ``module(batch)`` is the training pass.

        Args:
            batch: A train batch ``{column: Tensor}``.
        """
        return self.forward_train(batch)

    def _forward_train(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Override for a train pass that differs from :meth:`_forward`; the base calls it.

        Args:
            batch: A train batch ``{column: Tensor}``.
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

    def is_stateful(self) -> bool:
        """Return whether the module carries a recurrent state between steps."""
        return False

    def get_state(self) -> dict[str, Tensor]:
        """Return a detached copy of the ``state_dict`` that later updates do not change."""
        return {name: tensor.detach().clone() for name, tensor in self.state_dict().items()}

    def set_state(self, state: Mapping[str, Tensor]) -> None:
        """Load a state from :meth:`get_state`, after checking it fits.

        Args:
            state: ``{name: tensor}`` with exactly this module's keys and shapes.

        Raises:
            ValueError: From :func:`check_state_matches`; nothing is loaded then.
        """
        check_state_matches(self, state)
        self.load_state_dict(state)

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

    Args:
        rl_modules: The modules to start with, ``{module_id: module}``.
    """

    def __init__(self, rl_modules: Mapping[str, RLModule] | None = None) -> None:
        super().__init__(observation_space=None, action_space=None)
        self._rl_modules = nn.ModuleDict()
        for module_id, module in (rl_modules or {}).items():
            if not isinstance(module, RLModule):
                raise TypeError(f"Module {module_id!r} is a {type(module).__name__}, not an RLModule.")
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

    def forward_train(self, batch: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Run each module's train pass on its own batch.

        Args:
            batch: ``{module_id: {column: Tensor}}``; modules without a batch do not run.
        """
        self._check_known(*batch)
        return {module_id: self._rl_modules[module_id].forward_train(b) for module_id, b in batch.items()}

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
        return {module_id: self._rl_modules[module_id].get_state() for module_id in module_ids}

    def set_state(self, state: Mapping[str, Mapping[str, Tensor]]) -> None:
        """Load the states of the modules named in ``state``; others stay as they are.

        Every state is checked before any is loaded, so an error changes nothing.

        Args:
            state: ``{module_id: {name: tensor}}``.

        Raises:
            ValueError: For an unknown module id, or a state that does not fit its module.
        """
        self.check_state(state)
        for module_id, module_state in state.items():
            self._rl_modules[module_id].set_state(module_state)

    def check_state(self, state: Mapping[str, Mapping[str, Tensor]]) -> None:
        """Raise ``ValueError`` if :meth:`set_state` would reject ``state``; change nothing.

        Args:
            state: ``{module_id: {name: tensor}}``.
        """
        self._check_known(*state)
        for module_id, module_state in state.items():
            try:
                check_state_matches(self._rl_modules[module_id], module_state)
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


@dataclasses.dataclass
class RLModuleSpec:
    """How to build one :class:`RLModule`.

    Args:
        module_class: The RLModule subclass to build.
        observation_space: Passed to the module.
        action_space: Passed to the module.
        model_config: Passed to the module; keep it plain data so :meth:`to_dict` can store it.
        inference_only: Passed to the module.
    """

    module_class: type[RLModule] | None = None
    observation_space: gym.Space | None = None
    action_space: gym.Space | None = None
    model_config: dict[str, Any] | None = None
    inference_only: bool = False

    def build(self) -> RLModule:
        """Build the module.

        Raises:
            ValueError: Naming the first field that is not set.
        """
        for name in ("module_class", "observation_space", "action_space"):
            if getattr(self, name) is None:
                raise ValueError(f"Cannot build RLModule: {name} is not set.")
        return self.module_class(
            observation_space=self.observation_space,
            action_space=self.action_space,
            model_config=self.model_config,
            inference_only=self.inference_only,
        )

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
            "model_config": _to_plain_data(self.model_config, "model_config"),
            "inference_only": self.inference_only,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RLModuleSpec:
        """Rebuild a spec from :meth:`to_dict`'s output, importing the module class.

        Args:
            data: A dict made by :meth:`to_dict`.

        Raises:
            ValueError: For unknown keys, a class path that cannot be imported, or a class
                that is not an RLModule subclass.
        """
        unknown = sorted(data.keys() - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"Unknown RLModuleSpec keys {unknown}.")
        module_class = data.get("module_class")
        return cls(
            module_class=None if module_class is None else import_class(module_class, RLModule),
            observation_space=_optional_space_from_dict(data.get("observation_space")),
            action_space=_optional_space_from_dict(data.get("action_space")),
            model_config=data.get("model_config"),
            inference_only=data.get("inference_only", False),
        )


@dataclasses.dataclass
class MultiRLModuleSpec:
    """How to build a :class:`MultiRLModule`: one :class:`RLModuleSpec` per module id.

    Args:
        rl_module_specs: ``{module_id: spec}``.
    """

    rl_module_specs: dict[str, RLModuleSpec] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for module_id in self.rl_module_specs:
            validate_module_id(module_id)

    def build(self) -> MultiRLModule:
        """Build every module and return them in a :class:`MultiRLModule`."""
        return MultiRLModule({module_id: spec.build() for module_id, spec in self.rl_module_specs.items()})

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
            "rl_module_specs": {module_id: spec.to_dict() for module_id, spec in self.rl_module_specs.items()}
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MultiRLModuleSpec:
        """Rebuild a spec from :meth:`to_dict`'s output.

        Args:
            data: A dict made by :meth:`to_dict`.
        """
        return cls(
            {module_id: RLModuleSpec.from_dict(spec) for module_id, spec in data["rl_module_specs"].items()}
        )

    @classmethod
    def from_module(cls, multi_module: MultiRLModule) -> MultiRLModuleSpec:
        """Describe live modules: their classes, spaces, model configs and inference flags.

        Args:
            multi_module: The modules to describe.
        """
        return cls(
            {
                module_id: RLModuleSpec(
                    module_class=type(module),
                    observation_space=module.observation_space,
                    action_space=module.action_space,
                    model_config=dict(module.model_config),
                    inference_only=module.inference_only,
                )
                for module_id, module in multi_module.items()
            }
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
            would be silently ignored).
    """
    if module_spec is None:
        return RLModuleSpec(module_class=module_class, model_config=dict(model_config or {}))
    if model_config is not None:
        raise ValueError("pass either module_spec or model_config, not both (the spec has its own model_config)")
    return module_spec


def _optional_space_to_dict(space: gym.Space | None) -> dict[str, Any] | None:
    return None if space is None else space_to_dict(space)


def _optional_space_from_dict(data: dict[str, Any] | None) -> gym.Space | None:
    return None if data is None else space_from_dict(data)


def _to_plain_data(value: Any, path: str) -> Any:
    # A deep copy in plain types only, so the result loads with torch.load(weights_only=True)
    # and writes to JSON/YAML; tuples become lists, which JSON would do anyway.
    # Subclasses such as numpy.float64 become the builtin type, which torch's weights_only
    # loader accepts.
    if value is None or isinstance(value, bool):
        return value
    for plain_type in (str, int, float):
        if isinstance(value, plain_type):
            return plain_type(value)
    if isinstance(value, (list, tuple)):
        return [_to_plain_data(item, f"{path}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{path} keys must be str to be stored, got {key!r}.")
            plain[key] = _to_plain_data(item, f"{path}[{key!r}]")
        return plain
    raise ValueError(
        f"{path} is a {type(value).__name__}; only str, int, float, bool, None, list, tuple "
        "and dict can be stored."
    )
