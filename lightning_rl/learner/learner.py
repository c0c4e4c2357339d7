"""The Learner: RLlib's Learner API as a Lightning module with manual optimization.

A Learner owns a ``MultiRLModule`` (one or more RL modules by id), one or more optimizers per
module, and the update loop: epochs of minibatches, each a forward pass, a loss per module,
one backward pass, per-optimizer gradient clipping and an optimizer step for every module
that should be trained. Subclasses write the loss (``compute_loss_for_module``) and, when
they need more than one Adam per module, the optimizers (``configure_optimizers_for_module``).

The same code runs standalone (``learner.build()``, then ``learner.update_from_batch(...)``)
and under ``Trainer.fit``; attached to a running Trainer it backpropagates with
``manual_backward`` and steps Lightning's optimizer wrappers, so strategies (DDP, FSDP),
precision plugins and checkpoints see every step.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.trainer.states import TrainerStatus
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from lightning_rl.core.batch import MultiModuleBatch, iterate_minibatches, num_rows, to_tensor
from lightning_rl.core.checkpoint import (
    CHECKPOINT_KEY,
    FORMAT_VERSION,
    check_plain_data,
    class_path,
    import_class,
    read_learner_payload,
    write_learner_dir,
)
from lightning_rl.core.columns import (
    ALL_MODULES,
    COMPONENT_METRICS_LOGGER,
    COMPONENT_OPTIMIZER,
    COMPONENT_RL_MODULE,
    DEFAULT_MODULE_ID,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    Columns,
)
from lightning_rl.core.metrics import MetricsLogger
from lightning_rl.core.rl_module import (
    MultiRLModule,
    MultiRLModuleSpec,
    RLModule,
    RLModuleSpec,
    check_state_matches,
    validate_module_id,
)
from lightning_rl.core.schedules import Schedule, ScheduleSetting
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.connectors.episodes import episodes_to_batch
from lightning_rl.learner.callback import LearnerCallback

if TYPE_CHECKING:
    from lightning_rl.env.episode import SingleAgentEpisode

DEFAULT_OPTIMIZER = "default_optimizer"

# Result keys (RLlib's names).
TOTAL_LOSS_KEY = "total_loss"
LR_KEY = "learning_rate"
NUM_ENV_STEPS_TRAINED = "num_env_steps_trained"
NUM_ENV_STEPS_TRAINED_LIFETIME = "num_env_steps_trained_lifetime"
NUM_MODULE_STEPS_TRAINED = "num_module_steps_trained"
NUM_MODULE_STEPS_TRAINED_LIFETIME = "num_module_steps_trained_lifetime"
MODULE_TRAIN_BATCH_SIZE_MEAN = "module_train_batch_size_mean"
WEIGHTS_SEQ_NO = "weights_seq_no"
NUM_NON_FINITE_UPDATES_SKIPPED = "num_non_finite_updates_skipped"
EPISODE_RETURN_MEAN = "episode_return_mean"
TRAIN_RETURN_KEY = f"env_runners/{EPISODE_RETURN_MEAN}"

GRAD_CLIP_BY = ("value", "norm", "global_norm")
WHAT_TO_COMPILE = ("forward_train", "complete_update")

ShouldModuleBeUpdated = Union[Collection[str], Callable[[str, Optional[MultiModuleBatch]], bool]]
LearningRateOrSchedule = Union[ScheduleSetting, LRScheduler, Callable[[Optimizer], LRScheduler]]


class LearnerConfig(dict):
    """A Learner's hyperparameters for one module, readable as attributes (``config.lr``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no hyperparameter {name!r}; the Learner has {sorted(self)}") from None


class Learner(LightningModule):
    """Base class of all Learners: trains the RL modules of a ``MultiRLModule``.

    Subclasses implement ``compute_loss_for_module`` (or ``compute_losses`` for losses that
    span modules). Every argument is a hyperparameter, saved with ``save_hyperparameters``,
    settable from YAML with the Lightning CLI and overridable per module.

    Args:
        module_spec: What to build: an ``RLModuleSpec`` (trained under ``"default_policy"``)
            or a ``MultiRLModuleSpec``. May be left out when a checkpoint provides it.
        lr: Learning rate of the default optimizers: a number, or a piecewise schedule
            ``[[timestep, lr], ...]`` over ``num_env_steps_sampled_lifetime``.
        grad_clip: Clip threshold, or ``None`` not to clip.
        grad_clip_by: ``"value"`` (each element), ``"norm"`` (each tensor's L2 norm) or
            ``"global_norm"`` (the L2 norm of all of one optimizer's gradients together).
        num_epochs: Passes over each train batch when run by a Trainer.
        minibatch_size: Rows per gradient step when run by a Trainer; ``None`` for the whole batch.
        shuffle_batch_per_epoch: Whether each pass visits the rows in a new random order.
        policies_to_train: The module ids to train (others are left as they are), or a
            callable ``(module_id, batch) -> bool``; ``None`` trains every module.
        config_overrides_per_module: ``{module_id: {hyperparameter: value}}``, e.g. a module's own ``lr``.
        torch_compile: Whether to compile with ``torch.compile``.
        torch_compile_what_to_compile: ``"forward_train"`` (each module's training forward
            pass) or ``"complete_update"`` (the whole minibatch step).
    """

    def __init__(
        self,
        module_spec: RLModuleSpec | MultiRLModuleSpec | None = None,
        *,
        lr: ScheduleSetting = 3e-4,
        grad_clip: float | None = None,
        grad_clip_by: Literal["value", "norm", "global_norm"] = "global_norm",
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
        policies_to_train: ShouldModuleBeUpdated | None = None,
        config_overrides_per_module: dict[str, dict[str, Any]] | None = None,
        torch_compile: bool = False,
        torch_compile_what_to_compile: Literal["forward_train", "complete_update"] = "forward_train",
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        # The spec holds classes and gymnasium spaces, which must not enter the hyperparameters:
        # those stay plain data so checkpoints load with weights_only. The spec travels as
        # plain data of its own (``get_state()["module_spec"]``).
        ignore = ["module_spec"] + (["policies_to_train"] if callable(policies_to_train) else [])
        self.save_hyperparameters(ignore=ignore)
        if not callable(policies_to_train) and policies_to_train is not None:
            self.hparams.policies_to_train = sorted(policies_to_train)
        self._check_config(self.config, "Learner")
        self._config_overrides: dict[str, dict[str, Any]] = {}
        for module_id, overrides in (config_overrides_per_module or {}).items():
            self._config_overrides[module_id] = self._checked_overrides(module_id, overrides)

        self._module_spec = module_spec.as_multi_rl_module_spec() if module_spec is not None else None
        self._module: MultiRLModule | None = None
        self._should_module_be_updated: ShouldModuleBeUpdated | None = policies_to_train
        self._weights_seq_no = 0
        self._timesteps: dict[str, float] = {}
        self.metrics = MetricsLogger()

        # Optimizer bookkeeping, as RLlib keeps it. Full optimizer names are
        # "{module_id}_{optimizer_name}"; registration order is the order Lightning sees.
        self._named_optimizers: dict[str, Optimizer] = {}
        self._module_optimizers: dict[str, list[str]] = defaultdict(list)
        self._optimizer_parameters: dict[Optimizer, list[nn.Parameter]] = {}
        self._optimizer_grad_clip: dict[Optimizer, float | None] = {}  # thresholds set per optimizer
        self._params: dict[nn.Parameter, nn.Parameter] = {}
        self._lr_schedules: dict[str, Schedule | LRScheduler] = {}

        self._forward_train_fn: Callable[[MultiModuleBatch], dict[str, Any]] | None = None
        self._minibatch_step_fn: Callable[[MultiModuleBatch], None] | None = None
        self._lightning_optimizers: dict[Optimizer, Any] = {}
        self._measured_grad_norms: dict[Optimizer, torch.Tensor] = {}
        self._own_callbacks: list[Callback] | None = None
        # The modules the current update trains (agreed over all ranks); None outside updates.
        self._modules_in_update: set[str] | None = None

    # ------------------------------------------------------------------------------------
    # Building
    # ------------------------------------------------------------------------------------

    def build(self) -> None:
        """Build the modules and their optimizers. Call once before updating; idempotent.

        Under ``Trainer.fit`` the ``setup`` hook calls it, so it need not be called by hand.
        """
        if self._module is not None:
            return
        if self._module_spec is None:
            raise ValueError(
                f"{type(self).__name__} has no module_spec to build from: pass module_spec=... "
                "or load it with from_checkpoint(path)"
            )
        self._module = self._make_module().to(self.device)
        self.configure_optimizers()
        self._compile()

    @property
    def module(self) -> MultiRLModule | None:
        """The ``MultiRLModule`` being trained; ``None`` until ``build`` (as in RLlib)."""
        return self._module

    @property
    def module_spec(self) -> MultiRLModuleSpec:
        """The spec that rebuilds the current modules, added modules included."""
        if self._module is not None:
            return MultiRLModuleSpec.from_module(self._module)
        if self._module_spec is None:
            raise ValueError(f"{type(self).__name__} has no module_spec yet")
        return self._module_spec

    @property
    def config(self) -> LearnerConfig:
        """The Learner's hyperparameters, without per-module overrides."""
        return LearnerConfig(self.hparams)

    def config_for_module(self, module_id: str) -> LearnerConfig:
        """The hyperparameters for ``module_id``: the Learner's, with that module's overrides applied."""
        return LearnerConfig({**self.hparams, **self._config_overrides.get(module_id, {})})

    def _make_module(self) -> MultiRLModule:
        """Build the ``MultiRLModule`` from the spec; override to construct it differently."""
        return self._module_spec.build()

    @classmethod
    def rl_module_required_apis(cls) -> list[type]:
        """Classes (APIs) an RL module must be an instance of for this Learner to train it."""
        return []

    def rl_module_is_compatible(self, module: RLModule) -> bool:
        """Whether this Learner can train ``module``; incompatible modules get no optimizer."""
        return all(isinstance(module, api) for api in self.rl_module_required_apis())

    def _check_is_built(self) -> None:
        if self._module is None:
            raise ValueError(f"{type(self).__name__} is not built yet: call learner.build() first")

    def _compile(self) -> None:
        self._forward_train_fn = self._module.forward_train
        self._minibatch_step_fn = self._minibatch_step
        if self.hparams.torch_compile:
            if self.hparams.torch_compile_what_to_compile == "forward_train":
                self._forward_train_fn = torch.compile(self._module.forward_train, dynamic=True)
            else:
                self._minibatch_step_fn = torch.compile(self._minibatch_step, dynamic=True)

    # ------------------------------------------------------------------------------------
    # Optimizers
    # ------------------------------------------------------------------------------------

    def configure_optimizers(self) -> list[Optimizer]:
        """Register optimizers for every module that has none yet, and return all of them.

        ``build`` calls this once; Lightning calls it again as its own hook and receives the
        registered optimizers, so the Trainer wraps, steps and checkpoints them. Override
        ``configure_optimizers_for_module`` rather than this method.
        """
        for module_id in self.module.keys():
            if module_id not in self._module_optimizers and self.rl_module_is_compatible(self.module[module_id]):
                self.configure_optimizers_for_module(module_id=module_id, config=self.config_for_module(module_id))
        return list(self._named_optimizers.values())

    def configure_optimizers_for_module(self, module_id: str, config: LearnerConfig) -> None:
        """Create and ``register_optimizer`` the optimizer(s) of one module.

        Called for every module at build time and for each module added later. The default
        registers one Adam (``default_adam``) over all the module's parameters, scheduled by
        ``config.lr``.

        Args:
            module_id: The module to configure.
            config: The hyperparameters for this module (``config_for_module(module_id)``).
        """
        params = self.get_parameters(self.module[module_id])
        self.register_optimizer(
            module_id=module_id,
            optimizer=default_adam(params),
            params=params,
            lr_or_lr_schedule=config.lr,
        )

    def register_optimizer(
        self,
        *,
        module_id: str = ALL_MODULES,
        optimizer_name: str = DEFAULT_OPTIMIZER,
        optimizer: Optimizer,
        params: list[nn.Parameter],
        lr_or_lr_schedule: LearningRateOrSchedule | None = None,
        grad_clip: float | None | Literal["module"] = "module",
    ) -> None:
        """Register an optimizer under ``{module_id}_{optimizer_name}``.

        Args:
            module_id: The module it trains (``ALL_MODULES`` for one spanning modules).
            optimizer_name: Its name within the module; a module may have several.
            optimizer: The optimizer, constructed over exactly ``params``.
            params: The parameters it updates (and whose gradients it clips).
            lr_or_lr_schedule: ``None`` to leave the learning rate to the optimizer; a
                number or piecewise list (set before every update from
                ``num_env_steps_sampled_lifetime``); a torch ``LRScheduler`` built on this
                optimizer, or a callable that builds one from it (stepped after every update).
        """
        full_name = f"{module_id}_{optimizer_name}"
        if full_name in self._named_optimizers:
            raise ValueError(f"an optimizer named {optimizer_name!r} is already registered for module {module_id!r}")
        self._check_registered_optimizer(optimizer, params, full_name)
        schedule = self._make_lr_schedule(lr_or_lr_schedule, optimizer, full_name)

        self._named_optimizers[full_name] = optimizer
        self._module_optimizers[module_id].append(full_name)
        self._optimizer_parameters[optimizer] = list(params)
        if grad_clip != "module":
            self._optimizer_grad_clip[optimizer] = grad_clip
        for param in params:
            self._params[self.get_param_ref(param)] = param
        if schedule is not None:
            self._lr_schedules[full_name] = schedule
            if isinstance(schedule, Schedule):
                _set_lr(optimizer, schedule.value(self._timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0)))
        self._sync_trainer_optimizers()

    def _check_registered_optimizer(self, optimizer: Optimizer, params: list[nn.Parameter], full_name: str) -> None:
        if not isinstance(optimizer, Optimizer):
            raise ValueError(f"optimizer {full_name!r} must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not isinstance(params, list) or not all(isinstance(p, nn.Parameter) for p in params):
            raise ValueError(f"params of optimizer {full_name!r} must be a list of torch.nn.Parameter")
        optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if optimized != {id(p) for p in params}:
            raise ValueError(f"optimizer {full_name!r} must be constructed over exactly the params it is registered with")
        taken = [p for p in params if self.get_param_ref(p) in self._params]
        if taken:
            raise ValueError(f"optimizer {full_name!r}: {len(taken)} of its params already belong to another optimizer")

    def _make_lr_schedule(
        self, setting: LearningRateOrSchedule | None, optimizer: Optimizer, full_name: str
    ) -> Schedule | LRScheduler | None:
        if setting is None:
            return None
        if isinstance(setting, LRScheduler):
            scheduler = setting
        elif callable(setting):
            scheduler = setting(optimizer)
            if not isinstance(scheduler, LRScheduler):
                raise ValueError(f"the lr schedule factory of {full_name!r} must return a torch LRScheduler")
        else:
            return Schedule(setting, name=f"learning rate of {full_name}")
        if scheduler.optimizer is not optimizer:
            raise ValueError(f"the LRScheduler given for {full_name!r} was built on another optimizer")
        return scheduler

    def get_optimizer(self, module_id: str = DEFAULT_MODULE_ID, optimizer_name: str = DEFAULT_OPTIMIZER) -> Optimizer:
        """The optimizer registered as ``optimizer_name`` (short or full name) for ``module_id``."""
        for name in (optimizer_name, f"{module_id}_{optimizer_name}"):
            if name in self._named_optimizers:
                return self._named_optimizers[name]
        raise KeyError(
            f"no optimizer {optimizer_name!r} for module {module_id!r}; registered: {sorted(self._named_optimizers)}"
        )

    def get_optimizers_for_module(self, module_id: str = ALL_MODULES) -> list[tuple[str, Optimizer]]:
        """``(optimizer_name, optimizer)`` pairs registered for ``module_id``, short names."""
        prefix = len(module_id) + 1
        return [(name[prefix:], self._named_optimizers[name]) for name in self._module_optimizers.get(module_id, [])]

    def get_parameters(self, module: nn.Module) -> list[nn.Parameter]:
        """The trainable parameters of ``module``."""
        return [p for p in module.parameters() if p.requires_grad]

    def get_param_ref(self, param: nn.Parameter) -> nn.Parameter:
        """A hashable reference to ``param``; in torch, the parameter itself."""
        return param

    def filter_param_dict_for_optimizer(self, param_dict: Mapping[Any, Any], optimizer: Optimizer) -> dict[Any, Any]:
        """The entries of ``param_dict`` (keyed by param ref) that belong to ``optimizer``."""
        return {
            ref: param_dict[ref]
            for ref in self._optimizer_parameters[optimizer]
            if ref in param_dict and param_dict[ref] is not None
        }

    # ------------------------------------------------------------------------------------
    # Losses and gradients
    # ------------------------------------------------------------------------------------

    def compute_losses(self, *, fwd_out: dict[str, Any], batch: MultiModuleBatch) -> dict[str, torch.Tensor]:
        """The loss of every module in ``fwd_out``; override for losses that span modules.

        Returns:
            ``{module_id: scalar loss}``; an ``ALL_MODULES`` entry, if present, is the loss
            that is backpropagated, otherwise the sum of the module losses is.
        """
        return {
            module_id: self.compute_loss_for_module(
                module_id=module_id,
                config=self.config_for_module(module_id),
                batch=batch[module_id],
                fwd_out=module_fwd_out,
            )
            for module_id, module_fwd_out in fwd_out.items()
        }

    def compute_loss_for_module(
        self, *, module_id: str, config: LearnerConfig, batch: dict[str, torch.Tensor], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        """The scalar loss of one module on one minibatch. Subclasses implement it.

        Log extra values with ``self.metrics.log_value((module_id, "name"), tensor)``.

        Args:
            module_id: The module.
            config: Its hyperparameters.
            batch: Its minibatch, ``{column: Tensor[B, ...]}``.
            fwd_out: The output of its ``forward_train`` on ``batch``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement compute_loss_for_module (or compute_losses)")

    def compute_gradients(self, loss_per_module: Mapping[str, torch.Tensor], **kwargs: Any) -> dict[Any, torch.Tensor]:
        """Backpropagate the total loss; return ``{param_ref: gradient}``.

        The registered parameters' gradients are reset first. Under a running Trainer this
        backpropagates with ``manual_backward``.
        """
        for param in self._params.values():
            param.grad = None
        total = loss_per_module.get(ALL_MODULES)
        if total is None and loss_per_module:
            total = _sum(loss_per_module.values())
        anchor = self._unused_parameter_anchor()
        if anchor is not None:
            total = anchor if total is None else total + anchor
        if isinstance(total, torch.Tensor) and total.requires_grad:
            self.manual_backward(total) if self._is_running_under_trainer() else total.backward()
        return {ref: param.grad for ref, param in self._params.items() if param.grad is not None}

    def _unused_parameter_anchor(self) -> torch.Tensor | None:
        """Zero times every trainable parameter, for the backpropagated loss under DDP; else ``None``.

        DDP averages gradients bucket by bucket as backward reaches their parameters. A
        parameter that no loss on this rank touched (a module without rows on this rank, a
        frozen module, an unused head) would leave its bucket waiting for the other ranks
        forever; a rank with no rows at all would not even run backward. This term gives
        every parameter a gradient on every rank and step, zero where it was unused (also
        under ``find_unused_parameters=True``, which cannot help a rank that has no loss).
        """
        if not self._is_running_under_trainer():
            return None
        if not isinstance(self._trainer.strategy.model, DistributedDataParallel):
            return None
        return torch.stack([p.sum() for p in self.parameters() if p.requires_grad]).sum() * 0.0

    def postprocess_gradients(self, gradients_dict: dict[Any, torch.Tensor]) -> dict[Any, torch.Tensor]:
        """Post-process (clip) the gradients of every module's optimizers.

        Calls ``postprocess_gradients_for_module`` with each module's gradients; gradients
        of no registered optimizer pass unchanged.
        """
        processed = dict(gradients_dict)
        for module_id in self._module_optimizers:
            module_gradients = {}
            for _, optimizer in self.get_optimizers_for_module(module_id):
                module_gradients.update(self.filter_param_dict_for_optimizer(gradients_dict, optimizer))
            processed.update(
                self.postprocess_gradients_for_module(
                    module_id=module_id,
                    config=self.config_for_module(module_id),
                    module_gradients_dict=module_gradients,
                )
            )
        return processed

    def postprocess_gradients_for_module(
        self, *, module_id: str, config: LearnerConfig, module_gradients_dict: dict[Any, torch.Tensor]
    ) -> dict[Any, torch.Tensor]:
        """Clip one module's gradients, optimizer by optimizer, and log their global norms.

        Each optimizer clips at its own threshold when it was registered with one, else at
        the module's ``grad_clip``.

        The norm logged as ``gradients_{optimizer_name}_global_norm`` is taken before clipping.
        """
        for optimizer_name, optimizer in self.get_optimizers_for_module(module_id):
            gradients = self.filter_param_dict_for_optimizer(module_gradients_dict, optimizer)
            if not gradients:
                continue
            grad_clip = self._optimizer_grad_clip.get(optimizer, config.grad_clip)
            global_norm = clip_gradients(gradients, grad_clip=grad_clip, grad_clip_by=config.grad_clip_by)
            self.metrics.log_value((module_id, f"gradients_{optimizer_name}_global_norm"), global_norm)
            self._measured_grad_norms[optimizer] = global_norm
        return module_gradients_dict

    def apply_gradients(self, gradients_dict: Mapping[Any, torch.Tensor]) -> None:
        """Step the optimizers of every module that should be updated, with these gradients.

        An optimizer whose gradients hold a NaN or infinity (before any clipping) does not
        step (counted in the results as ``num_non_finite_updates_skipped``), so one bad batch
        cannot poison the weights or the optimizer's moments.
        """
        # Norms that postprocess_gradients measured in this step; measured here otherwise.
        measured = dict(self._measured_grad_norms)
        self._measured_grad_norms.clear()
        to_step: list[tuple[str, Optimizer]] = []
        norms = []
        in_update = self._modules_in_update
        for module_id, full_names in self._module_optimizers.items():
            if module_id != ALL_MODULES and not self.should_module_be_updated(module_id):
                continue
            if module_id != ALL_MODULES and in_update is not None and module_id not in in_update:
                continue  # its gradients are zeros from other ranks' steps, not its own data
            for full_name in full_names:
                optimizer = self._named_optimizers[full_name]
                grads = []
                for param in self._optimizer_parameters[optimizer]:
                    grad = gradients_dict.get(self.get_param_ref(param))
                    if grad is not param.grad:
                        param.grad = grad
                    if grad is not None:
                        grads.append(grad)
                if grads:
                    to_step.append((module_id, optimizer))
                    norm = measured.get(optimizer)
                    norms.append(_global_norm(grads) if norm is None else norm)
        if not to_step:
            return
        # One device sync for all optimizers; the check itself is cheaper on Python floats.
        for (module_id, optimizer), norm in zip(to_step, torch.stack(norms).tolist()):
            if math.isfinite(norm):
                self._step(optimizer)
            else:
                self.metrics.log_value((module_id, NUM_NON_FINITE_UPDATES_SKIPPED), 1, reduce="sum")

    def _step(self, optimizer: Optimizer) -> None:
        if self._is_running_under_trainer():
            # Lightning's wrapper runs the strategy's and precision plugin's step logic.
            if optimizer not in self._lightning_optimizers:  # apply_gradients called outside an update
                self._lightning_optimizers = self._lightning_optimizer_map()
            self._lightning_optimizers[optimizer].step()
        else:
            optimizer.step()

    # ------------------------------------------------------------------------------------
    # Updates
    # ------------------------------------------------------------------------------------

    def update_from_batch(
        self,
        batch: Mapping[str, Any],
        *,
        timesteps: Mapping[str, float] | None = None,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
    ) -> dict[str, dict[str, float]]:
        """Train on ``batch`` for ``num_epochs`` passes of minibatches; return the results.

        Args:
            batch: ``{column: array}`` for a single-module Learner, or
                ``{module_id: {column: array}}``; numpy arrays or tensors.
            timesteps: Lifetime counters, e.g. ``{"num_env_steps_sampled_lifetime": 4000}``;
                they drive the learning-rate schedules. Left out, the last ones are kept.
            num_epochs: Passes over the batch.
            minibatch_size: Rows per gradient step; ``None`` for the whole batch.
            shuffle_batch_per_epoch: Whether each pass visits rows in a new random order.

        Under a Trainer on several DDP ranks, every rank calls this with its own shard: the
        ranks agree on the modules trained (those with rows on any rank) and on the number
        of minibatch steps (set by the largest shard), so all take the same steps, and a
        rank whose shard lacks a module, or is empty (``{}``), still takes part with zero
        gradients. DDP averages the gradients of every step; the results are reduced over
        the ranks. ``num_epochs`` and ``minibatch_size`` must be the same on every rank.

        Returns:
            ``{module_id: {key: float}}`` plus ``ALL_MODULES``: losses, learning rates,
            gradient norms, steps trained (this update and lifetime), ``weights_seq_no``.

        Raises:
            ValueError: for unknown module ids, missing columns, columns of unequal length or
                observations/actions of the wrong shape. Nothing is updated then. On several
                ranks, also (on every rank alike) for ranks given different ``num_epochs``
                or ``minibatch_size``.
        """
        self._check_is_built()
        if num_epochs < 1:
            raise ValueError(f"num_epochs must be >= 1, got {num_epochs}")
        if minibatch_size is not None and minibatch_size < 1:
            raise ValueError(f"minibatch_size must be >= 1 or None, got {minibatch_size}")
        self._update(
            self._prepare_batch(batch),
            timesteps=dict(timesteps or {}),
            num_epochs=num_epochs,
            minibatch_size=minibatch_size,
            shuffle_batch_per_epoch=shuffle_batch_per_epoch,
        )
        return self.metrics.reduce()

    def _update(
        self,
        batch: MultiModuleBatch,
        *,
        timesteps: dict[str, Any],
        num_epochs: int,
        minibatch_size: int | None,
        shuffle_batch_per_epoch: bool,
    ) -> None:
        """One update on a prepared batch, hooks included; the results stay in ``self.metrics``.

        ``update_from_batch`` reduces them after each call; an update from replay takes
        several of these (one per gradient step) and reduces once.
        """
        self.before_gradient_based_update(timesteps=timesteps)
        self._lightning_optimizers = self._lightning_optimizer_map()
        # Modules frozen by policies_to_train sit out; so does one a before-update hook removed.
        batch = {
            mid: b for mid, b in batch.items() if mid in self._module and self.should_module_be_updated(mid, batch)
        }
        self._modules_in_update, num_rows_per_pass = None, None
        if self._is_data_parallel():
            self._modules_in_update, num_rows_per_pass = self._agree_with_other_ranks(batch, num_epochs, minibatch_size)
        module_rows: dict[str, int] = defaultdict(int)
        num_steps = 0
        env_steps = 0
        try:
            if batch or self._modules_in_update:
                for minibatch in iterate_minibatches(
                    batch,
                    num_epochs=num_epochs,
                    minibatch_size=minibatch_size,
                    shuffle=shuffle_batch_per_epoch,
                    num_rows_per_pass=num_rows_per_pass,
                ):
                    self._minibatch_step_fn(minibatch)
                    rows = {module_id: num_rows(module_batch) for module_id, module_batch in minibatch.items()}
                    for module_id, count in rows.items():
                        module_rows[module_id] += count
                    env_steps += max(rows.values(), default=0)
                    num_steps += 1
        finally:
            self._modules_in_update = None
        self._weights_seq_no += num_steps  # one per minibatch step; counted here to keep the step lean
        self._log_steps_trained(module_rows, num_steps, env_steps)
        self.after_gradient_based_update(timesteps=timesteps)

    def _is_data_parallel(self) -> bool:
        """Whether this update runs on several ranks of a Trainer (DDP), which must take it in step."""
        return self._is_running_under_trainer() and self._trainer.world_size > 1

    def _agree_with_other_ranks(
        self, batch: MultiModuleBatch, num_epochs: int, minibatch_size: int | None
    ) -> tuple[set[str], int]:
        """The modules trained on any rank and the largest module batch on any rank (a collective call).

        Every rank then takes the same number of minibatch steps, each with one backward
        pass that reaches every parameter (see ``_unused_parameter_anchor``), even when its
        shard is smaller or holds no rows of some module, so no rank waits on another forever.

        Raises:
            ValueError: On every rank alike, if the ranks were asked for different
                ``num_epochs`` or ``minibatch_size`` (their steps could not match).
        """
        module_ids = sorted(self._module.keys())
        local = [num_rows(batch[m]) if m in batch else 0 for m in module_ids]
        settings = [num_epochs, minibatch_size or 0]
        # One all_reduce (max) of [rows per module, settings, -settings]: the largest rows,
        # and each setting's largest and smallest value over the ranks.
        packed = torch.tensor(local + settings + [-x for x in settings], dtype=torch.float64, device=self.device)
        packed = self._trainer.strategy.reduce(packed, reduce_op="max").tolist()
        rows, largest, smallest = packed[: len(local)], packed[len(local) : -2], [-x for x in packed[-2:]]
        if largest != smallest:
            raise ValueError(
                f"the ranks were asked for different update settings (num_epochs from {smallest[0]:.0f} to "
                f"{largest[0]:.0f}, minibatch_size from {smallest[1]:.0f} to {largest[1]:.0f}, 0 meaning None): "
                "every data-parallel rank must take the same number of minibatch steps"
            )
        trained = {module_id for module_id, count in zip(module_ids, rows) if count > 0}
        return trained, int(max(rows, default=0))

    def _minibatch_step(self, minibatch: MultiModuleBatch) -> None:
        # A data-parallel rank without rows in this step still backpropagates (zeros), in step with the others.
        fwd_out = self._forward_train_fn(minibatch) if minibatch else {}
        loss_per_module = dict(self.compute_losses(fwd_out=fwd_out, batch=minibatch))
        if ALL_MODULES not in loss_per_module and loss_per_module:
            loss_per_module[ALL_MODULES] = _sum(loss_per_module.values())
        gradients = self.compute_gradients(loss_per_module)
        gradients = self.postprocess_gradients(gradients)
        self.apply_gradients(gradients)
        for module_id, loss in loss_per_module.items():
            self.metrics.log_value((module_id, TOTAL_LOSS_KEY), loss)

    def update_from_episodes(
        self,
        episodes: Sequence[SingleAgentEpisode],
        *,
        timesteps: Mapping[str, float] | None = None,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
    ) -> dict[str, dict[str, float]]:
        """Turn ``episodes`` into a train batch (the Learner connector), then ``update_from_batch``.

        Args:
            episodes: Single-agent episodes (or chunks of them) for this Learner's one module,
                sampled by the current weights for on-policy algorithms.
            timesteps: As in ``update_from_batch``.
            num_epochs: As in ``update_from_batch``.
            minibatch_size: As in ``update_from_batch``.
            shuffle_batch_per_epoch: As in ``update_from_batch``.

        Returns:
            The results of ``update_from_batch``.

        Raises:
            ValueError: For an empty list, an episode without steps, or a Learner with more
                than one module (single-agent episodes cannot say which module they are for).
        """
        self._check_is_built()
        batch = self.episodes_to_train_batch(episodes)
        return self.update_from_batch(
            batch,
            timesteps=timesteps,
            num_epochs=num_epochs,
            minibatch_size=minibatch_size,
            shuffle_batch_per_epoch=shuffle_batch_per_epoch,
        )

    def update_from_replay(self, replay: Any, *, timesteps: Mapping[str, float] | None = None) -> dict[str, dict[str, float]]:
        """Train on minibatches sampled from a replay buffer (off-policy Learners implement it).

        ``EpisodeDataModule`` in off-policy mode hands the Learner its replay buffer with
        every train item (``None`` until learning starts). See ``OffPolicyLearner``.

        Raises:
            NotImplementedError: This Learner learns on-policy, from episodes or batches.
        """
        raise NotImplementedError(
            f"{type(self).__name__} learns on-policy and cannot train from a replay buffer; use an off-policy "
            "Learner (DQNLearner, SACLearner) with an off-policy EpisodeDataModule, or leave "
            "EpisodeDataModule's replay_buffer_capacity unset for on-policy rollouts"
        )

    @property
    def weights_seq_no(self) -> int:
        """Gradient steps taken over the Learner's life (restored with its state)."""
        return self._weights_seq_no

    def episodes_to_train_batch(self, episodes: Sequence[SingleAgentEpisode]) -> dict[str, dict[str, torch.Tensor]]:
        """The Learner connector: build ``{module_id: {column: Tensor}}`` from ``episodes``.

        The base concatenates the episodes' steps (``episodes_to_batch``). Override to add
        columns computed with the current module, e.g. PPO's advantages; call ``super()``.
        """
        module_ids = list(self._module.keys())
        if len(module_ids) != 1:
            raise ValueError(
                f"update_from_episodes takes single-agent episodes, which need a Learner with one module; "
                f"this one has {sorted(module_ids)}"
            )
        return {module_ids[0]: episodes_to_batch(episodes, self.device)}

    def training_step(self, train_item: TrainItem | Mapping[str, Any], batch_idx: int = 0) -> dict[str, Any]:
        """Lightning's hook: one update with the Learner's epoch and minibatch settings.

        ``train_item`` is a ``TrainItem`` (what every lightning_rl data module yields): its data
        goes to ``update_from_batch``, ``update_from_episodes`` or ``update_from_replay``, its
        ``timesteps`` drive the schedules, its ``env_runners`` statistics are logged as
        ``env_runners/{key}`` and its ``update_settings`` replace the Learner's epoch and
        minibatch settings for this update alone. A plain batch (a ``DataLoader`` of
        ``{column: tensor}`` dicts) is trained on as it is. The results are logged
        (``"{module_id}/{key}"``) to the Trainer's logger.

        Returns:
            ``{"results": ...}``, the update's results as ``update_from_batch`` returns them;
            Lightning hands this to ``Callback.on_train_batch_end`` as ``outputs``.
        """
        item = _as_train_item(train_item)
        settings = dict(
            num_epochs=self.hparams.num_epochs,
            minibatch_size=self.hparams.minibatch_size,
            shuffle_batch_per_epoch=self.hparams.shuffle_batch_per_epoch,
        )
        settings.update(item.update_settings)
        data, timesteps = item.data, dict(item.timesteps)
        if data.source == "episodes":
            results = self.update_from_episodes(data.episodes, timesteps=timesteps, **settings)
        elif data.source == "batch":
            results = self.update_from_batch(data.batch, timesteps=timesteps, **settings)
        elif data.source in ("replay", None):
            results = self.update_from_replay(data.replay, timesteps=timesteps)
        else:
            raise ValueError(f"training_step cannot train on TrainingData.{data.source} yet")
        metrics = {f"{module_id}/{key}": value for module_id, values in results.items() for key, value in values.items()}
        metrics.update({f"env_runners/{key}": value for key, value in item.env_runners.items()})
        self._log_train_metrics(metrics, batch_idx)
        return {"results": results}

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Lightning's hook: leave train items where they are.

        The Learner moves what it trains on to its device itself (``_prepare_batch``), so
        Lightning's recursive walk over each item (episodes, a replay buffer, counters) is
        skipped; it cost about as much as a small network's gradient step per item.
        """
        return batch

    def validation_step(self, eval_item: TrainItem, batch_idx: int = 0) -> None:
        """Lightning's hook: log the statistics of evaluation episodes as ``eval/{key}``.

        ``eval_item`` is what ``EpisodeDataModule.val_dataloader()`` yields: a ``TrainItem``
        whose data is complete episodes played by ``forward_inference``.
        """
        episodes = eval_item.data.episodes
        returns = [episode.get_return() for episode in episodes]
        lengths = [len(episode) for episode in episodes]
        # Reduced over ranks, each of which played an equal share of the episodes (see
        # EpisodeDataModule), so a mean of the ranks' means is the mean over all episodes.
        stats = (
            (EPISODE_RETURN_MEAN, np.mean(returns), "mean"),
            ("episode_return_min", np.min(returns), "min"),
            ("episode_return_max", np.max(returns), "max"),
            ("episode_len_mean", np.mean(lengths), "mean"),
            ("num_episodes", len(episodes), "sum"),
        )
        for key, value, reduce_fx in stats:
            self.log(f"eval/{key}", float(value), batch_size=1, sync_dist=True, reduce_fx=reduce_fx)
        self.log("eval_return", float(np.mean(returns)), prog_bar=True, logger=False, batch_size=1, sync_dist=True)

    def _log_train_metrics(self, metrics: dict[str, float], batch_idx: int) -> None:
        """Log one train item's metrics, on the items whose logs Lightning writes, and on the epoch's last.

        Each ``self.log`` call costs Lightning about 0.1 ms (more on a busy machine) and an
        update reports ~50 values; an off-policy item (one env step and one gradient step)
        costs only a few ms, so logging even a handful of values after every item would slow
        training by a quarter. Lightning writes to the loggers only every
        ``log_every_n_steps`` train items, so the metrics are logged on those items, and on
        the last item of an epoch or of the run, so that epoch-end callbacks
        (``EarlyStopping``, ``ModelCheckpoint``) see the current values. In between,
        ``trainer.callback_metrics`` and the progress bar keep the last logged values.
        """
        trainer = self._trainer
        last_item = trainer is not None and (batch_idx + 1 >= trainer.num_training_batches or trainer.should_stop)
        if not (last_item or self._trainer_writes_logs_now()):
            return
        # The values are already reduced over ranks by the metrics logger.
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1, sync_dist=False)
        for name, key in (("return", TRAIN_RETURN_KEY), ("loss", f"{ALL_MODULES}/{TOTAL_LOSS_KEY}")):
            if key in metrics:
                self.log(name, metrics[key], prog_bar=True, logger=False, on_step=True, batch_size=1)

    def _trainer_writes_logs_now(self) -> bool:
        # A private Lightning property (the one its own logging uses); should it ever move,
        # logging everything on every step is still right, only slower.
        connector = getattr(self._trainer, "_logger_connector", None)
        return bool(getattr(connector, "should_update_logs", True))

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        """Called at the start of every update, before any gradient step.

        Sets the scheduled learning rates for the current ``timesteps`` and calls
        ``on_before_gradient_based_update`` on the Trainer's ``LearnerCallback``\\ s.
        Override for non-gradient updates; call ``super()``.
        """
        self._timesteps.update({k: float(v) for k, v in timesteps.items()})
        timestep = self._timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0)
        for module_id, full_names in self._module_optimizers.items():
            for full_name in full_names:
                optimizer = self._named_optimizers[full_name]
                schedule = self._lr_schedules.get(full_name)
                if isinstance(schedule, Schedule):
                    _set_lr(optimizer, schedule.value(timestep))
                optimizer_name = full_name[len(module_id) + 1 :]
                self.metrics.log_value((module_id, f"{optimizer_name}_{LR_KEY}"), _get_lr(optimizer), reduce="last")
        for callback in self._learner_callbacks():
            callback.on_before_gradient_based_update(self._trainer, self, timesteps)

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        """Called at the end of every update, after the last gradient step.

        Steps torch ``LRScheduler``\\ s and calls ``on_after_gradient_based_update`` on the
        Trainer's ``LearnerCallback``\\ s. Override for non-gradient updates (target
        networks, coefficients); call ``super()``.
        """
        for schedule in self._lr_schedules.values():
            if isinstance(schedule, LRScheduler):
                schedule.step()
        for callback in self._learner_callbacks():
            callback.on_after_gradient_based_update(self._trainer, self, timesteps)

    def required_batch_columns(self, module_id: str) -> list[str]:
        """Columns a batch must hold for ``module_id``; checked before any update."""
        return [Columns.OBS]

    def _prepare_batch(self, batch: Mapping[str, Any]) -> MultiModuleBatch:
        """Convert a user batch to ``{module_id: {column: Tensor}}`` on our device, checked."""
        data_parallel = self._is_data_parallel()
        if not isinstance(batch, Mapping) or (not batch and not data_parallel):
            raise ValueError(f"a batch must be a non-empty dict of columns or of module batches, got {type(batch).__name__}")
        if not batch:
            return {}  # this data-parallel rank has no rows this time; it still takes its steps
        nested = [isinstance(value, Mapping) for value in batch.values()]
        if all(nested):
            unknown = sorted(set(batch) - set(self._module.keys()))
            if unknown:
                raise ValueError(
                    f"the batch holds module ids {unknown} that this Learner does not have; "
                    f"its modules are {sorted(self._module.keys())}"
                )
            module_batches = dict(batch)
        elif any(nested):
            raise ValueError("a batch must map either columns to arrays or module ids to column dicts, not both")
        elif len(self._module) == 1:
            module_batches = {next(iter(self._module.keys())): batch}
        else:
            raise ValueError(
                f"a flat {{column: array}} batch is ambiguous for a Learner with modules {sorted(self._module.keys())}: "
                "pass {module_id: {column: array}}"
            )

        prepared: MultiModuleBatch = {}
        for module_id, module_batch in module_batches.items():
            missing = [c for c in self.required_batch_columns(module_id) if c not in module_batch]
            if missing:
                raise ValueError(
                    f"module {module_id!r}: the batch lacks column(s) {missing}; it has {sorted(module_batch)}"
                )
            columns = {column: to_tensor(values, self.device) for column, values in module_batch.items()}
            lengths = {column: (len(values) if values.dim() > 0 else 0) for column, values in columns.items()}
            if data_parallel and set(lengths.values()) == {0}:
                continue  # no rows of this module on this rank
            if len(set(lengths.values())) != 1 or 0 in lengths.values():
                raise ValueError(f"module {module_id!r}: columns must have the same, non-zero number of rows; got {lengths}")
            module = self._module[module_id]
            _check_column_shape(module_id, Columns.OBS, columns.get(Columns.OBS), module.observation_space, "observation")
            _check_column_shape(module_id, Columns.ACTIONS, columns.get(Columns.ACTIONS), module.action_space, "action")
            prepared[module_id] = columns
        return prepared

    def _log_steps_trained(self, module_rows: Mapping[str, int], num_steps: int, env_steps: int) -> None:
        log = self.metrics.log_value
        for module_id, rows in module_rows.items():
            log((module_id, NUM_MODULE_STEPS_TRAINED), rows, reduce="sum")
            log((module_id, NUM_MODULE_STEPS_TRAINED_LIFETIME), rows, reduce="sum", clear_on_reduce=False)
            log((module_id, MODULE_TRAIN_BATCH_SIZE_MEAN), rows / max(num_steps, 1))
            log((module_id, WEIGHTS_SEQ_NO), self._weights_seq_no, reduce="last")
        total_rows = sum(module_rows.values())
        log((ALL_MODULES, NUM_MODULE_STEPS_TRAINED), total_rows, reduce="sum")
        log((ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME), total_rows, reduce="sum", clear_on_reduce=False)
        log((ALL_MODULES, NUM_ENV_STEPS_TRAINED), env_steps, reduce="sum")
        log((ALL_MODULES, NUM_ENV_STEPS_TRAINED_LIFETIME), env_steps, reduce="sum", clear_on_reduce=False)
        log((ALL_MODULES, WEIGHTS_SEQ_NO), self._weights_seq_no, reduce="last")
        for key, value in self._timesteps.items():
            log((ALL_MODULES, key), value, reduce="last")

    # ------------------------------------------------------------------------------------
    # Adding and removing modules
    # ------------------------------------------------------------------------------------

    def should_module_be_updated(self, module_id: str, batch: MultiModuleBatch | None = None) -> bool:
        """Whether ``module_id`` is trained, per ``policies_to_train``."""
        rule = self._should_module_be_updated
        if rule is None:
            return True
        if callable(rule):
            return bool(rule(module_id, batch))
        return module_id in rule

    def add_module(
        self,
        *,
        module_id: str,
        module_spec: RLModuleSpec,
        config_overrides: dict[str, Any] | None = None,
        new_should_module_be_updated: ShouldModuleBeUpdated | None = None,
    ) -> MultiRLModuleSpec:
        """Add and train a new module (e.g. a league opponent), also while ``Trainer.fit`` runs.

        Its optimizers are registered through ``configure_optimizers_for_module`` and, under
        a Trainer, handed to it, so they are stepped and checkpointed from then on. Under
        DDP this is a collective call: every rank adds the module at the same point, and the
        DDP wrapper is rebuilt so that its gradients are averaged too.

        Args:
            module_id: The new module's id.
            module_spec: How to build it (always built for training, not inference only).
            config_overrides: Hyperparameters of this module that differ from the Learner's.
            new_should_module_be_updated: A new ``policies_to_train``; ``None`` keeps the current one.

        Returns:
            The spec of all modules after adding.
        """
        self._check_is_built()
        validate_module_id(module_id)
        if module_id in self._module:
            raise ValueError(f"module {module_id!r} already exists; remove it first or pick another id")
        overrides = self._checked_overrides(module_id, config_overrides or {})
        spec = copy.copy(module_spec)
        spec.inference_only = False
        module = spec.build().to(self.device)

        self._module.add_module(module_id, module)
        if overrides:
            self._config_overrides[module_id] = overrides
        if new_should_module_be_updated is not None:
            self._set_should_module_be_updated(new_should_module_be_updated)
        if self.rl_module_is_compatible(module):
            self.configure_optimizers_for_module(module_id=module_id, config=self.config_for_module(module_id))
        self._compile()
        self._rewrap_data_parallel()
        return self.module_spec

    def remove_module(
        self, module_id: str, *, new_should_module_be_updated: ShouldModuleBeUpdated | None = None
    ) -> MultiRLModuleSpec:
        """Remove a module with its optimizers, schedules, overrides and metrics.

        Under DDP this is a collective call, like ``add_module``.

        Args:
            module_id: The module to remove.
            new_should_module_be_updated: A new ``policies_to_train``; ``None`` keeps the current one.

        Returns:
            The spec of the remaining modules.
        """
        self._check_is_built()
        if module_id not in self._module:
            raise ValueError(f"no module {module_id!r} to remove; modules are {sorted(self._module.keys())}")
        for full_name in self._module_optimizers.pop(module_id, []):
            optimizer = self._named_optimizers.pop(full_name)
            self._optimizer_grad_clip.pop(optimizer, None)
            for param in self._optimizer_parameters.pop(optimizer):
                self._params.pop(self.get_param_ref(param), None)
            self._lr_schedules.pop(full_name, None)
        self._module.remove_module(module_id)
        self._config_overrides.pop(module_id, None)
        self.metrics.delete(module_id)
        if new_should_module_be_updated is not None:
            self._set_should_module_be_updated(new_should_module_be_updated)
        self._sync_trainer_optimizers()
        self._compile()
        self._rewrap_data_parallel()
        return self.module_spec

    def _rewrap_data_parallel(self) -> None:
        """Under DDP, wrap the Learner anew, so that DDP averages the gradients of the current modules.

        DDP fixes the parameters it synchronizes when it is built, and building it is a
        collective call: every rank must add or remove the same module at the same point
        (e.g. in a callback's ``on_train_batch_end``, which every rank runs).
        """
        if not self._is_running_under_trainer():
            return
        strategy = self._trainer.strategy
        if isinstance(strategy.model, DistributedDataParallel):
            # The old wrapper's gradient hooks go with it (its reducer removes them when freed).
            strategy.model = None
            strategy.model = strategy._setup_model(self)  # Lightning's own DDP construction (private)

    def _set_should_module_be_updated(self, rule: ShouldModuleBeUpdated) -> None:
        self._should_module_be_updated = rule
        self.hparams.policies_to_train = None if callable(rule) else sorted(rule)

    # ------------------------------------------------------------------------------------
    # State and checkpoints
    # ------------------------------------------------------------------------------------

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
    ) -> dict[str, Any]:
        """A snapshot of the Learner (copies, unaffected by later updates).

        Args:
            components: ``"rl_module"``, ``"optimizer"``, ``"metrics_logger"`` or a list of
                them; ``None`` for all.
            not_components: Components to leave out.

        Returns:
            The chosen components plus the bookkeeping that rebuilds the Learner: the module
            spec, per-module overrides, ``policies_to_train``, ``weights_seq_no`` and the last
            timesteps (which position the schedules).
        """
        self._check_is_built()
        wanted = _component_filter(components, not_components)
        state: dict[str, Any] = {
            "module_spec": self.module_spec.to_dict(),
            "config_overrides_per_module": copy.deepcopy(self._config_overrides),
            WEIGHTS_SEQ_NO: self._weights_seq_no,
            "timesteps": dict(self._timesteps),
        }
        if not callable(self._should_module_be_updated):
            rule = self._should_module_be_updated
            state["should_module_be_updated"] = None if rule is None else sorted(rule)
        if wanted(COMPONENT_RL_MODULE):
            state[COMPONENT_RL_MODULE] = self._module.get_state()
        if wanted(COMPONENT_OPTIMIZER):
            state[COMPONENT_OPTIMIZER] = self._get_optimizer_state(include_optimizers=True)
        if wanted(COMPONENT_METRICS_LOGGER):
            state[COMPONENT_METRICS_LOGGER] = self.metrics.get_state()
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore (part of) what ``get_state`` returned, for the modules this Learner has.

        Everything is checked before anything changes: unknown module or optimizer names,
        missing or unexpected weights and shape mismatches raise ``ValueError`` naming them.
        To restore a checkpoint whose modules differ, use ``restore_from_path`` or
        ``from_checkpoint``, which add and remove modules to match.
        """
        self._check_is_built()
        if COMPONENT_RL_MODULE in state:
            self._module.check_state(state[COMPONENT_RL_MODULE])
        if COMPONENT_OPTIMIZER in state:
            self._check_optimizer_state(state[COMPONENT_OPTIMIZER])

        if COMPONENT_RL_MODULE in state:
            self._module.set_state(state[COMPONENT_RL_MODULE])
        if COMPONENT_OPTIMIZER in state:
            optimizer_state = state[COMPONENT_OPTIMIZER]
            for full_name, saved in optimizer_state.get("optimizers", {}).items():
                self._named_optimizers[full_name].load_state_dict(_clone_tensors(saved))
            for full_name, saved in optimizer_state.get("lr_schedulers", {}).items():
                self._lr_schedules[full_name].load_state_dict(saved)
        if COMPONENT_METRICS_LOGGER in state:
            self.metrics.set_state(state[COMPONENT_METRICS_LOGGER])
        for module_id, overrides in state.get("config_overrides_per_module", {}).items():
            if module_id in self._module:
                self._config_overrides[module_id] = dict(overrides)
        if state.get("should_module_be_updated", False) is not False:
            rule = state["should_module_be_updated"]
            self._should_module_be_updated = rule
            self.hparams.policies_to_train = rule
        self._weights_seq_no = int(state.get(WEIGHTS_SEQ_NO, self._weights_seq_no))
        self._timesteps.update(state.get("timesteps", {}))

    def save_to_path(self, path: str) -> str:
        """Save the complete Learner to the directory ``path`` (written atomically).

        Returns:
            ``path``; ``restore_from_path(path)`` or ``from_checkpoint(path)`` reads it back.
        """
        payload = self._checkpoint_payload()
        payload["state"] = self.get_state()
        write_learner_dir(path, payload)
        return path

    def restore_from_path(self, path: str) -> None:
        """Restore this Learner from ``save_to_path`` output or a Lightning checkpoint.

        Modules are added or removed to match the checkpoint. If anything does not fit,
        the error names the file and the mismatch, and the Learner is left as it was.
        """
        self._check_is_built()
        file, payload = read_learner_payload(path)
        snapshot = self.get_state()
        try:
            self._apply_payload(payload)
        except Exception as error:
            self._match_modules(snapshot["module_spec"], snapshot["config_overrides_per_module"])
            self.set_state(snapshot)
            raise ValueError(f"cannot restore from {str(file)!r}: {error}") from error

    @classmethod
    def from_checkpoint(cls, path: str, **hparam_overrides: Any) -> Learner:
        """Build a new Learner from a checkpoint alone, added modules included.

        Args:
            path: A ``save_to_path`` directory or a Lightning checkpoint file.
            **hparam_overrides: Hyperparameters to change, or to supply what a checkpoint
                cannot hold (a callable ``policies_to_train``).
        """
        file, payload = read_learner_payload(path)
        learner_class = import_class(payload["learner_class"], cls)
        state = payload["state"]
        try:
            saved = dict(payload["hparams"])
            if saved.get("model_config") is not None:
                # Learners that build their default module from model_config save it as a
                # hyperparameter too; the saved spec already holds it, so pass the spec alone.
                saved["model_config"] = None
            hparams = {
                **saved,
                "config_overrides_per_module": state.get("config_overrides_per_module"),
                **hparam_overrides,
            }
            learner = learner_class(module_spec=MultiRLModuleSpec.from_dict(state["module_spec"]), **hparams)
            learner.build()
            learner._apply_payload(payload)
        except ValueError as error:
            raise ValueError(f"cannot load a Learner from {str(file)!r}: {error}") from error
        return learner

    def setup(self, stage: str) -> None:
        """Lightning's hook: build the Learner if it has not been built.

        Modules whose spec leaves out the observation or action space take it from the
        Trainer's data module (``datamodule.observation_space`` / ``.action_space``).

        Raises:
            ValueError: under ``strategy="fsdp"`` (not supported yet, see below); under
                ``precision="16-mixed"``, whose gradient scaling would hand
                scaled gradients to the Learner's clipping and non-finite checks; when a space
                is missing and no data module provides it; and when ``minibatch_size`` is
                larger than the data module's train batch.
        """
        if isinstance(getattr(self.trainer, "strategy", None), FSDPStrategy):
            # Sharding needs optimizers built on the wrapped parameters, every minibatch's
            # forward pass to go through the FSDP wrapper (the Learner runs all its steps
            # inside one training_step) and gradient norms reduced over shards for clipping.
            raise ValueError(
                f"{type(self).__name__} does not support strategy='fsdp' yet: it builds its optimizers before the "
                "strategy wraps the model and takes all minibatch steps inside one training_step, which FSDP's "
                "parameter sharding does not allow. Use strategy='ddp' (every rank holds the whole model)."
            )
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            raise ValueError(
                f"{type(self).__name__} does not support precision='16-mixed' (gradient scaling) yet: it clips and "
                "checks gradients itself. Use precision='bf16-mixed' or '32-true'."
            )
        datamodule = getattr(self.trainer, "datamodule", None)
        if self._module is None and self._module_spec is not None:
            self._module_spec = _with_spaces_from(self._module_spec, datamodule)
        if stage == "fit":
            self.check_fits_data(datamodule)
        self.build()

    def check_fits_data(self, datamodule: Any) -> None:
        """Check that ``minibatch_size`` fits into one train item of ``datamodule``.

        Data modules that know their train batch size expose it as ``train_batch_size``
        (``EpisodeDataModule``: ``num_envs * rollout_fragment_length``); others are not checked.

        Raises:
            ValueError: Naming both sizes, if the minibatch is larger.
        """
        train_batch_size = getattr(datamodule, "train_batch_size", None)
        minibatch_size = self.hparams.minibatch_size
        if train_batch_size is not None and minibatch_size is not None and minibatch_size > train_batch_size:
            raise ValueError(
                f"minibatch_size={minibatch_size} is larger than the data module's train batch of {train_batch_size} "
                "env steps (num_envs * rollout_fragment_length); lower minibatch_size or sample more steps"
            )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Lightning's hook: add what rebuilds this Learner to a Lightning checkpoint.

        Weights and optimizer states are in the checkpoint already (``state_dict``,
        ``optimizer_states``); this adds the module spec, hyperparameters, optimizer names
        (in Lightning's order), schedules, metrics and counters.
        """
        payload = self._checkpoint_payload()
        state = self.get_state(not_components=[COMPONENT_RL_MODULE, COMPONENT_OPTIMIZER])
        state[COMPONENT_OPTIMIZER] = self._get_optimizer_state(include_optimizers=False)
        payload["state"] = state
        payload["optimizer_order"] = list(self._named_optimizers)
        checkpoint[CHECKPOINT_KEY] = payload

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Lightning's hook: rebuild the modules the checkpoint holds, then restore state.

        Lightning then loads the weights and, when resuming a fit, the optimizer states.
        """
        if CHECKPOINT_KEY not in checkpoint:
            raise ValueError("this checkpoint was not written by a lightning_rl Learner (no 'lightning_rl' entry)")
        payload = checkpoint[CHECKPOINT_KEY]
        state = payload["state"]
        if self._module is None:
            self._module_spec = MultiRLModuleSpec.from_dict(state["module_spec"])
            for module_id, overrides in state.get("config_overrides_per_module", {}).items():
                self._config_overrides[module_id] = dict(overrides)
            self.build()
        self._match_modules(state["module_spec"], state.get("config_overrides_per_module", {}))
        source = f" {str(self._trainer.ckpt_path)!r}" if self._trainer is not None and self._trainer.ckpt_path else ""
        if list(self._named_optimizers) != list(payload["optimizer_order"]):
            raise ValueError(
                f"checkpoint{source}: its optimizers {payload['optimizer_order']} do not match this Learner's "
                f"{list(self._named_optimizers)}"
            )
        try:
            # Lightning loads the weights next; check them first so a mismatch names the keys.
            check_state_matches(self, checkpoint["state_dict"])
        except ValueError as error:
            raise ValueError(f"checkpoint{source}: {error}") from error
        self.set_state(state)

    def _checkpoint_payload(self) -> dict[str, Any]:
        hparams = dict(self.hparams)
        check_plain_data(hparams, "hyperparameters")
        return {"format_version": FORMAT_VERSION, "learner_class": class_path(type(self)), "hparams": hparams}

    def _apply_payload(self, payload: Mapping[str, Any]) -> None:
        """Match modules to the payload, then restore its weights and state (checked first)."""
        state = dict(payload["state"])
        self._match_modules(state["module_spec"], state.get("config_overrides_per_module", {}))
        weights = payload.get("lightning_state_dict")
        if weights is not None:
            check_state_matches(self, weights)
            self._check_optimizer_state(state.get(COMPONENT_OPTIMIZER, {}))
            self.load_state_dict(weights)
        self.set_state(state)

    def _match_modules(self, spec_dict: Mapping[str, Any], overrides: Mapping[str, dict[str, Any]]) -> None:
        """Add and remove modules so that this Learner holds those of ``spec_dict``."""
        spec = MultiRLModuleSpec.from_dict(spec_dict)
        for module_id in [m for m in self._module.keys() if m not in spec.rl_module_specs]:
            self.remove_module(module_id)
        for module_id, module_spec in spec.rl_module_specs.items():
            if module_id not in self._module:
                self.add_module(module_id=module_id, module_spec=module_spec, config_overrides=overrides.get(module_id))

    def _check_optimizer_state(self, optimizer_state: Mapping[str, Any]) -> None:
        for kind, registry in (("optimizers", self._named_optimizers), ("lr_schedulers", self._lr_schedules)):
            unknown = sorted(set(optimizer_state.get(kind, {})) - set(registry))
            if unknown:
                raise ValueError(f"the state holds {kind} {unknown} that this Learner does not have ({sorted(registry)})")
        for full_name, saved in optimizer_state.get("optimizers", {}).items():
            _check_optimizer_state_fits(full_name, self._named_optimizers[full_name], saved)

    def _get_optimizer_state(self, *, include_optimizers: bool) -> dict[str, Any]:
        state: dict[str, Any] = {
            "lr_schedulers": {
                name: _clone_tensors(schedule.state_dict())
                for name, schedule in self._lr_schedules.items()
                if isinstance(schedule, LRScheduler)
            }
        }
        if include_optimizers:
            state["optimizers"] = {
                name: _clone_tensors(optimizer.state_dict()) for name, optimizer in self._named_optimizers.items()
            }
        return state

    # ------------------------------------------------------------------------------------
    # Trainer plumbing and validation
    # ------------------------------------------------------------------------------------

    def _is_running_under_trainer(self) -> bool:
        trainer = self._trainer
        return trainer is not None and trainer.state.status == TrainerStatus.RUNNING

    def _learner_callbacks(self) -> list[Any]:
        if self._trainer is None:
            # Standalone, the Learner's own callbacks (which a Trainer would add) still run.
            if self._own_callbacks is None:
                own = self.configure_callbacks()
                self._own_callbacks = [own] if isinstance(own, Callback) else list(own)
            callbacks = self._own_callbacks
        else:
            callbacks = self._trainer.callbacks
        return [c for c in callbacks if isinstance(c, LearnerCallback)]

    def _lightning_optimizer_map(self) -> dict[Optimizer, Any]:
        if not self._is_running_under_trainer():
            return {}
        return {wrapper.optimizer: wrapper for wrapper in self._trainer.strategy._lightning_optimizers}

    def _sync_trainer_optimizers(self) -> None:
        """Hand the current optimizers to an attached Trainer, so it steps and saves them."""
        if self._trainer is not None:
            self._trainer.strategy.optimizers = list(self._named_optimizers.values())
            self._lightning_optimizers = self._lightning_optimizer_map()

    def _checked_overrides(self, module_id: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(overrides) - set(self.hparams))
        if unknown:
            raise ValueError(f"config overrides for module {module_id!r} name unknown hyperparameters {unknown}")
        overrides = dict(overrides)
        self._check_config({**self.hparams, **overrides}, f"module {module_id!r}")
        return overrides

    @staticmethod
    def _check_config(config: Mapping[str, Any], where: str) -> None:
        Schedule(config["lr"], name=f"{where}: lr")
        grad_clip = config["grad_clip"]
        if grad_clip is not None and not (isinstance(grad_clip, (int, float)) and grad_clip > 0):
            raise ValueError(f"{where}: grad_clip must be a positive number or None, got {grad_clip!r}")
        if config["grad_clip_by"] not in GRAD_CLIP_BY:
            raise ValueError(f"{where}: grad_clip_by must be one of {GRAD_CLIP_BY}, got {config['grad_clip_by']!r}")
        if not (isinstance(config["num_epochs"], int) and config["num_epochs"] >= 1):
            raise ValueError(f"{where}: num_epochs must be an int >= 1, got {config['num_epochs']!r}")
        minibatch_size = config["minibatch_size"]
        if minibatch_size is not None and not (isinstance(minibatch_size, int) and minibatch_size >= 1):
            raise ValueError(f"{where}: minibatch_size must be an int >= 1 or None, got {minibatch_size!r}")
        if config["torch_compile_what_to_compile"] not in WHAT_TO_COMPILE:
            raise ValueError(
                f"{where}: torch_compile_what_to_compile must be one of {WHAT_TO_COMPILE}, "
                f"got {config['torch_compile_what_to_compile']!r}"
            )


def default_adam(params: list[nn.Parameter], **kwargs: Any) -> torch.optim.Adam:
    """``torch.optim.Adam`` with torch's fused kernel wherever the parameters allow it.

    The same update rule, computed by one kernel per step instead of about ten small ops per
    parameter tensor: for the small networks of RL this takes a fifth off a CPU minibatch step.

    Args:
        params: The parameters to optimize.
        **kwargs: Adam's arguments (``lr``, ``eps``, ``betas``, ...).
    """
    fusable = bool(params) and all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params)
    return torch.optim.Adam(params, fused=True if fusable else None, **kwargs)


def clip_gradients(
    gradients: Mapping[Any, torch.Tensor], *, grad_clip: float | None, grad_clip_by: str = "global_norm"
) -> torch.Tensor:
    """Clip ``gradients`` in place and return their global L2 norm from before clipping.

    Args:
        gradients: The gradients of one optimizer, ``{param_ref: grad}``.
        grad_clip: The threshold; ``None`` only measures the norm.
        grad_clip_by: ``"value"``: clamp every element to ``[-grad_clip, grad_clip]``.
            ``"norm"``: scale each tensor whose L2 norm exceeds ``grad_clip`` down to it.
            ``"global_norm"``: scale all tensors by ``grad_clip / global_norm`` when the
            global norm exceeds ``grad_clip`` (``torch.nn.utils.clip_grad_norm_``'s rule,
            with its ``1e-6`` guard against division by zero).
    """
    grads = list(gradients.values())
    norms = torch._foreach_norm(grads)
    global_norm = torch.linalg.vector_norm(torch.stack(norms))
    if grad_clip is None:
        return global_norm
    if grad_clip_by == "value":
        for grad in grads:
            grad.clamp_(-grad_clip, grad_clip)
    elif grad_clip_by == "norm":
        for grad, norm in zip(grads, norms):
            grad.mul_(torch.clamp(grad_clip / (norm + 1e-6), max=1.0))
    elif grad_clip_by == "global_norm":
        torch._foreach_mul_(grads, torch.clamp(grad_clip / (global_norm + 1e-6), max=1.0))
    else:
        raise ValueError(f"grad_clip_by must be one of {GRAD_CLIP_BY}, got {grad_clip_by!r}")
    return global_norm


def _with_spaces_from(spec: MultiRLModuleSpec, datamodule: Any) -> MultiRLModuleSpec:
    """``spec`` with every missing observation/action space taken from ``datamodule``."""
    missing = [
        module_id
        for module_id, module_spec in spec.rl_module_specs.items()
        if module_spec.observation_space is None or module_spec.action_space is None
    ]
    if not missing:
        return spec
    if getattr(datamodule, "observation_space", None) is None or getattr(datamodule, "action_space", None) is None:
        raise ValueError(
            f"the specs of modules {missing} have no observation/action space, and the Trainer has no data module "
            "that provides them: pass the spaces in the module spec, or fit with datamodule=EpisodeDataModule(...)"
        )
    specs = dict(spec.rl_module_specs)
    for module_id in missing:
        specs[module_id] = dataclasses.replace(
            specs[module_id],
            observation_space=specs[module_id].observation_space or datamodule.observation_space,
            action_space=specs[module_id].action_space or datamodule.action_space,
        )
    return dataclasses.replace(spec, rl_module_specs=specs)


def _sum(values: Any) -> torch.Tensor:
    """Sum of tensors; a single tensor is returned as it is (no extra op, no copy)."""
    values = list(values)
    return values[0] if len(values) == 1 else torch.stack(values).sum()


def _global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))


def _set_lr(optimizer: Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def _get_lr(optimizer: Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


def _check_column_shape(
    module_id: str, column: str, values: torch.Tensor | None, space: Any, kind: str
) -> None:
    """Raise if a column's per-row shape does not match its gymnasium space."""
    expected = getattr(space, "shape", None)
    if values is None or expected is None:
        return  # absent column, or a space without a flat shape (Dict, Tuple)
    if tuple(values.shape[1:]) != tuple(expected):
        raise ValueError(
            f"module {module_id!r}: column {column!r} has shape {tuple(values.shape)}, but the {kind} space "
            f"{space} expects [batch, {', '.join(map(str, expected))}]".replace("[batch, ]", "[batch]")
        )


def _check_optimizer_state_fits(full_name: str, optimizer: Optimizer, saved: Mapping[str, Any]) -> None:
    groups = optimizer.param_groups
    saved_groups = saved.get("param_groups", [])
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in saved_groups]:
        raise ValueError(
            f"optimizer {full_name!r}: saved parameter groups of sizes {[len(g['params']) for g in saved_groups]} "
            f"do not fit its groups of sizes {[len(g['params']) for g in groups]}"
        )
    params = [p for group in groups for p in group["params"]]
    saved_ids = [i for group in saved_groups for i in group["params"]]
    position = {saved_id: index for index, saved_id in enumerate(saved_ids)}
    for saved_id, entry in saved.get("state", {}).items():
        param = params[position[saved_id]]
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                raise ValueError(
                    f"optimizer {full_name!r}: saved state {key!r} of shape {tuple(value.shape)} does not fit "
                    f"a parameter of shape {tuple(param.shape)}"
                )


def _component_filter(
    components: str | Collection[str] | None, not_components: str | Collection[str] | None
) -> Callable[[str], bool]:
    def as_set(value: str | Collection[str] | None) -> set[str]:
        return {value} if isinstance(value, str) else set(value or ())

    included, excluded = as_set(components), as_set(not_components)
    return lambda component: (components is None or component in included) and component not in excluded


def _clone_tensors(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {key: _clone_tensors(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone_tensors(item) for item in value)
    return value


def _as_train_item(train_item: TrainItem | Mapping[str, Any]) -> TrainItem:
    """A ``TrainItem`` as it is; a plain batch wrapped in one; an untyped item refused by name."""
    if isinstance(train_item, TrainItem):
        return train_item
    if isinstance(train_item, Mapping):
        if {"episodes", "replay", "batch"} & set(train_item):
            raise ValueError(
                f"training_step got a dict train item with keys {sorted(train_item)}; train items are "
                "lightning_rl.core.train_item.TrainItem(TrainingData(episodes=...), timesteps=..., env_runners=...)"
            )
        return TrainItem(TrainingData(batch=train_item))
    raise ValueError(f"training_step takes a TrainItem or a batch dict, got {type(train_item).__name__}")
