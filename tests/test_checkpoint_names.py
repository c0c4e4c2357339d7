"""Checkpoint file names say what their step count counts: env steps, or an offline run's dataset rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _helpers import bc_spec, make_trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.callbacks.progress_bar import EnvStepProgressBar
from lightning_rl.core.data_contract import DATASET_ROWS, ENV_STEPS, DataOffer
from lightning_rl.data import MultiAgentDataModule, OfflineDataModule, OffPolicyDataModule, OnPolicyDataModule
from lightning_rl.learner.checkpoint_names import checkpoint_filename, name_checkpoint_files

minari = pytest.importorskip("minari")
from test_offline_datamodule import bc_learner, make_hand_dataset, minari_root, offline_trainer  # noqa: F401


def _names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob("*.ckpt"))


def test_an_offline_fits_checkpoints_are_named_by_the_dataset_rows_trained_on(tmp_path: Path):
    make_hand_dataset("test/names-v0", [4, 5, 3, 6])
    data = OfflineDataModule("test/names-v0", batch_size=5, updates_per_epoch=4, seed=0, evaluation_env=None)
    saves = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, save_last=True)
    trainer = offline_trainer(
        tmp_path, max_epochs=2, callbacks=[saves], enable_checkpointing=True, limit_val_batches=0
    )  # fmt: skip
    trainer.fit(bc_learner(), datamodule=data)
    # 4 gradient steps of 5 rows per epoch: Lightning named these step=20 and step=40.
    assert _names(tmp_path / "ckpt") == ["epoch=0-dataset_rows=20.ckpt", "epoch=1-dataset_rows=40.ckpt", "last.ckpt"]
    assert data.num_env_steps_sampled_lifetime == 40


def test_an_env_fits_checkpoints_are_named_by_the_env_steps_sampled_and_resume(tmp_path: Path):
    def fit(root: Path, max_epochs: int, ckpt_path: str | None = None) -> OnPolicyDataModule:
        data = OnPolicyDataModule(
            "CartPole-v1", num_envs=2, rollout_fragment_length=16, rollouts_per_epoch=2, seed=0,
            evaluation_num_episodes=1,
        )  # fmt: skip
        saves = ModelCheckpoint(dirpath=root, save_top_k=-1, save_last=True)
        trainer = make_trainer(
            root, max_epochs=max_epochs, callbacks=[saves], enable_checkpointing=True, num_sanity_val_steps=0
        )
        trainer.fit(BCLearner(module_spec=bc_spec()), datamodule=data, ckpt_path=ckpt_path)
        return data

    fit(tmp_path / "first", max_epochs=1)
    # 2 rollouts of 2 x 16 env steps.
    assert _names(tmp_path / "first") == ["epoch=0-env_steps=64.ckpt", "last.ckpt"]
    resumed = fit(tmp_path / "resumed", max_epochs=2, ckpt_path=str(tmp_path / "first" / "epoch=0-env_steps=64.ckpt"))
    assert resumed.num_env_steps_sampled_lifetime == 128
    assert _names(tmp_path / "resumed") == ["epoch=1-env_steps=128.ckpt", "last.ckpt"]


def test_a_fit_resumes_from_a_checkpoint_with_lightnings_old_step_name(tmp_path: Path):
    make_hand_dataset("test/old-name-v0", [4, 5, 3, 6])

    def fit(root: Path, max_epochs: int, ckpt_path: str | None = None) -> OfflineDataModule:
        data = OfflineDataModule("test/old-name-v0", batch_size=5, updates_per_epoch=2, seed=0, evaluation_env=None)
        saves = ModelCheckpoint(dirpath=root, save_top_k=-1)
        trainer = offline_trainer(
            root, max_epochs=max_epochs, callbacks=[saves], enable_checkpointing=True, limit_val_batches=0
        )
        trainer.fit(bc_learner(), datamodule=data, ckpt_path=ckpt_path)
        return data

    fit(tmp_path / "first", max_epochs=1)
    old = tmp_path / "first" / "epoch=0-step=10.ckpt"  # as Lightning named it before
    (tmp_path / "first" / "epoch=0-dataset_rows=10.ckpt").rename(old)
    assert fit(tmp_path / "resumed", max_epochs=2, ckpt_path=str(old)).num_env_steps_sampled_lifetime == 20
    assert _names(tmp_path / "resumed") == ["epoch=1-dataset_rows=20.ckpt"]


def test_a_filename_of_the_users_own_and_a_source_that_names_no_count_keep_their_names():
    own, plain, renamed = ModelCheckpoint(filename="{epoch}-{step}"), ModelCheckpoint(), ModelCheckpoint()
    name_checkpoint_files([own, renamed, object()], ENV_STEPS)
    name_checkpoint_files([plain], None)
    assert (own.filename, own.auto_insert_metric_name) == ("{epoch}-{step}", True)
    assert plain.filename is None
    assert renamed.filename == checkpoint_filename(ENV_STEPS) == "epoch={epoch}-env_steps={step}"
    assert renamed.format_checkpoint_name({"epoch": torch.tensor(2), "step": torch.tensor(5120)}).endswith(
        "epoch=2-env_steps=5120.ckpt"
    )
    # A later fit on data that counts something else renames what this module named.
    name_checkpoint_files([renamed], DATASET_ROWS)
    assert renamed.filename == "epoch={epoch}-dataset_rows={step}"


def test_every_data_module_that_samples_envs_counts_env_steps_and_an_offline_one_dataset_rows():
    pytest.importorskip("pettingzoo")
    sampling = [
        OnPolicyDataModule("CartPole-v1"),
        OffPolicyDataModule("CartPole-v1"),
        MultiAgentDataModule("pettingzoo.classic.connect_four_v3", policy_mapping_fn="per_agent"),
    ]
    assert [data.data_offer().step_name for data in sampling] == [ENV_STEPS] * 3
    make_hand_dataset("test/any-v0", [3])
    assert OfflineDataModule("test/any-v0").data_offer().step_name == DATASET_ROWS


def test_a_step_name_must_be_a_name():
    with pytest.raises(ValueError, match="step_name"):
        DataOffer(frozenset({"episodes"}), step_name="env steps")


def test_the_progress_bar_shows_the_count_under_the_data_modules_name(tmp_path: Path):
    make_hand_dataset("test/bar-v0", [4, 5])
    data = OfflineDataModule("test/bar-v0", batch_size=3, updates_per_epoch=1, seed=0, evaluation_env=None)
    learner = bc_learner()
    trainer = offline_trainer(tmp_path, enable_progress_bar=True, callbacks=[EnvStepProgressBar()], limit_val_batches=0)
    trainer.fit(learner, datamodule=data)
    metrics = EnvStepProgressBar().get_metrics(trainer, learner)
    assert metrics["dataset_rows"] == 3 and "env_steps" not in metrics
