"""CUDA graphs for a Learner's minibatch step (``Learner(cuda_graphs=True)``).

On a GPU, the minibatch step of an RL-sized network is bound by launches, not arithmetic:
the forward pass, the loss, the backward pass, clipping and the optimizer step are about a
hundred small kernels, each costing the CPU a few microseconds to launch. A CUDA graph
records those kernels once and replays them with one launch. ``GraphedSteps`` does that
for ``StepRunner`` and keeps the step's meaning:

- **Shapes.** A graph replays fixed shapes: each minibatch is copied into the input tensors
  its graph was captured with. A minibatch of another shape (the smaller last one of an
  epoch, a different number of sequences) gets a graph of its own, up to ``MAX_GRAPHS``
  shapes per Learner; further shapes take eager steps.
- **Warm-up.** The first ``WARMUP_STEPS`` steps of a shape run eagerly on a side stream (as
  capture requires: libraries set up their workspaces there, optimizers their state); they
  are real steps. Then the step is captured and replayed.
- **Python numbers.** What the loss reads as a Python number (a coefficient) is fixed in the
  graph at capture. The graphs are captured again whenever ``Learner.cuda_graph_key()``
  changes, which by default is at every update; algorithms whose numbers change only with
  their key return it, and keep their graphs across updates.
- **Non-finite gradients.** A step is two kinds of graph: one up to the gradients' global
  norms (forward, loss, backward, ``postprocess_gradients``), and one per optimizer for its
  step. The norms are read between them (one device sync per step, as the eager step has),
  and an optimizer whose gradients hold a NaN or infinity does not step.
- **Metrics and outputs.** Values logged during the step are recorded at capture and logged
  again from each replay's results (``MetricsLogger.recording``); tensors the step hands back
  (``StepRunner.step_outputs``: an off-policy loss's TD errors) are handed back from each replay.
- **Learning rates.** Optimizers are made capturable, and Adam's and AdamW's learning rates
  become device tensors that schedules fill in place, so a schedule reaches the replays.
  Their checkpoints hold plain numbers, as an eager Learner's do.
- **Lightning.** A replayed optimizer step is counted in ``trainer.global_step`` as any
  other. Listeners to Lightning's per-step hooks (``on_before_backward``, ...; a profiler;
  a precision plugin that scales) would be skipped by a replay, so with any of them the
  steps stay eager, and a warning says why.
- **Replaced state.** Graphs read memory by address: if weights or optimizer states are
  replaced (a checkpoint loaded, a module added), the graphs are dropped and captured again.

Refused with an error naming the reason: a Learner not on a CUDA device, and several ranks
(DDP, FSDP2), whose collective calls a graph does not capture here. A step that cannot be
captured (a loss that reads a tensor on the host) stays eager for its shape, with a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
import weakref
from collections.abc import Hashable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer

from lightning_rl.core.batch import MultiModuleBatch
from lightning_rl.core.metrics import RecordedValues

if TYPE_CHECKING:
    from lightning_rl.learner.step_runner import StepRunner

WARMUP_STEPS = 3
MAX_GRAPHS = 8
# Optimizers that take their learning rate as a device tensor when capturable, so that a
# schedule filling it in place reaches a captured step.
_TENSOR_LR_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW)

# A leaf of a minibatch: (path of keys, shape, dtype).
_Signature = tuple[tuple[tuple[str, ...], tuple[int, ...], torch.dtype], ...]


@dataclasses.dataclass
class GradientPass:
    """What the capture of the step up to the gradients leaves for the rest of the step.

    ``StepRunner.apply`` fills it instead of stepping while a capture runs.

    Attributes:
        to_step: The ``(module_id, optimizer)`` pairs with gradients.
        norms: Their gradients' global norms, one tensor (``[len(to_step)]``).
    """

    to_step: list[tuple[str, Optimizer]] = dataclasses.field(default_factory=list)
    norms: torch.Tensor | None = None


@dataclasses.dataclass
class _CapturedGradients:
    """One minibatch shape's graph of the step up to the gradients, and the tensors it reads and writes."""

    inputs: list[torch.Tensor]
    graph: torch.cuda.CUDAGraph
    to_step: list[tuple[str, Optimizer]]
    norms: torch.Tensor | None
    logged: RecordedValues
    losses: dict[str, torch.Tensor]
    step_outputs: dict[Hashable, torch.Tensor]


@dataclasses.dataclass
class _CapturedOptimizerStep:
    """One optimizer's step as a graph, and the gradients it reads (by address)."""

    graph: torch.cuda.CUDAGraph
    grad_pointers: tuple[int, ...]


class GraphedSteps:
    """Takes a ``StepRunner``'s minibatch steps by replaying CUDA graphs, captured per minibatch shape.

    The graphs share one set of gradient tensors: each shape's gradient graph zeroes them and
    backpropagates into them, and each optimizer's step graph (one per optimizer, whatever the
    shape) reads them.

    Args:
        runner: The step runner whose steps these are.
    """

    def __init__(self, runner: StepRunner) -> None:
        self._runner = runner
        self._gradient_graphs: dict[_Signature, _CapturedGradients] = {}
        self._optimizer_steps: dict[Optimizer, _CapturedOptimizerStep] = {}
        self._grads: dict[nn.Parameter, torch.Tensor] = {}
        self._eager_steps: dict[_Signature, int] = {}
        # Shapes whose capture failed (an operation a graph cannot hold: a device sync in the loss).
        self._uncapturable: set[_Signature] = set()
        self._key: Hashable | None = None
        self._fingerprint: tuple[int, ...] = ()
        self._side_stream: torch.cuda.Stream | None = None
        self._warned_eager = False

    @property
    def num_captured(self) -> int:
        """How many minibatch shapes have graphs now."""
        return len(self._gradient_graphs)

    def reset(self) -> None:
        """Drop every graph and gradient tensor (the modules or optimizers changed); steps warm up and capture anew."""
        self._gradient_graphs.clear()
        self._optimizer_steps.clear()
        self._grads.clear()
        self._eager_steps.clear()
        self._uncapturable.clear()
        self._fingerprint = ()

    def check_learner(self) -> None:
        """Refuse a Learner whose minibatch step is more than one forward and one backward pass.

        Called when the Learner is built (``StepRunner.compile``), so that the error comes before
        any env step rather than at the first update.

        Raises:
            ValueError: If the Learner steps its optimizers in several gradient phases
                (``Learner.gradient_phases``).
        """
        phases = self._runner.learner.gradient_phases()
        if len(phases) > 1:
            order = " then ".join("all" if phase is None else "+".join(sorted(phase)) for phase in phases)
            raise ValueError(
                f"cuda_graphs=True captures a minibatch step as one forward and one backward pass, but "
                f"{type(self._runner.learner).__name__} steps its optimizers in {len(phases)} phases ({order}), "
                "each after a forward pass through the weights the phase before stepped. Set cuda_graphs=False."
            )

    def start_update(self, key: Hashable | None, dispatch_step_hooks: bool, device: torch.device) -> bool:
        """Check that this update can replay graphs; drop the gradient graphs captured for another ``key``.

        Args:
            key: The Learner's ``cuda_graph_key()``; ``None`` captures anew in every update.
            dispatch_step_hooks: Whether anything listens to the running Trainer's per-step hooks.
            device: The Learner's device.

        Returns:
            Whether this update's steps replay graphs (``False``: they run eagerly).

        Raises:
            ValueError: If the Learner is not on a CUDA device, or runs on several ranks.
        """
        if device.type != "cuda":
            raise ValueError(
                f"cuda_graphs=True captures the minibatch step in CUDA graphs, but the Learner is on {device}: "
                "train on a GPU (Trainer(accelerator='gpu'), --trainer.accelerator gpu) or set cuda_graphs=False"
            )
        if self._runner.is_data_parallel() or self._runner.sharding_mesh is not None:
            raise ValueError(
                "cuda_graphs=True is for a Learner in one process: under DDP or FSDP2 each step's collective calls "
                "are not captured. Set cuda_graphs=False for several ranks."
            )
        if dispatch_step_hooks:
            if not self._warned_eager:
                warnings.warn(
                    "cuda_graphs=True: the minibatch steps run eagerly, since something listens to Lightning's "
                    "per-step hooks (a callback or the Learner overriding on_before_backward, on_after_backward or "
                    "on_before_optimizer_step, a profiler, or a precision plugin that scales gradients), and a "
                    "replayed step would skip them",
                    stacklevel=2,
                )
                self._warned_eager = True
            return False
        if key is None or key != self._key:
            # The optimizer steps read no Python number of the loss: only the gradient graphs go.
            self._gradient_graphs.clear()
        self._key = key
        return True

    def step(self, minibatch: MultiModuleBatch) -> bool:
        """One minibatch step: a replay of this shape's graphs once captured, an eager step before.

        Returns:
            Whether it changed any weights (as ``StepRunner.minibatch_step``).
        """
        leaves = _leaves(minibatch)
        if leaves is None:  # a column that is not a tensor on the device: no graph can read it
            return self._runner.minibatch_step(minibatch)
        signature = tuple((path, tuple(tensor.shape), tensor.dtype) for path, tensor in leaves)
        if signature in self._uncapturable:
            return self._runner.minibatch_step(minibatch)
        if self._fingerprint and _fingerprint(self._runner) != self._fingerprint:
            self.reset()  # weights or optimizer states were replaced since the capture
        captured = self._gradient_graphs.get(signature)
        if captured is None:
            seen = self._eager_steps.get(signature, 0)
            if seen < WARMUP_STEPS or len(self._gradient_graphs) >= MAX_GRAPHS or not self._optimizers_ready():
                self._eager_steps[signature] = seen + 1
                return self._eager_step_on_side_stream(minibatch)
            try:
                captured = self._capture(minibatch, leaves)
            except RuntimeError as error:
                # A genuine error of the step raises again from the eager step; an operation a
                # graph cannot hold (e.g. a device sync in the loss) leaves this shape eager.
                self._uncapturable.add(signature)
                warnings.warn(
                    f"cuda_graphs=True: a minibatch step could not be captured in a CUDA graph ({error}); steps of "
                    "this minibatch shape run eagerly. A loss that reads a tensor's value on the host (.item(), "
                    "bool(tensor), indexing by a boolean mask) cannot be captured.",
                    stacklevel=2,
                )
                return self._runner.minibatch_step(minibatch)
            self._gradient_graphs[signature] = captured
            self._fingerprint = _fingerprint(self._runner)
        else:
            for static, (_, tensor) in zip(captured.inputs, leaves):
                static.copy_(tensor, non_blocking=True)
        return self._replay(captured)

    # ------------------------------------------------------------------------------------

    def _optimizers_ready(self) -> bool:
        """Whether every optimizer a step may take has its state (a capture must not create it)."""
        learner = self._runner.learner
        registry = learner.optimizer_registry
        for module_id, names in registry.by_module.items():
            if module_id in learner.module and not learner.should_module_be_updated(module_id):
                continue
            if any(not registry.named[name].state for name in names):
                return False
        return True

    def _eager_step_on_side_stream(self, minibatch: MultiModuleBatch) -> bool:
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream()
        current = torch.cuda.current_stream()
        self._side_stream.wait_stream(current)
        try:
            with torch.cuda.stream(self._side_stream):
                return self._runner.minibatch_step(minibatch)
        finally:
            current.wait_stream(self._side_stream)

    def _capture(
        self, minibatch: MultiModuleBatch, leaves: list[tuple[tuple[str, ...], torch.Tensor]]
    ) -> _CapturedGradients:
        """Capture the step up to the gradients on ``minibatch``'s shape (and the optimizer steps not captured yet)."""
        runner = self._runner
        learner = runner.learner
        registry = learner.optimizer_registry
        for full_name, optimizer in registry.named.items():
            schedule = registry.lr_schedules.get(full_name)
            has_schedule = schedule is not None and not getattr(schedule, "is_constant", False)
            make_capturable(optimizer, has_schedule=has_schedule, name=full_name)
        # The gradients the last eager step left become the graphs' gradient tensors, kept for good.
        for param in registry.params.values():
            if param in self._grads:
                param.grad = self._grads[param]
            elif param.grad is not None:
                self._grads[param] = param.grad
        inputs = [tensor.clone() for _, tensor in leaves]
        static_batch = _with_leaves(minibatch, dict(zip((path for path, _ in leaves), inputs)))
        gradient_pass = GradientPass()
        graph = torch.cuda.CUDAGraph()
        with runner.capturing(gradient_pass), _capturing_into(graph):
            # The recording ends inside the capture: the logged tensors it stacks are refreshed by each replay.
            with learner.metrics.recording() as logged:
                losses = runner.compute_and_apply(static_batch)
        for _, optimizer in gradient_pass.to_step:
            pointers = tuple(p.grad.data_ptr() if p.grad is not None else 0 for p in _params(optimizer))
            known = self._optimizer_steps.get(optimizer)
            if known is None or known.grad_pointers != pointers:
                step_graph = torch.cuda.CUDAGraph()
                with _capturing_into(step_graph):
                    optimizer.step()
                self._optimizer_steps[optimizer] = _CapturedOptimizerStep(step_graph, pointers)
        return _CapturedGradients(
            inputs, graph, gradient_pass.to_step, gradient_pass.norms, logged, losses, dict(runner.step_outputs)
        )

    def _replay(self, captured: _CapturedGradients) -> bool:
        runner = self._runner
        captured.graph.replay()
        for param, grad in self._grads.items():
            param.grad = grad  # what an eager step leaves for code that reads the gradients afterwards
        runner.learner.metrics.log_recorded(captured.logged)
        # Copies: the next replay overwrites the captured tensors before the Learner may be done with them.
        runner.step_outputs = {key: value.clone() for key, value in captured.step_outputs.items()}
        norms = captured.norms.tolist() if captured.norms is not None else []
        replays = {optimizer: self._optimizer_steps[optimizer].graph.replay for _, optimizer in captured.to_step}
        runner.step_or_skip(captured.to_step, norms, replays)
        runner.raise_if_too_many_non_finite_steps(captured.losses)
        return not runner.non_finite.all_skipped


@contextlib.contextmanager
def _capturing_into(graph: torch.cuda.CUDAGraph) -> Iterator[None]:
    """Capture the CUDA work of the block into ``graph``, on a side stream, as ``torch.cuda.graph`` does.

    Without ``torch.cuda.graph``'s ``gc.collect()`` and ``empty_cache()`` before each capture
    (tens of milliseconds in a training process): a Learner captures again whenever its loss's
    numbers change.
    """
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            yield
        except BaseException:
            with contextlib.suppress(RuntimeError):  # the capture is invalid already: the first error tells why
                graph.capture_end()
            raise
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)


def _params(optimizer: Optimizer) -> list[torch.Tensor]:
    return [param for group in optimizer.param_groups for param in group["params"]]


def make_capturable(optimizer: Optimizer, *, has_schedule: bool, name: str) -> None:
    """Make ``optimizer``'s step capturable in a CUDA graph, its learning rate a device tensor where it can be.

    Idempotent. The state dict it returns stays that of an eager optimizer (plain learning
    rates, ``capturable=False``), so checkpoints load anywhere, on the CPU too.

    Args:
        optimizer: An optimizer of the Learner, its state already initialized by a step.
        has_schedule: Whether a learning-rate schedule sets its rate.
        name: Its full name, for errors.

    Raises:
        ValueError: For a scheduled optimizer whose rate cannot be a device tensor (a
            replay would keep the rate it was captured with), or an optimizer that cannot be
            captured (it has no ``capturable`` setting and is not plain SGD).
    """
    tensor_lr = isinstance(optimizer, _TENSOR_LR_OPTIMIZERS)
    if has_schedule and not tensor_lr:
        raise ValueError(
            f"cuda_graphs=True: optimizer {name!r} ({type(optimizer).__name__}) has a learning-rate schedule, but only "
            "Adam and AdamW take their rate as a device tensor that a captured step reads; a replay would keep the "
            "rate of the capture. Use Adam/AdamW, a constant lr, or cuda_graphs=False"
        )
    if "capturable" not in optimizer.defaults and type(optimizer) is not torch.optim.SGD:
        raise ValueError(
            f"cuda_graphs=True: optimizer {name!r} ({type(optimizer).__name__}) cannot be captured in a CUDA graph "
            "(it has no capturable setting); use Adam, AdamW or SGD, or cuda_graphs=False"
        )
    for group in optimizer.param_groups:
        if "capturable" in group:
            group["capturable"] = True
        if tensor_lr and not isinstance(group["lr"], torch.Tensor):
            device = group["params"][0].device
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
    for param, state in optimizer.state.items():
        step = state.get("step") if isinstance(state, Mapping) else None
        if isinstance(step, torch.Tensor) and step.device != param.device:
            state["step"] = step.to(device=param.device, dtype=torch.float32)
    # Eager steps of a new minibatch shape run between replays on purpose: torch's warning against that is moot.
    optimizer._warned_capturable_if_run_uncaptured = True
    if optimizer not in _PLAIN_STATE_DICT:
        optimizer.register_state_dict_post_hook(_plain_state_dict)
        _PLAIN_STATE_DICT.add(optimizer)


_PLAIN_STATE_DICT: weakref.WeakSet[Optimizer] = weakref.WeakSet()


def _plain_state_dict(optimizer: Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """An optimizer's state dict as an eager one writes it: plain learning rates, not capturable."""
    for group in state_dict["param_groups"]:
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = float(group["lr"])
        if "capturable" in group:
            group["capturable"] = False
    return state_dict


def _fingerprint(runner: StepRunner) -> tuple[int, ...]:
    """The addresses of the weights and optimizer states the graphs read: any change means replaced state."""
    registry = runner.learner.optimizer_registry
    pointers = []
    for optimizer in registry.named.values():
        for group in optimizer.param_groups:
            for param in group["params"]:
                pointers.append(param.data_ptr())
                for value in optimizer.state.get(param, {}).values():
                    if isinstance(value, torch.Tensor):
                        pointers.append(value.data_ptr())
    return tuple(pointers)


def _leaves(batch: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], torch.Tensor]] | None:
    """Every tensor of a (nested) minibatch with its path of keys; ``None`` if a leaf is not a CUDA tensor."""
    if isinstance(batch, torch.Tensor):
        return [(path, batch)] if batch.is_cuda else None
    if not isinstance(batch, Mapping):
        return None
    leaves = []
    for key in batch:
        found = _leaves(batch[key], (*path, key))
        if found is None:
            return None
        leaves.extend(found)
    return leaves


def _with_leaves(batch: Any, leaves: Mapping[tuple[str, ...], torch.Tensor], path: tuple[str, ...] = ()) -> Any:
    """A copy of ``batch``'s nesting with its tensors replaced by ``leaves[path]``."""
    if isinstance(batch, torch.Tensor):
        return leaves[path]
    return {key: _with_leaves(value, leaves, (*path, key)) for key, value in batch.items()}
