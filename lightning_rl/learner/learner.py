"""The Learner: RLlib's Learner API as a Lightning module with manual optimization.

A Learner owns a ``MultiRLModule`` (one or more RL modules by id), one or more optimizers per
module, and the update loop: epochs of minibatches, each a forward pass, a loss per module,
one backward pass, per-optimizer gradient clipping and an optimizer step for every module
that should be trained. Subclasses write the loss (``compute_loss_for_module``) and, when
they need more than one Adam per module, the optimizers (``configure_optimizers_for_module``).

The same code runs standalone (``learner.build()``, then ``learner.update_from_batch(...)``)
and under ``Trainer.fit``; attached to a running Trainer it backpropagates with
``manual_backward`` and steps Lightning's optimizer wrappers, so strategies (DDP), precision
plugins, callbacks and checkpoints see every step. When nothing listens to the per-step hooks
(no callback, module, strategy, precision plugin or profiler overrides or records them), the
step calls ``backward()`` and the optimizer itself and only counts the step in the Trainer's
progress: the same arithmetic, without Lightning's dispatch (``step_hooks_have_listeners``).

Every piece of the Learner's state has one owner:

- here: the modules and their spec, the hyperparameters and per-module overrides,
  ``policies_to_train``, the last timesteps, the metrics and the connector pipeline; and RLlib's
  override points, marked "Override point" below, in the order an update calls them;
- ``step_runner.StepRunner`` (``learner.step_runner``): the state of taking a gradient step
  (compiled passes, Lightning's optimizer wrappers, DDP/FSDP2 step-keeping, non-finite skips,
  ``weights_seq_no``);
- ``optimizers.OptimizerRegistry`` (``learner.optimizer_registry``): the optimizers, their
  parameters, clip thresholds and learning-rate schedules.

The other parts are mixins that hold no state and use only public names of the Learner and
of these two collaborators (``tests/test_learner_parts.py`` checks it), as Lightning assembles
``LightningModule`` from hook mixins:

- ``update_api``: RLlib's ``update(...)`` and every ``update_from_*``;
- ``optimizers``: the optimizer API (``register_optimizer``, ``get_optimizer``, ...);
- ``multi_module``: adding and removing modules;
- ``state``: ``get_state`` / ``set_state``, checkpoints in and out;
- ``lightning_hooks``: what a ``Trainer`` calls (``setup``, ``training_step``, ...).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Hashable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, ClassVar, Literal

import torch
from lightning.pytorch import Callback, LightningModule

from lightning_rl.connectors import AddColumnsFromEpisodes, AddTimeDimToBatchAndZeroPad, ConnectorPipeline, Piece
from lightning_rl.core.arguments import ArgumentCheck, check_bool, check_choice, check_int, check_number
from lightning_rl.core.batch import MultiModuleBatch
from lightning_rl.core.columns import (
    ALL_MODULES,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    Columns,
)
from lightning_rl.core.learner_config import LearnerConfig
from lightning_rl.core.metrics import MetricsLogger
from lightning_rl.core.module_checks import check_known_keys
from lightning_rl.core.rl_module_specs import (
    MultiRLModuleSpec,
    RLModuleSpec,
    spec_or_default,
)
from lightning_rl.core.rl_modules import MultiRLModule, RLModule
from lightning_rl.core.schedules import Schedule, ScheduleSetting, check_schedule
from lightning_rl.core.sharding import gathered
from lightning_rl.learner._lightning_private import attached_trainer
from lightning_rl.learner.callback import LearnerCallback
from lightning_rl.learner.evaluation import EvaluationMetrics
from lightning_rl.learner.lightning_hooks import EvaluationProgress, LightningHooksMixin
from lightning_rl.learner.multi_module import (
    MultiModuleMixin,
    ShouldModuleBeUpdated,
    check_policies_to_train,
)
from lightning_rl.learner.optimizers import (
    GRAD_CLIP_BY,
    OptimizerRegistry,
    OptimizersMixin,
    clip_gradients,
)
from lightning_rl.learner import result_keys
from lightning_rl.learner.state import StateMixin
from lightning_rl.learner.step_runner import WHAT_TO_COMPILE, NonFiniteSteps, StepRunner
from lightning_rl.learner.update_api import UpdateApiMixin


def algorithm_module_spec(
    module_spec: RLModuleSpec | MultiRLModuleSpec | None,
    model_config: dict[str, Any] | None,
    module_class: type[RLModule],
    module: RLModule | None,
) -> RLModuleSpec | MultiRLModuleSpec | None:
    """The spec an algorithm's Learner hands to ``Learner``: none when a built ``module`` is given.

    Without ``module``, ``spec_or_default``: the given spec, or a ``module_class`` spec built
    from ``model_config``. With it, ``module_spec`` as given, which ``Learner`` refuses
    beside ``module`` with its "not both" error.

    Raises:
        ValueError: For ``model_config`` beside ``module`` (the module is built already).
    """
    if module is None:
        return spec_or_default(module_spec, model_config, module_class)
    if model_config is not None:
        raise ValueError(
            "pass model_config or module, not both: model_config builds a new module, module is one already built"
        )
    return module_spec


class Learner(UpdateApiMixin, OptimizersMixin, MultiModuleMixin, StateMixin, LightningHooksMixin, LightningModule):
    """Base class of all Learners: trains the RL modules of a ``MultiRLModule``.

    Subclasses implement ``compute_loss_for_module`` (or ``compute_losses`` for losses that
    span modules). Every argument but ``module_spec`` and ``module`` is a hyperparameter,
    saved with ``save_hyperparameters``, settable from YAML with the Lightning CLI and
    overridable per module.

    Args:
        module_spec: What to build: an ``RLModuleSpec`` (trained under ``"default_policy"``)
            or a ``MultiRLModuleSpec``. May be left out when a checkpoint provides it.
        module: Instead of ``module_spec``, an already built ``RLModule`` (trained under
            ``"default_policy"``) or ``MultiRLModule``; its spec is derived from it, so
            checkpoints rebuild it.
        lr: Learning rate of the default optimizers: a number, or a piecewise schedule
            ``[[timestep, lr], ...]`` over ``num_env_steps_sampled_lifetime``.
        grad_clip: Clip threshold, or ``None`` not to clip.
        grad_clip_by: ``"value"`` (each element), ``"norm"`` (each tensor's L2 norm) or
            ``"global_norm"`` (the L2 norm of all of one optimizer's gradients together).
        num_epochs: Passes over each train batch when run by a Trainer.
        minibatch_size: Rows (env steps) per gradient step when run by a Trainer; ``None`` for the
            whole batch. Stateful (recurrent) modules take whole sequences:
            ``max(1, minibatch_size // max_seq_len)`` of them per step.
        shuffle_batch_per_epoch: Whether each pass visits the rows in a new random order.
        policies_to_train: The module ids to train (others are left as they are), or a
            callable ``(module_id, batch) -> bool``; ``None`` trains every module.
        config_overrides_per_module: ``{module_id: {hyperparameter: value}}``, e.g. a module's own ``lr``.
        torch_compile: Whether to compile with ``torch.compile``.
        torch_compile_what_to_compile: ``"forward_train"`` (each module's training forward
            pass) or ``"complete_update"`` (the whole minibatch step).
        cuda_graphs: Whether to capture each minibatch step (forward, loss, backward, clipping,
            optimizer steps) in CUDA graphs and replay them: several times faster for small
            networks on a GPU, whose steps are bound by kernel launches. The Learner must be on
            a GPU, in one process. Python numbers the loss reads are fixed at capture, and
            captured again when ``cuda_graph_key()`` changes (see ``learner/cuda_graphs.py``).
        learner_connector_pieces: Connector pieces that run right after ``AddColumnsFromEpisodes``
            and before the pieces an algorithm adds (GAE), as RLlib runs a config's
            ``learner_connector`` pieces before its defaults' GAE: e.g. one adding a column the
            loss reads, or reshaping ``rewards`` before the advantages are computed.
            Objects, not hyperparameters: they are not saved with the checkpoint, so pass
            them again when loading one (overriding ``build_learner_connector`` saves that).
        max_consecutive_non_finite_steps: Optimizer steps in a row that one optimizer may skip
            for NaN or infinite gradients before training stops with a ``FloatingPointError``
            naming the module, the optimizer and whether the loss was finite; ``None`` never stops.
        learner_config_dict: RLlib's free-form settings for a custom Learner, read as
            ``self.config.learner_config_dict["my_key"]`` (or per module, through
            ``config_for_module``); plain data, saved with the hyperparameters. ``{}`` by default.

    Raises:
        ValueError: For both ``module_spec`` and ``module``, a ``module`` that is not an
            ``RLModule``, or a hyperparameter out of range.
    """

    # Result keys, readable from the class as in RLlib (``Learner.TOTAL_LOSS_KEY``).
    TOTAL_LOSS_KEY = result_keys.TOTAL_LOSS_KEY
    LR_KEY = result_keys.LR_KEY
    NUM_ENV_STEPS_TRAINED = result_keys.NUM_ENV_STEPS_TRAINED
    NUM_ENV_STEPS_TRAINED_LIFETIME = result_keys.NUM_ENV_STEPS_TRAINED_LIFETIME
    NUM_MODULE_STEPS_TRAINED = result_keys.NUM_MODULE_STEPS_TRAINED
    NUM_MODULE_STEPS_TRAINED_LIFETIME = result_keys.NUM_MODULE_STEPS_TRAINED_LIFETIME
    MODULE_TRAIN_BATCH_SIZE_MEAN = result_keys.MODULE_TRAIN_BATCH_SIZE_MEAN
    WEIGHTS_SEQ_NO = result_keys.WEIGHTS_SEQ_NO
    NUM_NON_FINITE_UPDATES_SKIPPED = result_keys.NUM_NON_FINITE_UPDATES_SKIPPED

    def __init__(
        self,
        module_spec: RLModuleSpec | MultiRLModuleSpec | None = None,
        *,
        module: RLModule | None = None,
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
        cuda_graphs: bool = False,
        learner_connector_pieces: Sequence[Piece] = (),
        max_consecutive_non_finite_steps: int | None = 100,
        learner_config_dict: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        if module is not None and module_spec is not None:
            raise ValueError(
                f"{type(self).__name__} takes module_spec or module, not both: module_spec builds a new module, "
                "module trains one already built"
            )
        if module is not None and not isinstance(module, RLModule):
            raise ValueError(f"module must be an RLModule or MultiRLModule, got {type(module).__name__}")
        # The spec and module hold classes, spaces and tensors, which must not enter the
        # hyperparameters: those stay plain data so checkpoints load with weights_only. The
        # spec travels as plain data of its own (``get_state()["module_spec"]``).
        # The connector pieces are objects (functions, pieces holding settings) for the same reason.
        check_policies_to_train(policies_to_train)
        ignore = ["module_spec", "module", "learner_connector_pieces"]
        ignore += ["policies_to_train"] if callable(policies_to_train) else []
        self.save_hyperparameters(ignore=ignore)
        if not callable(policies_to_train) and policies_to_train is not None:
            self.hparams.policies_to_train = sorted(policies_to_train)
        if learner_config_dict is not None and not isinstance(learner_config_dict, Mapping):
            raise ValueError(f"learner_config_dict must be a dict, got {type(learner_config_dict).__name__}")
        self.hparams.learner_config_dict = dict(learner_config_dict or {})
        self._config_overrides: dict[str, dict[str, Any]] = {}
        self._check_config(self.config, "Learner")
        for module_id, overrides in (config_overrides_per_module or {}).items():
            self._config_overrides[module_id] = self.check_config_overrides(module_id, overrides)

        given = module.as_multi_rl_module() if module is not None else None
        if given is not None:
            module_spec = MultiRLModuleSpec.from_module(given)
        self._module_spec = module_spec.as_multi_rl_module_spec() if module_spec is not None else None
        # A given module stays out of nn.Module's registry of children until build() makes it
        # self._module: registered now, its weights would appear twice in state_dict().
        object.__setattr__(self, "_given_module", given)
        self._module: MultiRLModule | None = None
        self._should_module_be_updated: ShouldModuleBeUpdated | None = policies_to_train
        self._timesteps: dict[str, float] = {}
        # Each module's scheduled settings (clip_param, entropy_coeff, epsilon, ...), built on first use.
        self._setting_schedules: dict[tuple[str, str], Schedule] = {}
        self.metrics = MetricsLogger()
        self.eval_metrics = EvaluationMetrics()
        # Where the fit's evaluations stand (the one owed after a resume, the best return so far).
        self.evaluation_progress = EvaluationProgress()
        self._optimizer_registry = OptimizerRegistry(self.get_param_ref)
        self._step_runner = StepRunner(
            self,
            torch_compile=torch_compile,
            what_to_compile=torch_compile_what_to_compile,
            cuda_graphs=cuda_graphs,
        )
        # Checked now (a ConnectorPipeline refuses what is not a piece); joined to the pipeline in build().
        self._user_connector_pieces: list[Piece] = list(ConnectorPipeline(learner_connector_pieces))
        self._learner_connector: ConnectorPipeline | None = None
        self._own_callbacks: list[Callback] | None = None

    # ------------------------------------------------------------------------------------
    # Building
    # ------------------------------------------------------------------------------------

    def build(self) -> None:
        """Build the modules and their optimizers. Call once before updating; idempotent.

        Under ``Trainer.fit`` the ``setup`` hook calls it, so it need not be called by hand.
        """
        if self._module is not None:
            return
        if self._given_module is None and self._module_spec is None:
            raise ValueError(
                f"{type(self).__name__} has no module_spec to build from: pass module_spec=... "
                "or load it with from_checkpoint(path)"
            )
        module = self._given_module if self._given_module is not None else self._make_module()
        self._given_module = None
        self._check_required_apis(module)
        self._module = module.to(self.device)
        self.configure_optimizers()
        self._step_runner.compile(self._module)
        self._learner_connector = self.build_learner_connector()
        # The base pipeline holds the user's pieces already; an override that builds its own
        # without calling super() gets them at its end.
        for piece in self._user_connector_pieces:
            if not any(held is piece for held in self._learner_connector):
                self._learner_connector.append(piece)
        self._end_connector_with_time_axis()

    def _end_connector_with_time_axis(self) -> None:
        """With a stateful (recurrent) module, end the Learner connector with ``AddTimeDimToBatchAndZeroPad``.

        It runs after every other piece (user pieces included), so they all see rows, and
        the batch the Learner trains on is sequences. A Learner of feed-forward modules
        keeps its pipeline as it is (the piece would do nothing); ``build`` calls this, and so
        does adding a module.
        """
        pipeline = self._learner_connector
        if pipeline is None or not any(self._module[mid].is_stateful() for mid in self._module):
            return
        if any(isinstance(piece, AddTimeDimToBatchAndZeroPad) for piece in pipeline):
            pipeline.remove(AddTimeDimToBatchAndZeroPad)  # moved to the end, behind pieces added since
        pipeline.append(AddTimeDimToBatchAndZeroPad())

    def build_learner_connector(self) -> ConnectorPipeline:
        """Override point: the Learner connector, the pipeline that turns episodes into a train batch.

        Called once by ``build``, after the modules and optimizers exist. The base pipeline
        holds ``AddColumnsFromEpisodes`` (the episodes' steps as columns, keyed by module
        id), then the pieces given as ``learner_connector_pieces``: so, as in RLlib, a user's
        pieces run before what an algorithm appends (``PPOLearner``'s GAE), and a piece that
        reshapes ``rewards`` changes the advantages. Override to add pieces anywhere
        (``insert_after``, ``prepend``, ...); call ``super()`` first, as ``PPOLearner`` does to
        append GAE (an override that does not gets the user's pieces appended at its end).
        With a stateful module, ``build`` ends the pipeline with ``AddTimeDimToBatchAndZeroPad``,
        after every other piece.
        """
        return ConnectorPipeline([AddColumnsFromEpisodes(), *self._user_connector_pieces])

    def _make_module(self) -> MultiRLModule:
        """Build the ``MultiRLModule`` from the spec; override to construct it differently."""
        return self._module_spec.build()

    @classmethod
    def rl_module_required_apis(cls) -> list[type]:
        """Classes (APIs) an RL module must be an instance of for this Learner to train it."""
        return []

    def _check_required_apis(self, module: MultiRLModule) -> None:
        """Refuse, at build, a module to train that lacks an API of ``rl_module_required_apis``.

        Exempt: modules without trainable parameters (fixed policies) and modules left out of a
        ``policies_to_train`` list; they get no optimizer (``rl_module_is_compatible``).
        Modules added later (``add_module``) are not checked, as in RLlib.

        Raises:
            ValueError: Naming the module, its class and the APIs it lacks.
        """
        rule = self._should_module_be_updated
        for module_id, sub_module in module.items():
            missing = [api.__name__ for api in self.rl_module_required_apis() if not isinstance(sub_module, api)]
            trainable = any(param.requires_grad for param in sub_module.parameters())
            to_train = rule is None or callable(rule) or module_id in rule
            if missing and trainable and to_train:
                hint = " (compute_values(batch) -> Tensor[B])" if "ValueFunctionAPI" in missing else ""
                raise ValueError(
                    f"{type(self).__name__} trains modules that implement "
                    f"{[api.__name__ for api in self.rl_module_required_apis()]} (rl_module_required_apis); module "
                    f"{module_id!r} ({type(sub_module).__name__}) does not implement {missing}{hint}. Implement it, or "
                    "leave the module out of policies_to_train"
                )

    def rl_module_is_compatible(self, module: RLModule) -> bool:
        """Whether this Learner can train ``module``; incompatible modules get no optimizer."""
        return all(isinstance(module, api) for api in self.rl_module_required_apis())

    # ------------------------------------------------------------------------------------
    # What the Learner holds
    # ------------------------------------------------------------------------------------

    @property
    def module(self) -> MultiRLModule | None:
        """The ``MultiRLModule`` being trained; ``None`` until ``build`` (as in RLlib)."""
        return self._module

    @property
    def built_module(self) -> MultiRLModule:
        """The ``MultiRLModule`` being trained.

        Raises:
            ValueError: If the Learner is not built yet.
        """
        self._check_is_built()
        return self._module

    def _check_is_built(self) -> None:
        if self._module is None:
            raise ValueError(f"{type(self).__name__} is not built yet: call learner.build() first")

    def _set_module(self, module: MultiRLModule) -> None:
        """Train ``module`` from now on (sharding replaces the modules by their FSDP unit)."""
        self._module = module
        self._step_runner.compile(module)

    @property
    def module_spec(self) -> MultiRLModuleSpec:
        """The spec that rebuilds the current modules, added modules included."""
        if self._module is not None:
            return MultiRLModuleSpec.from_module(self._module)
        if self._module_spec is None:
            raise ValueError(f"{type(self).__name__} has no module_spec yet")
        return self._module_spec

    @property
    def spec_to_build(self) -> MultiRLModuleSpec | None:
        """The spec ``build`` will build from; ``None`` when there is none yet (a checkpoint provides it)."""
        return self._module_spec if self._module is None else None

    @module_spec.setter
    def module_spec(self, spec: MultiRLModuleSpec) -> None:
        """What ``build`` builds (a checkpoint sets it before the modules exist).

        Raises:
            ValueError: Once the modules are built (add or remove modules instead).
        """
        if self._module is not None:
            raise ValueError(f"{type(self).__name__} is built: add or remove modules to change them")
        self._module_spec = spec

    @contextlib.contextmanager
    def module_for_acting(self, module_id: str | None = None) -> Iterator[RLModule]:
        """The module ``module_id``, ready to act in an environment for the length of the block.

        Data modules sample with it: ``with learner.module_for_acting(module_id) as module: ...``.
        With no ``module_id`` the block gets every module (the ``MultiRLModule``), as multi-agent
        sampling needs. Unsharded, it is the trained module itself. When the modules are sharded (FSDP2),
        their whole weights are gathered in place for the block and the slices restored after
        it: one collective call that every rank makes at the same point (the data modules do,
        once per rollout and per evaluation). So acting needs no collective call per env step,
        ranks may play evaluation episodes of different lengths, and no second copy of the
        weights outlives the block. Do not keep the module for use after the block.

        Raises:
            ValueError: If the Learner is not built or has no module ``module_id``.
        """
        self._check_is_built()
        if module_id is not None and module_id not in self._module:
            raise ValueError(f"{type(self).__name__} has no module {module_id!r}; it has {sorted(self._module.keys())}")
        with gathered(self._module):
            yield self._module if module_id is None else self._module[module_id]

    @property
    def learner_connector(self) -> ConnectorPipeline | None:
        """The pipeline ``episodes_to_train_batch`` runs; ``None`` until ``build``."""
        return self._learner_connector

    @property
    def step_runner(self) -> StepRunner:
        """What takes the Learner's gradient steps and owns the state of taking them (see ``StepRunner``)."""
        return self._step_runner

    @property
    def optimizer_registry(self) -> OptimizerRegistry:
        """The bookkeeping behind the optimizer API: names, parameters, clip thresholds, schedules."""
        return self._optimizer_registry

    @property
    def timesteps(self) -> dict[str, float]:
        """The last lifetime counters the Learner was given (``num_env_steps_sampled_lifetime``, ...).

        They position the schedules; restored with the Learner's state.
        """
        return self._timesteps

    @property
    def weights_seq_no(self) -> int:
        """Gradient steps taken over the Learner's life (restored with its state)."""
        return self._step_runner.weights_seq_no

    # The step runner's state under the names tests and debugging sessions know it by.
    @property
    def _weights_seq_no(self) -> int:
        return self._step_runner.weights_seq_no

    @property
    def _non_finite_steps(self) -> NonFiniteSteps:
        return self._step_runner.non_finite

    @property
    def _sharding_mesh(self) -> Any:
        return self._step_runner.sharding_mesh

    @_sharding_mesh.setter
    def _sharding_mesh(self, mesh: Any) -> None:
        self._step_runner.sharding_mesh = mesh

    # ------------------------------------------------------------------------------------
    # Hyperparameters and the modules to train
    # ------------------------------------------------------------------------------------

    @property
    def config(self) -> LearnerConfig:
        """The Learner's hyperparameters, without per-module overrides (``get_config_for_module`` applies them)."""
        config = LearnerConfig(self.hparams)
        config._overrides_per_module = self._config_overrides
        return config

    def config_for_module(self, module_id: str) -> LearnerConfig:
        """The hyperparameters for ``module_id``: the Learner's, with that module's overrides applied."""
        return LearnerConfig({**self.hparams, **self._config_overrides.get(module_id, {})})

    def current_scheduled_value(self, module_id: str, name: str) -> float:
        """The value of ``module_id``'s setting ``name`` now: a number, or RLlib's piecewise schedule at the env steps.

        For settings that take a number or a schedule (PPO's ``clip_param`` and ``entropy_coeff``,
        IMPALA's ``entropy_coeff``, DQN's ``epsilon``), read at ``timesteps["num_env_steps_sampled_lifetime"]``
        (the last counters the Learner was given). Each module's schedule is built once from its
        config (overrides included) and forgotten when the module is removed.
        """
        key = (module_id, name)
        if key not in self._setting_schedules:
            setting = self.config_for_module(module_id)[name]
            self._setting_schedules[key] = Schedule(setting, name=f"module {module_id!r}: {name}")
        return self._setting_schedules[key].value(self._timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0))

    def _forget_scheduled_values(self, module_id: str) -> None:
        """Drop ``module_id``'s schedules (it was removed: a module added under its id builds its own)."""
        for key in [key for key in self._setting_schedules if key[0] == module_id]:
            del self._setting_schedules[key]

    @property
    def config_overrides_per_module(self) -> dict[str, dict[str, Any]]:
        """``{module_id: {hyperparameter: value}}``: what differs per module (checked by ``check_config_overrides``)."""
        return self._config_overrides

    def should_module_be_updated(self, module_id: str, batch: MultiModuleBatch | None = None) -> bool:
        """Whether ``module_id`` is trained, per ``policies_to_train``."""
        rule = self._should_module_be_updated
        if rule is None:
            return True
        if callable(rule):
            return bool(rule(module_id, batch))
        return module_id in rule

    @property
    def policies_to_train(self) -> ShouldModuleBeUpdated | None:
        """The modules to train: ids, a callable ``(module_id, batch) -> bool``, or ``None`` for all."""
        return self._should_module_be_updated

    @policies_to_train.setter
    def policies_to_train(self, rule: ShouldModuleBeUpdated | None) -> None:
        self._should_module_be_updated = check_policies_to_train(rule, "policies_to_train")
        self.hparams.policies_to_train = None if rule is None or callable(rule) else sorted(rule)

    # ------------------------------------------------------------------------------------
    # Override points of an update, in the order it calls them
    # ------------------------------------------------------------------------------------

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        """Override point, called at the start of every update, before any gradient step.

        Sets the scheduled learning rates for the current ``timesteps`` and calls
        ``on_before_gradient_based_update`` on the Trainer's ``LearnerCallback``\\ s.
        Override for non-gradient updates; call ``super()``.
        """
        self._timesteps.update({k: float(v) for k, v in timesteps.items()})
        timestep = self._timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0)
        self._optimizer_registry.update_learning_rates(timestep, self.metrics)
        for callback in self._learner_callbacks():
            callback.on_before_gradient_based_update(attached_trainer(self), self, timesteps)

    def gradient_phases(self) -> tuple[frozenset[str] | None, ...]:
        """Override point: which optimizers each phase of a minibatch step steps, in order.

        Each phase is a forward pass, the losses, a backward pass, clipping and the steps of
        the phase's optimizers (by the names they were registered with, in every module that
        has them; ``None`` for all). A later phase's forward pass sees the weights the earlier
        phases stepped: ``(frozenset({"qf"}), frozenset({"policy", "alpha"}))`` trains an
        actor against critics already updated on the same minibatch (Stable-Baselines3's
        and d3rlpy's SAC). The default, ``(None,)``, is one phase that steps every optimizer
        with the gradients of one backward pass (RLlib's). The losses read the current phase
        with :meth:`in_gradient_phase`.

        Called at the start of every minibatch step; the answer must be the same on every DDP rank.
        """
        return (None,)

    def in_gradient_phase(self, optimizer_name: str) -> bool:
        """Whether the current phase of the minibatch step steps the optimizers named ``optimizer_name``.

        A loss returns only the terms of the optimizers its phase steps (see :meth:`gradient_phases`);
        outside a minibatch step, and in a Learner with one phase, every optimizer's.
        """
        phase = self._step_runner.gradient_phase
        return phase is None or optimizer_name in phase

    def compute_losses(self, *, fwd_out: dict[str, Any], batch: MultiModuleBatch) -> dict[str, torch.Tensor]:
        """Override point: the loss of every module in ``fwd_out``; override for losses that span modules.

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
        """Override point: the scalar loss of one module on one minibatch. Subclasses implement it.

        Log extra values with ``self.metrics.log_value((module_id, "name"), tensor, window=math.inf,
        clear_on_reduce=True)`` (the mean over the update; the default is RLlib's EMA).

        Args:
            module_id: The module.
            config: Its hyperparameters.
            batch: Its minibatch, ``{column: Tensor[B, ...]}``.
            fwd_out: The output of its ``forward_train`` on ``batch``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement compute_loss_for_module (or compute_losses)")

    def compute_gradients(self, loss_per_module: Mapping[str, torch.Tensor], **kwargs: Any) -> dict[Any, torch.Tensor]:
        """Override point: backpropagate the total loss; return ``{param_ref: gradient}``.

        The default is ``StepRunner.backward``: it resets the registered parameters'
        gradients, backpropagates through Lightning (``manual_backward``) when a Trainer runs
        the Learner, and keeps DDP and FSDP2 ranks in step.
        """
        return self._step_runner.backward(loss_per_module)

    def postprocess_gradients(self, gradients_dict: dict[Any, torch.Tensor]) -> dict[Any, torch.Tensor]:
        """Override point: post-process (clip) the gradients of every module's optimizers.

        Calls ``postprocess_gradients_for_module`` with each module's gradients; gradients
        of no registered optimizer pass unchanged.
        """
        processed = dict(gradients_dict)
        for module_id in self._optimizer_registry.by_module:
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
        """Override point: clip one module's gradients, optimizer by optimizer, and log their global norms.

        Each optimizer clips at its own threshold when it was registered with one, else at
        the module's ``grad_clip``. Optimizers the current gradient phase does not step are
        left alone (see ``gradient_phases``).

        The norm logged as ``gradients_{optimizer_name}_global_norm`` is taken before clipping.
        """
        registry = self._optimizer_registry
        for optimizer_name, optimizer in self.get_optimizers_for_module(module_id):
            gradients = self.filter_param_dict_for_optimizer(module_gradients_dict, optimizer)
            if not gradients or not self.in_gradient_phase(optimizer_name):
                continue  # (under DDP the other phases' parameters hold the anchor's zeros)
            grad_clip = registry.grad_clip.get(optimizer, config.grad_clip)
            global_norm = clip_gradients(gradients, grad_clip=grad_clip, grad_clip_by=config.grad_clip_by)
            key = (module_id, f"gradients_{optimizer_name}_global_norm")
            self.metrics.log_value(key, global_norm, window=math.inf, clear_on_reduce=True)
            registry.measured_norms[optimizer] = global_norm
        return module_gradients_dict

    def apply_gradients(self, gradients_dict: Mapping[Any, torch.Tensor]) -> None:
        """Override point: step the optimizers of every module that should be updated, with these gradients.

        An optimizer whose gradients hold a NaN or infinity (before any clipping) does not
        step (counted in the results as ``num_non_finite_updates_skipped``), so one bad batch
        cannot poison the weights or the optimizer's moments; the steps it skips in a row are
        counted towards ``max_consecutive_non_finite_steps``. Under DDP the gradients are
        averaged over the ranks before this runs, so every rank steps or skips alike. A module
        that no rank has rows of in this update does not step: its gradients are zeros.
        """
        in_update = self._step_runner.modules_in_update
        module_ids = []
        for module_id in self._optimizer_registry.by_module:
            if module_id != ALL_MODULES and not self.should_module_be_updated(module_id):
                continue
            if module_id != ALL_MODULES and in_update is not None and module_id not in in_update:
                continue  # its gradients are zeros from other ranks' steps, not its own data
            module_ids.append(module_id)
        self._step_runner.apply(gradients_dict, module_ids)

    def cuda_graph_key(self) -> Hashable | None:
        """Override point: the Python numbers this Learner's loss reads, for ``cuda_graphs=True``.

        A CUDA graph replays the numbers it was captured with. The minibatch steps' graphs are
        captured again whenever this key changes; ``None`` (the default) captures them again in
        every update, which is right for a loss whose numbers change at most between updates.
        Return every number that may change (a scheduled coefficient, an adaptive one), or
        ``()`` when the loss reads none but its constant hyperparameters.

        Called at the start of each update's minibatch steps, with ``cuda_graphs=True`` only.
        """
        return None

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        """Override point, called at the end of every update, after the last gradient step.

        Steps torch ``LRScheduler``\\ s and calls ``on_after_gradient_based_update`` on the
        Trainer's ``LearnerCallback``\\ s. Override for non-gradient updates (target
        networks, coefficients); call ``super()``.
        """
        self._optimizer_registry.step_lr_schedulers()
        for callback in self._learner_callbacks():
            callback.on_after_gradient_based_update(attached_trainer(self), self, timesteps)

    def required_batch_columns(self, module_id: str) -> list[str]:
        """Override point: columns a batch must hold for ``module_id``; checked before any update."""
        return [Columns.OBS]

    def _learner_callbacks(self) -> list[LearnerCallback]:
        trainer = attached_trainer(self)
        if trainer is None:
            # Standalone, the Learner's own callbacks (which a Trainer would add) still run.
            if self._own_callbacks is None:
                own = self.configure_callbacks()
                self._own_callbacks = [own] if isinstance(own, Callback) else list(own)
            callbacks = self._own_callbacks
        else:
            callbacks = trainer.callbacks
        return [c for c in callbacks if isinstance(c, LearnerCallback)]

    # ------------------------------------------------------------------------------------
    # Checks of the hyperparameters
    # ------------------------------------------------------------------------------------

    def check_config_overrides(self, module_id: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """``overrides`` for ``module_id``, checked as the Learner's own hyperparameters are.

        Raises:
            ValueError: For ``model_config``, an unknown hyperparameter, one of the
                ``learner_wide_hyperparameters``, or a value out of range, naming the module.
        """
        where = f"config overrides for module {module_id!r}"
        if "model_config" in overrides:
            raise ValueError(
                f"{where}: model_config shapes a module when it is built, so it cannot be overridden per module; "
                "give the module a spec with its own model_config instead"
            )
        per_module = set(self.hparams) - {"config_overrides_per_module", "policies_to_train"}
        check_known_keys(overrides, per_module, "hyperparameter", where=where)
        shared = sorted(overrides.keys() & self.learner_wide_hyperparameters)
        if shared:
            raise ValueError(
                f"{where}: {', '.join(shared)} apply to the whole Learner (all modules step together, with one "
                "setting), so they cannot be overridden per module; set them on the Learner. A checkpoint saved "
                "with such an override (which never took effect) loads with load_from_checkpoint(path, "
                "config_overrides_per_module=<its overrides without these keys>)"
            )
        overrides = dict(overrides)
        self._check_config({**self.hparams, **overrides}, f"module {module_id!r}")
        return overrides

    #: The hyperparameters the Learner reads once for all its modules (the update loop's passes
    #: and minibatches, how the steps run); a module's overrides of them are refused.
    #: A subclass adds its own (a target network's ``tau`` read by one callback, say).
    learner_wide_hyperparameters: ClassVar[frozenset[str]] = frozenset(
        {
            "num_epochs",
            "minibatch_size",
            "shuffle_batch_per_epoch",
            "torch_compile",
            "torch_compile_what_to_compile",
            "cuda_graphs",
        }
    )

    # The range of every hyperparameter, checked at construction and for each module's
    # overrides. A subclass declares its own hyperparameters' checks in a table of its own;
    # ``_check_config`` runs every class's table, the base's first, so a subclass that narrows
    # a base hyperparameter (``minibatch_size`` must not be ``None``) adds a check, never drops one.
    hyperparameter_checks: ClassVar[Mapping[str, ArgumentCheck]] = {
        "lr": check_schedule,
        "grad_clip": partial(check_number, low=0, low_open=True, optional=True),
        "grad_clip_by": partial(check_choice, choices=GRAD_CLIP_BY),
        "num_epochs": check_int,
        "minibatch_size": partial(check_int, optional=True),
        "max_consecutive_non_finite_steps": partial(check_int, optional=True),
        "torch_compile_what_to_compile": partial(check_choice, choices=WHAT_TO_COMPILE),
        "cuda_graphs": check_bool,
    }

    @classmethod
    def _check_config(cls, config: Mapping[str, Any], where: str) -> None:
        """Run the ``hyperparameter_checks`` of every class from ``Learner`` down to ``cls`` on ``config``.

        Subclasses override it only for checks that read several hyperparameters together,
        calling ``super()._check_config`` first.

        Args:
            config: The hyperparameters, with a module's overrides applied.
            where: Where they came from, the errors' prefix (``"Learner"``, ``"module 'p0'"``).

        Raises:
            ValueError: Naming the first hyperparameter out of its range.
        """
        for klass in reversed(cls.__mro__):
            for name, check in vars(klass).get("hyperparameter_checks", {}).items():
                check(name, config[name], where=where)
        if config["cuda_graphs"] and config["torch_compile"]:
            raise ValueError(
                f"{where}: torch_compile and cuda_graphs together are not supported; cuda_graphs alone takes the "
                "launch overhead off a GPU step, torch_compile alone fuses its kernels"
            )
