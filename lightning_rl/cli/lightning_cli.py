"""``LightningRLCLI``: Lightning's CLI for Learners and environment data modules (``fit``, ``validate``).

    lightning-rl fit --config examples/ppo_cartpole.yaml
    lightning-rl fit --config examples/ppo_cartpole.yaml --model.init_args.lr 3e-4
    lightning-rl validate --config examples/ppo_cartpole.yaml --ckpt_path path/to/last.ckpt
    lightning-rl fit --config examples/ppo_cartpole.yaml --print_config
    lightning-rl fit --model.help PPOLearner

The model is any ``Learner`` subclass and the data any ``LightningDataModule``, both chosen
by ``class_path``; the package's own classes also by their short names (``PPOLearner``,
``OffPolicyDataModule``), since this module imports them. Every ``__init__`` argument is
settable from YAML or a flag. The Learner's observation and action spaces come from the
data module at setup. ``lightning_rl.cli.main`` dispatches the ``lightning-rl`` command here.

With ``--ckpt_path``, the settings the user gives win over the checkpoint's, each difference
is reported in one line, and nothing in the checkpoint becomes code (``resume.py``): only the
Learner's plain-data hyperparameters are ever taken from it, never the data module's (an env
id or factory path in a checkpoint is never imported).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import warnings
from typing import Any, NoReturn

import yaml
from jsonargparse import Namespace
from jsonargparse._common import debug_mode_active
from jsonargparse.typing import NonNegativeInt
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_only

# Imported so that jsonargparse, which resolves a short class name among the subclasses
# imported when the parser is built, knows every algorithm's Learner by name.
import lightning_rl.algorithms  # noqa: F401
from lightning_rl.callbacks import (  # noqa: F401 (short names, as above)
    RecordEpisodes,
    SelfPlayLeague,
    StoredTrialPruning,
    TargetNetworkUpdate,
)
from lightning_rl.callbacks.progress_bar import EnvStepProgressBar
from lightning_rl.cli import TRAINER_SUBCOMMANDS
from lightning_rl.cli.config_errors import short_error
from lightning_rl.cli.resume import plan_resume
from lightning_rl.cli.threads import HELP as THREADS_HELP
from lightning_rl.cli.threads import apply_threads
from lightning_rl.core.checkpoint import (
    CHECKPOINT_KEY,
    check_checkpoint_fits,
    loaded_subclass,
    read_checkpoint_file,
    remove_stale_temporary_files,
)
from lightning_rl.core.data_contract import data_offer_of
from lightning_rl.data import AsyncSamplingDataModule, OffPolicyDataModule, OnPolicyDataModule  # noqa: F401 (short names, as above)
from lightning_rl.data.env_datamodule import ASYNC_SAMPLING_ARGUMENTS, OFF_POLICY_ARGUMENTS, ON_POLICY_ARGUMENTS
from lightning_rl.learner._lightning_private import claim_version_directory
from lightning_rl.learner.checkpoint_io import AtomicCheckpointIO
from lightning_rl.learner.learner import Learner
from lightning_rl.learner.tensorboard_logger import HParamsTensorBoardLogger

# What a fit without a logger or a default_root_dir says about its checkpoints.
NO_CHECKPOINT_DIRECTORY = (
    "No logger and no --trainer.default_root_dir: only a ModelCheckpoint with a dirpath of its own "
    "writes checkpoints (--trainer.default_root_dir DIR keeps them in DIR/checkpoints)"
)

# Names Lightning's Trainer resolves itself rather than as a file path.
_LIGHTNING_CKPT_NAMES = ("last", "best", "hpc", "registry")

# How jsonargparse's reports of a failed constructor begin.
_PARSER_WRAPPERS = ("Does not validate against any of the Union subtypes", "Problem with given class_path")

# How jsonargparse reports an init argument the chosen class does not take.
_NOT_ACCEPTED = re.compile(r"Option '(\w+)' is not accepted")


class LightningRLArgumentParser(LightningArgumentParser):
    """Lightning's parser, whose errors are short and also name the data module that takes a misplaced argument.

    A config error is one line naming the key, with the closest valid names or the expected
    type (``config_errors.short_error``), then a pointer to ``--help``: no usage block and no
    union-type dump; a YAML syntax error names the file and line. jsonargparse checks a config
    against the chosen class's signature before anything is built, so ``replay_buffer_capacity``
    under ``OnPolicyDataModule`` fails there with "Option 'replay_buffer_capacity' is not
    accepted"; this adds which class takes it.
    """

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        """Report a bad config in one or two lines (``config_errors.short_error``), without the usage block."""
        hint = misplaced_data_argument_hint(message)
        if not self.exit_on_error or debug_mode_active():  # jsonargparse's inner parsers raise, and it catches
            super().error(f"{message}\n{hint}" if hint else message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        text = short_error(parser.prog.replace(" [options]", ""), message, parser)
        if hint:
            first, see = text.rstrip("\n").rsplit("\n", 1)
            text = f"{first}\n{hint}\n{see}\n"
        self._logger.error(message)
        sys.stderr.write(text)
        self.exit(2)

    def _load_config_parser_mode(self, content: str, path: Any = "", *args: Any, **kwargs: Any) -> Namespace:
        """Load a config, naming the file and line of a YAML syntax error rather than ``<unicode string>``."""
        try:
            return super()._load_config_parser_mode(content, path, *args, **kwargs)
        except TypeError as error:
            cause = error.__cause__
            if not isinstance(cause, yaml.MarkedYAMLError) or cause.problem_mark is None:
                raise
            # jsonargparse loads a config file from the file's directory and passes its base name.
            where = f"{os.path.abspath(path) if path else 'config'}, line {cause.problem_mark.line + 1}"
            context = f" ({cause.context}, line {cause.context_mark.line + 1})" if cause.context_mark else ""
            raise TypeError(f"{where}: YAML syntax error: {cause.problem}{context}") from cause


class SaveConfigToLogDirectory(SaveConfigCallback):
    """Lightning's ``SaveConfigCallback``, which writes ``config.yaml`` only for a run with a logger.

    Without a logger (``--trainer.logger false``) Lightning's ``trainer.log_dir`` is
    ``default_root_dir``, the current directory by default: the stock callback writes
    ``config.yaml`` there, and the next such run stops because the file exists. Such a run
    has no log directory, so no config is written.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.logger is None:
            return
        super().setup(trainer, pl_module, stage)


class LightningRLCLI(LightningCLI):
    """``LightningCLI`` set up for Learners.

    Differences from the stock CLI: model and data are chosen by class path (any ``Learner``
    and any ``LightningDataModule``, ``OnPolicyDataModule`` by default); the CLI never
    replaces the Learner's optimizers (``auto_configure_optimizers=False``: Learners register
    their own, per module); a config value that the Learner or data module rejects ends the
    command with a usage error naming it, before anything runs, and an argument of the other
    environment data module gets an error naming that one. ``--ckpt_path`` is read safely and
    merged under the user's settings (``_parse_ckpt_path``); checkpoints are written by
    ``AtomicCheckpointIO`` unless the user chose another plugin; every run gets a version
    directory of its own, with its ``config.yaml`` (none for a run without a logger,
    ``SaveConfigToLogDirectory``). A config that adds no ``ModelCheckpoint`` gets Lightning's
    default one with ``save_last=True``, so every run writes ``checkpoints/last.ckpt``; a run
    without a logger writes none into the current directory (``instantiate_trainer``). A config
    that adds no progress bar gets ``EnvStepProgressBar``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _silence_lightning_pytree_deprecation()
        # No abbreviated flags: argparse would take a typo such as --trainer.max_epoch for
        # --trainer.max_epochs, which it prefixes, and run; it is an unknown key instead.
        kwargs.setdefault("parser_kwargs", {"prog": "lightning-rl", "allow_abbrev": False})
        kwargs.setdefault("model_class", Learner)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("datamodule_class", LightningDataModule)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("auto_configure_optimizers", False)
        kwargs.setdefault("parser_class", LightningRLArgumentParser)
        kwargs.setdefault("save_config_callback", SaveConfigToLogDirectory)
        self._checkpoint: tuple[str, dict[str, Any]] | None = None  # --ckpt_path and what it holds
        super().__init__(*args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """``fit`` and ``validate``, with the Trainer method arguments the parser adds to each.

        Lightning's ``test`` and ``predict`` are left out: a Learner has no test set and no
        ``predict_step`` (``lightning-rl evaluate`` plays held-out episodes; ``lightning_rl.Policy``
        and ``lightning-rl export`` act with a trained policy).
        """
        return {
            name: arguments for name, arguments in LightningCLI.subcommands().items() if name in TRAINER_SUBCOMMANDS
        }

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.set_defaults({"data": {"class_path": f"{OnPolicyDataModule.__module__}.{OnPolicyDataModule.__name__}"}})
        parser.add_argument("--threads", type=NonNegativeInt | None, default=None, help=THREADS_HELP)

    def before_instantiate_classes(self) -> None:
        """Set torch's thread count (``--threads``, ``threads.py``) before the Trainer, model or data exist."""
        subcommand = self.config.get("subcommand")
        apply_threads((self.config[subcommand] if subcommand else self.config).get("threads"))

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse as Lightning does, keeping the arguments to tell the user's settings from defaults."""
        self._raw_args = args
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        """Merge a ``--ckpt_path`` checkpoint's hyperparameters under the user's settings.

        Replaces Lightning's rule (the checkpoint's values over the user's, parsed as config,
        which can turn a string into a function). See ``lightning_rl.cli.resume``. A missing
        or unreadable checkpoint, or one written by another algorithm, is a usage error here,
        before any directory is created.
        """
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        if not ckpt_path or ckpt_path in _LIGHTNING_CKPT_NAMES:
            return
        checkpoint = self._read_checkpoint(ckpt_path)
        self._checkpoint = (ckpt_path, checkpoint)
        saved = dict(checkpoint.get("hyper_parameters") or {})
        model = self.config[subcommand].model
        chosen = loaded_subclass(model.class_path, Learner, "the config's model class_path")
        try:
            check_checkpoint_fits(ckpt_path, checkpoint, chosen)
        except ValueError as error:
            self._error(f"--ckpt_path {error}")
        given = self._given_settings()[subcommand].get("model") or {}
        same_class = given.get("class_path") in (None, model.class_path)
        given_names = set((given.get("init_args") or {}).keys()) if same_class else set()
        plan = plan_resume(chosen, saved, dict(model.init_args), given_names)
        if plan.adopted:
            adopted = {subcommand: {"model": {"class_path": model.class_path, "init_args": plan.adopted}}}
            try:
                self.config = self.parser.parse_object(adopted, self.config)
            except SystemExit:  # the parser has printed which value does not fit
                self._error(
                    f"--ckpt_path {ckpt_path}: the checkpoint's hyperparameters do not fit {chosen.__name__}"
                )
        for line in plan.report_lines(ckpt_path):
            _tell(line)
        if plan.adopted:
            _tell(
                f"{ckpt_path}: settings from the checkpoint that your config and flags leave out: {', '.join(plan.adopted)}"
            )

    def _error(self, message: str) -> NoReturn:
        """A usage error of the running subcommand (``lightning-rl fit: error: ...``, then where to look)."""
        config = getattr(self, "config", None)
        subcommand = config.get("subcommand") if config is not None else None
        # Lightning makes subcommand parsers only when the CLI runs a subcommand (not with run=False).
        subcommand_parsers = getattr(self, "_subcommand_parsers", {})
        self._parser(subcommand if subcommand in subcommand_parsers else None).error(message)

    def _given_settings(self) -> Any:
        """What the user set (config files and flags, or the ``args`` dict), without the defaults."""
        if isinstance(self._raw_args, (dict, Namespace)):
            return self.parser.parse_object(self._raw_args, defaults=False)
        return self.parser.parse_args(self._raw_args, defaults=False)

    def _read_checkpoint(self, ckpt_path: str) -> dict[str, Any]:
        """The checkpoint at ``ckpt_path``, loaded safely; a usage error naming the file and problem otherwise."""
        try:
            checkpoint = read_checkpoint_file(ckpt_path)
        except ValueError as error:
            self._error(f"--ckpt_path {error}")
        if CHECKPOINT_KEY not in checkpoint:
            self._error(
                f"--ckpt_path {ckpt_path}: a Learner directory, not a Lightning checkpoint a Trainer resumes from"
            )
        return checkpoint

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Lightning's Trainer, with the CLI's default checkpoint and progress bar callbacks.

        A config that adds no ``ModelCheckpoint`` gets one with ``save_last=True``: Lightning
        adds ``ModelCheckpoint()`` itself when no callback is one, which keeps only the latest
        epoch's file under a name with the epoch and step, while the commands that read a
        run's checkpoint (``validate``, ``evaluate``, ``export``, ``record``, and ``fit
        --ckpt_path`` to resume) are shown with ``last.ckpt``. ``enable_checkpointing: false``
        still turns checkpoints off. A config whose ``ModelCheckpoint``\ s all monitor a metric
        (the examples keep their best evaluation) gets one more that writes ``last.ckpt``, the
        latest state, at every epoch end (``_latest_state_checkpoint``): since Lightning 2.6 a
        monitored ``ModelCheckpoint(save_last=True)`` writes ``last.ckpt`` only when it saves a
        best checkpoint, so its ``last.ckpt`` was the best state, not the latest.

        A run without a logger (``--trainer.logger false``) has no log directory: it writes
        checkpoints under ``default_root_dir`` only if the user set one, and otherwise only
        those of a ``ModelCheckpoint`` with a ``dirpath`` of its own. Lightning would put the
        others in ``./checkpoints``, the current directory's.

        A config that adds no progress bar gets ``EnvStepProgressBar`` rather than Lightning's
        choice (``RichProgressBar`` once ``rich`` is installed, which reads ``Epoch 1/-2`` for
        ``max_epochs: -1``); ``enable_progress_bar: false`` still turns it off.

        A config that chooses no logger gets Lightning's default TensorBoard logger as
        ``HParamsTensorBoardLogger``, which does not log ``hp_metric = -1`` at step 0 (the
        Learner logs the best evaluation return as ``hp_metric``); without ``tensorboard``
        installed, Lightning's own default.
        """
        trainer_config = {**(self._get(self.config_init, "trainer", default={}) or {}), **kwargs}
        callbacks = trainer_config.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
        extra = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        defaults = self.trainer_defaults.get("callbacks") or []
        defaults = defaults if isinstance(defaults, list) else [defaults]
        others = [*extra, *defaults]  # Lightning's CLI adds these to the callbacks itself

        def has(kind: type[Callback]) -> bool:
            return any(isinstance(callback, kind) for callback in [*callbacks, *others])

        checkpointing = trainer_config.get("enable_checkpointing") is not False
        if checkpointing and not _has_checkpoint_directory(trainer_config):
            callbacks = [c for c in callbacks if not isinstance(c, ModelCheckpoint) or c.dirpath is not None]
            if self.subcommand == "fit":
                _tell(NO_CHECKPOINT_DIRECTORY)
            if not has(ModelCheckpoint):
                # Lightning adds a ModelCheckpoint of its own unless checkpointing is off.
                kwargs["enable_checkpointing"] = checkpointing = False
        if checkpointing and not has(ModelCheckpoint):
            callbacks.append(ModelCheckpoint(save_last=True))
        elif checkpointing and not any(_keeps_the_latest_state(c) for c in [*callbacks, *others]):
            callbacks.append(_latest_state_checkpoint([*callbacks, *others], self.subcommand == "fit"))
        progress_bar = trainer_config.get("enable_progress_bar") is not False and not trainer_config.get("barebones")
        if progress_bar and not has(ProgressBar):
            callbacks.append(EnvStepProgressBar())
        kwargs["callbacks"] = callbacks
        default_logger = trainer_config.get("logger") in (None, True) and not trainer_config.get("barebones")
        if default_logger and importlib.util.find_spec("tensorboard") is not None:
            # Lightning's default logger, as Lightning builds it, but without the hp_metric = -1 point.
            save_dir = trainer_config.get("default_root_dir") or os.getcwd()
            kwargs["logger"] = HParamsTensorBoardLogger(save_dir=save_dir, version=SLURMEnvironment.job_id())
        return super().instantiate_trainer(**kwargs)

    def instantiate_classes(self) -> None:
        """Instantiate model, data and Trainer; turn their ``ValueError``\\ s into usage errors."""
        try:
            super().instantiate_classes()
            self.model.check_fits_data(self.datamodule)
            if self._checkpoint is not None:
                ckpt_path, checkpoint = self._checkpoint
                offer = data_offer_of(self.datamodule)
                spaces = offer.single_spaces() if offer is not None else (None, None)
                check_checkpoint_fits(ckpt_path, checkpoint, type(self.model), *spaces)
        except ValueError as error:
            self._error(f"invalid configuration: {_without_parser_wrapping(error)}")
        strategy = self.trainer.strategy
        if type(strategy.checkpoint_io) is TorchCheckpointIO:  # Lightning's default, not one the user chose
            strategy.checkpoint_io = AtomicCheckpointIO()
        if self.trainer.is_global_zero:
            # Only now, with the configuration checked, does the run get a directory.
            for logger in self.trainer.loggers:
                claimed = claim_version_directory(logger)
                if claimed is not None:
                    # Each run saves into a new version directory, so no later save would
                    # meet the temporary file a killed save left in an earlier one.
                    for directory in claimed.parent.glob("version_*/checkpoints"):
                        remove_stale_temporary_files(directory)


def _keeps_the_latest_state(callback: Any) -> bool:
    """Whether ``callback`` is a ``ModelCheckpoint`` that saves every epoch's state: one that monitors no metric."""
    return isinstance(callback, ModelCheckpoint) and callback.monitor is None and callback.save_top_k != 0


def _latest_state_checkpoint(callbacks: list[Any], fitting: bool) -> ModelCheckpoint:
    """A ``ModelCheckpoint`` whose one file, ``last.ckpt``, is the latest state, written at every epoch end.

    It writes beside the config's first ``ModelCheckpoint`` (its ``dirpath``; ``None``: the run's
    ``checkpoints`` directory). The config's monitored ``ModelCheckpoint``\ s keep their best
    checkpoints; their own ``save_last`` is turned off, since from Lightning 2.6 on it writes
    ``last.ckpt`` only beside a best checkpoint (and two callbacks would write one file). Told on ``fit``.
    """
    checkpoints = [c for c in callbacks if isinstance(c, ModelCheckpoint)]
    monitored = [c for c in checkpoints if c.save_last]
    for callback in monitored:
        callback.save_last = False
    if monitored and fitting:
        _tell(
            f"ModelCheckpoint(monitor={monitored[0].monitor!r}) keeps the best checkpoints; last.ckpt, the latest "
            "state to resume from, is written at every epoch end by a ModelCheckpoint of its own (Lightning >= 2.6 "
            "writes a monitored ModelCheckpoint's last.ckpt only when its metric improves)"
        )
    return ModelCheckpoint(dirpath=checkpoints[0].dirpath, filename=ModelCheckpoint.CHECKPOINT_NAME_LAST, save_top_k=1)


def _has_checkpoint_directory(trainer_config: dict[str, Any]) -> bool:
    """Whether a ``ModelCheckpoint`` without a ``dirpath`` has a directory to write into other than the current one.

    Lightning puts such checkpoints in the logger's version directory, or, without a logger,
    in ``default_root_dir/checkpoints``, where ``default_root_dir`` is the current directory
    unless the user set one.

    Args:
        trainer_config: The Trainer's arguments, as the CLI parsed them.
    """
    logger = trainer_config.get("logger")
    has_logger = logger is None or bool(logger)  # None: Lightning's default logger
    return has_logger or trainer_config.get("default_root_dir") is not None


def _silence_lightning_pytree_deprecation() -> None:
    """Hide one deprecation warning that Lightning's own code raises on every fit and validate.

    Lightning (2.6) wraps every train and validation iterable, here the data module's
    in-process iterable, in a ``CombinedLoader`` whose pytree code checks
    ``isinstance(spec, LeafSpec)``, which torch 2.13 deprecates. Nothing in a config or in this
    package can avoid it; the filter matches that message from that Lightning module only.
    """
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        module=r"lightning\.pytorch\.utilities\._pytree",
    )


def _without_parser_wrapping(error: BaseException) -> BaseException:
    """The error a constructor raised, without the union-type report jsonargparse wraps it in.

    jsonargparse instantiates ``model: Learner | None`` as a union, and reports a failed
    constructor as "Does not validate against any of the Union subtypes", followed by the
    real message and a dump of every value; the real error is the one it chained.
    """
    while str(error).startswith(_PARSER_WRAPPERS) and (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
    return error


@rank_zero_only
def _tell(line: str) -> None:
    """Print a line for the user on stderr, once per run (on rank zero)."""
    print(line, file=sys.stderr)


def misplaced_data_argument_hint(message: str) -> str | None:
    """The line to add to a parser error about a data argument the chosen class does not take.

    Args:
        message: The parser's error message.

    Returns:
        ``"replay_buffer_capacity is an OffPolicyDataModule argument: use
        lightning_rl.data.OffPolicyDataModule"`` when the message rejects an argument of one of
        the environment data modules under ``data`` (on-policy, off-policy, asynchronous); ``None`` otherwise.
    """
    if not message.lstrip().startswith('Parser key "data"'):
        return None
    for name in _NOT_ACCEPTED.findall(message):
        for other_class, arguments in (
            ("OffPolicyDataModule", OFF_POLICY_ARGUMENTS),
            ("OnPolicyDataModule", ON_POLICY_ARGUMENTS),
            ("AsyncSamplingDataModule", ASYNC_SAMPLING_ARGUMENTS),
        ):
            if name in arguments:
                return f"{name} is an {other_class} argument: use lightning_rl.data.{other_class}"
    return None
