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

The Learner's surface (RLlib's method names) is assembled from parts, each in its own
file and readable on its own, as Lightning assembles ``LightningModule`` from hook mixins:

- here: construction, ``build``, hyperparameters and the seed update API (``update_from_*``);
- ``update_api``: RLlib's current ``update(...)``, ``update_from_iterator`` and the update
  every ``update_from_*`` runs (hooks around the gradient steps, in step with DDP ranks);
- ``optimizers``: the optimizer API and the ``OptimizerRegistry`` behind it;
- ``gradient_step``: losses, backward pass, clipping and optimizer steps of one minibatch;
- ``update_loop``: epochs of minibatches and the steps-trained results;
- ``multi_module``: adding and removing modules, ``policies_to_train``;
- ``state``: ``get_state`` / ``set_state``, checkpoints in and out;
- ``lightning_hooks``: what a ``Trainer`` calls (``setup``, ``training_step``, ...);
- ``batches``, ``data_parallel``, ``_lightning_private``: input checks, keeping DDP ranks in
  step, and the private Lightning API used (one function per use).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerStatus
from torch.optim import Optimizer

from lightning_rl.connectors import AddColumnsFromEpisodes, ConnectorPipeline, Piece
from lightning_rl.connectors.add_columns import MODULES_TO_TRAIN
from lightning_rl.core.arguments import ArgumentCheck, check_choice, check_int, check_number
from lightning_rl.core.batch import MultiModuleBatch
from lightning_rl.core.columns import NUM_ENV_STEPS_SAMPLED_LIFETIME, Columns
from lightning_rl.core.metrics import MetricsLogger
from lightning_rl.core.module_checks import check_known_keys
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec, spec_or_default
from lightning_rl.core.rl_modules import MultiRLModule, RLModule
from lightning_rl.core.schedules import ScheduleSetting, check_schedule
from lightning_rl.learner._lightning_private import attached_trainer, step_hooks_have_listeners
from lightning_rl.learner.batches import prepare_batch
from lightning_rl.learner.callback import LearnerCallback
from lightning_rl.learner.evaluation import EvaluationMetrics
from lightning_rl.learner.gradient_step import GradientStepMixin, NonFiniteSteps
from lightning_rl.learner.lightning_hooks import LightningHooksMixin
from lightning_rl.learner.multi_module import MultiModuleMixin, ShouldModuleBeUpdated, check_policies_to_train

# DEFAULT_OPTIMIZER, clip_gradients, default_adam, EPISODE_RETURN_MEAN and TRAIN_RETURN_KEY are
# re-exported: code imports them from lightning_rl.learner.learner.
from lightning_rl.learner.optimizers import (  # noqa: F401
    DEFAULT_OPTIMIZER,
    GRAD_CLIP_BY,
    OptimizerRegistry,
    OptimizersMixin,
    clip_gradients,
    default_adam,
)
from lightning_rl.learner.result_keys import (  # noqa: F401
    EPISODE_RETURN_MEAN,
    LR_KEY,
    MODULE_TRAIN_BATCH_SIZE_MEAN,
    NUM_ENV_STEPS_TRAINED,
    NUM_ENV_STEPS_TRAINED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    NUM_NON_FINITE_UPDATES_SKIPPED,
    TOTAL_LOSS_KEY,
    TRAIN_RETURN_KEY,
    WEIGHTS_SEQ_NO,
)
from lightning_rl.learner.sharding import gathered
from lightning_rl.learner.state import StateMixin
from lightning_rl.learner.update_api import UpdateApiMixin

if TYPE_CHECKING:
    from lightning_rl.env.episode import SingleAgentEpisode
    from lightning_rl.env.multi_agent_episode import MultiAgentEpisode

WHAT_TO_COMPILE = ("forward_train", "complete_update")


class LearnerConfig(dict):
    """A Learner's hyperparameters, readable as attributes (``config.lr``).

    ``learner.config`` also knows the per-module overrides: its
    ``get_config_for_module(module_id)`` (RLlib's name) is ``learner.config_for_module(module_id)``.
    """

    _overrides_per_module: Mapping[str, Mapping[str, Any]] = MappingProxyType({})

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no hyperparameter {name!r}; the Learner has {sorted(self)}") from None

    def get_config_for_module(self, module_id: str) -> LearnerConfig:
        """These hyperparameters with ``module_id``'s overrides applied."""
        return LearnerConfig({**self, **self._overrides_per_module.get(module_id, {})})


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


class Learner(
    UpdateApiMixin, OptimizersMixin, GradientStepMixin, MultiModuleMixin, StateMixin, LightningHooksMixin, LightningModule
):
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
        minibatch_size: Rows per gradient step when run by a Trainer; ``None`` for the whole batch.
        shuffle_batch_per_epoch: Whether each pass visits the rows in a new random order.
        policies_to_train: The module ids to train (others are left as they are), or a
            callable ``(module_id, batch) -> bool``; ``None`` trains every module.
        config_overrides_per_module: ``{module_id: {hyperparameter: value}}``, e.g. a module's own ``lr``.
        torch_compile: Whether to compile with ``torch.compile``.
        torch_compile_what_to_compile: ``"forward_train"`` (each module's training forward
            pass) or ``"complete_update"`` (the whole minibatch step).
        learner_connector_pieces: Connector pieces appended to the pipeline that
            ``build_learner_connector`` returns, e.g. one adding a column the loss reads.
            Objects, not hyperparameters: they are not saved with the checkpoint, so pass
            them again when loading one (overriding ``build_learner_connector`` saves that).
        max_consecutive_non_finite_steps: Optimizer steps in a row that one optimizer may skip
            for NaN or infinite gradients before training stops with a ``FloatingPointError``
            naming the module, the optimizer and whether the loss was finite; ``None`` never stops.

    Raises:
        ValueError: For both ``module_spec`` and ``module``, a ``module`` that is not an
            ``RLModule``, or a hyperparameter out of range.
    """

    # Result keys, readable from the class as in RLlib (``Learner.TOTAL_LOSS_KEY``).
    TOTAL_LOSS_KEY = TOTAL_LOSS_KEY
    LR_KEY = LR_KEY
    NUM_ENV_STEPS_TRAINED = NUM_ENV_STEPS_TRAINED
    NUM_ENV_STEPS_TRAINED_LIFETIME = NUM_ENV_STEPS_TRAINED_LIFETIME
    NUM_MODULE_STEPS_TRAINED = NUM_MODULE_STEPS_TRAINED
    NUM_MODULE_STEPS_TRAINED_LIFETIME = NUM_MODULE_STEPS_TRAINED_LIFETIME
    MODULE_TRAIN_BATCH_SIZE_MEAN = MODULE_TRAIN_BATCH_SIZE_MEAN
    WEIGHTS_SEQ_NO = WEIGHTS_SEQ_NO
    NUM_NON_FINITE_UPDATES_SKIPPED = NUM_NON_FINITE_UPDATES_SKIPPED

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
        learner_connector_pieces: Sequence[Piece] = (),
        max_consecutive_non_finite_steps: int | None = 100,
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
        self._config_overrides: dict[str, dict[str, Any]] = {}
        self._check_config(self.config, "Learner")
        for module_id, overrides in (config_overrides_per_module or {}).items():
            self._config_overrides[module_id] = self._checked_overrides(module_id, overrides)

        given = module.as_multi_rl_module() if module is not None else None
        if given is not None:
            module_spec = MultiRLModuleSpec.from_module(given)
        self._module_spec = module_spec.as_multi_rl_module_spec() if module_spec is not None else None
        # A given module stays out of nn.Module's registry of children until build() makes it
        # self._module: registered now, its weights would appear twice in state_dict().
        object.__setattr__(self, "_given_module", given)
        self._module: MultiRLModule | None = None
        self._should_module_be_updated: ShouldModuleBeUpdated | None = policies_to_train
        self._weights_seq_no = 0
        self._timesteps: dict[str, float] = {}
        # An epoch's last train item ran and its evaluation has not yet (saved in checkpoints);
        # a resumed fit that owes that evaluation runs it first (``on_train_start``).
        self._evaluation_pending = False
        self._evaluation_owed = False
        # The best evaluation return of the fit so far, logged as hp_metric (saved in checkpoints).
        self._best_evaluation_return: float | None = None
        self.metrics = MetricsLogger()
        self._optimizer_registry = OptimizerRegistry(self.get_param_ref)
        self._non_finite_steps = NonFiniteSteps()
        # Checked now (a ConnectorPipeline refuses what is not a piece); joined to the pipeline in build().
        self._user_connector_pieces: list[Piece] = list(ConnectorPipeline(learner_connector_pieces))
        self._learner_connector: ConnectorPipeline | None = None
        self.eval_metrics = EvaluationMetrics()

        self._forward_train_fn: Callable[[MultiModuleBatch], dict[str, Any]] | None = None
        self._minibatch_step_fn: Callable[[MultiModuleBatch], bool] | None = None
        self._optimizer_wrappers: dict[Optimizer, Any] = {}
        # Whether the running Trainer's per-step hooks have listeners (step_hooks_have_listeners);
        # set with the wrappers at each update, and True until then: dispatching is never wrong.
        self._dispatch_step_hooks = True
        self._own_callbacks: list[Callback] | None = None
        # The modules the current update trains (agreed over all ranks); None outside updates.
        self._modules_in_update: set[str] | None = None
        # Under a sharding strategy (FSDP2): the mesh the modules are sharded over.
        self._sharding_mesh: Any = None
        self._step_anchor: torch.Tensor | None = None

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
        self._module = module.to(self.device)
        self.configure_optimizers()
        self._compile()
        self._learner_connector = self.build_learner_connector()
        for piece in self._user_connector_pieces:
            self._learner_connector.append(piece)

    def build_learner_connector(self) -> ConnectorPipeline:
        """The Learner connector: the pipeline that turns episodes into a train batch.

        Called once by ``build``, after the modules and optimizers exist; the pieces given as
        ``learner_connector_pieces`` are appended to what it returns. The base pipeline
        holds ``AddColumnsFromEpisodes`` (the episodes' steps as columns, keyed by module
        id). Override to add pieces anywhere (``insert_after``, ``prepend``, ...); call
        ``super()`` first, as ``PPOLearner`` does to append GAE.
        """
        return ConnectorPipeline([AddColumnsFromEpisodes()])

    @property
    def learner_connector(self) -> ConnectorPipeline | None:
        """The pipeline ``episodes_to_train_batch`` runs; ``None`` until ``build``."""
        return self._learner_connector

    @property
    def module(self) -> MultiRLModule | None:
        """The ``MultiRLModule`` being trained; ``None`` until ``build`` (as in RLlib)."""
        return self._module

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
    def module_spec(self) -> MultiRLModuleSpec:
        """The spec that rebuilds the current modules, added modules included."""
        if self._module is not None:
            return MultiRLModuleSpec.from_module(self._module)
        if self._module_spec is None:
            raise ValueError(f"{type(self).__name__} has no module_spec yet")
        return self._module_spec

    @property
    def config(self) -> LearnerConfig:
        """The Learner's hyperparameters, without per-module overrides (``get_config_for_module`` applies them)."""
        config = LearnerConfig(self.hparams)
        config._overrides_per_module = self._config_overrides
        return config

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

    def update_from_episodes(
        self,
        episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode],
        *,
        timesteps: Mapping[str, float] | None = None,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
    ) -> dict[str, dict[str, float]]:
        """Turn ``episodes`` into a train batch (``episodes_to_train_batch``), then ``update_from_batch``.

        Args:
            episodes: Single-agent episodes (or chunks of them) for this Learner's one module,
                or multi-agent ones, whose agents' steps train the modules their episode maps
                them to (modules not in ``policies_to_train`` get no rows); sampled by the
                current weights for on-policy algorithms.
            timesteps: As in ``update_from_batch``.
            num_epochs: As in ``update_from_batch``.
            minibatch_size: As in ``update_from_batch``.
            shuffle_batch_per_epoch: As in ``update_from_batch``.

        Returns:
            The results of ``update_from_batch``.

        Raises:
            ValueError: For an empty list, an episode without steps, single-agent episodes and
                a Learner with more than one module (they cannot say which module they are
                for), or a multi-agent episode mapping an agent to a module the Learner lacks.
        """
        self._check_is_built()
        return self.update_from_batch(
            self.episodes_to_train_batch(episodes),
            timesteps=timesteps,
            num_epochs=num_epochs,
            minibatch_size=minibatch_size,
            shuffle_batch_per_epoch=shuffle_batch_per_epoch,
        )

    def update_from_replay(
        self, replay: Any, *, timesteps: Mapping[str, float] | None = None
    ) -> dict[str, dict[str, float]]:
        """Train on minibatches sampled from a replay buffer (off-policy Learners implement it).

        ``OffPolicyDataModule`` hands the Learner its replay buffer with every train item
        (``None`` until learning starts). See ``OffPolicyLearner``.

        Raises:
            NotImplementedError: This Learner learns on-policy, from episodes or batches.
        """
        raise NotImplementedError(
            f"{type(self).__name__} learns on-policy and cannot train from a replay buffer; use an off-policy "
            "Learner (DQNLearner, SACLearner) with lightning_rl.data.OffPolicyDataModule; on-policy Learners use "
            "OnPolicyDataModule"
        )

    @property
    def weights_seq_no(self) -> int:
        """Gradient steps taken over the Learner's life (restored with its state)."""
        return self._weights_seq_no

    def episodes_to_train_batch(
        self, episodes: Sequence[SingleAgentEpisode] | Sequence[MultiAgentEpisode]
    ) -> dict[str, dict[str, torch.Tensor]]:
        """Run the Learner connector (``learner_connector``) on ``episodes``: ``{module_id: {column: Tensor}}``.

        The pieces share ``shared_data``, which starts with ``"modules_to_train"``: the ids
        ``should_module_be_updated`` says yes to, so multi-agent episodes give no rows (and
        cost no value predictions) to frozen modules. To add columns, add connector pieces
        (``learner_connector_pieces`` or an override of ``build_learner_connector``) rather
        than overriding this.
        """
        self._check_is_built()
        modules_to_train = {mid for mid in self._module.keys() if self.should_module_be_updated(mid)}
        # Pieces may run the modules (GAE's value predictions): sharded ones are gathered whole meanwhile.
        with gathered(self._module):
            return self._learner_connector(
                rl_module=self._module,
                batch={},
                episodes=list(episodes),
                shared_data={MODULES_TO_TRAIN: modules_to_train},
                metrics=self.metrics,
            )

    def required_batch_columns(self, module_id: str) -> list[str]:
        """Columns a batch must hold for ``module_id``; checked before any update."""
        return [Columns.OBS]

    def _prepare_batch(self, batch: Mapping[str, Any]) -> MultiModuleBatch:
        """A user batch as ``{module_id: {column: Tensor}}`` on our device, checked (``batches.prepare_batch``)."""
        return prepare_batch(
            batch,
            self._module,
            device=self.device,
            required_columns=self.required_batch_columns,
            data_parallel=self._is_data_parallel(),
        )

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        """Called at the start of every update, before any gradient step.

        Sets the scheduled learning rates for the current ``timesteps`` and calls
        ``on_before_gradient_based_update`` on the Trainer's ``LearnerCallback``\\ s.
        Override for non-gradient updates; call ``super()``.
        """
        self._timesteps.update({k: float(v) for k, v in timesteps.items()})
        timestep = self._timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0)
        self._optimizer_registry.update_learning_rates(timestep, self.metrics)
        for callback in self._learner_callbacks():
            callback.on_before_gradient_based_update(attached_trainer(self), self, timesteps)

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        """Called at the end of every update, after the last gradient step.

        Steps torch ``LRScheduler``\\ s and calls ``on_after_gradient_based_update`` on the
        Trainer's ``LearnerCallback``\\ s. Override for non-gradient updates (target
        networks, coefficients); call ``super()``.
        """
        self._optimizer_registry.step_lr_schedulers()
        for callback in self._learner_callbacks():
            callback.on_after_gradient_based_update(attached_trainer(self), self, timesteps)

    # ------------------------------------------------------------------------------------
    # Trainer plumbing and validation
    # ------------------------------------------------------------------------------------

    def _running_trainer(self) -> Trainer | None:
        """The attached Trainer while it runs (fit, validate, ...); ``None`` otherwise."""
        trainer = attached_trainer(self)
        return trainer if trainer is not None and trainer.state.status == TrainerStatus.RUNNING else None

    def _is_running_under_trainer(self) -> bool:
        trainer = attached_trainer(self)
        return trainer is not None and trainer.state.status == TrainerStatus.RUNNING

    def _is_data_parallel(self) -> bool:
        """Whether this update runs on several ranks of a Trainer (DDP), which must take it in step."""
        trainer = self._running_trainer()
        return trainer is not None and trainer.world_size > 1

    def _learner_callbacks(self) -> list[Any]:
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

    def _attach_trainer_step(self) -> None:
        """Look up, once per update, how the running Trainer takes a step.

        Sets ``{optimizer: its LightningOptimizer wrapper}`` (``{}`` without a running Trainer)
        and whether anything listens to the Trainer's per-step hooks (else the steps skip
        Lightning's dispatch).
        """
        trainer = self._running_trainer()
        if trainer is None:
            self._optimizer_wrappers, self._dispatch_step_hooks = {}, True
            return
        wrappers = self.optimizers()
        wrappers = wrappers if isinstance(wrappers, list) else [wrappers]
        self._optimizer_wrappers = {wrapper.optimizer: wrapper for wrapper in wrappers}
        self._dispatch_step_hooks = step_hooks_have_listeners(trainer, self)

    def _rebuild_optimizers(self, state: Mapping[str, Any]) -> None:
        """Register every module's optimizers anew (on its current parameters) and load ``state`` into them.

        ``state`` is what ``OptimizerRegistry.get_state(include_optimizers=True)`` returned
        before the parameters were replaced (sharding replaces them).
        """
        old_registry, old_counts = self._optimizer_registry, self._non_finite_steps
        self._optimizer_registry = OptimizerRegistry(self.get_param_ref)
        self.configure_optimizers()
        registry = self._optimizer_registry
        registry.check_state(state)
        registry.set_state(state)
        # Skips in a row go on counting on the new optimizers (their names are the old ones').
        name_of = {optimizer: name for name, optimizer in old_registry.named.items()}
        self._non_finite_steps = NonFiniteSteps(
            in_a_row={
                registry.named[name_of[optimizer]]: count
                for optimizer, count in old_counts.in_a_row.items()
                if optimizer in name_of  # not one of a removed module
            }
        )
        self._sync_trainer_optimizers()

    def _sync_trainer_optimizers(self) -> None:
        """Hand the current optimizers to an attached Trainer, so it steps and saves them."""
        trainer = attached_trainer(self)
        if trainer is not None:
            trainer.strategy.optimizers = list(self._optimizer_registry.named.values())
            self._attach_trainer_step()

    def _checked_overrides(self, module_id: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
        where = f"config overrides for module {module_id!r}"
        if "model_config" in overrides:
            raise ValueError(
                f"{where}: model_config shapes a module when it is built, so it cannot be overridden per module; "
                "give the module a spec with its own model_config instead"
            )
        per_module = set(self.hparams) - {"config_overrides_per_module", "policies_to_train"}
        check_known_keys(overrides, per_module, "hyperparameter", where=where)
        overrides = dict(overrides)
        self._check_config({**self.hparams, **overrides}, f"module {module_id!r}")
        return overrides

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
