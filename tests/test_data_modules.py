"""The two environment data modules: whose arguments are whose, ``EpisodeDataModule`` as the
on-policy one by its former name, and checkpoints it wrote before the split resuming into either."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import make_trainer
from lightning.pytorch import Callback, Trainer
from test_off_policy import RecordItems, TinyQLearner, fit, off_policy_datamodule, tiny_spec

from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.data import EnvDataModule, EpisodeDataModule, OffPolicyDataModule, OnPolicyDataModule
from lightning_rl.data.env_datamodule import OFF_POLICY_ARGUMENTS, ON_POLICY_ARGUMENTS


def own_arguments(cls: type) -> tuple[str, ...]:
    parameters = inspect.signature(cls.__init__).parameters.values()
    return tuple(parameter.name for parameter in parameters if parameter.kind is parameter.KEYWORD_ONLY)


def test_the_argument_tables_list_each_classs_own_arguments_and_none_of_the_shared_ones():
    assert own_arguments(OnPolicyDataModule) == ON_POLICY_ARGUMENTS
    assert own_arguments(OffPolicyDataModule) == OFF_POLICY_ARGUMENTS
    shared = set(inspect.signature(EnvDataModule.__init__).parameters)
    assert not shared & {*ON_POLICY_ARGUMENTS, *OFF_POLICY_ARGUMENTS}


@pytest.mark.parametrize("cls", [OnPolicyDataModule, EpisodeDataModule])
@pytest.mark.parametrize("name", OFF_POLICY_ARGUMENTS)
def test_an_off_policy_argument_given_to_the_on_policy_module_names_the_off_policy_one(cls: type, name: str):
    message = f"^{name} is an OffPolicyDataModule argument: use lightning_rl.data.OffPolicyDataModule$"
    with pytest.raises(ValueError, match=message):
        cls("CartPole-v1", **{name: 1})


def test_the_on_policy_argument_given_to_the_off_policy_module_names_the_on_policy_one():
    message = "^rollout_fragment_length is an OnPolicyDataModule argument: use lightning_rl.data.OnPolicyDataModule$"
    with pytest.raises(ValueError, match=message):
        OffPolicyDataModule("CartPole-v1", rollout_fragment_length=32)


def test_several_misplaced_arguments_are_named_together():
    with pytest.raises(ValueError, match="^replay_buffer_capacity, train_freq are OffPolicyDataModule arguments"):
        EpisodeDataModule("CartPole-v1", replay_buffer_capacity=1000, train_freq=4)


def test_an_argument_of_neither_module_is_pythons_usual_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_argument'"):
        OffPolicyDataModule("CartPole-v1", no_such_argument=1)


def test_episode_datamodule_is_the_on_policy_module_and_keeps_its_checkpoint_entry_name(tmp_path: Path):
    data = EpisodeDataModule("CartPole-v1", num_envs=2, rollout_fragment_length=16, rollouts_per_epoch=1, seed=0)
    assert isinstance(data, OnPolicyDataModule)
    assert data.data_offer().sources == {"episodes"} and OffPolicyDataModule().data_offer().sources == {"replay"}
    assert data.train_batch_size == 32
    trainer = make_trainer(tmp_path, limit_val_batches=0)
    trainer.fit(PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=32), datamodule=data)
    trainer.save_checkpoint(tmp_path / "episode.ckpt")
    checkpoint = torch.load(tmp_path / "episode.ckpt", weights_only=True)
    assert checkpoint["EpisodeDataModule"]["num_env_steps_sampled_lifetime"] == 32


def written_before_the_split(path: Path, entry: str) -> Path:
    """The checkpoint at ``path`` as ``EpisodeDataModule`` wrote it: the same state under its name."""
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["EpisodeDataModule"] = checkpoint.pop(entry)
    old = path.with_name(f"old_{path.name}")
    torch.save(checkpoint, old)
    return old


def resume_off_policy(tmp_path: Path, ckpt_path: Path) -> RecordItems:
    record = RecordItems()
    learner = TinyQLearner(tiny_spec(None, None), minibatch_size=8)
    data = off_policy_datamodule(checkpoint_replay_buffer=True)
    fit(learner, data, tmp_path, callbacks=[record], max_epochs=2, ckpt_path=str(ckpt_path))
    return record


def test_an_off_policy_checkpoint_of_episode_datamodule_resumes_into_off_policy_data_module(tmp_path: Path):
    learner = TinyQLearner(tiny_spec(None, None), minibatch_size=8)
    trainer = fit(learner, off_policy_datamodule(checkpoint_replay_buffer=True), tmp_path)
    new = tmp_path / "off_policy.ckpt"
    trainer.save_checkpoint(new)  # 10 items of 4 env steps
    old = written_before_the_split(new, "OffPolicyDataModule")

    record = resume_off_policy(tmp_path, old)
    # The counters continue from 40 and the 40 saved env steps are back in the buffer, so
    # learning goes on from the first item (a fresh start would replay only from the fifth).
    assert record.items[0].timesteps["num_env_steps_sampled_lifetime"] == 44
    assert record.buffer_sizes[0] == 44
    assert all(item.data.replay is not None for item in record.items)
    # Exactly as from the checkpoint OffPolicyDataModule writes itself.
    from_new = resume_off_policy(tmp_path, new)
    assert [item.timesteps for item in record.items] == [item.timesteps for item in from_new.items]
    assert record.buffer_sizes == from_new.buffer_sizes


def test_an_on_policy_checkpoint_of_episode_datamodule_resumes_into_on_policy_data_module(tmp_path: Path):
    class RecordTimesteps(Callback):
        def __init__(self) -> None:
            self.timesteps: list[float] = []

        def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.timesteps.append(batch.timesteps["num_env_steps_sampled_lifetime"])

    def parts(budget: int) -> tuple[PPOLearner, OnPolicyDataModule]:
        learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=32)
        data = OnPolicyDataModule("CartPole-v1", num_envs=2, rollout_fragment_length=16, seed=0, max_env_steps=budget)
        return learner, data

    trainer = make_trainer(tmp_path, limit_val_batches=0, max_epochs=-1)
    trainer.fit(*parts(64))
    new = tmp_path / "on_policy.ckpt"
    trainer.save_checkpoint(new)
    old = written_before_the_split(new, "OnPolicyDataModule")

    learner, data = parts(128)
    record = RecordTimesteps()
    make_trainer(tmp_path, limit_val_batches=0, max_epochs=-1, callbacks=[record]).fit(
        learner, datamodule=data, ckpt_path=str(old)
    )
    assert record.timesteps == [96, 128]  # the counters continue from 64: two more rollouts of 32
