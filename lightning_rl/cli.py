"""The ``lightning-rl`` command: Lightning's CLI for Learners and environment data modules.

    lightning-rl fit --config examples/ppo_cartpole.yaml
    lightning-rl fit --config examples/ppo_cartpole.yaml --model.init_args.lr 3e-4
    lightning-rl validate --config examples/ppo_cartpole.yaml --ckpt_path path/to/last.ckpt
    lightning-rl fit --config examples/ppo_cartpole.yaml --print_config

The model is any ``Learner`` subclass and the data any ``LightningDataModule``, both chosen
by ``class_path``; every ``__init__`` argument is settable from YAML or a flag. The
Learner's observation and action spaces come from the data module at setup.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

from lightning.pytorch import LightningDataModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lightning_rl.data.env_datamodule import OFF_POLICY_ARGUMENTS, ON_POLICY_ARGUMENTS
from lightning_rl.data.on_policy import OnPolicyDataModule
from lightning_rl.learner.learner import Learner

# How jsonargparse reports an init argument the chosen class does not take.
_NOT_ACCEPTED = re.compile(r"Option '(\w+)' is not accepted")


class LightningRLArgumentParser(LightningArgumentParser):
    """Lightning's parser, whose errors also name the data module that takes a misplaced argument.

    jsonargparse checks a config against the chosen class's signature before anything is
    built, so ``replay_buffer_capacity`` under ``OnPolicyDataModule`` fails there with
    "Option 'replay_buffer_capacity' is not accepted"; this adds which class takes it.
    """

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        hint = misplaced_data_argument_hint(message)
        super().error(f"{message}\n{hint}" if hint else message, ex)


class LightningRLCLI(LightningCLI):
    """``LightningCLI`` set up for Learners.

    Differences from the stock CLI: model and data are chosen by class path (any ``Learner``
    and any ``LightningDataModule``, ``OnPolicyDataModule`` by default); the CLI never
    replaces the Learner's optimizers (``auto_configure_optimizers=False``: Learners register
    their own, per module); a config value that the Learner or data module rejects ends the
    command with a usage error naming it, before anything runs, and an argument of the other
    environment data module gets an error naming that one.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("model_class", Learner)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("datamodule_class", LightningDataModule)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("auto_configure_optimizers", False)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_class", LightningRLArgumentParser)
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.set_defaults({"data": {"class_path": f"{OnPolicyDataModule.__module__}.{OnPolicyDataModule.__name__}"}})

    def instantiate_classes(self) -> None:
        """Instantiate model, data and Trainer; turn their ``ValueError``\\ s into usage errors."""
        try:
            super().instantiate_classes()
            self.model.check_fits_data(self.datamodule)
        except ValueError as error:
            self.parser.error(f"invalid configuration: {error}")


def misplaced_data_argument_hint(message: str) -> str | None:
    """The line to add to a parser error about a data argument the chosen class does not take.

    Args:
        message: The parser's error message.

    Returns:
        ``"replay_buffer_capacity is an OffPolicyDataModule argument: use
        lightning_rl.data.OffPolicyDataModule"`` when the message rejects an argument of one of
        the two environment data modules under ``data``; ``None`` otherwise.
    """
    if not message.lstrip().startswith('Parser key "data"'):
        return None
    for name in _NOT_ACCEPTED.findall(message):
        for other_class, arguments in (
            ("OffPolicyDataModule", OFF_POLICY_ARGUMENTS),
            ("OnPolicyDataModule", ON_POLICY_ARGUMENTS),
        ):
            if name in arguments:
                return f"{name} is an {other_class} argument: use lightning_rl.data.{other_class}"
    return None


def main(args: list[str] | None = None) -> None:
    """Run the ``lightning-rl`` command (``args`` defaults to ``sys.argv[1:]``)."""
    LightningRLCLI(args=args)


if __name__ == "__main__":
    main()
