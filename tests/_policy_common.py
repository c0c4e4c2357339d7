"""What the Policy tests share: every way this package writes a checkpoint, and the greedy action by hand.

``write_checkpoints(row, directory)``, for one algorithm row of ``tests/_algorithms.py``, trains the row's tiny Learner twice (a few hundred env
steps each): once through ``lightning-rl fit`` (``LightningRLCLI``, default logger, so the
checkpoint lands in ``lightning_logs/version_0/checkpoints/last.ckpt`` with LightningCLI's
``_class_path`` and ``_instantiator`` in its hyperparameters) and once through a plain
``Trainer.fit`` with ``ModelCheckpoint`` (the Learner built from ``model_config`` alone, its
spaces taken from the data module); that second Learner is then saved with
``Learner.save_to_path`` and ``LearnerGroup.save_to_path``. Each path comes with the module
weights it must load to.

``greedy_actions`` spells out, independently of the package's acting code, what evaluation
does: ``forward_inference``, then the module's own actions or the inference distribution's
``deterministic_sample``, then Box clipping.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import yaml
from _algorithms import MODEL_CONFIG, AlgorithmRow
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_rl import DEFAULT_MODULE_ID, Columns, Learner, LearnerGroup, RLModule
from lightning_rl.cli import LightningRLCLI

WRITERS = ("cli", "trainer_fit", "save_to_path", "learner_group")
# Two train items of 64 env steps each.
FIT_ENV_STEPS = 128


@dataclasses.dataclass(frozen=True)
class WrittenCheckpoint:
    """A checkpoint path and the weights of the module it holds (``default_policy``)."""

    path: Path
    weights: dict[str, torch.Tensor]


def module_weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in learner.module[DEFAULT_MODULE_ID].state_dict().items()}


def write_checkpoints(row: AlgorithmRow, directory: Path) -> dict[str, WrittenCheckpoint]:
    """One checkpoint per writer in ``WRITERS``, each of a briefly trained Learner of ``row``."""
    cli_learner, cli_path = fit_from_the_command_line(row, directory / "cli")
    fitted, fit_path = _fit_in_python(row, directory / "trainer_fit")
    weights = module_weights(fitted)
    saved = Path(fitted.save_to_path(str(directory / "save_to_path")))
    group = LearnerGroup(fitted, num_learners=0)
    try:
        grouped = Path(group.save_to_path(directory / "learner_group"))
    finally:
        group.shutdown()
    return {
        "cli": WrittenCheckpoint(cli_path, module_weights(cli_learner)),
        "trainer_fit": WrittenCheckpoint(fit_path, weights),
        "save_to_path": WrittenCheckpoint(saved, weights),
        "learner_group": WrittenCheckpoint(grouped, weights),
    }


def _data_kwargs() -> dict[str, int]:
    return dict(rollouts_per_epoch=2, max_env_steps=FIT_ENV_STEPS, evaluation_num_episodes=1)


def fit_from_the_command_line(row: AlgorithmRow, directory: Path) -> tuple[Learner, Path]:
    """``lightning-rl fit`` of ``FIT_ENV_STEPS`` env steps in ``directory``; the fitted Learner and its ``last.ckpt``."""
    directory.mkdir(parents=True)
    config = {
        "seed_everything": 0,
        "trainer": {
            "max_epochs": -1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 0,
            "default_root_dir": str(directory),
            "callbacks": [
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True}}
            ],
        },
        "model": row.cli_model(),
        "data": row.cli_data(**_data_kwargs()),
    }
    path = directory / "config.given.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = LightningRLCLI(args=["fit", "--config", str(path)])
    return cli.model, directory / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"


def _fit_in_python(row: AlgorithmRow, directory: Path) -> tuple[Learner, Path]:
    seed_everything(0)
    if row.takes_model_config:
        learner = row.learner_class(model_config=dict(MODEL_CONFIG), **row.learner_kwargs)
    else:
        learner = row.make_learner()
    trainer = Trainer(
        max_epochs=-1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=directory,
        callbacks=[ModelCheckpoint(dirpath=directory, save_last=True)],
    )
    trainer.fit(learner, datamodule=row.make_data(**_data_kwargs()))
    return learner, directory / "last.ckpt"


def observations(space: gym.spaces.Box, count: int, seed: int = 0) -> np.ndarray:
    """``count`` observations from standard normal draws, clipped to the space's bounds."""
    draws = np.random.default_rng(seed).standard_normal((count, *space.shape))
    return np.clip(draws, space.low, space.high).astype(space.dtype)


def run_export(path: Path, obs: np.ndarray) -> np.ndarray:
    """The actions an exported file computes: with onnxruntime for ``.onnx``, ``torch.export.load`` for ``.pt2``."""
    if path.suffix == ".onnx":
        import onnxruntime  # only where an ONNX file is run (the GPU lane skips without it)

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(None, {session.get_inputs()[0].name: obs})[0]
    with torch.no_grad():
        return torch.export.load(path).module()(torch.from_numpy(obs)).numpy()


def greedy_actions(module: RLModule, obs: torch.Tensor) -> torch.Tensor:
    """The greedy actions evaluation takes, computed here step by step."""
    with torch.no_grad():
        out = module.forward_inference({Columns.OBS: obs})
        if Columns.ACTIONS in out:
            actions = out[Columns.ACTIONS]
        else:
            dist = module.get_inference_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
            actions = dist.deterministic_sample()
    space = module.action_space
    if isinstance(space, gym.spaces.Box):
        actions = actions.clamp(torch.as_tensor(space.low), torch.as_tensor(space.high))
    return actions
