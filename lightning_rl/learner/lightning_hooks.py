"""The Lightning hooks of a Learner: what a ``Trainer`` calls, and what it does with it.

``LightningHooksMixin`` is one part of ``Learner``, which inherits it. Under
``Trainer.fit`` Lightning calls ``setup`` (build the modules, check the Trainer's settings
and data module), then ``training_step`` for every train item the data module yields (one
update each, see ``Learner.update_from_batch``) and ``validation_step`` for every evaluation
item, and ``on_save_checkpoint`` / ``on_load_checkpoint`` around checkpoints. The
optimizers Lightning steps and saves are the Learner's own (``configure_optimizers``).

Scalars are logged at the env-step count, and the best evaluation return as ``hp_metric``.
Lightning writes logged values to every logger at a step it picks (the number of optimizer
steps taken), unless a value named ``"step"`` is logged with them: that value is then the
step, for every logger that takes one (TensorBoard, CSV, ...); see
``_LoggerConnector.log_metrics``. The Learner logs ``num_env_steps_sampled_lifetime`` (summed
over all ranks) under that name beside its training and evaluation scalars, so runs with
different ``num_envs``, ``rollout_fragment_length`` or ``train_freq`` share one x-axis, as
CleanRL's ``global_step`` charts do. (Lightning then adds no ``epoch`` value to those rows,
as it does when it picks the step itself.)

``hp_metric`` is the value TensorBoard's HParams dashboard shows for a run (Lightning's
``TensorBoardLogger`` writes -1 at the start of a fit; ``HParamsTensorBoardLogger``, the
default logger of ``lightning-rl fit``, does not); the Learner logs the best evaluation
return so far under that name after every evaluation.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.strategies import FSDPStrategy

from lightning_rl.core.checkpoint import CHECKPOINT_KEY
from lightning_rl.core.columns import ALL_MODULES, DEFAULT_MODULE_ID, NUM_ENV_STEPS_SAMPLED_LIFETIME
from lightning_rl.core.data_contract import (
    TRAINING_DATA_SOURCES,
    DataOffer,
    DataRequirements,
    DataSource,
    check_data_fits,
    data_offer_of,
)
from lightning_rl.core.recurrent import max_seq_len_of
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.train_item import TrainItem
from lightning_rl.learner import state as learner_state
from lightning_rl.learner._lightning_private import (
    attached_trainer,
    resume_skips_the_epochs_evaluation,
    run_validation_now,
    trainer_writes_logs_now,
    write_step_metrics,
)
from lightning_rl.learner.batches import as_train_item
from lightning_rl.learner.checkpoint_names import name_checkpoint_files
from lightning_rl.learner.result_keys import TOTAL_LOSS_KEY, TRAIN_RETURN_KEY
from lightning_rl.learner.sharding import (
    check_writes_whole_checkpoints,
    data_parallel_mesh,
    is_sharding_strategy,
    shard_modules,
)
from lightning_rl.learner.update_api import SETTINGS_OF_SOURCE

# ----------------------------------------------------------------------------------------
# Logging at the env-step count (see the module docstring)
# ----------------------------------------------------------------------------------------

# The name under which a logged value becomes the loggers' step.
STEP_KEY = "step"
# The scalar TensorBoard's HParams dashboard reads as the run's metric.
HP_METRIC_KEY = "hp_metric"


def log_env_step(module: LightningModule, env_steps: float, *, on_step: bool) -> None:
    """Log ``env_steps`` as the step of the values ``module`` logs in the same hook.

    Args:
        module: The Learner, inside a Lightning hook that may log.
        env_steps: ``num_env_steps_sampled_lifetime`` of what is being logged.
        on_step: ``True`` from ``training_step`` (the values are written after the item),
            ``False`` from evaluation hooks (written at the end of the evaluation epoch).
    """
    # float64: Lightning keeps a logged Python number as float32, exact only up to 2**24
    # (about 16.8M) env steps; a float64 tensor stays float64 up to the loggers.
    # On CUDA the value lives on the device: NCCL reduces device tensors only (sync_dist below).
    # (MPS has no float64; CPU and MPS runs reduce over gloo, on the CPU.)
    device = module.device if module.device.type == "cuda" else torch.device("cpu")
    value = torch.tensor(float(env_steps), dtype=torch.float64, device=device)
    # Every rank holds the same global count: "max" over the epoch's items and the ranks is it.
    module.log(
        STEP_KEY, value, on_step=on_step, on_epoch=not on_step, reduce_fx="max", batch_size=1, sync_dist=not on_step
    )


def best_return(best_so_far: float | None, evaluation_return: Any) -> float | None:
    """The better of ``best_so_far`` and ``evaluation_return``; a NaN return (no episodes) is not counted.

    Args:
        best_so_far: The best return of earlier evaluations, ``None`` before the first.
        evaluation_return: This evaluation's mean return (a number or a one-element tensor).
    """
    value = float(evaluation_return)
    if value != value:  # NaN
        return best_so_far
    return value if best_so_far is None else max(best_so_far, value)


@dataclasses.dataclass
class EvaluationProgress:
    """Where a fit's evaluations stand; the Learner holds one (``learner.evaluation_progress``), saved in checkpoints.

    Attributes:
        pending: The epoch's last train item has run and its evaluation has not yet: a
            checkpoint written now owes that evaluation.
        owed: A resumed fit owes the evaluation its checkpoint was written before; ``on_train_start`` runs it.
        best_return: The best evaluation return of the fit so far, logged as ``hp_metric``.
    """

    pending: bool = False
    owed: bool = False
    best_return: float | None = None


class LightningHooksMixin:
    """The hooks a Lightning ``Trainer`` calls on a Learner (a part of ``Learner``)."""

    def setup(self, stage: str) -> None:
        """Lightning's hook: build the Learner if it has not been built, meeting its data module through the data contract.

        The Trainer's data module, if it is a ``DataSource`` (``lightning_rl.core.data_contract``),
        offers its spaces (``DataOffer``): modules whose spec leaves out the observation or
        action space take the one pair a single-agent data module offers. A multi-agent data
        module offers ``module_spaces`` (``{module_id: (observation_space, action_space)}``, the
        modules its policy mapping sends agents to) instead: a spec of one ``default_policy``
        module without spaces (an algorithm's default) then becomes one module per id, each with
        that spec's class and ``model_config`` and its own spaces; an explicit
        ``MultiRLModuleSpec`` gets each module's missing spaces from its id (see
        ``specs_for_module_spaces``). Under ``fit`` the offer is checked against
        ``data_requirements()`` (``check_fits_data``); once built, the Learner hands its
        requirements to the data module (``accept_requirements``). A data module that is not a
        ``DataSource`` offers nothing and is not checked. Under ``fit`` the files of each
        ``ModelCheckpoint`` without a ``filename`` are named after what the offer's step count
        counts (``DataOffer.step_name``: ``epoch=0-env_steps=5120.ckpt``; ``checkpoint_names``).

        Raises:
            ValueError: under ``strategy="fsdp"`` (FSDP1: use ``"fsdp2"``); under
                ``precision="16-mixed"``, whose gradient scaling would hand
                scaled gradients to the Learner's clipping and non-finite checks; when the data
                module's train items hold a source this Learner does not train from, or
                ``minibatch_size`` is larger than its train batch (``check_fits_data``); when a
                space is missing and no data module offers it; and for a module id the data
                module's ``module_spaces`` names but an explicit spec lacks, or whose spec's
                spaces differ from the data module's.
        """
        if isinstance(getattr(self.trainer, "strategy", None), FSDPStrategy):
            # FSDP1 wraps the module and shards flat parameter groups at setup, after which the
            # Learner's optimizers, its minibatch steps inside one training_step and its
            # per-optimizer clipping do not fit; FSDP2 shards the parameters themselves.
            raise ValueError(
                f"{type(self).__name__} does not support strategy='fsdp' (FSDPStrategy, FSDP1). Use "
                "strategy='fsdp2' (lightning_rl.FSDP2Strategy: FSDP2 through Lightning's ModelParallelStrategy, "
                "on CPU ranks or GPUs), or strategy='ddp' (every rank holds the whole model)."
            )
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            raise ValueError(
                f"{type(self).__name__} does not support precision='16-mixed' (gradient scaling) yet: it clips and "
                "checks gradients itself. Use precision='bf16-mixed' or '32-true'."
            )
        datamodule = getattr(self.trainer, "datamodule", None)
        if stage == "fit":
            self.check_fits_data(datamodule)
            # ModelCheckpoint files say what the step count counts: epoch=0-env_steps=5120.ckpt.
            offer = data_offer_of(datamodule)
            name_checkpoint_files(getattr(self.trainer, "checkpoint_callbacks", ()), offer and offer.step_name)
        if self.module is None and self.spec_to_build is not None:
            self.module_spec = _with_spaces_from(self.spec_to_build, data_offer_of(datamodule))
        self.build()
        if isinstance(datamodule, DataSource):
            datamodule.accept_requirements(self.data_requirements())

    def configure_model(self) -> None:
        """Lightning's hook, after ``setup``: under a sharding strategy, shard the modules (FSDP2).

        Under ``FSDP2Strategy`` (``strategy="fsdp2"``) or a ``ModelParallelStrategy`` with
        ``tensor_parallel_size=1``, the modules become one FSDP unit over the data-parallel
        ranks and the optimizers are built again on the slices (``sharding.shard_modules``).
        Other strategies leave the modules as they are. Called again for later stages; the
        modules are sharded once.

        Raises:
            ValueError: Under a ``ModelParallelStrategy`` with ``tensor_parallel_size > 1``, and
                under Lightning's own ``ModelParallelStrategy`` with checkpoints enabled (its
                checkpoints hold slices the Learner cannot restore; ``"fsdp2"`` writes whole ones).
        """
        strategy = getattr(self.trainer, "strategy", None)
        if not is_sharding_strategy(strategy) or self.step_runner.sharding_mesh is not None:
            return
        check_writes_whole_checkpoints(strategy, checkpointing=bool(self.trainer.checkpoint_callbacks))
        shard_modules(self, data_parallel_mesh(strategy))

    def data_requirements(self) -> DataRequirements:
        """What this Learner requires of its data: its side of the data contract (``lightning_rl.core.data_contract``).

        Called by ``check_fits_data`` (at ``setup`` under ``fit``, and by the CLI before the
        run), and once more after ``setup`` built the modules, to hand the requirements to the
        data module (``DataSource.accept_requirements``). Override it, calling ``super()`` and
        replacing fields with ``dataclasses.replace``, to train from other sources
        (``OffPolicyLearner`` takes ``"replay"``).

        Returns:
            A ``DataRequirements``: every ``TrainingData`` source but ``"replay"`` (which
            off-policy Learners sample), ``minibatch_size``, each module's
            ``required_batch_columns`` (the built modules, else the spec's), the ``gamma``
            and ``n_step`` hyperparameters, ``None`` where the Learner has none, and the
            ``max_seq_len`` of each built stateful module (none before the modules are built).
        """
        if self.module is not None:
            module_ids = list(self.module.keys())
        else:
            module_ids = list(self.spec_to_build.rl_module_specs) if self.spec_to_build is not None else []
        return DataRequirements(
            learner=type(self).__name__,
            sources=frozenset(TRAINING_DATA_SOURCES) - {"replay"},
            minibatch_size=self.hparams.minibatch_size,
            columns={module_id: tuple(self.required_batch_columns(module_id)) for module_id in module_ids},
            gamma=self.hparams.get("gamma"),
            n_step=self.hparams.get("n_step"),
            suggestion="a replay buffer is for off-policy Learners (DQNLearner, SACLearner); use "
            "lightning_rl.data.OnPolicyDataModule",
            max_seq_lens={
                module_id: max_seq_len_of(module)
                for module_id, module in (self.module.items() if self.module is not None else ())
                if module.is_stateful()
            },
        )

    def check_fits_data(self, datamodule: Any) -> None:
        """Check ``datamodule``'s offer against ``data_requirements()`` (``core.data_contract.check_data_fits``).

        Called by ``setup`` under ``fit``, and by the CLI once the Learner and the data module
        exist. A data module that is not a ``DataSource`` offers nothing and is not checked.

        Raises:
            ValueError: One line naming this Learner's class and the data module's: if the
                data module's train items hold a source this Learner does not train from, or
                if ``minibatch_size`` is larger than one train item's rows (naming both sizes).
        """
        check_data_fits(self.data_requirements(), data_offer_of(datamodule), type(datamodule).__name__)

    def training_step(self, train_item: TrainItem | Mapping[str, Any], batch_idx: int = 0) -> dict[str, Any]:
        """Lightning's hook: one update with the Learner's epoch and minibatch settings.

        ``train_item`` is a ``TrainItem`` (what every lightning_rl data module yields): its data
        goes to ``update(training_data=...)``, which trains on it as its source requires, its
        ``timesteps`` drive the schedules, its ``env_runners`` statistics are logged as
        ``env_runners/{key}`` (but not a NaN, a statistic with nothing to measure yet, such as
        ``episode_return_mean`` before the first episode ended) and its ``update_settings``
        replace the Learner's epoch and minibatch settings for this update alone. A plain batch (a ``DataLoader`` of
        ``{column: tensor}`` dicts) is trained on as it is. The results are logged
        (``"{module_id}/{key}"``) to the Trainer's logger.

        An item of several sampling cycles (``TrainItem.next_cycle``, from
        ``OffPolicyDataModule(cycles_per_item=k)``) takes one update per cycle, each cycle
        sampled after the previous update; the last cycle's results and statistics are logged
        and returned (its lifetime counters and moving averages cover the earlier cycles).

        Returns:
            ``{"results": ...}``, the (last) update's results as ``update_from_batch`` returns them;
            Lightning hands this to ``Callback.on_train_batch_end`` as ``outputs``.
        """
        item = as_train_item(train_item)
        results = self.update(
            training_data=item.data, timesteps=dict(item.timesteps), **self._update_settings_for(item)
        )
        # An item of several sampling cycles: one update per cycle, each cycle sampled after the
        # previous update, so it acts with the weights that update left (TrainItem.next_cycle).
        while item.next_cycle is not None and (following := item.next_cycle()) is not None:
            item = following
            results = self.update(
                training_data=item.data, timesteps=dict(item.timesteps), **self._update_settings_for(item)
            )
        metrics = {f"{mid}/{key}": value for mid, values in results.items() for key, value in values.items()}
        # A NaN sampling statistic is a placeholder, not a measurement: the return and length
        # statistics before the first episode ended, a speed with no sampling time. Logged, it
        # would be a NaN point at the start of every chart; it is left out instead.
        metrics.update(
            {f"env_runners/{key}": value for key, value in item.env_runners.items() if not math.isnan(value)}
        )
        self._log_train_metrics(metrics, batch_idx, item.timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME))
        self.evaluation_progress.pending = _ends_an_epoch_that_evaluates(attached_trainer(self), batch_idx)
        return {"results": results}

    def _update_settings_for(self, item: TrainItem) -> dict[str, Any]:
        """The epoch and minibatch settings of ``item``'s update: the Learner's, replaced by the item's own.

        Which settings a source of data trains with is ``update_api.SETTINGS_OF_SOURCE``'s:
        a replay source, or no data, takes none (it trains with the Learner's own); an
        iterator takes only ``minibatch_size`` (``num_epochs`` only when the item sets it).
        """
        names = SETTINGS_OF_SOURCE[item.data.source]
        if names is None:
            return {}
        settings = {name: self.hparams[name] for name in names}
        settings.update(item.update_settings)
        return settings

    def validation_step(self, eval_item: TrainItem, batch_idx: int = 0) -> None:
        """Lightning's hook: add evaluation episodes to the epoch's statistics, logged as ``eval/{key}``.

        ``eval_item`` is what ``EnvDataModule.val_dataloader()`` yields: a ``TrainItem`` whose
        data is complete episodes played by ``forward_inference`` (single- or multi-agent; a
        multi-agent episode's return is the sum over its agents), and whose ``env_runners``
        statistics, if any, are logged as ``eval/{key}`` too (``MultiAgentDataModule``'s win rates). The statistics are torchmetrics
        aggregators (``learner.eval_metrics``, see ``EvaluationMetrics``) logged as objects, so
        Lightning computes them over the whole epoch and all ranks, then resets them; the return
        mean is also on the progress bar as ``eval_return``. They are written at the item's
        ``num_env_steps_sampled_lifetime`` (the Learner's last one if the item has none).
        """
        self.eval_metrics.update(eval_item.data.episodes)
        for key, metric in self.eval_metrics.items():
            self.log(f"eval/{key}", metric, on_step=False, on_epoch=True)
        # Statistics the data module computed itself (win rates against fixed opponents): every
        # rank plays an equal share, so the mean over items and ranks is the mean over all games.
        for key, value in eval_item.env_runners.items():
            self.log(f"eval/{key}", float(value), on_step=False, on_epoch=True, sync_dist=True, batch_size=1)
        return_mean = self.eval_metrics.return_mean
        self.log("eval_return", return_mean, prog_bar=True, logger=False, on_step=False, on_epoch=True)
        env_steps = eval_item.timesteps.get(
            NUM_ENV_STEPS_SAMPLED_LIFETIME, self.timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME)
        )
        if env_steps is not None:
            log_env_step(self, env_steps, on_step=False)

    def on_validation_epoch_end(self) -> None:
        """Lightning's hook: log the best evaluation return so far as ``hp_metric``.

        Called after the epoch's last ``validation_step``. ``hp_metric`` is the metric
        TensorBoard's HParams dashboard shows for the run; the best return is kept in
        checkpoints, so a resumed run goes on from it. Sanity-check evaluations do not count.
        """
        trainer = attached_trainer(self)
        return_mean = self.eval_metrics.return_mean
        if trainer is None or trainer.sanity_checking or not return_mean.update_called:
            return
        # compute() gathers over the ranks and caches the result, which Lightning then logs as it is.
        progress = self.evaluation_progress
        progress.best_return = best_return(progress.best_return, return_mean.compute())
        if progress.best_return is not None:
            self.log(HP_METRIC_KEY, progress.best_return, on_step=False, on_epoch=True, sync_dist=True)

    def _log_train_metrics(self, metrics: dict[str, float], batch_idx: int, env_steps: float | None) -> None:
        """Log one train item's metrics, on the items whose logs Lightning writes, and on the epoch's last.

        Lightning writes to the loggers only every ``log_every_n_steps`` train items, so the
        metrics are handed over on those items, and on the last item of an epoch or of the run,
        so that epoch-end callbacks (``EarlyStopping``, ``ModelCheckpoint``) see the current
        values. In between, ``trainer.callback_metrics`` and the progress bar keep the last
        values handed over. Each value is the Learner's reduced result of the item written (its
        ``update`` reduces every item, written or not): lifetime counters and moving averages
        cover the items in between, per-update values (``total_loss``, ``num_env_steps_trained``)
        are that item's.

        The values are plain floats, already reduced over the ranks, so they go to the loggers,
        ``trainer.callback_metrics`` and ``trainer.logged_metrics`` in one call
        (``write_step_metrics``) at ``env_steps`` (the item's ``num_env_steps_sampled_lifetime``)
        as the loggers' step, rather than through ``self.log`` one key at a time, which costs
        Lightning ~0.2 ms per key (~7 ms per item of ~35 keys: as much as a DQN item's 256 env
        steps). The progress bar's ``return`` and ``loss`` still go through ``self.log``. An
        item without ``env_steps`` (a plain batch) is written at Lightning's own step.
        """
        trainer = attached_trainer(self)
        last_item = trainer is not None and (batch_idx + 1 >= trainer.num_training_batches or trainer.should_stop)
        if not (last_item or trainer_writes_logs_now(trainer)):
            return
        if trainer is None or not write_step_metrics(trainer, metrics, env_steps):
            # The values are already reduced over ranks by the metrics logger.
            self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1, sync_dist=False)
            if env_steps is not None:
                log_env_step(self, env_steps, on_step=True)
        if trainer is not None and trainer.progress_bar_callback is None:
            return  # the two values below are for the progress bar alone
        for name, key in (("return", TRAIN_RETURN_KEY), ("loss", f"{ALL_MODULES}/{TOTAL_LOSS_KEY}")):
            if key in metrics:
                self.log(name, metrics[key], prog_bar=True, logger=False, on_step=True, batch_size=1)

    def on_validation_end(self) -> None:
        """Lightning's hook: the epoch's evaluation has run, so a checkpoint from now on owes none."""
        self.evaluation_progress.pending = False

    def on_train_start(self) -> None:
        """Lightning's hook: run the evaluation a resumed checkpoint's epoch still owed, before training goes on.

        A checkpoint written after an epoch's last train item (``ModelCheckpoint`` with
        ``every_n_train_steps``, or a save from a callback) comes before that epoch's
        evaluation. Lightning resumes such a run at the next epoch and skips the evaluation,
        so the run would lose one evaluation point per interruption (and ``EarlyStopping`` one
        chance to stop). The checkpoint records the debt (``on_save_checkpoint``); it is paid
        here, logged at the checkpoint's step.
        """
        trainer = attached_trainer(self)
        if self.evaluation_progress.owed and trainer is not None and trainer.enable_validation:
            run_validation_now(trainer)
        self.evaluation_progress.owed = False

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Lightning's hook: add what rebuilds this Learner to a Lightning checkpoint.

        Weights and optimizer states are in the checkpoint already (``state_dict``,
        ``optimizer_states``); this adds the module spec, hyperparameters, optimizer names
        (in Lightning's order), schedules, metrics and counters, and then the checksum of
        all of these (``lightning_rl.core.checkpoint.add_learner_checksum``), which loading
        checks. Lightning calls this hook last, after every callback's; a subclass that
        overrides it must change the checkpoint before calling ``super()``, not after.
        """
        check_writes_whole_checkpoints(self.trainer.strategy, checkpointing=True)
        learner_state.add_to_lightning_checkpoint(
            self,
            checkpoint,
            evaluation_owed=self.evaluation_progress.pending,
            best_evaluation_return=self.evaluation_progress.best_return,
        )

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Lightning's hook: check the Learner's checksum, rebuild the modules the checkpoint holds, restore state.

        Lightning then loads the weights and, when resuming a fit, the optimizer states.
        """
        learner_state.restore_from_lightning_checkpoint(self, checkpoint)
        owed = bool(checkpoint[CHECKPOINT_KEY].get("evaluation_owed", False))
        best = checkpoint[CHECKPOINT_KEY].get("best_evaluation_return")
        self.evaluation_progress.best_return = None if best is None else float(best)
        self.evaluation_progress.owed = owed and resume_skips_the_epochs_evaluation(checkpoint)

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | os.PathLike,
        map_location: torch.device | str | None = None,
        hparams_file: Any = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Lightning's classmethod, made safe: the same as ``from_checkpoint(checkpoint_path, **kwargs)``.

        Lightning's own version builds the module from the checkpoint's
        ``hyper_parameters``, through the ``_instantiator`` the file names; LightningCLI's
        instantiator parses them as config, which turns a string such as ``"builtins.print"``
        into a function where an argument may be callable (``policies_to_train``). This one
        reads the file with ``read_checkpoint_file`` (plain data, checksum checked), finds
        its Learner class among the loaded ones and passes the hyperparameters as values;
        keys starting with ``_`` are ignored.

        Args:
            checkpoint_path: A Lightning ``.ckpt`` file or a ``save_to_path`` directory.
            map_location: The device to load onto (a ``torch.device`` or a string); ``None``
                for the CPU.
            hparams_file: Not supported (it would replace the saved hyperparameters).
            strict: ``None`` or ``True``: weights are always checked to match exactly.
            weights_only: ``None`` or ``True``: checkpoints are always loaded as plain data.
            **kwargs: Hyperparameters replacing the saved ones.

        Raises:
            ValueError: One line naming the file, if it cannot be read or does not fit; and
                for the unsupported arguments above, naming them.
        """
        refused = [
            name
            for name, given in (
                ("hparams_file", hparams_file is not None),
                ("strict=False", strict is False),
                ("weights_only=False", weights_only is False),
                ("a map_location that is not a device", not isinstance(map_location, (str, torch.device, type(None)))),
            )
            if given
        ]
        if refused:
            raise ValueError(
                f"{cls.__name__}.load_from_checkpoint does not support {refused}: a Learner checkpoint is read as "
                "plain data, its weights must match exactly, and keyword arguments replace its hyperparameters"
            )
        return learner_state.learner_from_checkpoint(cls, os.fspath(checkpoint_path), device=map_location, **kwargs)


def _ends_an_epoch_that_evaluates(trainer: Any, batch_idx: int) -> bool:
    """Whether train item ``batch_idx`` is the last of an epoch after which Lightning evaluates."""
    if trainer is None or not trainer.enable_validation or trainer.check_val_every_n_epoch is None:
        return False
    last_item = batch_idx + 1 >= trainer.num_training_batches
    return last_item and (trainer.current_epoch + 1) % trainer.check_val_every_n_epoch == 0


def _with_spaces_from(spec: MultiRLModuleSpec, offer: DataOffer | None) -> MultiRLModuleSpec:
    """``spec`` with every missing observation/action space taken from the data module's ``offer``.

    A multi-agent offer (``module_spaces``) goes through ``specs_for_module_spaces``; a
    single-agent one gives its one pair to every module that lacks a space. The offered spaces
    are read only when a module lacks one, or for ``module_spaces``.
    """
    if offer is not None and offer.module_spaces is not None:
        return specs_for_module_spaces(spec, offer.module_spaces())
    missing = [
        module_id
        for module_id, module_spec in spec.rl_module_specs.items()
        if module_spec.observation_space is None or module_spec.action_space is None
    ]
    if not missing:
        return spec
    observation_space, action_space = offer.single_spaces() if offer is not None else (None, None)
    if observation_space is None or action_space is None:
        raise ValueError(
            f"the specs of modules {missing} have no observation/action space, and the Trainer has no data module "
            "that provides them: pass the spaces in the module spec, or fit with "
            "datamodule=lightning_rl.data.OnPolicyDataModule(...)"
        )
    specs = dict(spec.rl_module_specs)
    for module_id in missing:
        specs[module_id] = dataclasses.replace(
            specs[module_id],
            observation_space=specs[module_id].observation_space or observation_space,
            action_space=specs[module_id].action_space or action_space,
        )
    return dataclasses.replace(spec, rl_module_specs=specs)


def specs_for_module_spaces(
    spec: MultiRLModuleSpec, module_spaces: Mapping[str, tuple[gym.Space, gym.Space]]
) -> MultiRLModuleSpec:
    """The module specs a multi-agent data module's offered ``module_spaces`` (``DataOffer.module_spaces``) call for.

    Args:
        spec: The Learner's spec. One ``default_policy`` spec without spaces (what an
            algorithm's Learner builds from ``model_config``) is a template: the result holds one
            copy of it per id of ``module_spaces``, with that id's spaces. Any other spec must
            hold every id of ``module_spaces``; a spec missing a space gets its id's, and specs of
            ids that ``module_spaces`` does not name (fixed opponents) must carry their own.
        module_spaces: ``{module_id: (observation_space, action_space)}``.

    Raises:
        ValueError: For an empty ``module_spaces``; for ids it names that ``spec`` lacks
            (naming both lists); for a spec whose space differs from its id's; and for a spec
            without spaces whose id ``module_spaces`` does not name.
    """
    if not module_spaces:
        raise ValueError("the data module's module_spaces is empty: its policy mapping sends no agent to any module")
    specs = spec.rl_module_specs
    template = specs.get(DEFAULT_MODULE_ID)
    has_no_spaces = template is not None and template.observation_space is None and template.action_space is None
    if len(specs) == 1 and has_no_spaces:
        return dataclasses.replace(
            spec,
            rl_module_specs={
                module_id: dataclasses.replace(template, observation_space=obs_space, action_space=act_space)
                for module_id, (obs_space, act_space) in module_spaces.items()
            },
        )
    lacking = [module_id for module_id in module_spaces if module_id not in specs]
    if lacking:
        raise ValueError(
            f"the data module maps agents to modules {sorted(module_spaces)}, but the module spec has no module "
            f"{lacking} (it has {sorted(specs)}); add a spec for each, or leave module_spec out to build one per id"
        )
    filled = dict(specs)
    for module_id, (obs_space, act_space) in module_spaces.items():
        filled[module_id] = _with_module_spaces(module_id, specs[module_id], obs_space, act_space)
    without = [mid for mid, s in filled.items() if s.observation_space is None or s.action_space is None]
    if without:
        raise ValueError(
            f"the specs of modules {without} have no observation/action space, and the data module maps no agent "
            f"to them (it maps agents to {sorted(module_spaces)}): pass their spaces in the module spec"
        )
    return dataclasses.replace(spec, rl_module_specs=filled)


def _with_module_spaces(
    module_id: str, module_spec: RLModuleSpec, obs_space: gym.Space, act_space: gym.Space
) -> RLModuleSpec:
    """``module_spec`` with its missing spaces set; a space it gives must be the data module's."""
    for kind, given, expected in (
        ("observation", module_spec.observation_space, obs_space),
        ("action", module_spec.action_space, act_space),
    ):
        if given is not None and given != expected:
            raise ValueError(
                f"module {module_id!r}: the module spec's {kind} space is {given}, but the agents the data module "
                f"maps to it have {expected}"
            )
    return dataclasses.replace(module_spec, observation_space=obs_space, action_space=act_space)
