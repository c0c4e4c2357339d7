"""The Learner's optimizers: who trains which parameters, at which learning rate, clipped how.

``OptimizerRegistry`` keeps RLlib's bookkeeping: every optimizer under a full name
``"{module_id}_{optimizer_name}"`` (a module may have several; ``ALL_MODULES`` owns those
spanning modules), the parameters it updates, its own gradient-clip threshold if it has one,
and its learning-rate schedule. The Learner registers optimizers into it
(``Learner.register_optimizer``), asks it which optimizers step after a backward pass, and
saves and restores its state. ``default_adam`` and ``clip_gradients`` are the two numeric
helpers every Learner uses.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal, Union

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from lightning_rl.core.columns import (
    ALL_MODULES,
    DEFAULT_MODULE_ID,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
)
from lightning_rl.core.learner_config import LearnerConfig
from lightning_rl.core.metrics import MetricsLogger
from lightning_rl.core.schedules import Schedule, ScheduleSetting
from lightning_rl.core.sharding import (
    load_optimizer_state,
    local_part,
    optimizer_state,
    whole_copies,
    whole_norms,
)
from lightning_rl.learner._lightning_private import attached_trainer
from lightning_rl.learner.result_keys import LR_KEY

DEFAULT_OPTIMIZER = "default_optimizer"
"""The optimizer name ``register_optimizer`` and ``get_optimizer`` use when none is given."""
GRAD_CLIP_BY = ("value", "norm", "global_norm")

LearningRateOrSchedule = Union[ScheduleSetting, LRScheduler, Callable[[Optimizer], LRScheduler]]
ParamRef = Any  # a hashable reference to a parameter; in torch, the parameter itself


class OptimizerRegistry:
    """Named optimizers per module, with their parameters, clip thresholds and lr schedules.

    The tables are plain dicts, read directly on every gradient step (no copies):

    - ``named``: ``{full_name: optimizer}`` in registration order, the order Lightning sees;
    - ``by_module``: ``{module_id: [full_name, ...]}``;
    - ``params_of``: ``{optimizer: [param, ...]}``, the parameters each one updates;
    - ``params``: ``{param_ref: param}`` over all optimizers;
    - ``grad_clip``: ``{optimizer: threshold}`` for optimizers registered with their own;
    - ``lr_schedules``: ``{full_name: Schedule | LRScheduler}``;
    - ``measured_norms``: ``{optimizer: global grad norm}`` measured while clipping in the
      current gradient step, so that the non-finite check need not measure again.

    Args:
        param_ref: Maps a parameter to its hashable reference (``Learner.get_param_ref``).
    """

    def __init__(self, param_ref: Callable[[nn.Parameter], ParamRef]) -> None:
        self.param_ref = param_ref
        self.clear()

    def clear(self) -> None:
        """Forget every optimizer (sharding registers them all again, on the slices)."""
        self.named: dict[str, Optimizer] = {}
        self.by_module: dict[str, list[str]] = defaultdict(list)
        self.params_of: dict[Optimizer, list[nn.Parameter]] = {}
        self.params: dict[ParamRef, nn.Parameter] = {}
        self.grad_clip: dict[Optimizer, float | None] = {}
        self.lr_schedules: dict[str, Schedule | LRScheduler] = {}
        self.measured_norms: dict[Optimizer, torch.Tensor] = {}
        # Optimizers registered outside configure_optimizers_for_module (which sharding cannot rebuild).
        self.registered_directly: set[str] = set()
        self.configuring = False

    # ------------------------------------------------------------------------------------
    # Registering and looking up
    # ------------------------------------------------------------------------------------

    def register(
        self,
        *,
        module_id: str,
        optimizer_name: str,
        optimizer: Optimizer,
        params: list[nn.Parameter],
        lr_or_lr_schedule: LearningRateOrSchedule | None,
        grad_clip: float | None | Literal["module"],
        timestep: float,
    ) -> None:
        """Add ``optimizer`` under ``{module_id}_{optimizer_name}`` (see ``Learner.register_optimizer``).

        Args:
            timestep: The current ``num_env_steps_sampled_lifetime``, which positions a
                piecewise learning-rate schedule right away.

        Raises:
            ValueError: For a taken name, an optimizer not built over exactly ``params``,
                parameters another optimizer already owns, or an unusable schedule.
        """
        full_name = f"{module_id}_{optimizer_name}"
        if full_name in self.named:
            raise ValueError(f"an optimizer named {optimizer_name!r} is already registered for module {module_id!r}")
        self._check_new_optimizer(optimizer, params, full_name)
        schedule = _make_lr_schedule(lr_or_lr_schedule, optimizer, full_name)

        self.named[full_name] = optimizer
        self.by_module[module_id].append(full_name)
        if not self.configuring:
            self.registered_directly.add(full_name)
        self.params_of[optimizer] = list(params)
        if grad_clip != "module":
            self.grad_clip[optimizer] = grad_clip
        for param in params:
            self.params[self.param_ref(param)] = param
        if schedule is not None:
            self.lr_schedules[full_name] = schedule
            if isinstance(schedule, Schedule):
                _set_lr(optimizer, schedule.value(timestep))

    def remove_module(self, module_id: str) -> None:
        """Forget the optimizers of ``module_id``, with their parameters and schedules."""
        for full_name in self.by_module.pop(module_id, []):
            self.registered_directly.discard(full_name)
            optimizer = self.named.pop(full_name)
            self.grad_clip.pop(optimizer, None)
            for param in self.params_of.pop(optimizer):
                self.params.pop(self.param_ref(param), None)
            self.lr_schedules.pop(full_name, None)

    def get(self, module_id: str, optimizer_name: str) -> Optimizer:
        """The optimizer registered as ``optimizer_name`` (short or full name) for ``module_id``.

        Raises:
            KeyError: Naming the registered optimizers, if there is none.
        """
        for name in (optimizer_name, f"{module_id}_{optimizer_name}"):
            if name in self.named:
                return self.named[name]
        raise KeyError(f"no optimizer {optimizer_name!r} for module {module_id!r}; registered: {sorted(self.named)}")

    # ------------------------------------------------------------------------------------
    # Per update and per gradient step
    # ------------------------------------------------------------------------------------

    def update_learning_rates(self, timestep: float, metrics: MetricsLogger) -> None:
        """Set every scheduled learning rate for ``timestep`` and log each optimizer's rate.

        Logged as ``(module_id, "{optimizer_name}_learning_rate")``, the last value kept.
        """
        for module_id, full_names in self.by_module.items():
            for full_name in full_names:
                optimizer = self.named[full_name]
                schedule = self.lr_schedules.get(full_name)
                if isinstance(schedule, Schedule):
                    _set_lr(optimizer, schedule.value(timestep))
                key = (module_id, f"{_short_name(module_id, full_name)}_{LR_KEY}")
                metrics.log_value(key, _get_lr(optimizer), window=1, clear_on_reduce=True)

    def step_lr_schedulers(self) -> None:
        """Step every torch ``LRScheduler`` once (after each update)."""
        for schedule in self.lr_schedules.values():
            if isinstance(schedule, LRScheduler):
                schedule.step()

    def clear_grads(self, *, in_place: bool = False) -> None:
        """Reset the gradient of every registered parameter to ``None``, or zero it where it is kept.

        Args:
            in_place: Zero the gradient tensors that exist instead (a CUDA graph's step
                backpropagates into the same tensors at every replay).
        """
        if in_place:
            grads = [param.grad for param in self.params.values() if param.grad is not None]
            if grads:
                torch._foreach_zero_(grads)
            return
        for param in self.params.values():
            param.grad = None

    def attach_gradients(
        self,
        gradients_dict: Mapping[ParamRef, torch.Tensor],
        module_ids: Collection[str],
        optimizer_names: Collection[str] | None = None,
    ) -> tuple[list[tuple[str, Optimizer]], list[torch.Tensor]]:
        """Point each parameter's ``.grad`` at its gradient, for the optimizers of ``module_ids``.

        Args:
            gradients_dict: ``{param_ref: gradient}``.
            module_ids: The modules whose optimizers may step.
            optimizer_names: Only the optimizers registered under these names (``None``: all).

        Returns:
            The ``(module_id, optimizer)`` pairs that have gradients, and the global norm of
            each one's gradients (taken while clipping if it was, measured here otherwise).
        """
        measured, self.measured_norms = self.measured_norms, {}
        to_step: list[tuple[str, Optimizer]] = []
        norms: list[torch.Tensor] = []
        for module_id in module_ids:
            for full_name in self.by_module[module_id]:
                if optimizer_names is not None and _short_name(module_id, full_name) not in optimizer_names:
                    continue
                optimizer = self.named[full_name]
                grads = []
                for param in self.params_of[optimizer]:
                    grad = gradients_dict.get(self.param_ref(param))
                    if grad is not param.grad:
                        param.grad = grad
                    if grad is not None:
                        grads.append(grad)
                if grads:
                    to_step.append((module_id, optimizer))
                    norm = measured.get(optimizer)
                    norms.append(_global_norm(grads) if norm is None else norm)
        return to_step, norms

    # ------------------------------------------------------------------------------------
    # State
    # ------------------------------------------------------------------------------------

    def get_state(self, *, include_optimizers: bool) -> dict[str, Any]:
        """Copies of the ``LRScheduler`` states and, if asked, of the optimizer states, by full name."""
        state: dict[str, Any] = {
            "lr_schedulers": {
                name: whole_copies(schedule.state_dict())
                for name, schedule in self.lr_schedules.items()
                if isinstance(schedule, LRScheduler)
            }
        }
        if include_optimizers:
            state["optimizers"] = {name: optimizer_state(opt) for name, opt in self.named.items()}
        return state

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` if ``set_state`` would reject ``state``; change nothing.

        Rejected: optimizer or scheduler names this registry does not have, and saved
        optimizer states whose parameter groups or moment shapes do not fit.
        """
        for kind, registry in (("optimizers", self.named), ("lr_schedulers", self.lr_schedules)):
            unknown = sorted(set(state.get(kind, {})) - set(registry))
            if unknown:
                raise ValueError(
                    f"the state holds {kind} {unknown} that this Learner does not have ({sorted(registry)})"
                )
        for full_name, saved in state.get("optimizers", {}).items():
            _check_optimizer_state_fits(full_name, self.named[full_name], saved)

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Load what ``get_state`` returned (checked by ``check_state`` beforehand)."""
        for full_name, saved in state.get("optimizers", {}).items():
            load_optimizer_state(self.named[full_name], whole_copies(saved))
        for full_name, saved in state.get("lr_schedulers", {}).items():
            self.lr_schedules[full_name].load_state_dict(saved)

    def _check_new_optimizer(self, optimizer: Optimizer, params: list[nn.Parameter], full_name: str) -> None:
        if not isinstance(optimizer, Optimizer):
            raise ValueError(f"optimizer {full_name!r} must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not isinstance(params, list) or not all(isinstance(p, nn.Parameter) for p in params):
            raise ValueError(f"params of optimizer {full_name!r} must be a list of torch.nn.Parameter")
        optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if optimized != {id(p) for p in params}:
            raise ValueError(
                f"optimizer {full_name!r} must be constructed over exactly the params it is registered with"
            )
        taken = [p for p in params if self.param_ref(p) in self.params]
        if taken:
            raise ValueError(f"optimizer {full_name!r}: {len(taken)} of its params already belong to another optimizer")


class OptimizersMixin:
    """The Learner's optimizer API, RLlib's names (a part of ``Learner``, which inherits it).

    The bookkeeping is the Learner's ``OptimizerRegistry`` (``learner.optimizer_registry``);
    these methods are what a Learner subclass calls or overrides
    (``configure_optimizers_for_module``, the override point). The mixin holds no state.
    """

    def configure_optimizers(self) -> list[Optimizer]:
        """Register optimizers for every module that has none yet, and return all of them.

        ``build`` calls this once; Lightning calls it again as its own hook and receives the
        registered optimizers, so the Trainer wraps, steps and checkpoints them. Override
        ``configure_optimizers_for_module`` rather than this method.
        """
        for module_id in self.module.keys():
            has_optimizers = module_id in self.optimizer_registry.by_module
            if not has_optimizers and self.rl_module_is_compatible(self.module[module_id]):
                self._configure_module_optimizers(module_id)
        return list(self.optimizer_registry.named.values())

    def _configure_module_optimizers(self, module_id: str) -> None:
        """``configure_optimizers_for_module`` for ``module_id``, noting that what it registers can be rebuilt.

        Sharding (FSDP2) builds every optimizer again this way; one registered otherwise
        (``register_optimizer`` after ``build``) could not be, and is refused before sharding.
        A module without parameters (a fixed opponent such as ``RandomLegalModule``) has
        nothing to optimize and gets no optimizer.
        """
        if not any(True for _ in self.module[module_id].parameters()):
            return
        self.optimizer_registry.configuring = True
        try:
            self.configure_optimizers_for_module(module_id=module_id, config=self.config_for_module(module_id))
        finally:
            self.optimizer_registry.configuring = False

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
            module_id=module_id, optimizer=default_adam(params), params=params, lr_or_lr_schedule=config.lr
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
        """Register an optimizer under ``{module_id}_{optimizer_name}``; an attached Trainer gets it too.

        Args:
            module_id: The module it trains (``ALL_MODULES`` for one spanning modules).
            optimizer_name: Its name within the module; a module may have several.
            optimizer: The optimizer, constructed over exactly ``params``.
            params: The parameters it updates (and whose gradients it clips).
            lr_or_lr_schedule: ``None`` to leave the learning rate to the optimizer; a
                number or piecewise list (set before every update from
                ``num_env_steps_sampled_lifetime``); a torch ``LRScheduler`` built on this
                optimizer, or a callable that builds one from it (stepped after every update).
            grad_clip: This optimizer's own clip threshold (``None``: no clipping), or
                ``"module"`` for the module's ``grad_clip``.
        """
        self.optimizer_registry.register(
            module_id=module_id,
            optimizer_name=optimizer_name,
            optimizer=optimizer,
            params=params,
            lr_or_lr_schedule=lr_or_lr_schedule,
            grad_clip=grad_clip,
            timestep=self.timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0),
        )
        self._sync_trainer_optimizers()

    def get_optimizer(self, module_id: str = DEFAULT_MODULE_ID, optimizer_name: str = DEFAULT_OPTIMIZER) -> Optimizer:
        """The optimizer registered as ``optimizer_name`` (short or full name) for ``module_id``."""
        return self.optimizer_registry.get(module_id, optimizer_name)

    def get_optimizers_for_module(self, module_id: str = ALL_MODULES) -> list[tuple[str, Optimizer]]:
        """``(optimizer_name, optimizer)`` pairs registered for ``module_id``, short names."""
        registry = self.optimizer_registry
        return [(_short_name(module_id, name), registry.named[name]) for name in registry.by_module.get(module_id, [])]

    def get_parameters(self, module: nn.Module) -> list[nn.Parameter]:
        """The trainable parameters of ``module``."""
        return [p for p in module.parameters() if p.requires_grad]

    def get_param_ref(self, param: nn.Parameter) -> nn.Parameter:
        """A hashable reference to ``param``; in torch, the parameter itself."""
        return param

    def filter_param_dict_for_optimizer(self, param_dict: Mapping[Any, Any], optimizer: Optimizer) -> dict[Any, Any]:
        """The non-``None`` entries of ``param_dict`` (keyed by param ref) that belong to ``optimizer``."""
        return {
            ref: param_dict[ref]
            for ref in self.optimizer_registry.params_of[optimizer]
            if ref in param_dict and param_dict[ref] is not None
        }

    @property
    def _named_optimizers(self) -> dict[str, Optimizer]:
        """RLlib's ``{full_name: optimizer}`` table, in registration order (the registry's ``named``)."""
        return self.optimizer_registry.named

    def _rebuild_optimizers(self, state: Mapping[str, Any]) -> None:
        """Register every module's optimizers anew (on its current parameters) and load ``state`` into them.

        ``state`` is what ``OptimizerRegistry.get_state(include_optimizers=True)`` returned
        before the parameters were replaced (sharding replaces them). Skips in a row go on
        counting on the new optimizers (their names are the old ones').
        """
        registry = self.optimizer_registry
        old_named = dict(registry.named)
        registry.clear()
        self.configure_optimizers()
        registry.check_state(state)
        registry.set_state(state)
        self.step_runner.follow_rebuilt_optimizers(
            {old: registry.named[name] for name, old in old_named.items() if name in registry.named}
        )
        self._sync_trainer_optimizers()

    def _sync_trainer_optimizers(self) -> None:
        """Hand the current optimizers to an attached Trainer, so it steps and saves them."""
        trainer = attached_trainer(self)
        if trainer is not None:
            trainer.strategy.optimizers = list(self.optimizer_registry.named.values())
            self.step_runner.attach_trainer()


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
    # Sharded gradients (FSDP2) are clipped slice by slice, by the norms of the whole tensors,
    # so that every rank clips alike and the result equals clipping the whole gradients.
    norms = whole_norms(list(gradients.values()))
    grads = [local_part(grad) for grad in gradients.values()]
    global_norm = torch.linalg.vector_norm(norms)
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


def _make_lr_schedule(
    setting: LearningRateOrSchedule | None, optimizer: Optimizer, full_name: str
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


def _short_name(module_id: str, full_name: str) -> str:
    """The name an optimizer was registered under, from its registry name ``f"{module_id}_{name}"``."""
    return full_name[len(module_id) + 1 :]


def _global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.linalg.vector_norm(whole_norms(grads))


def _set_lr(optimizer: Optimizer, lr: float) -> None:
    # A fused or capturable optimizer may hold its rate as a tensor, which must stay one.
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def _get_lr(optimizer: Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


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
