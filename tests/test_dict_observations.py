"""Dict (and Tuple) observations: stored in gymnasium's flatten layout from the env to the batch, and back for acting.

The layout (``core.observation_layout``) against ``gym.spaces.flatten`` row by row; the env
runner's episodes, final observations and the batches built from them; what is refused by name
(spaces that cannot be flattened, normalization, EnvPool); PPO and DQN
under ``Trainer.fit``; ``lightning-rl fit`` with an env factory path, then ``Policy`` on raw
dicts, ``evaluate``, ``record`` and ONNX export of a checkpoint.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import gymnasium as gym
import minari
import numpy as np
import onnxruntime
import pytest
import torch
import yaml
from _dict_obs_env import DICT_SPACE, EPISODE_STEPS, NUM_MODES, DictObsEnv, TupleObsEnv
from lightning.pytorch import Trainer

from lightning_rl import Columns, Policy, RLModuleSpec
from lightning_rl.algorithms.bc import BCLearner, BCModule
from lightning_rl.algorithms.dqn import DQNLearner
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.cli import LightningRLCLI, evaluate_command, record_command
from lightning_rl.core.mlp import flat_obs_dim
from lightning_rl.core.observation_layout import ObservationLayout, stored_observation_space
from lightning_rl.data import OfflineDataModule, OffPolicyDataModule, OnPolicyDataModule
from lightning_rl.env import EnvRunner
from lightning_rl.env import env_factory
from lightning_rl.env.env_errors import NonFiniteEnvError, SubEnvError
from lightning_rl.policy.export import export_policy

S = gym.spaces
FLAT_DIM = 8 * 8 * 3 + NUM_MODES + 3

# The stored dtype of each: uint8 when every part fits one (images, one-hots, MultiBinary), else float32.
LAYOUT_SPACES = {
    "image_vector_discrete": DICT_SPACE,
    "discrete_and_multidiscrete_with_starts": S.Dict(
        OrderedDict(
            z=S.MultiDiscrete([[2, 3], [4, 5]], start=[[1, 0], [0, -2]]),
            a=S.Discrete(4, start=-1),
            m=S.MultiBinary([2, 2]),
        )
    ),
    "nested_tuple_and_dict": S.Tuple(
        [S.Box(-1, 1, (2,), np.float32), S.Dict({"x": S.Discrete(2), "y": S.Tuple([S.MultiBinary(3)])})]
    ),
    "uint8_image_only": S.Dict({"pixels": S.Box(0, 255, (6, 5, 2), np.uint8)}),
}
STORED_DTYPES = {
    "image_vector_discrete": np.float32,  # gymnasium's flatten_space says float64
    "discrete_and_multidiscrete_with_starts": np.uint8,  # gymnasium's says int64
    "nested_tuple_and_dict": np.float32,
    "uint8_image_only": np.uint8,
}


def same_bounds_and_shape(stored: gym.Space, space: gym.Space) -> bool:
    """Whether ``stored`` has the shape and bounds of gymnasium's ``flatten_space(space)``."""
    flat = gym.spaces.flatten_space(space)
    return (
        stored.shape == flat.shape
        and np.array_equal(stored.low, flat.low.astype(stored.dtype))
        and np.array_equal(stored.high, flat.high.astype(stored.dtype))
    )


def vector_batch(space: gym.Space, rows: list[Any]) -> Any:
    """``rows`` batched as a gymnasium vector env batches them (``{key: [N, ...]}``)."""
    return gym.vector.utils.concatenate(space, rows, gym.vector.utils.create_empty_array(space, len(rows)))


def raw_observation(info: dict[str, Any]) -> dict[str, Any]:
    """The observation ``DictObsEnv`` returned with these infos."""
    return {key: info[f"raw_{key}"] for key in DICT_SPACE.spaces}


def quiet_trainer(**kwargs: Any) -> Trainer:
    options = dict(
        max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    return Trainer(**{**options, **kwargs})


# ---------------------------------------------------------------------------------------------
# The layout
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(LAYOUT_SPACES))
def test_a_batch_flattens_to_gymnasiums_flatten_of_each_row_and_back(name: str) -> None:
    space = LAYOUT_SPACES[name]
    space.seed(0)
    rows = [space.sample() for _ in range(7)]
    layout = ObservationLayout(space)
    flat = layout.flatten_batch(vector_batch(space, rows))
    expected = np.stack([gym.spaces.flatten(space, row) for row in rows])
    assert layout.stored_space == stored_observation_space(space)
    assert same_bounds_and_shape(layout.stored_space, space)
    assert flat.dtype == layout.stored_space.dtype == STORED_DTYPES[name]
    np.testing.assert_array_equal(flat, expected)
    np.testing.assert_array_equal(layout.flatten_one(rows[3]), expected[3])
    unflattened = layout.unflatten_batch(flat)
    np.testing.assert_array_equal(layout.flatten_batch(unflattened), expected)
    for index, row in enumerate(rows):
        one = gym.spaces.unflatten(space, expected[index])
        np.testing.assert_array_equal(gym.spaces.flatten(space, one), gym.spaces.flatten(space, row))


def test_the_layout_of_an_array_space_is_the_space_itself() -> None:
    box = S.Box(-1, 1, (2, 3), np.float32)
    layout = ObservationLayout(box)
    obs = np.zeros((4, 2, 3), np.float32)
    assert not layout.flattens and layout.stored_space is box and stored_observation_space(box) is box
    assert layout.flatten_batch(obs) is obs
    assert flat_obs_dim(DICT_SPACE) == FLAT_DIM == gym.spaces.flatdim(DICT_SPACE)


@pytest.mark.parametrize(
    "space, message",
    [
        (S.Dict({"name": S.Text(5), "x": S.Discrete(2)}), r"holds Text\(.*\) at observation\['name'\]"),
        (S.Tuple([S.Discrete(2), S.Sequence(S.Discrete(2))]), r"holds Sequence\(.*\) at observation\[1\]"),
        (S.Dict({}), "is empty at observation"),
        (S.Dict({"x": S.Dict({})}), r"is empty at observation\['x'\]"),
        (S.Text(4), "cannot be stored as one array per step"),
        (S.Dict({1: S.Discrete(2)}), "the key 1; Dict observation keys must be str"),
    ],
)
def test_spaces_that_cannot_be_stored_flat_are_refused_by_name(space: gym.Space, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ObservationLayout(space)


def test_a_discrete_value_outside_its_space_is_refused_naming_the_key() -> None:
    batch = vector_batch(DICT_SPACE, [DICT_SPACE.sample(), DICT_SPACE.sample()])
    batch["mode"][1] = NUM_MODES
    with pytest.raises(ValueError, match=r"observation\['mode'\] holds 3 \(row 1\), outside its space Discrete\(3\)"):
        ObservationLayout(DICT_SPACE).flatten_batch(batch)


def test_batch_shape_tells_one_observation_from_a_batch_and_names_what_fits_neither() -> None:
    layout = ObservationLayout(DICT_SPACE)
    one = DICT_SPACE.sample()
    assert layout.batch_shape(one) == ()
    assert layout.batch_shape(vector_batch(DICT_SPACE, [one] * 5)) == (5,)
    with pytest.raises(ValueError, match=r"observation must be a dict with the keys \['image', 'mode', 'vector'\]"):
        layout.batch_shape({"image": one["image"], "mode": 1})
    with pytest.raises(ValueError, match=r"observation\['image'\] has shape \(8, 8\), but its space"):
        layout.batch_shape({**one, "image": one["image"][..., 0]})
    with pytest.raises(ValueError, match="disagree on the batch size"):
        layout.batch_shape({**one, "mode": np.array([0, 1])})


# ---------------------------------------------------------------------------------------------
# The env runner
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env_class, vectorize_mode", [(DictObsEnv, "sync"), (DictObsEnv, "async"), (TupleObsEnv, "sync")]
)
def test_the_runner_stores_every_observation_as_gymnasium_flattens_it(env_class, vectorize_mode) -> None:
    with EnvRunner(env_class, num_envs=3, rollout_fragment_length=20, seed=0, vectorize_mode=vectorize_mode) as runner:
        space = runner.observation_space
        assert isinstance(space, (S.Dict, S.Tuple))  # what modules are built from
        assert same_bounds_and_shape(runner.stored_observation_space, space)
        module = RLModuleSpec(PPOModule, observation_space=space, action_space=runner.action_space).build()
        episodes = runner.sample(module)
    done = [episode for episode in episodes if episode.is_done]
    assert len(done) == 6 and all(len(episode) == EPISODE_STEPS for episode in done)
    for episode in episodes:
        assert episode.observations.shape == (len(episode) + 1, FLAT_DIM)
        assert episode.observations.dtype == np.float32  # not gymnasium's float64
        # Each step's infos carry the env's raw observation: the reset's, each step's, and the
        # final one's (from final_info) at the end of an episode that ended.
        for row, info in zip(episode.observations, episode.infos):
            raw = raw_observation(info)
            if isinstance(space, S.Tuple):
                raw = tuple(raw.values())
            np.testing.assert_array_equal(row, gym.spaces.flatten(space, raw))


def test_on_policy_and_replay_batches_hold_the_flat_layout() -> None:
    spec = RLModuleSpec(PPOModule, observation_space=DICT_SPACE, action_space=S.Discrete(NUM_MODES))
    learner = PPOLearner(module_spec=spec, minibatch_size=16)
    learner.build()
    with EnvRunner(DictObsEnv, num_envs=2, rollout_fragment_length=16, seed=0) as runner:
        episodes = runner.sample(learner.module["default_policy"])
    batch = learner.episodes_to_train_batch(episodes)["default_policy"]
    assert batch[Columns.OBS].shape == (32, FLAT_DIM)
    data = OffPolicyDataModule(DictObsEnv, num_envs=2, seed=0, train_freq=16, learning_starts=16)
    data.replay_buffer.add_episodes(episodes)
    sample = data.replay_buffer.sample(8)
    for column in (Columns.OBS, Columns.NEXT_OBS):
        assert sample[column].shape == (8, FLAT_DIM) and sample[column].dtype == np.float32


class TextObsEnv(DictObsEnv):
    def __init__(self) -> None:
        super().__init__()
        self.observation_space = S.Dict({"name": S.Text(4), "mode": S.Discrete(NUM_MODES)})


def test_the_runner_refuses_what_it_cannot_store_or_normalize_naming_the_space() -> None:
    with pytest.raises(ValueError, match=r"EnvRunner cannot store this env's observations: .* holds Text\(.*'name'\]"):
        EnvRunner(TextObsEnv)
    with pytest.raises(ValueError, match=r"normalize_observations needs a Box .* Dict\('image'.*normalize the parts"):
        EnvRunner(DictObsEnv, normalize_observations=True)
    with EnvRunner(DictObsEnv, normalize_rewards=True) as runner:  # rewards alone are fine
        assert runner.normalization.observations is None


def test_envpool_mode_refuses_dict_observations_naming_the_space(monkeypatch: pytest.MonkeyPatch) -> None:
    # EnvPool has no Dict-observation env among its ids: a gymnasium vector env stands in for its pool.
    monkeypatch.setattr(env_factory, "envpool_time_limit", lambda env, env_kwargs: None)
    monkeypatch.setattr(env_factory, "EnvPoolVectorEnv", lambda *args, **kwargs: gym.vector.SyncVectorEnv([DictObsEnv]))
    with pytest.raises(ValueError, match=r"vectorize_mode='envpool' supports .* the env has Dict\('image'"):
        env_factory.make_vector_env("CartPole-v1", {}, [], 1, "envpool")


class WrongImageAtStep2(DictObsEnv):
    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        if self._t == 2:
            obs = {**obs, "image": obs["image"][..., :2]}
        return obs, reward, terminated, truncated, info


class NanVectorAtStep3(DictObsEnv):
    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        if self._t == 3:
            obs = {**obs, "vector": np.array([0.0, np.nan, 0.0], np.float32)}
        return obs, reward, terminated, truncated, info


def test_env_faults_in_dict_observations_name_the_env_and_the_part() -> None:
    module = RLModuleSpec(PPOModule, observation_space=DICT_SPACE, action_space=S.Discrete(NUM_MODES)).build()
    with EnvRunner(WrongImageAtStep2, num_envs=2, rollout_fragment_length=8, seed=0) as runner:
        wrong_shape = r"env 0 raised ValueError: step\(\) returned an observation .*\['image'\] has shape \(8, 8, 2\)"
        with pytest.raises(SubEnvError, match=wrong_shape):
            runner.sample(module)
    with EnvRunner(NanVectorAtStep3, num_envs=2, rollout_fragment_length=8, seed=0) as runner:
        # The flat row: the image's 192 values, the mode's 3, then the vector's; its element 1 is the NaN.
        with pytest.raises(NonFiniteEnvError, match=r"env 0 returned a NaN observation \(element \(196,\)\) at env"):
            runner.sample(module)


def test_a_batch_of_unflattened_observations_is_refused_at_the_learners_boundary() -> None:
    learner = BCLearner(module_spec=RLModuleSpec(BCModule, observation_space=DICT_SPACE, action_space=S.Discrete(3)))
    learner.build()
    batch = {Columns.OBS: np.zeros((4, 8 * 8 * 3), np.float32), Columns.ACTIONS: np.zeros(4, np.int64)}
    flat_layout = r"column 'obs' has shape \(4, 192\), but the flat layout .* of the Dict\(.* \[batch, 198\]"
    with pytest.raises(ValueError, match=flat_layout):
        learner.update_from_batch(batch)


# ---------------------------------------------------------------------------------------------
# Training and acting
# ---------------------------------------------------------------------------------------------


def fit_ppo(max_env_steps: int) -> tuple[PPOLearner, OnPolicyDataModule, Trainer]:
    torch.manual_seed(0)
    learner = PPOLearner(model_config={"fcnet_hiddens": [32]}, lr=3e-3, num_epochs=4, minibatch_size=64)
    data = OnPolicyDataModule(
        DictObsEnv, num_envs=4, rollout_fragment_length=32, seed=0, max_env_steps=max_env_steps,
        rollouts_per_epoch=2, evaluation_num_episodes=4,
    )  # fmt: skip
    trainer = quiet_trainer()
    trainer.fit(learner, datamodule=data)
    return learner, data, trainer


def fit_dqn(max_env_steps: int) -> tuple[DQNLearner, Trainer]:
    torch.manual_seed(0)
    learner = DQNLearner(
        model_config={"fcnet_hiddens": [32]}, lr=1e-3, epsilon=[[0, 1.0], [400, 0.05]], gradient_steps=32,
        minibatch_size=32, target_network_update_freq=32,
    )  # fmt: skip
    data = OffPolicyDataModule(
        DictObsEnv, num_envs=2, seed=0, train_freq=64, learning_starts=128, max_env_steps=max_env_steps,
        rollouts_per_epoch=4, evaluation_num_episodes=4, replay_buffer_capacity=2000,
    )  # fmt: skip
    trainer = quiet_trainer()
    trainer.fit(learner, datamodule=data)
    return learner, trainer


def test_ppo_and_dqn_fit_a_dict_observation_env_built_from_its_dict_space() -> None:
    ppo, data, trainer = fit_ppo(max_env_steps=256)
    module = ppo.module["default_policy"]
    assert module.observation_space == DICT_SPACE and data.observation_space == DICT_SPACE
    assert data.num_env_steps_sampled_lifetime == 256
    assert np.isfinite(float(trainer.callback_metrics["default_policy/total_loss"]))
    dqn, trainer = fit_dqn(max_env_steps=256)
    assert dqn.module["default_policy"].observation_space == DICT_SPACE
    assert dqn.weights_seq_no > 0 and np.isfinite(float(trainer.callback_metrics["default_policy/qf_loss"]))


@pytest.mark.slow
def test_ppo_and_dqn_learn_to_read_the_dict_observation() -> None:
    # Reward 1 per step for the action that equals the observation's mode: 8 per episode
    # for a policy that reads it, about 2.7 for a random one. (PPO reaches 8, DQN about 6.)
    _, _, trainer = fit_ppo(max_env_steps=1024)
    assert float(trainer.callback_metrics["eval/episode_return_mean"]) >= 6.0
    _, trainer = fit_dqn(max_env_steps=768)
    assert float(trainer.callback_metrics["eval/episode_return_mean"]) >= 4.5


@pytest.fixture(scope="module")
def cli_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``lightning-rl fit`` of PPO on the Dict env named by its factory's import path: (config, last.ckpt)."""
    directory = tmp_path_factory.mktemp("dict_fit")
    config = {
        "seed_everything": 0,
        "trainer": {
            "max_epochs": -1, "enable_progress_bar": False, "enable_model_summary": False,
            "num_sanity_val_steps": 0, "limit_val_batches": 0, "default_root_dir": str(directory),
            "callbacks": [
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"save_last": True}}
            ],
        },
        "model": {
            "class_path": "lightning_rl.algorithms.ppo.PPOLearner",
            "init_args": {"model_config": {"fcnet_hiddens": [16]}, "minibatch_size": 32, "num_epochs": 2},
        },
        "data": {
            "class_path": "lightning_rl.data.OnPolicyDataModule",
            "init_args": {
                "env": "_dict_obs_env.make_dict_obs_env", "num_envs": 2, "rollout_fragment_length": 32,
                "seed": 0, "max_env_steps": 256, "rollouts_per_epoch": 2,
            },
        },
    }  # fmt: skip
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = LightningRLCLI(args=["fit", "--config", str(path)])
    assert cli.model.module["default_policy"].observation_space == DICT_SPACE
    return path, directory / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"


def test_a_checkpoints_policy_acts_on_raw_dict_observations_as_on_their_flat_rows(cli_checkpoint) -> None:
    policy = Policy.from_checkpoint(cli_checkpoint[1])
    assert policy.observation_space == DICT_SPACE
    DICT_SPACE.seed(1)
    raw = [DICT_SPACE.sample() for _ in range(16)]
    flat = np.stack([gym.spaces.flatten(DICT_SPACE, obs) for obs in raw])
    expected = policy.act(flat)  # the stored layout, as PolicyNet and an export take it
    assert expected.shape == (16,)
    np.testing.assert_array_equal(policy.act(vector_batch(DICT_SPACE, raw)), expected)
    assert [int(policy.act(obs)) for obs in raw] == expected.tolist()
    assert int(policy.act(flat[0])) == expected[0]
    with pytest.raises(ValueError, match=r"observation\['image'\] has shape \(8, 8\)"):
        policy.act({**raw[0], "image": raw[0]["image"][..., 0]})
    with pytest.raises(ValueError, match=r"must be a dict with the keys \['image', 'mode', 'vector'\], got keys"):
        policy.act({"image": raw[0]["image"]})
    with pytest.raises(ValueError, match=r"expected \(198,\) for one observation .* flat layout, or pass the Dict"):
        policy.act(np.zeros(5))


def test_evaluate_and_record_play_a_dict_observation_env(cli_checkpoint, tmp_path, monkeypatch) -> None:
    config, checkpoint = cli_checkpoint
    evaluate_command.main(
        ["--ckpt_path", str(checkpoint), "--config", str(config), "--num_episodes", "3", "--seed", "7",
         "--json", str(tmp_path / "stats.json")]
    )  # fmt: skip
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["num_episodes"] == 3 and stats["episode_len_mean"] == EPISODE_STEPS

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    record_command.main(
        ["--ckpt_path", str(checkpoint), "--config", str(config), "--num_episodes", "2", "--seed", "7",
         "--dataset_id", "dictobs/ppo-v0"]
    )  # fmt: skip
    dataset = minari.load_dataset("dictobs/ppo-v0")
    assert dataset.observation_space == DICT_SPACE
    first = next(dataset.iterate_episodes())
    # The dataset holds the env's own observations, as dicts: the first is the reset of seed 7.
    obs, _ = DictObsEnv().reset(seed=7)
    assert set(first.observations) == set(DICT_SPACE.spaces)
    for key, value in obs.items():
        np.testing.assert_array_equal(first.observations[key][0], value)
    assert first.observations["image"].shape == (EPISODE_STEPS + 1, 8, 8, 3)
    assert first.observations["image"].dtype == np.uint8
    with pytest.raises(ValueError, match=r"observation space Dict\(.*OfflineDataModule reads Box"):
        OfflineDataModule("dictobs/ppo-v0")


def test_onnx_export_of_a_dict_observation_policy_takes_the_flat_layout(cli_checkpoint, tmp_path) -> None:
    policy = Policy.from_checkpoint(cli_checkpoint[1])
    path = export_policy(policy, tmp_path / "policy.onnx", "onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (model_input,) = session.get_inputs()
    assert model_input.shape[1:] == [FLAT_DIM] and model_input.type == "tensor(float)"
    DICT_SPACE.seed(2)
    raw = [DICT_SPACE.sample() for _ in range(8)]
    flat = np.stack([gym.spaces.flatten(DICT_SPACE, obs) for obs in raw]).astype(np.float32)
    (actions,) = session.run(None, {model_input.name: flat})
    np.testing.assert_array_equal(actions, policy.act(vector_batch(DICT_SPACE, raw)))
