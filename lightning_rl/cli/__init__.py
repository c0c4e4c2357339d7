"""The ``lightning-rl`` command: train, validate, evaluate and export Learners.

    lightning-rl fit --config examples/ppo_cartpole.yaml
    lightning-rl validate --config examples/ppo_cartpole.yaml --ckpt_path last.ckpt
    lightning-rl evaluate --ckpt_path last.ckpt --num_episodes 100
    lightning-rl export --ckpt_path last.ckpt --format onnx --output policy.onnx
    lightning-rl record --ckpt_path last.ckpt --num_episodes 200 --dataset_id pendulum/sac-medium-v0
    lightning-rl tune --config examples/tune_ppo_cartpole.yaml

``fit`` and ``validate`` run Lightning's CLI (``LightningRLCLI``, in ``lightning_cli.py``);
``evaluate``, ``export``, ``record`` and ``tune`` are commands of their own (``evaluate_command.py``,
``export_command.py``, ``record_command.py``, ``tune_command.py``). This module only dispatches, and imports each command when it runs:
``lightning-rl --help`` answers without loading torch or Lightning, as do the ``--help`` and
usage errors of ``evaluate``, ``export`` and ``record`` (their parsers are in
``command_parsers.py``), and ``fit --help`` from a cache (``help_cache.py``).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import io
import signal
import sys
from typing import Any, NoReturn

# Each subcommand and the line the top-level help gives it.
SUBCOMMANDS = {
    "fit": "Train a Learner on a data module (Lightning's Trainer.fit), from a config file and flags.",
    "validate": "Run one evaluation epoch of a Learner, e.g. of a checkpoint (--ckpt_path).",
    "evaluate": "Play episodes with a checkpoint's policy on held-out seeds; print the return's statistics.",
    "export": "Export a checkpoint's policy for deployment (ONNX or torch.export).",
    "record": "Play episodes with checkpoints' policies or random actions; write them as a Minari dataset.",
    "tune": "Search a training config's hyperparameters with Optuna, each trial a fit (the [tune] extra).",
}
# Lightning's other subcommands, and why they are not offered.
_NOT_OFFERED = {
    "test": "a Learner has no test set; measure a policy with 'lightning-rl evaluate --ckpt_path ...' "
    "or 'lightning-rl validate --config ... --ckpt_path ...'",
    "predict": "a Learner has no predict_step; act with a trained policy through lightning_rl.Policy, "
    "or export it with 'lightning-rl export --ckpt_path ...'",
}
# The subcommands Lightning's CLI runs (``LightningRLCLI.subcommands``); the others have a module of their own.
TRAINER_SUBCOMMANDS = ("fit", "validate")
_USAGE = "usage: lightning-rl [-h] {fit,validate,evaluate,export,record,tune} ..."

# Names this package used to define here, imported from lightning_cli.py when first used.
_FROM_LIGHTNING_CLI = ("LightningRLCLI", "LightningRLArgumentParser", "misplaced_data_argument_hint")


def main(args: list[str] | None = None) -> None:
    """Run the ``lightning-rl`` command.

    Args:
        args: The command's arguments without the program name; ``sys.argv[1:]`` by default.

    Raises:
        SystemExit: With status 2 and a message on stderr for a missing, unknown or
            unavailable subcommand; with the status of ``--help`` and of usage errors.
    """
    from_command_line = args is None
    args = list(sys.argv[1:] if args is None else args)
    if args and args[0] in ("-h", "--help"):
        print(top_level_help())
        return
    if not args:
        _usage_error("choose a subcommand: " + ", ".join(SUBCOMMANDS))
    command = args[0]
    if command in _NOT_OFFERED:
        _usage_error(f"'{command}' is not offered: {_NOT_OFFERED[command]}")
    if command in ("evaluate", "export", "record", "tune"):
        if command != "tune":
            # --help and usage errors answer here, before the command's module loads torch.
            from lightning_rl.cli.command_parsers import PARSERS

            PARSERS[command]().parse_args(args[1:])
        module = importlib.import_module(f"lightning_rl.cli.{command}_command")
        module.main(args[1:])
        return
    if command in TRAINER_SUBCOMMANDS or command.startswith("-"):
        # Options before the subcommand (``--config``, ``--print_config``) are Lightning's too.
        _run_lightning_cli(args, from_command_line)
        return
    close = difflib.get_close_matches(command, list(SUBCOMMANDS) + list(_NOT_OFFERED), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    _usage_error(f"unknown subcommand '{command}' (choose from {', '.join(SUBCOMMANDS)}){hint}")


def top_level_help() -> str:
    """The text of ``lightning-rl --help``."""
    width = max(len(name) for name in SUBCOMMANDS)
    lines = [
        _USAGE,
        "",
        "Train and deploy RLlib-style Learners with PyTorch Lightning.",
        "",
        "subcommands:",
        *(f"  {name:<{width}}  {summary}" for name, summary in SUBCOMMANDS.items()),
        "",
        "options:",
        "  -h, --help  show this help message and exit",
        "",
        "'lightning-rl SUBCOMMAND --help' lists a subcommand's options; for fit and validate,",
        "'--model.help CLASS' and '--data.help CLASS' list a Learner's or data module's",
        "arguments (short names such as PPOLearner and OffPolicyDataModule work).",
    ]
    return "\n".join(lines)


def _run_lightning_cli(args: list[str], from_command_line: bool) -> None:
    """Run ``LightningRLCLI`` on ``args``, answering ``SUBCOMMAND --help`` from the help cache when it can.

    ``from_command_line``: ``args`` are ``sys.argv[1:]``, which Lightning's CLI then reads itself
    (it warns when given both).
    """
    from lightning_rl.cli.help_cache import HelpCache

    cache = HelpCache.for_args(args, TRAINER_SUBCOMMANDS)
    if cache is not None and (text := cache.read()) is not None:
        sys.stdout.write(text)
        raise SystemExit(0)  # as the parser's own --help ends
    from lightning_rl.cli.lightning_cli import LightningRLCLI

    lightning_args = None if from_command_line else args
    if cache is None:
        _run_until_stopped(LightningRLCLI, lightning_args, args)
        return
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            _run_until_stopped(LightningRLCLI, lightning_args, args)
    except SystemExit as exit_:
        if exit_.code in (0, None) and printed.getvalue():
            cache.write(printed.getvalue())
        raise
    finally:
        sys.stdout.write(printed.getvalue())


def _run_until_stopped(cli_class: Any, lightning_args: list[str] | None, args: list[str]) -> None:
    """Run ``cli_class(args=lightning_args)``; a run that SIGTERM stopped exits with status 143.

    Lightning ends a fit or validation stopped by SIGTERM with a bare ``SystemExit`` (its
    ``SIGTERMException``): status 0 and no word, as if the run had finished, so a scheduler or
    a script could not tell a preempted run from a finished one.

    Raises:
        SystemExit: With status ``128 + SIGTERM`` and one line on stderr, after a SIGTERM.
    """
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    try:
        cli_class(args=lightning_args)
    except SIGTERMException:
        command = next((arg for arg in args if arg in TRAINER_SUBCOMMANDS), "fit")
        print(
            f"lightning-rl {command}: stopped by SIGTERM before the run ended; the checkpoints written before the stop "
            "are kept (ModelCheckpoint(save_on_exception=True) also writes one at the stop): resume with --ckpt_path",
            file=sys.stderr,
        )
        raise SystemExit(128 + signal.SIGTERM) from None


def _usage_error(message: str) -> NoReturn:
    print(f"{_USAGE}\nlightning-rl: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def __getattr__(name: str) -> Any:
    """``from lightning_rl.cli import LightningRLCLI`` (and its helpers), imported on first use."""
    if name in _FROM_LIGHTNING_CLI:
        return getattr(importlib.import_module("lightning_rl.cli.lightning_cli"), name)
    raise AttributeError(f"module 'lightning_rl.cli' has no attribute {name!r}")
