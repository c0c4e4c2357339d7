"""The data contract (``lightning_rl.core.data_contract``): what data offers, what a Learner requires, one check.

Each data module family offers what its train items hold; each Learner family requires what it
trains from; a mismatch fails at setup naming both classes; an offline dataset takes ``gamma``
and ``n_step`` from the Learner's requirements, never from its hyperparameters; and a plain
``LightningDataModule`` offers nothing and is not checked.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from _helpers import OBS_SPACE, bc_spec, loader_of, make_trainer, random_train_items
from lightning.pytorch import LightningDataModule

from lightning_rl.algorithms.bc import BCLearner, BCModule
from lightning_rl.algorithms.dqn import DQNLearner
from lightning_rl.algorithms.marwil import MARWILLearner, MARWILModule
from lightning_rl.algorithms.ppo import PPOLearner
from lightning_rl.algorithms.sac import SACLearner
from lightning_rl.core.columns import Columns
from lightning_rl.core.data_contract import (
    TRAINING_DATA_SOURCES,
    DataOffer,
    DataRequirements,
    DataSource,
    check_data_fits,
    data_offer_of,
)
from lightning_rl.core.rl_module_specs import RLModuleSpec
from lightning_rl.data import (
    MultiAgentDataModule,
    OffPolicyDataModule,
    OnPolicyDataModule,
)

CARTPOLE_SPACES = (gym.make("CartPole-v1").observation_space, gym.make("CartPole-v1").action_space)


# ----------------------------------------------------------------------------------------
# The declarations
# ----------------------------------------------------------------------------------------


def test_the_sources_are_the_fields_of_training_data():
    assert set(TRAINING_DATA_SOURCES) == {"batch", "batches", "episodes", "data_iterators", "replay"}
    with pytest.raises(ValueError, match=r"DataOffer.sources names \['rollouts'\], which are not TrainingData sources"):
        DataOffer(frozenset({"rollouts"}))
    with pytest.raises(ValueError, match="DataRequirements.sources must be a frozenset"):
        DataRequirements("L", {"batch"})  # type: ignore[arg-type]


def test_an_offer_is_of_spaces_for_any_module_or_of_spaces_per_module_not_both():
    pair = CARTPOLE_SPACES
    with pytest.raises(ValueError, match="not both"):
        DataOffer(frozenset(), spaces=lambda: pair, module_spaces=lambda: {"a": pair})
    with pytest.raises(ValueError, match="train_batch_size must be an int >= 1 or None, got 0"):
        DataOffer(frozenset(), train_batch_size=0)
    assert DataOffer(frozenset(), spaces=lambda: pair).single_spaces() == pair
    assert DataOffer(frozenset(), module_spaces=lambda: {"a": pair}).single_spaces() == (None, None)


def test_a_source_the_learner_does_not_train_from_is_refused_in_one_line_naming_both_sides():
    requirements = DataRequirements("MyLearner", frozenset({"episodes"}), suggestion="use MyData")
    with pytest.raises(ValueError) as error:
        check_data_fits(requirements, DataOffer(frozenset({"replay"})), "MyReplayData")
    message = str(error.value)
    assert "\n" not in message
    assert message == (
        "MyLearner trains from ['episodes'], but the data module MyReplayData yields train items of ['replay']: use MyData"
    )
    check_data_fits(requirements, DataOffer(frozenset({"episodes"})), "MyData")
    check_data_fits(requirements, None, "NotASource")  # nothing offered: nothing checked


def test_a_minibatch_larger_than_the_offered_train_batch_is_refused_naming_both_sides_and_sizes():
    requirements = DataRequirements("MyLearner", frozenset({"episodes"}), minibatch_size=65)
    too_large = r"^MyLearner: minibatch_size=65 is larger than the data module's train batch of 64 .*MyData"
    with pytest.raises(ValueError, match=too_large):
        check_data_fits(requirements, DataOffer(frozenset({"episodes"}), train_batch_size=64), "MyData")
    check_data_fits(requirements, DataOffer(frozenset({"episodes"}), train_batch_size=65), "MyData")
    check_data_fits(requirements, DataOffer(frozenset({"episodes"})), "MyData")  # no train batch offered
    check_data_fits(dataclasses.replace(requirements, minibatch_size=None), DataOffer(frozenset({"episodes"}), 1), "D")


# ----------------------------------------------------------------------------------------
# What each data module family offers
# ----------------------------------------------------------------------------------------


def test_every_data_module_family_is_a_data_source_and_a_plain_data_module_is_not():
    assert isinstance(OnPolicyDataModule(), DataSource)
    assert isinstance(OffPolicyDataModule(), DataSource)
    assert not isinstance(LightningDataModule(), DataSource)
    assert data_offer_of(LightningDataModule()) is None and data_offer_of(None) is None


class _CountingCartPole:
    """An env factory that counts the envs it made."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self) -> gym.Env:
        self.made += 1
        return gym.make("CartPole-v1")


def test_the_on_policy_offer_is_episodes_of_one_rollout_and_the_envs_spaces_read_lazily():
    make_env = _CountingCartPole()
    data = OnPolicyDataModule(make_env, num_envs=2, rollout_fragment_length=16)
    offer = data.data_offer()
    assert offer.sources == {"episodes"} and offer.train_batch_size == 32 and offer.module_spaces is None
    assert make_env.made == 0  # the offer builds no env; its spaces do, when read
    assert offer.single_spaces() == CARTPOLE_SPACES
    assert make_env.made > 0
    data.teardown("fit")


def test_the_off_policy_offer_is_the_replay_buffer_without_a_train_batch():
    data = OffPolicyDataModule("CartPole-v1", num_envs=2, train_freq=4)
    offer = data.data_offer()
    assert offer.sources == {"replay"} and offer.train_batch_size is None and offer.module_spaces is None
    assert offer.single_spaces() == CARTPOLE_SPACES
    data.teardown("fit")


def test_the_multi_agent_offer_is_episodes_and_a_space_pair_per_mapped_module():
    pytest.importorskip("pettingzoo")
    data = MultiAgentDataModule("pettingzoo.classic.connect_four_v3", policy_mapping_fn="per_agent")
    offer = data.data_offer()
    assert offer.sources == {"episodes"} and offer.train_batch_size is None and offer.spaces is None
    spaces = offer.module_spaces()
    assert sorted(spaces) == ["player_0", "player_1"]
    assert spaces["player_0"] == data.module_spaces["player_0"]
    data.teardown("fit")


def test_the_offline_offer_is_iterators_of_ready_minibatches_and_the_datasets_spaces(tmp_path, monkeypatch):
    data = _offline_data(tmp_path, monkeypatch)
    offer = data.data_offer()
    assert offer.sources == {"data_iterators"} and offer.train_batch_size is None
    assert offer.single_spaces() == (_DATASET_OBS_SPACE, _DATASET_ACT_SPACE)


# ----------------------------------------------------------------------------------------
# What each Learner family requires, and the check at setup
# ----------------------------------------------------------------------------------------


def test_on_policy_learners_train_from_everything_but_replay_and_off_policy_ones_from_replay_not_episodes():
    ppo = PPOLearner(model_config={"fcnet_hiddens": [4]}, gamma=0.9, minibatch_size=16).data_requirements()
    assert ppo.learner == "PPOLearner" and ppo.sources == set(TRAINING_DATA_SOURCES) - {"replay"}
    assert ppo.gamma == 0.9 and ppo.n_step is None and ppo.minibatch_size == 16
    assert Columns.ADVANTAGES in ppo.columns["default_policy"]
    dqn = DQNLearner(gamma=0.5, n_step=3).data_requirements()
    assert dqn.sources == {"replay", "batch", "batches", "data_iterators"}
    assert (dqn.gamma, dqn.n_step) == (0.5, 3) and Columns.NEXT_OBS in dqn.columns["default_policy"]
    assert BCLearner(bc_spec()).data_requirements().gamma is None


def test_an_off_policy_learner_fit_on_rollouts_fails_at_setup_naming_both_classes(tmp_path):
    learner = DQNLearner(model_config={"fcnet_hiddens": [4]})
    make_env = _CountingCartPole()
    data = OnPolicyDataModule(make_env, num_envs=1, rollout_fragment_length=8)
    refused = r"^DQNLearner trains from .*OnPolicyDataModule yields train items of \['episodes'\]: use lightning_rl.data.OffPolicyDataModule"
    with pytest.raises(ValueError, match=refused):
        make_trainer(tmp_path).fit(learner, datamodule=data)
    assert learner.module is None  # refused before anything was built
    assert make_env.made == 0  # nor any env


def test_an_on_policy_learner_fit_on_replay_fails_at_setup_naming_both_classes(tmp_path):
    learner = PPOLearner(model_config={"fcnet_hiddens": [4]}, minibatch_size=2)
    data = OffPolicyDataModule("CartPole-v1")
    refused = r"^PPOLearner trains from .*OffPolicyDataModule yields train items of \['replay'\]: .*OnPolicyDataModule"
    with pytest.raises(ValueError, match=refused):
        make_trainer(tmp_path).fit(learner, datamodule=data)


class _RecordingSource(LightningDataModule):
    """A data source of the user's own: batches of random rows; records the requirements it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[DataRequirements] = []

    def train_dataloader(self) -> Any:
        return loader_of(random_train_items(2, rows=16))

    def data_offer(self) -> DataOffer:
        return DataOffer(frozenset({"batch"}), train_batch_size=16, spaces=lambda: (OBS_SPACE, gym.spaces.Discrete(2)))

    def accept_requirements(self, requirements: DataRequirements) -> None:
        self.handed.append(requirements)


def test_setup_takes_the_offered_spaces_and_hands_the_built_learners_requirements_to_the_source(tmp_path):
    data = _RecordingSource()
    learner = BCLearner(model_config={"fcnet_hiddens": [4]}, minibatch_size=8, lr=0.01)
    make_trainer(tmp_path, max_epochs=1).fit(learner, datamodule=data)
    assert learner.module["default_policy"].observation_space == OBS_SPACE
    assert learner.weights_seq_no > 0
    [handed] = data.handed
    assert handed == learner.data_requirements() and handed.columns == {"default_policy": (Columns.OBS, Columns.ACTIONS)}
    with pytest.raises(ValueError, match="BCLearner: minibatch_size=17 is larger than the data module's train batch of 16"):
        make_trainer(tmp_path).fit(BCLearner(model_config={"fcnet_hiddens": [4]}, minibatch_size=17), datamodule=_RecordingSource())


class _PlainData(LightningDataModule):
    """A user's plain data module: batch dicts, and attributes a Learner once read by name (now ignored)."""

    observation_space = gym.spaces.Box(-1, 1, (7,), np.float32)
    action_space = gym.spaces.Discrete(5)
    train_batch_size = 1
    is_off_policy = False

    def train_dataloader(self) -> Any:
        return loader_of(random_train_items(2, rows=16))


def test_a_plain_data_module_offers_nothing_so_spaces_come_from_the_spec_and_nothing_is_checked(tmp_path):
    learner = BCLearner(bc_spec(), minibatch_size=8)  # larger than its train_batch_size, which is not read
    make_trainer(tmp_path).fit(learner, datamodule=_PlainData())
    assert learner.module["default_policy"].observation_space == OBS_SPACE  # the spec's, not the attribute's
    assert learner.weights_seq_no > 0
    DQNLearner().check_fits_data(_PlainData())  # no is_off_policy flag is read
    with pytest.raises(ValueError, match="have no observation/action space, and the Trainer has no data module that provides them"):
        make_trainer(tmp_path).fit(BCLearner(model_config={"fcnet_hiddens": [4]}), datamodule=_PlainData())


# ----------------------------------------------------------------------------------------
# Offline: gamma and n_step come from the Learner's requirements
# ----------------------------------------------------------------------------------------

_DATASET_OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
_DATASET_ACT_SPACE = gym.spaces.Discrete(3)


def _offline_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An ``OfflineDataModule`` on two hand-made episodes of 3 and 4 steps (rewards 1 each step)."""
    minari = pytest.importorskip("minari")
    from minari.data_collector import EpisodeBuffer

    from lightning_rl.data import OfflineDataModule

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    episodes = []
    for index, steps in enumerate([3, 4]):
        episodes.append(
            EpisodeBuffer(
                observations=np.stack([np.array([index, t], dtype=np.float32) for t in range(steps + 1)]),
                actions=np.arange(steps, dtype=np.int64) % 3,
                rewards=[1.0] * steps,
                terminations=[False] * (steps - 1) + [True],
                truncations=[False] * steps,
            )
        )
    minari.create_dataset_from_buffers(
        "test/contract-v0", episodes, observation_space=_DATASET_OBS_SPACE, action_space=_DATASET_ACT_SPACE
    )
    return OfflineDataModule("test/contract-v0", batch_size=7, updates_per_epoch=1, shuffle=False, evaluation_env=None)


class _RequiresOtherDiscounting(MARWILLearner):
    """A MARWIL Learner whose requirements say gamma 0.5 and n_step 1, whatever its hyperparameters say."""

    def data_requirements(self) -> DataRequirements:
        return dataclasses.replace(super().data_requirements(), gamma=0.5, n_step=1)


def _marwil(learner_class: type = MARWILLearner, **kwargs: Any) -> Any:
    spec = RLModuleSpec(MARWILModule, model_config={"fcnet_hiddens": [4]})
    return learner_class(spec, beta=1.0, **kwargs)


def test_offline_data_discounts_with_the_gamma_of_the_learners_requirements_not_its_hyperparameters(
    tmp_path, monkeypatch
):
    data = _offline_data(tmp_path, monkeypatch)
    learner = _marwil(_RequiresOtherDiscounting, gamma=0.99)
    make_trainer(tmp_path, limit_val_batches=0).fit(learner, datamodule=data)
    assert learner.hparams.gamma == 0.99
    assert data._gamma == 0.5  # the requirements' discount, which the stream's value targets use
    rows = data.stream.rows(0, 7)
    # Episode 0 (3 steps, rewards 1): return-to-go with gamma 0.5 is 1.75, 1.5, 1.
    episode_0 = rows[Columns.OBS][:, 0] == 0
    assert np.allclose(np.asarray(rows[Columns.VALUE_TARGETS])[np.asarray(episode_0)], [1.75, 1.5, 1.0])


class _RequiresNStep(BCLearner):
    """A BC Learner whose requirements ask for 3-step returns (it has no n_step hyperparameter)."""

    def data_requirements(self) -> DataRequirements:
        return dataclasses.replace(super().data_requirements(), n_step=3)


def test_offline_data_refuses_the_n_step_of_the_learners_requirements(tmp_path, monkeypatch):
    data = _offline_data(tmp_path, monkeypatch)
    learner = _RequiresNStep(RLModuleSpec(BCModule, model_config={"fcnet_hiddens": [4]}))
    assert "n_step" not in learner.hparams
    with pytest.raises(ValueError, match=r"^_RequiresNStep has n_step=3, .* one-step transitions: set n_step=1"):
        make_trainer(tmp_path, limit_val_batches=0).fit(learner, datamodule=data)


def test_an_off_policy_learner_trains_offline_from_the_dataset_it_accepts(tmp_path, monkeypatch):
    data = _offline_data(tmp_path, monkeypatch)
    requirements = SACLearner(model_config={"fcnet_hiddens": [4]}).data_requirements()
    check_data_fits(requirements, data.data_offer(), "OfflineDataModule")  # data_iterators: accepted
