"""The ``lightning-rl`` command: Lightning's CLI for Learners and episode data modules.

    lightning-rl fit --config examples/ppo_cartpole.yaml
    lightning-rl fit --config examples/ppo_cartpole.yaml --model.init_args.lr 3e-4
    lightning-rl validate --config examples/ppo_cartpole.yaml --ckpt_path path/to/last.ckpt
    lightning-rl fit --config examples/ppo_cartpole.yaml --print_config

The model is any ``Learner`` subclass and the data any ``LightningDataModule``, both chosen
by ``class_path``; every ``__init__`` argument is settable from YAML or a flag. The
Learner's observation and action spaces come from the data module at setup.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningDataModule
from lightning.pytorch.cli import LightningCLI

from lightning_rl.learner.learner import Learner
from lightning_rl.data.episode_datamodule import EpisodeDataModule


class LightningRLCLI(LightningCLI):
    """``LightningCLI`` set up for Learners.

    Differences from the stock CLI: model and data are chosen by class path (any ``Learner``
    and any ``LightningDataModule``, ``EpisodeDataModule`` by default); the CLI never
    replaces the Learner's optimizers (``auto_configure_optimizers=False``: Learners register
    their own, per module); a config value that the Learner or data module rejects ends the
    command with a usage error naming it, before anything runs.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("model_class", Learner)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("datamodule_class", LightningDataModule)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("auto_configure_optimizers", False)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.set_defaults({"data": {"class_path": f"{EpisodeDataModule.__module__}.{EpisodeDataModule.__name__}"}})

    def instantiate_classes(self) -> None:
        """Instantiate model, data and Trainer; turn their ``ValueError``\\ s into usage errors."""
        try:
            super().instantiate_classes()
            self.model.check_fits_data(self.datamodule)
        except ValueError as error:
            self.parser.error(f"invalid configuration: {error}")


def main(args: list[str] | None = None) -> None:
    """Run the ``lightning-rl`` command (``args`` defaults to ``sys.argv[1:]``)."""
    LightningRLCLI(args=args)


if __name__ == "__main__":
    main()
