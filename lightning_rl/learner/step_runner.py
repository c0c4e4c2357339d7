"""How a Learner takes its gradient steps: the one owner of the state of taking a step.

A ``StepRunner`` runs the minibatch steps of one update and keeps what they need between
calls: the (compiled) train pass and minibatch step, the running Trainer's optimizer wrappers
and whether its per-step hooks have listeners, the FSDP2 mesh and the anchor of the current
sharded step, the modules the current update trains (agreed over the DDP ranks), the
optimizer steps skipped for non-finite gradients, and ``weights_seq_no``.

It owns no numerics of its own. Each minibatch step calls the Learner's override points in
RLlib's order (``compute_losses``, ``compute_gradients``, ``postprocess_gradients``,
``apply_gradients``); the Learner's default ``compute_gradients`` and ``apply_gradients``
call back into ``backward`` and ``apply`` here, which is where Lightning's dispatch, DDP's
and FSDP2's step-keeping and the non-finite check live. The Learner reaches the runner as
``learner.step_runner``; the runner reaches the Learner through ``StepHooks``, the public
methods it calls.

Under data parallelism (``Trainer(strategy="ddp")``) every rank runs the same update on its
own shard, and each backward pass is a collective call: every rank must take the same number
of minibatch steps, and each backward pass must reach every parameter, or some rank waits
forever. ``agree_with_other_ranks`` (one all-gather before the steps) and
``unused_parameter_anchor`` (a zero loss term touching every parameter) see to that. DDP
averages the ranks' gradients, which weighs every rank alike; each module's loss is weighted
by its rank's share of that module's rows (``RankAgreement.loss_weights``), so that a module
with more rows on one rank than on another, or with rows on some ranks only (a multi-agent
shard without that module's agents), gets the gradient of its mean loss over all its rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.trainer.states import TrainerStatus
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from lightning_rl.core.batch import (
    MultiModuleBatch,
    iterate_minibatches,
    num_env_steps,
    num_rows,
)
from lightning_rl.core.columns import ALL_MODULES
from lightning_rl.core.metrics import MetricsLogger
from lightning_rl.core.recurrent import max_seq_len_of
from lightning_rl.core.rl_modules import MultiRLModule
from lightning_rl.learner._lightning_private import (
    attached_trainer,
    step_hooks_have_listeners,
    step_without_dispatch,
    wrap_model_for_strategy,
)
from lightning_rl.learner.cuda_graphs import GradientPass, GraphedSteps
from lightning_rl.learner.optimizers import OptimizerRegistry
from lightning_rl.learner.result_keys import (
    MODULE_TRAIN_BATCH_SIZE_MEAN,
    NUM_ENV_STEPS_TRAINED,
    NUM_ENV_STEPS_TRAINED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    NUM_NON_FINITE_UPDATES_SKIPPED,
    TOTAL_LOSS_KEY,
    WEIGHTS_SEQ_NO,
)
from lightning_rl.learner.sharding import reduce_replicated_gradients

WHAT_TO_COMPILE = ("forward_train", "complete_update")


class StepHooks(Protocol):
    """What a ``StepRunner`` calls on its Learner: RLlib's override points and the Learner's public state."""

    metrics: MetricsLogger

    @property
    def module(self) -> MultiRLModule | None: ...

    @property
    def optimizer_registry(self) -> OptimizerRegistry: ...

    def config_for_module(self, module_id: str) -> Mapping[str, Any]: ...

    def gradient_phases(self) -> tuple[frozenset[str] | None, ...]: ...

    def compute_losses(self, *, fwd_out: dict[str, Any], batch: MultiModuleBatch) -> dict[str, torch.Tensor]: ...

    def compute_gradients(self, loss_per_module: Mapping[str, torch.Tensor], **kwargs: Any) -> dict[Any, torch.Tensor]: ...

    def postprocess_gradients(self, gradients_dict: dict[Any, torch.Tensor]) -> dict[Any, torch.Tensor]: ...

    def apply_gradients(self, gradients_dict: Mapping[Any, torch.Tensor]) -> None: ...

    def get_optimizers_for_module(self, module_id: str) -> list[tuple[str, Optimizer]]: ...

    def cuda_graph_key(self) -> Hashable | None: ...

    def should_module_be_updated(self, module_id: str, batch: MultiModuleBatch | None = None) -> bool: ...


@dataclasses.dataclass
class NonFiniteSteps:
    """Optimizer steps skipped for non-finite gradients: the running count of one run, not saved state.

    ``StepRunner.step_or_skip`` fills it and ``StepRunner.minibatch_step`` reads it. A skipped step
    leaves the weights as they were, so a checkpoint holds finite weights, and a run resumed
    from it (often with a lower learning rate or cleaner data) starts counting afresh.

    Attributes:
        in_a_row: Steps each optimizer skipped since it last stepped (optimizers with none are absent).
        all_skipped: Whether every optimizer the last minibatch step tried to step was skipped.
        over_limit: ``(module_id, optimizer, in_a_row)`` for each optimizer that reached its
            module's ``max_consecutive_non_finite_steps`` in the last minibatch step.
    """

    in_a_row: dict[Optimizer, int] = dataclasses.field(default_factory=dict)
    all_skipped: bool = False
    over_limit: list[tuple[str, Optimizer, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class StepsTrained:
    """What minibatch steps trained: rows per module, steps, env steps (rows of the largest module).

    Rows are env steps: a stateful module's sequences count their real (unpadded) steps.

    ``num_steps_applied`` counts the steps that changed the weights: all but those whose every
    optimizer step was skipped for non-finite gradients.
    """

    module_rows: dict[str, int] = dataclasses.field(default_factory=dict)
    num_steps: int = 0
    env_steps: int = 0
    num_steps_applied: int = 0

    def __add__(self, other: StepsTrained) -> StepsTrained:
        rows = dict(self.module_rows)
        for module_id, count in other.module_rows.items():
            rows[module_id] = rows.get(module_id, 0) + count
        return StepsTrained(
            rows,
            self.num_steps + other.num_steps,
            self.env_steps + other.env_steps,
            self.num_steps_applied + other.num_steps_applied,
        )


class StepRunner:
    """Runs a Learner's minibatch steps and owns the state of taking them.

    Args:
        learner: The Learner whose steps these are (a ``LightningModule`` with ``StepHooks``).
        torch_compile: Whether to compile with ``torch.compile``.
        what_to_compile: ``"forward_train"`` (the modules' train pass) or ``"complete_update"``
            (the whole minibatch step).
        cuda_graphs: Whether to replay the minibatch steps from CUDA graphs (``cuda_graphs.py``).

    Attributes:
        sharding_mesh: Under a sharding strategy (FSDP2), the mesh the modules are sharded
            over (set by ``Learner.shard_modules``); ``None`` otherwise.
        modules_in_update: The modules the current update trains (agreed over all ranks);
            ``None`` outside updates and on a single rank.
        non_finite: Optimizer steps skipped for non-finite gradients.
        weights_seq_no: Minibatch steps that changed the weights, over the Learner's life.
        step_outputs: Tensors the last minibatch step handed back to the Learner (e.g. an
            off-policy loss's TD errors, for prioritized replay), by key; emptied when a step
            starts. Through this dict, a step replayed from a CUDA graph hands them back too.
        gradient_phase: The names of the optimizers the running phase of a minibatch step
            steps (``Learner.gradient_phases``); ``None`` (all) outside the steps and in a
            Learner with one phase.
    """

    def __init__(
        self,
        learner: Any,
        *,
        torch_compile: bool = False,
        what_to_compile: str = "forward_train",
        cuda_graphs: bool = False,
    ) -> None:
        self._learner = learner
        self._torch_compile = torch_compile
        self._what_to_compile = what_to_compile
        self._forward_train_fn: Callable[..., dict[str, Any]] | None = None
        self._minibatch_step_fn: Callable[[MultiModuleBatch], bool] = self.minibatch_step
        self._optimizer_wrappers: dict[Optimizer, Any] = {}
        # Whether the running Trainer's per-step hooks have listeners (step_hooks_have_listeners);
        # set with the wrappers at each update, and True until then: dispatching is never wrong.
        self._dispatch_step_hooks = True
        self._step_anchor: torch.Tensor | None = None
        self._graphs = GraphedSteps(self) if cuda_graphs else None
        # While a CUDA graph captures a step: where ``apply`` leaves the gradients' norms instead of stepping.
        self._gradient_pass: GradientPass | None = None
        self.sharding_mesh: Any = None
        self.modules_in_update: set[str] | None = None
        # {module_id: weight} of this rank's module losses in the current update (only weights other than 1).
        self._loss_weights: dict[str, float] = {}
        self.non_finite = NonFiniteSteps()
        self.weights_seq_no = 0
        self.step_outputs: dict[Hashable, torch.Tensor] = {}
        self.gradient_phase: frozenset[str] | None = None

    # ------------------------------------------------------------------------------------
    # Set-up: what is compiled, and how the running Trainer takes a step
    # ------------------------------------------------------------------------------------

    def compile(self, module: MultiRLModule) -> None:
        """Take the train pass of ``module`` (and the minibatch step), compiled if the Learner asks for it.

        Called after ``build`` and whenever the modules change (added, removed, sharded).
        """
        self._forward_train_fn = module.forward_train
        self._minibatch_step_fn = self.minibatch_step
        if self._graphs is not None:
            self._graphs.check_learner()
            self._graphs.reset()
        if self._torch_compile:
            if self._what_to_compile == "forward_train":
                self._forward_train_fn = torch.compile(module.forward_train, dynamic=True)
            else:
                self._minibatch_step_fn = torch.compile(self.minibatch_step, dynamic=True)

    @property
    def cuda_graphs(self) -> GraphedSteps | None:
        """The CUDA graphs of the minibatch steps (``cuda_graphs=True``); ``None`` for eager steps."""
        return self._graphs

    @property
    def learner(self) -> Any:
        """The Learner whose steps these are."""
        return self._learner

    def running_trainer(self) -> Trainer | None:
        """The attached Trainer while it runs (fit, validate, ...); ``None`` otherwise."""
        trainer = attached_trainer(self._learner)
        return trainer if trainer is not None and trainer.state.status == TrainerStatus.RUNNING else None

    def is_data_parallel(self) -> bool:
        """Whether the Learner runs on several ranks of a Trainer (DDP), which must take their steps in step."""
        trainer = self.running_trainer()
        return trainer is not None and trainer.world_size > 1

    def attach_trainer(self) -> None:
        """Look up, once per update, how the running Trainer takes a step.

        Keeps ``{optimizer: its LightningOptimizer wrapper}`` (none without a running Trainer)
        and whether anything listens to the Trainer's per-step hooks (else the steps skip
        Lightning's dispatch: the same arithmetic, without the hook calls).
        """
        trainer = self.running_trainer()
        if trainer is None:
            self._optimizer_wrappers, self._dispatch_step_hooks = {}, True
            return
        wrappers = self._learner.optimizers()
        wrappers = wrappers if isinstance(wrappers, list) else [wrappers]
        self._optimizer_wrappers = {wrapper.optimizer: wrapper for wrapper in wrappers}
        self._dispatch_step_hooks = step_hooks_have_listeners(trainer, self._learner)

    def follow_rebuilt_optimizers(self, new_of_old: Mapping[Optimizer, Optimizer]) -> None:
        """Go on counting skipped steps on the optimizers that replaced ``new_of_old``'s keys (sharding rebuilds them)."""
        self.non_finite = NonFiniteSteps(
            in_a_row={new_of_old[old]: count for old, count in self.non_finite.in_a_row.items() if old in new_of_old}
        )

    def rewrap_data_parallel(self, module: nn.Module) -> None:
        """Under DDP, wrap ``module`` anew, so that DDP averages the gradients of its current parameters.

        DDP fixes the parameters it synchronizes when it is built, and building it is a
        collective call: every rank must add or remove the same module at the same point
        (e.g. in a callback's ``on_train_batch_end``, which every rank runs).
        """
        trainer = self.running_trainer()
        if trainer is not None and is_wrapped_in_ddp(trainer.strategy):
            # The old wrapper's gradient hooks go with it (its reducer removes them when freed).
            trainer.strategy.model = None
            trainer.strategy.model = wrap_model_for_strategy(trainer.strategy, module)

    # ------------------------------------------------------------------------------------
    # An update's steps
    # ------------------------------------------------------------------------------------

    def run(
        self,
        batch: MultiModuleBatch,
        *,
        num_epochs: int,
        minibatch_size: int | None,
        shuffle: bool,
        device: torch.device,
    ) -> StepsTrained:
        """The minibatch steps of ``num_epochs`` passes over ``batch``, in step with the other DDP ranks.

        Called between the before/after hooks of an update, after ``attach_trainer``.

        Args:
            batch: The prepared batch of the modules to train; may be ``{}`` on a
                data-parallel rank without rows, which still takes every step in step with the others.
            num_epochs: Passes over the batch.
            minibatch_size: Env steps per step; ``None`` for the whole batch. Stateful modules
                train on whole sequences holding about that many real steps
                (``check_minibatch_size``; ``iterate_minibatches``).
            shuffle: Whether each pass visits the rows in a new random order.
            device: Where the ranks' agreement is reduced (the Learner's device).

        Raises:
            ValueError: With sharded modules outside their Trainer (the ranks would not agree
                on their steps, and could wait on each other forever); on several ranks asked
                for different ``num_epochs`` or ``minibatch_size``; for a ``minibatch_size``
                below a stateful module's ``max_seq_len``.
        """
        if self.sharding_mesh is not None and self.running_trainer() is None:
            raise ValueError(
                f"{type(self._learner).__name__}'s modules are sharded (FSDP2): it updates only within the Trainer "
                "that sharded them (Trainer.fit, or a LearnerGroup), where the ranks keep in step"
            )
        self.modules_in_update, num_rows_per_pass, self._loss_weights = None, None, {}
        self.check_minibatch_size(minibatch_size)
        if self.is_data_parallel():
            agreement = agree_with_other_ranks(
                list(self._learner.module.keys()),
                batch,
                num_epochs=num_epochs,
                minibatch_size=minibatch_size,
                device=device,
            )
            self.modules_in_update, num_rows_per_pass = agreement.modules, agreement.num_rows_per_pass
            self._loss_weights = agreement.loss_weights
        trained = StepsTrained()
        try:
            if batch or self.modules_in_update:
                trained = self._minibatch_steps(batch, num_epochs, minibatch_size, shuffle, num_rows_per_pass)
        finally:
            self.modules_in_update, self._loss_weights = None, {}
        # Only steps that changed the weights count: one whose optimizers all skipped for
        # non-finite gradients does not, so a TargetNetworkUpdate does not fire on it.
        self.weights_seq_no += trained.num_steps_applied
        return trained

    def check_minibatch_size(self, minibatch_size: int | None) -> None:
        """Raise if this Learner's modules cannot take minibatches of ``minibatch_size`` env steps.

        Read from the Learner's modules, not from the batch, so that a data-parallel rank
        without rows decides as the others do.

        Args:
            minibatch_size: Env steps per minibatch, as users set it; ``None`` for the whole batch.

        Raises:
            ValueError: For a ``minibatch_size`` below a stateful module's ``max_seq_len`` (a
                minibatch holds whole sequences), naming the module.
        """
        if minibatch_size is None:
            return
        for module_id, module in self._learner.module.items():
            if module.is_stateful() and minibatch_size < max_seq_len_of(module):
                raise ValueError(
                    f"minibatch_size={minibatch_size} is below module {module_id!r}'s max_seq_len="
                    f"{max_seq_len_of(module)}: a stateful module's minibatch holds whole sequences, so make "
                    "minibatch_size at least max_seq_len (or max_seq_len smaller)"
                )

    def _minibatch_steps(
        self,
        batch: MultiModuleBatch,
        num_epochs: int,
        minibatch_size: int | None,
        shuffle: bool,
        num_rows_per_pass: int | None,
    ) -> StepsTrained:
        """Call the minibatch step on every minibatch of ``num_epochs`` passes; count rows and steps."""
        module_rows: dict[str, int] = defaultdict(int)
        num_steps = num_steps_applied = env_steps = 0
        step = self._minibatch_step_fn
        listeners = self._dispatch_step_hooks and self.running_trainer() is not None
        if self._graphs is not None and self._graphs.start_update(
            self._cuda_graph_key(), listeners, self._learner.device
        ):
            step = self._graphs.step
        for minibatch in iterate_minibatches(
            batch,
            num_epochs=num_epochs,
            minibatch_size=minibatch_size,
            shuffle=shuffle,
            num_rows_per_pass=num_rows_per_pass,
        ):
            num_steps_applied += bool(step(minibatch))
            rows = {module_id: num_env_steps(module_batch) for module_id, module_batch in minibatch.items()}
            for module_id, count in rows.items():
                module_rows[module_id] += count
            env_steps += max(rows.values(), default=0)
            num_steps += 1
        return StepsTrained(dict(module_rows), num_steps, env_steps, num_steps_applied)

    def _cuda_graph_key(self) -> Hashable | None:
        """The Learner's ``cuda_graph_key`` and which modules it trains (the graphs step those optimizers)."""
        key = self._learner.cuda_graph_key()
        if key is None:
            return None
        trained = tuple(self._learner.should_module_be_updated(module_id) for module_id in sorted(self._learner.module))
        return key, trained

    def minibatch_step(self, minibatch: MultiModuleBatch) -> bool:
        """One gradient step: forward, losses, backward, clip, optimizer steps, loss logging.

        Returns:
            Whether it changed any weights: ``False`` when every optimizer it was to step
            skipped its step for non-finite gradients.

        Raises:
            FloatingPointError: When an optimizer has now skipped its module's
                ``max_consecutive_non_finite_steps`` steps in a row.
        """
        loss_per_module = self.compute_and_apply(minibatch)
        self.raise_if_too_many_non_finite_steps(loss_per_module)
        return not self.non_finite.all_skipped

    def compute_and_apply(self, minibatch: MultiModuleBatch) -> dict[str, torch.Tensor]:
        """A minibatch step but its last check: each gradient phase's forward, losses, gradients and their
        application, then the loss logging.

        Returns:
            The losses per module (and ``ALL_MODULES``' total), summed over the phases.
        """
        learner = self._learner
        self.step_outputs = {}
        totals: dict[str, torch.Tensor] = {}
        all_skipped = True
        try:
            for phase in learner.gradient_phases():
                self.gradient_phase = phase
                for module_id, loss in self._compute_and_apply_phase(minibatch).items():
                    totals[module_id] = totals[module_id] + loss if module_id in totals else loss
                all_skipped = all_skipped and self.non_finite.all_skipped
        finally:
            self.gradient_phase = None
        self.non_finite.all_skipped = all_skipped
        for module_id, loss in totals.items():
            learner.metrics.log_value((module_id, TOTAL_LOSS_KEY), loss, window=math.inf, clear_on_reduce=True)
        return totals

    def _compute_and_apply_phase(self, minibatch: MultiModuleBatch) -> dict[str, torch.Tensor]:
        """One gradient phase of a minibatch step: forward, losses, gradients, the phase's optimizer steps."""
        learner = self._learner
        if self.sharding_mesh is not None:
            # All modules are one FSDP unit, so any pass of it gathers the same weights: the
            # modules this rank has rows of run (none, on a rank without rows). Then the unit's
            # zero pass returns zero times every parameter: added to the loss (``backward``),
            # it gives every parameter a gradient, so every rank reduces the same ones, and as
            # an output of the unit it starts FSDP's reduction on every rank.
            has_rows = any(num_rows(batch) > 0 for batch in minibatch.values())
            fwd_out = self._forward_train(minibatch) if has_rows else {}
            self._step_anchor = learner.module.zero_pass(torch.zeros((), device=learner.device))
        else:
            # A data-parallel rank without rows in this step still backpropagates (zeros), in step with the others.
            fwd_out = self._forward_train(minibatch) if minibatch else {}
        loss_per_module = dict(learner.compute_losses(fwd_out=fwd_out, batch=minibatch))
        if ALL_MODULES not in loss_per_module and loss_per_module:
            loss_per_module[ALL_MODULES] = sum_losses(loss_per_module.values())
        gradients = learner.compute_gradients(loss_per_module)
        gradients = learner.postprocess_gradients(gradients)
        # An apply_gradients override that does not call super() leaves every step counted as a change.
        self.non_finite.all_skipped = False
        learner.apply_gradients(gradients)
        return loss_per_module

    def _forward_train(self, minibatch: MultiModuleBatch) -> dict[str, Any]:
        """The modules' train pass; within one of several gradient phases, told which (``gradient_phase=``).

        A step of one phase (``gradient_phase`` is ``None``) calls ``forward_train(minibatch)``
        alone, so modules that take no keyword arguments keep working; with several phases each
        pass gets the optimizer names its phase steps, so it may compute only what their losses read.
        """
        if self.gradient_phase is None:
            return self._forward_train_fn(minibatch)
        return self._forward_train_fn(minibatch, gradient_phase=self.gradient_phase)

    def raise_if_too_many_non_finite_steps(self, loss_per_module: Mapping[str, torch.Tensor]) -> None:
        """Raise if an optimizer has now skipped its module's ``max_consecutive_non_finite_steps`` steps in a row.

        Raises:
            FloatingPointError: Naming each such optimizer and whether its loss was finite.
        """
        if self.non_finite.over_limit:
            raise FloatingPointError(self._too_many_non_finite_steps_message(loss_per_module))

    @contextlib.contextmanager
    def capturing(self, gradient_pass: GradientPass) -> Iterator[None]:
        """While a CUDA graph captures a step: ``apply`` leaves the norms in ``gradient_pass`` and steps nothing."""
        self._gradient_pass = gradient_pass
        try:
            yield
        finally:
            self._gradient_pass = None

    # ------------------------------------------------------------------------------------
    # What the Learner's default gradient hooks call
    # ------------------------------------------------------------------------------------

    def backward(self, loss_per_module: Mapping[str, torch.Tensor]) -> dict[Any, torch.Tensor]:
        """Backpropagate the total loss; return ``{param_ref: gradient}`` (``Learner.compute_gradients``).

        The registered parameters' gradients are reset first. Under a running Trainer this
        backpropagates with ``manual_backward`` (plain ``backward()`` when nothing listens to
        Lightning's per-step hooks); under DDP the loss also touches every parameter
        (``unused_parameter_anchor``), so no rank's backward waits. With sharded modules
        (FSDP2) it adds the anchor of this step's sharded pass instead, and afterwards
        averages the gradients of the parameters FSDP left whole.
        """
        registry = self._learner.optimizer_registry
        # A CUDA graph's capture backpropagates into the gradient tensors its optimizer steps read.
        registry.clear_grads(in_place=self._gradient_pass is not None)
        total = loss_per_module.get(ALL_MODULES)
        if total is None and loss_per_module:
            total = sum_losses(loss_per_module.values())
        if self._loss_weights and total is not None:
            # Reweigh each module's part of the total by this rank's share of its rows (see agree_with_other_ranks).
            reweighed = [(w - 1.0) * loss_per_module[m] for m, w in self._loss_weights.items() if m in loss_per_module]
            if reweighed:
                total = total + sum_losses(reweighed)
        trainer = self.running_trainer()
        anchor = None
        if self.sharding_mesh is not None:
            anchor, self._step_anchor = self._step_anchor, None
        elif trainer is not None and is_wrapped_in_ddp(trainer.strategy):
            anchor = unused_parameter_anchor(self._learner)
        if anchor is not None:
            total = anchor if total is None else total + anchor
        if isinstance(total, torch.Tensor) and total.requires_grad:
            # Lightning's manual_backward adds only its hooks' dispatch when no one listens to them.
            if trainer is not None and self._dispatch_step_hooks:
                self._learner.manual_backward(total)
            else:
                total.backward()
        if self.sharding_mesh is not None:
            reduce_replicated_gradients(list(registry.params.values()), self.sharding_mesh)
        return {ref: param.grad for ref, param in registry.params.items() if param.grad is not None}

    def apply(self, gradients_dict: Mapping[Any, torch.Tensor], module_ids: Sequence[str]) -> None:
        """Step the optimizers of ``module_ids`` with these gradients, skipping non-finite ones (``Learner.apply_gradients``).

        Only the optimizers of the running gradient phase step (``gradient_phase``). An optimizer
        whose gradients hold a NaN or infinity (before any clipping) does not step; the steps it
        skips in a row count towards its module's ``max_consecutive_non_finite_steps``.
        """
        registry = self._learner.optimizer_registry
        to_step, norms = registry.attach_gradients(gradients_dict, module_ids, self.gradient_phase)
        if self._gradient_pass is not None:  # a CUDA graph's capture: the graphs step the optimizers
            self._gradient_pass.to_step = to_step
            self._gradient_pass.norms = torch.stack(norms) if norms else None
            return
        if not to_step:
            return
        # One device sync for all optimizers; the check itself is cheaper on Python floats.
        self.step_or_skip(to_step, torch.stack(norms).tolist())

    def step_or_skip(
        self,
        to_step: Sequence[tuple[str, Optimizer]],
        norms: Sequence[float],
        replays: Mapping[Optimizer, Callable[[], Any]] | None = None,
    ) -> None:
        """Step each optimizer of ``to_step`` whose gradients' norm is finite; count a skipped step for the others.

        Args:
            to_step: The ``(module_id, optimizer)`` pairs with gradients.
            norms: Their gradients' global norms, as Python numbers.
            replays: For a step replayed from CUDA graphs: what takes each optimizer's step
                instead of ``optimizer.step()`` (only where nothing listens to Lightning's
                per-step hooks); the running Trainer counts it as any step.
        """
        under_trainer = self.running_trainer() is not None
        any_stepped = False
        for (module_id, optimizer), norm in zip(to_step, norms):
            if math.isfinite(norm):
                self._step(optimizer, under_trainer, None if replays is None else replays[optimizer])
                self.non_finite.in_a_row.pop(optimizer, None)
                any_stepped = True
            else:
                self._skip_non_finite_step(module_id, optimizer)
        self.non_finite.all_skipped = bool(to_step) and not any_stepped

    def _step(self, optimizer: Optimizer, under_trainer: bool, replay: Callable[[], Any] | None) -> None:
        if not under_trainer:
            (replay or optimizer.step)()
            return
        # Lightning's wrapper runs the strategy's and precision plugin's step logic and counts the step.
        if optimizer not in self._optimizer_wrappers:  # apply_gradients called outside an update
            self.attach_trainer()
        wrapper = self._optimizer_wrappers[optimizer]
        if self._dispatch_step_hooks and replay is None:
            wrapper.step()
        else:
            step_without_dispatch(wrapper, replay)

    def _skip_non_finite_step(self, module_id: str, optimizer: Optimizer) -> None:
        """Count a skipped step of ``optimizer``; note it if its module's limit of skips in a row is reached."""
        self._learner.metrics.log_value(
            (module_id, NUM_NON_FINITE_UPDATES_SKIPPED), 1, reduce="sum", clear_on_reduce=True
        )
        counts = self.non_finite
        in_a_row = counts.in_a_row[optimizer] = counts.in_a_row.get(optimizer, 0) + 1
        limit = self._learner.config_for_module(module_id).max_consecutive_non_finite_steps
        if limit is not None and in_a_row >= limit:
            counts.over_limit.append((module_id, optimizer, in_a_row))

    def _too_many_non_finite_steps_message(self, loss_per_module: Mapping[str, torch.Tensor]) -> str:
        """What stopped training: which optimizers skipped how many steps, and whether their loss was finite."""
        over_limit, self.non_finite.over_limit = self.non_finite.over_limit, []
        where = " on this rank" if self.is_data_parallel() else ""
        lines = []
        for module_id, optimizer, in_a_row in over_limit:
            name = next(n for n, o in self._learner.get_optimizers_for_module(module_id) if o is optimizer)
            loss = loss_per_module.get(module_id, loss_per_module.get(ALL_MODULES))
            if loss is not None and not bool(torch.isfinite(loss.detach()).all()):
                what = f"its loss was {loss.detach().float().mean().item()}{where}"
            else:
                what = f"its loss was finite{where}, its gradients were not"
            lines.append(f"module {module_id!r}, optimizer {name!r}: {in_a_row} steps in a row skipped; {what}")
        return (
            "training stopped: gradients held NaN or infinity in too many consecutive steps, so the weights "
            "stopped changing (max_consecutive_non_finite_steps reached):\n  "
            + "\n  ".join(lines)
            + "\nLook for NaN/inf in the data (rewards, observations) and in the loss; a lower lr or grad_clip "
            "helps against exploding gradients. max_consecutive_non_finite_steps=None turns this check off."
        )


def log_steps_trained(
    metrics: MetricsLogger, trained: StepsTrained, weights_seq_no: int, timesteps: Mapping[str, float]
) -> None:
    """Log an update's steps trained, per module and over all modules, and the lifetime counters.

    Every trained module also gets a ``num_non_finite_updates_skipped`` of 0 (the skips its
    optimizers logged add to it), so a clean update reports 0 rather than no value, which a
    Trainer's logger would show as the last update's count.

    Args:
        metrics: The Learner's metrics logger.
        trained: What the update's minibatch steps trained.
        weights_seq_no: The Learner's gradient steps that changed its weights, over its life, after this update.
        timesteps: The last lifetime counters the Learner was given (logged as they are).
    """
    log = metrics.log_value
    num_steps = trained.num_steps
    for module_id, rows in trained.module_rows.items():
        log((module_id, NUM_MODULE_STEPS_TRAINED), rows, reduce="sum", clear_on_reduce=True)
        log((module_id, NUM_MODULE_STEPS_TRAINED_LIFETIME), rows, reduce="sum", clear_on_reduce=False)
        log((module_id, MODULE_TRAIN_BATCH_SIZE_MEAN), rows / max(num_steps, 1), window=math.inf, clear_on_reduce=True)
        log((module_id, WEIGHTS_SEQ_NO), weights_seq_no, window=1, clear_on_reduce=True)
        log((module_id, NUM_NON_FINITE_UPDATES_SKIPPED), 0, reduce="sum", clear_on_reduce=True)
    total_rows = sum(trained.module_rows.values())
    log((ALL_MODULES, NUM_MODULE_STEPS_TRAINED), total_rows, reduce="sum", clear_on_reduce=True)
    log((ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME), total_rows, reduce="sum", clear_on_reduce=False)
    log((ALL_MODULES, NUM_ENV_STEPS_TRAINED), trained.env_steps, reduce="sum", clear_on_reduce=True)
    log((ALL_MODULES, NUM_ENV_STEPS_TRAINED_LIFETIME), trained.env_steps, reduce="sum", clear_on_reduce=False)
    log((ALL_MODULES, WEIGHTS_SEQ_NO), weights_seq_no, window=1, clear_on_reduce=True)
    for key, value in timesteps.items():
        log((ALL_MODULES, key), value, window=1, clear_on_reduce=True)


def sum_losses(values: Any) -> torch.Tensor:
    """Sum of tensors; a single tensor is returned as it is (no extra op, no copy)."""
    values = list(values)
    return values[0] if len(values) == 1 else torch.stack(values).sum()


# ----------------------------------------------------------------------------------------
# Keeping data-parallel (DDP) ranks in step
# ----------------------------------------------------------------------------------------


class RankAgreement(NamedTuple):
    """What the data-parallel ranks agreed on before an update's steps (``agree_with_other_ranks``).

    Attributes:
        modules: The modules with rows on any rank: those the update trains.
        num_rows_per_pass: The largest module batch on any rank (env steps): it sets every
            rank's number of minibatch steps per pass.
        loss_weights: ``{module_id: weight}`` of this rank's module losses, for the modules
            whose weight is not 1 (see ``agree_with_other_ranks``).
    """

    modules: set[str]
    num_rows_per_pass: int
    loss_weights: dict[str, float]


def agree_with_other_ranks(
    module_ids: Sequence[str],
    batch: MultiModuleBatch,
    *,
    num_epochs: int,
    minibatch_size: int | None,
    device: torch.device,
) -> RankAgreement:
    """The modules trained on any rank, the largest module batch, this rank's loss weights (a collective call).

    A module batch's size is its env steps: a stateful module's real (unpadded) steps, which
    ``iterate_minibatches`` cuts into minibatches, so ranks with unequal episode lengths
    agree on numbers of sequence minibatches.

    Every rank then takes the same number of minibatch steps, each with one backward pass
    that reaches every parameter (see ``unused_parameter_anchor``), even when its shard is
    smaller or holds no rows of some module, so no rank waits on another forever.

    DDP (and FSDP2) average the gradients over the R ranks. With rank r's loss of module m
    weighted by ``R * share(r, m) / sum over ranks of share(., m)``, that average is the
    gradient of m's mean-reduced loss over all of m's rows in the step, as one learner on
    the whole batch would take it: ``share`` is r's rows of m when each pass is one step
    (no minibatches), and 1 where r has rows of m when passes are cut into minibatches (every
    rank holding rows of m then gives each step the same number of them; sequence
    minibatches, cut at sequence ends, about the same). Equal shards give every weight 1.

    Args:
        module_ids: All of the Learner's module ids (the same on every rank).
        batch: This rank's prepared batch.
        num_epochs: This rank's passes over its batch.
        minibatch_size: This rank's ``minibatch_size`` setting (env steps).
        device: Where the gathered tensor lives (the Learner's device).

    Raises:
        ValueError: On every rank alike, if the ranks were asked for different
            ``num_epochs`` or ``minibatch_size`` (their steps could not match).
    """
    module_ids = sorted(module_ids)
    local = [num_env_steps(batch[m]) if m in batch else 0 for m in module_ids]
    settings = [num_epochs, minibatch_size or 0]
    # One all_gather (over the default process group, the Trainer's) of [rows per module, settings]:
    # every rank's rows and settings, by rank.
    packed = torch.tensor(local + settings, dtype=torch.float64, device=device)
    parts = [torch.empty_like(packed) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, packed)
    gathered = torch.stack(parts).cpu()
    rows, asked = gathered[:, : len(local)], gathered[:, len(local) :]
    largest, smallest = asked.max(dim=0).values.tolist(), asked.min(dim=0).values.tolist()
    if largest != smallest:
        raise ValueError(
            f"the ranks were asked for different update settings (num_epochs from {smallest[0]:.0f} to "
            f"{largest[0]:.0f}, minibatch_size from {smallest[1]:.0f} to {largest[1]:.0f}, 0 meaning None): "
            "every data-parallel rank must take the same number of minibatch steps"
        )
    num_rows_per_pass = int(rows.max()) if rows.numel() else 0
    one_step_per_pass = minibatch_size is None or minibatch_size >= num_rows_per_pass
    shares = rows if one_step_per_pass else (rows > 0).to(rows.dtype)
    mine, totals = shares[dist.get_rank()].tolist(), shares.sum(dim=0).tolist()
    loss_weights = {}
    for module_id, share, total in zip(module_ids, mine, totals):
        weight = len(shares) * share / total if share > 0 else 1.0
        if weight != 1.0:
            loss_weights[module_id] = weight
    trained = {module_id for module_id, count in zip(module_ids, rows.max(dim=0).values.tolist()) if count > 0}
    return RankAgreement(trained, num_rows_per_pass, loss_weights)


def is_wrapped_in_ddp(strategy: Strategy) -> bool:
    """Whether ``strategy`` trains its model through a ``DistributedDataParallel`` wrapper."""
    return isinstance(strategy.model, DistributedDataParallel)


def unused_parameter_anchor(module: LightningModule | nn.Module) -> torch.Tensor:
    """Zero times every trainable parameter of ``module``, to add to the backpropagated loss under DDP.

    DDP averages gradients bucket by bucket as backward reaches their parameters. A
    parameter that no loss on this rank touched (a module without rows on this rank, a
    frozen module, an unused head) would leave its bucket waiting for the other ranks
    forever; a rank with no rows at all would not even run backward. This term gives
    every parameter a gradient on every rank and step, zero where it was unused (also
    under ``find_unused_parameters=True``, which cannot help a rank that has no loss).
    """
    return torch.stack([p.sum() for p in module.parameters() if p.requires_grad]).sum() * 0.0
