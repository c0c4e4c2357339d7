"""What ``evaluate`` and ``record`` read of the run behind a checkpoint: its base seed, and a config's data section.

Both are read as data only: a checkpoint or a config never makes a command import anything here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from lightning_rl.cli._command_line import CommandError


@dataclasses.dataclass(frozen=True)
class DataSection:
    """The data section of a training config (``--config``).

    Attributes:
        class_path: The data module's ``class_path``, if the section names one.
        init_args: Its arguments (the section itself when it has no ``class_path``/``init_args``).
        seed: The data module's ``seed``, else the config's ``seed_everything``; ``None`` if neither is an int.
    """

    class_path: str | None
    init_args: dict[str, Any]
    seed: int | None


def read_data_section(config: Path) -> DataSection:
    """The data section of the YAML config ``config``.

    Raises:
        CommandError: If the file cannot be read or has no data section.
    """
    try:
        content = yaml.safe_load(config.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise CommandError(f"--config {config}: cannot read it: {error}") from error
    data = content.get("data") if isinstance(content, Mapping) else None
    if not isinstance(data, Mapping):
        raise CommandError(f"--config {config}: it has no data section")
    wrapped = "class_path" in data or "init_args" in data
    init_args = dict((data.get("init_args") or {}) if wrapped else data)
    class_path = data.get("class_path") if wrapped else None
    seed = int_or_none(init_args.get("seed"))
    if seed is None:
        seed = int_or_none(content.get("seed_everything"))
    return DataSection(class_path if isinstance(class_path, str) else None, init_args, seed)


def run_base_seed(checkpoint: Mapping[str, Any], ckpt_path: str | Path) -> int | None:
    """The run's base seed: its data module's saved ``seed``, else the ``seed_everything`` of its saved config.

    Args:
        checkpoint: The checkpoint's content.
        ckpt_path: Where it was read from (the saved config is looked for beside it).
    """
    saved = checkpoint.get("datamodule_hyper_parameters") or {}
    seed = int_or_none(saved.get("seed"))
    return seed if seed is not None else _seed_everything_of_run(Path(ckpt_path))


def _seed_everything_of_run(ckpt_path: Path) -> int | None:
    """The ``seed_everything`` of the run that wrote ``ckpt_path``, from the config ``lightning-rl fit`` saved.

    Lightning's CLI saves the run's config (``seed_everything`` always an int: a random one
    when the config sets none) as ``version_N/config.yaml``, beside the ``checkpoints``
    directory the checkpoint is in. It is read as data only.

    Args:
        ckpt_path: The checkpoint file (or Learner directory) being evaluated.

    Returns:
        The saved ``seed_everything``; ``None`` when there is no such config, it cannot be
        read, or it holds no int seed.
    """
    if ckpt_path.parent.name != "checkpoints":
        return None
    try:
        content = yaml.safe_load((ckpt_path.parent.parent / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return int_or_none(content.get("seed_everything")) if isinstance(content, Mapping) else None


def int_or_none(value: Any) -> int | None:
    """``value`` if it is an int seed; ``None`` otherwise (``seed_everything: true`` is not a seed)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
