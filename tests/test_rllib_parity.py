"""Issue 32: RLlib users' Learner code, written as RLlib writes it, runs here or fails loudly at construction.

Each test is an RLlib example or test ported with no more translation than the "Coming from
RLlib" page names (docs/coming_from_rllib.md).
"""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import assert_same_tensors, bc_spec, random_batch
from torch import nn

from lightning_rl import Learner, MultiRLModule, MultiRLModuleSpec, RLModule, RLModuleSpec
from lightning_rl.core.columns import Columns

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACT_SPACE = gym.spaces.Discrete(2)
SHARED_ENCODER_ID = "shared_encoder"
EMBEDDINGS = "encoder_embeddings"


# ---------------------------------------------------------------------------------------
# (5) A MultiRLModule subclass with a shared encoder (RLlib's multi_agent/shared_encoder example)
# ---------------------------------------------------------------------------------------


class SharedEncoder(RLModule):
    def setup(self):
        self.net = nn.Sequential(nn.Linear(self.observation_space.shape[0], 8), nn.ReLU())

    def _forward(self, batch, **kwargs):
        return {EMBEDDINGS: self.net(batch[Columns.OBS])}


class PolicyHead(RLModule):
    def setup(self):
        self.pi = nn.Linear(8, self.action_space.n)

    def _forward(self, batch, **kwargs):
        return {Columns.ACTION_DIST_INPUTS: self.pi(batch[EMBEDDINGS])}


class SharedEncoderMultiRLModule(MultiRLModule):
    def setup(self):
        super().setup()
        # As in RLlib: the sub-modules exist when setup() runs.
        assert SHARED_ENCODER_ID in self._rl_modules and len(self._rl_modules) > 1
        self.encoder = self._rl_modules[SHARED_ENCODER_ID]

    def forward_train(self, batch, **kwargs):
        outputs = {}
        for module_id, module_batch in batch.items():
            if module_id == SHARED_ENCODER_ID:
                continue
            embeddings = self.encoder.forward_train(module_batch)[EMBEDDINGS]
            outputs[module_id] = self._rl_modules[module_id].forward_train({EMBEDDINGS: embeddings})
        return outputs


class SharedEncoderLearner(Learner):
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        logits = fwd_out[Columns.ACTION_DIST_INPUTS]
        return nn.functional.cross_entropy(logits, batch[Columns.ACTIONS])


def _shared_encoder_spec() -> MultiRLModuleSpec:
    head = RLModuleSpec(module_class=PolicyHead, observation_space=OBS_SPACE, action_space=ACT_SPACE)
    return MultiRLModuleSpec(
        multi_rl_module_class=SharedEncoderMultiRLModule,
        rl_module_specs={
            SHARED_ENCODER_ID: RLModuleSpec(
                module_class=SharedEncoder, observation_space=OBS_SPACE, action_space=ACT_SPACE
            ),
            "p0": head,
            "p1": head,
        },
    )


def _two_agent_batch(seed: int) -> dict:
    return {"p0": random_batch(seed=seed), "p1": random_batch(seed=seed + 1)}


def test_a_multi_rl_module_subclass_sets_up_after_its_sub_modules_exist():
    module = _shared_encoder_spec().build()
    assert type(module) is SharedEncoderMultiRLModule
    assert module.encoder is module[SHARED_ENCODER_ID]


def test_multi_rl_module_takes_rllibs_rl_module_specs_argument():
    specs = _shared_encoder_spec().rl_module_specs
    module = SharedEncoderMultiRLModule(rl_module_specs=specs)
    assert sorted(module.keys()) == sorted(specs)


def test_a_custom_multi_rl_module_class_survives_a_learner_checkpoint(tmp_path):
    learner = SharedEncoderLearner(module_spec=_shared_encoder_spec(), lr=0.01)
    learner.build()
    learner.update_from_batch(_two_agent_batch(0))
    path = learner.save_to_path(str(tmp_path / "learner"))

    restored = SharedEncoderLearner.from_checkpoint(path)
    assert type(restored.module) is SharedEncoderMultiRLModule
    assert restored.module_spec.multi_rl_module_class is SharedEncoderMultiRLModule
    assert_same_tensors(restored.get_module_state(), learner.get_module_state())
    # Both continue identically.
    learner.update_from_batch(_two_agent_batch(2))
    restored.update_from_batch(_two_agent_batch(2))
    assert_same_tensors(restored.get_module_state(), learner.get_module_state())


def test_a_learner_over_a_built_subclass_records_the_subclass(tmp_path):
    module = _shared_encoder_spec().build()
    learner = SharedEncoderLearner(module=module)
    learner.build()
    assert learner.module_spec.multi_rl_module_class is SharedEncoderMultiRLModule
    restored = SharedEncoderLearner.from_checkpoint(learner.save_to_path(str(tmp_path / "l")))
    assert type(restored.module) is SharedEncoderMultiRLModule


def test_the_spec_stores_the_container_class_as_a_path_and_never_imports_it():
    data = _shared_encoder_spec().to_dict()
    assert data["multi_rl_module_class"] == f"{__name__}.SharedEncoderMultiRLModule"
    assert MultiRLModuleSpec.from_dict(data).multi_rl_module_class is SharedEncoderMultiRLModule
    data["multi_rl_module_class"] = "os.system"
    with pytest.raises(ValueError, match="not a loaded subclass of MultiRLModule"):
        MultiRLModuleSpec.from_dict(data)


def test_rllibs_positional_class_argument_is_refused_naming_the_keyword():
    with pytest.raises(ValueError, match="multi_rl_module_class=SharedEncoderMultiRLModule"):
        MultiRLModuleSpec(SharedEncoderMultiRLModule)


# ---------------------------------------------------------------------------------------
# (6) Multi-module off-policy: DQN plus a curiosity model (RLlib's curiosity examples)
# ---------------------------------------------------------------------------------------


class ForwardModel(RLModule):
    """Predicts the next observation from the observation: a stand-in for a curiosity model."""

    def setup(self):
        self.net = nn.Linear(self.observation_space.shape[0], self.observation_space.shape[0])

    def _forward(self, batch, **kwargs):
        return {"predicted_next_obs": self.net(batch[Columns.OBS])}


def _dqn_with_curiosity_learner(obs_space=OBS_SPACE, **kwargs):
    from lightning_rl.algorithms.dqn import DQNLearner, DQNModule

    class DQNWithCuriosityLearner(DQNLearner):
        def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
            if module_id == "curiosity":
                return nn.functional.mse_loss(fwd_out["predicted_next_obs"], batch[Columns.NEXT_OBS])
            return super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)

    spec = RLModuleSpec(module_class=DQNModule, observation_space=obs_space, action_space=ACT_SPACE)
    learner = DQNWithCuriosityLearner(module_spec=spec, minibatch_size=16, **kwargs)
    learner.build()
    learner.add_module(
        module_id="curiosity",
        module_spec=RLModuleSpec(module_class=ForwardModel, observation_space=obs_space, action_space=ACT_SPACE),
    )
    return learner


def _transitions_replay():
    from lightning_rl.algorithms.dqn import DQNModule
    from lightning_rl.data.uniform_replay import ReplayBuffer
    from lightning_rl.env import EnvRunner

    runner = EnvRunner("CartPole-v1", num_envs=2, rollout_fragment_length=50, seed=0)
    buffer = ReplayBuffer(1000, seed=0)
    module = RLModuleSpec(
        module_class=DQNModule,
        observation_space=runner.observation_space,
        action_space=runner.action_space,
    ).build()
    buffer.add_episodes(runner.sample(module))
    return buffer, runner


def test_add_module_of_a_module_without_the_learners_apis_gets_an_optimizer():
    learner = _dqn_with_curiosity_learner()
    assert learner.get_optimizer("curiosity") is not None


def test_update_from_replay_trains_every_module_on_the_sampled_transitions():
    from lightning_rl.algorithms.dqn import DQNLearner, DQNModule

    buffer, runner = _transitions_replay()
    learner = _dqn_with_curiosity_learner(runner.observation_space)
    assert isinstance(learner, DQNLearner) and isinstance(learner.module["default_policy"], DQNModule)
    before = {mid: {k: v.clone() for k, v in w.items()} for mid, w in learner.get_module_state().items()}
    results = learner.update_from_replay(buffer)
    assert "curiosity" in results and "default_policy" in results
    after = learner.get_module_state()
    for module_id in ("curiosity", "default_policy"):
        assert any(not torch.equal(before[module_id][k], after[module_id][k]) for k in after[module_id]), module_id


def test_update_from_replay_refuses_modules_whose_sampling_settings_differ():
    buffer, runner = _transitions_replay()
    learner = _dqn_with_curiosity_learner(runner.observation_space)
    learner.config_overrides_per_module["curiosity"] = {"minibatch_size": 8}
    with pytest.raises(ValueError, match="minibatch_size.*must agree"):
        learner.update_from_replay(buffer)


# ---------------------------------------------------------------------------------------
# (7) LearnerGroup.set_state with the numpy weights of get_weights()
# ---------------------------------------------------------------------------------------


def test_learner_group_set_state_takes_the_numpy_weights_of_get_weights():
    from lightning_rl import LearnerGroup
    from lightning_rl.algorithms.bc import BCLearner

    source = BCLearner(module_spec=bc_spec(), lr=0.05)
    source.build()
    source.update_from_batch(random_batch(seed=1))
    target = BCLearner(module_spec=bc_spec())
    target.build()
    with LearnerGroup(source) as source_group, LearnerGroup(target) as group:
        weights = source_group.get_weights()
        assert isinstance(next(iter(weights["default_policy"].values())), np.ndarray)
        group.set_state({"rl_module": weights})
        assert_same_tensors(target.get_module_state(), source.get_module_state())


# ---------------------------------------------------------------------------------------
# (3) Connector order: a user's pieces run before GAE, as in RLlib
# ---------------------------------------------------------------------------------------


def _episodes():
    from lightning_rl.env.episode import SingleAgentEpisode

    def episode(rewards, terminated, first_obs):
        steps = len(rewards)
        obs = np.tile((first_obs + np.arange(steps + 1, dtype=np.float32))[:, None] / 10, (1, 4))
        return SingleAgentEpisode(
            observations=obs,
            actions=np.zeros(steps, dtype=np.int64),
            rewards=np.asarray(rewards, dtype=np.float32),
            terminated=terminated,
            extra_model_outputs={Columns.ACTION_LOGP: np.full(steps, -0.7, dtype=np.float32)},
        )

    return [episode([1.0, 2.0, 3.0], True, 0.0), episode([0.5, 0.5], False, 5.0)]


def _ppo_spec():
    from lightning_rl.algorithms.ppo import PPOModule

    return RLModuleSpec(
        module_class=PPOModule, observation_space=OBS_SPACE, action_space=ACT_SPACE, model_config={"fcnet_hiddens": [8]}
    )


def scale_rewards(rl_module, batch, episodes, shared_data, metrics):
    """A reward-shaping piece."""
    for module_batch in batch.values():
        module_batch[Columns.REWARDS] = module_batch[Columns.REWARDS] * 10.0
    return batch


def test_a_reward_shaping_piece_changes_ppos_value_targets():
    from lightning_rl.algorithms.ppo import PPOLearner

    torch.manual_seed(0)
    plain = PPOLearner(_ppo_spec())
    plain.build()
    shaped = PPOLearner(_ppo_spec(), learner_connector_pieces=[scale_rewards])
    shaped.build()
    shaped.set_module_state(plain.get_module_state())
    plain_batch = plain.episodes_to_train_batch(_episodes())["default_policy"]
    shaped_batch = shaped.episodes_to_train_batch(_episodes())["default_policy"]
    values = plain_batch[Columns.VF_PREDS]
    # value_targets = raw advantages + values; the shaped rewards are 10x.
    assert not torch.allclose(shaped_batch[Columns.VALUE_TARGETS], plain_batch[Columns.VALUE_TARGETS])
    assert shaped_batch[Columns.VALUE_TARGETS][0] - values[0] > 5 * (plain_batch[Columns.VALUE_TARGETS][0] - values[0])


def test_rllibs_compute_returns_to_go_and_next_observation_pieces_add_their_columns():
    from lightning_rl.algorithms.ppo import PPOLearner
    from lightning_rl.connectors import AddNextObservationsFromEpisodesToTrainBatch, ComputeReturnsToGo

    pieces = [ComputeReturnsToGo(gamma=0.5), AddNextObservationsFromEpisodesToTrainBatch()]
    learner = PPOLearner(_ppo_spec(), learner_connector_pieces=pieces)
    learner.build()
    batch = learner.episodes_to_train_batch(_episodes())["default_policy"]
    # Episode 1: rewards 1, 2, 3 -> 1 + .5 * 2 + .25 * 3, 2 + .5 * 3, 3; episode 2 (cut): .5 + .25, .5.
    assert batch[Columns.RETURNS_TO_GO].tolist() == pytest.approx([2.75, 3.5, 3.0, 0.75, 0.5])
    # Each step's next observation: the first feature counts up by 0.1 within an episode.
    assert batch[Columns.NEXT_OBS][:, 0].tolist() == pytest.approx([0.1, 0.2, 0.3, 0.6, 0.7])
    with pytest.raises(ValueError, match="gamma must be a number in"):
        ComputeReturnsToGo(gamma=1.5)


def test_rllibs_episode_getters_read_and_its_setters_say_what_to_change_instead():
    episode = _episodes()[0]
    assert episode.get_rewards().tolist() == [1.0, 2.0, 3.0]
    assert episode.get_rewards(-1) == 3.0 and episode.get_actions([0, 2]).tolist() == [0, 0]
    assert episode.get_observations(slice(1, 3))[:, 0].tolist() == pytest.approx([0.1, 0.2])
    assert episode.get_extra_model_outputs(Columns.ACTION_LOGP, 0) == pytest.approx(-0.7)
    with pytest.raises(ValueError, match="no counterpart here"):
        episode.get_observations(-1, neg_index_as_lookback=True)
    with pytest.raises(ValueError, match=r"Change batch\[module_id\]\['rewards'\] in your piece instead"):
        episode.set_rewards(new_data=[0.0, 0.0, 0.0])


def test_replacing_gae_by_name_keeps_the_pipeline_working():
    from lightning_rl.algorithms.ppo import PPOLearner
    from lightning_rl.connectors import GeneralAdvantageEstimation

    class MyPPOLearner(PPOLearner):
        def build_learner_connector(self):
            pipeline = super().build_learner_connector()
            pipeline.remove("GeneralAdvantageEstimation")
            pipeline.append(GeneralAdvantageEstimation(gamma=0.5, lambda_=1.0))
            return pipeline

    learner = MyPPOLearner(_ppo_spec())
    learner.build()
    results = learner.update_from_episodes(_episodes())
    assert np.isfinite(results["default_policy"]["total_loss"])


# ---------------------------------------------------------------------------------------
# (8) PPO loss rewrites: standardized advantages, RLlib's schedule and KL attributes
# ---------------------------------------------------------------------------------------


def test_ppos_batch_holds_standardized_advantages_as_rllibs_gae_leaves_them():
    from lightning_rl.algorithms.ppo import PPOLearner

    learner = PPOLearner(_ppo_spec())
    learner.build()
    advantages = learner.episodes_to_train_batch(_episodes())["default_policy"][Columns.ADVANTAGES]
    assert abs(float(advantages.mean())) < 1e-5
    assert abs(float(advantages.std(unbiased=False)) - 1.0) < 1e-4


def test_ppo_has_rllibs_entropy_schedulers_and_kl_coefficients_per_module():
    from lightning_rl.algorithms.ppo import PPOLearner

    learner = PPOLearner(_ppo_spec(), entropy_coeff=[[0, 0.1], [100, 0.0]], kl_coeff=0.2)
    learner.build()
    learner.update_from_episodes(_episodes(), timesteps={"num_env_steps_sampled_lifetime": 50})
    assert learner.entropy_coeff_schedulers_per_module["default_policy"].get_current_value() == pytest.approx(0.05)
    kl_coeff = learner.curr_kl_coeffs_per_module["default_policy"]
    assert isinstance(kl_coeff, torch.Tensor)
    before = float(kl_coeff)
    # RLlib's _update_module_kl_coeff rewrites change the tensor in place.
    kl_coeff.data *= 1.5
    assert learner.curr_kl_coeff("default_policy") == pytest.approx(before * 1.5)
    assert learner.get_state()["curr_kl_coeffs"]["default_policy"] == pytest.approx(before * 1.5)


# ---------------------------------------------------------------------------------------
# (4) Module checkpoints: save_to_path / from_checkpoint, load_state_path, components, "learner" level
# ---------------------------------------------------------------------------------------


def _trained_bc_learner():
    from lightning_rl.algorithms.bc import BCLearner

    learner = BCLearner(module_spec=bc_spec(), lr=0.05)
    learner.build()
    learner.update_from_batch(random_batch(seed=3))
    return learner


def test_rl_module_save_to_path_and_from_checkpoint(tmp_path):
    module = _trained_bc_learner().module["default_policy"]
    path = module.save_to_path(str(tmp_path / "module"))
    restored = RLModule.from_checkpoint(path)
    assert type(restored) is type(module)
    assert_same_tensors(restored.get_state(), module.get_state())
    fresh = bc_spec().build()
    fresh.restore_from_path(path)
    assert_same_tensors(fresh.get_state(), module.get_state())


def test_multi_rl_module_save_to_path_writes_one_directory_per_module(tmp_path):
    module = _shared_encoder_spec().build()
    path = module.save_to_path(tmp_path / "multi")
    restored = MultiRLModule.from_checkpoint(path)
    assert type(restored) is SharedEncoderMultiRLModule
    assert_same_tensors(restored.get_state(), module.get_state())
    # RLlib's way of loading one module of a multi-module checkpoint: its own subdirectory.
    one = RLModuleSpec(
        module_class=PolicyHead,
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
        load_state_path=os.path.join(path, "p0"),
    ).build()
    assert_same_tensors(one.get_state(), module["p0"].get_state())


def test_rl_module_spec_load_state_path_loads_the_weights_into_the_learner(tmp_path):
    from lightning_rl.algorithms.bc import BCLearner

    trained = _trained_bc_learner()
    path = trained.module["default_policy"].save_to_path(tmp_path / "module")
    spec = bc_spec()
    spec.load_state_path = path  # RLlib users set it on the spec, too
    learner = BCLearner(module_spec=spec)
    learner.build()
    assert_same_tensors(learner.get_module_state(), trained.get_module_state())


def test_multi_rl_module_spec_load_state_path_with_modules_to_load(tmp_path):
    source = _shared_encoder_spec().build()
    path = source.save_to_path(tmp_path / "multi")
    spec = _shared_encoder_spec()
    spec.load_state_path, spec.modules_to_load = str(path), {"p1"}
    built = spec.build()
    assert_same_tensors(built["p1"].get_state(), source["p1"].get_state())
    assert not all(
        torch.equal(a, b) for a, b in zip(built["p0"].get_state().values(), source["p0"].get_state().values())
    )


def test_a_learner_level_state_is_restored_not_ignored():
    source, target = _trained_bc_learner(), _trained_bc_learner()
    target.update_from_batch(random_batch(seed=9))
    target.set_state({"learner": source.get_state()})
    assert_same_tensors(target.get_module_state(), source.get_module_state())
    with pytest.raises(ValueError, match="unknown state key"):
        target.set_state({"rl_modules": source.get_module_state()})


def test_learner_group_restore_from_path_with_a_component(tmp_path):
    from lightning_rl import LearnerGroup

    source = _trained_bc_learner()
    learner_path = source.save_to_path(str(tmp_path / "learner"))
    module_path = source.module["default_policy"].save_to_path(tmp_path / "module")
    for path, component in (
        (learner_path, "learner/rl_module/default_policy"),
        (module_path, "rl_module/default_policy"),
    ):
        target = _trained_bc_learner()
        target.update_from_batch(random_batch(seed=11))
        optimizer_before = target.get_state(components="optimizer")
        with LearnerGroup(target) as group:
            group.restore_from_path(path, component=component)
        assert_same_tensors(target.get_module_state(), source.get_module_state())
        # Only the weights: the optimizer state is this Learner's own still.
        assert target.get_state(components="optimizer")["optimizer"].keys() == optimizer_before["optimizer"].keys()
    with pytest.raises(ValueError, match="unknown state component"):
        source.restore_from_path(learner_path, component="rl_module/ghost")


# ---------------------------------------------------------------------------------------
# (1) Settings RLlib keeps in the AlgorithmConfig
# ---------------------------------------------------------------------------------------


class ConfigDictLearner(SharedEncoderLearner):
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        scale = self.config.learner_config_dict["loss_scale"]
        assert config.learner_config_dict["loss_scale"] == scale
        return scale * super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)


def test_a_custom_learner_reads_learner_config_dict(tmp_path):
    learner = ConfigDictLearner(module_spec=_shared_encoder_spec(), learner_config_dict={"loss_scale": 2.0})
    learner.build()
    learner.update_from_batch(_two_agent_batch(0))
    restored = ConfigDictLearner.from_checkpoint(learner.save_to_path(str(tmp_path / "l")))
    assert restored.config.learner_config_dict == {"loss_scale": 2.0}
    assert SharedEncoderLearner(module_spec=_shared_encoder_spec()).config.learner_config_dict == {}


def test_ppo_reads_rllibs_lambda_and_use_critic_and_refuses_lambda_at_construction():
    from lightning_rl.algorithms.ppo import PPOLearner

    learner = PPOLearner(_ppo_spec(), gae_lambda=0.9)
    assert learner.config.lambda_ == 0.9
    assert learner.config.use_critic is True
    with pytest.raises(ValueError, match="gae_lambda, RLlib's lambda_: pass gae_lambda=0.8"):
        PPOLearner(_ppo_spec(), lambda_=0.8)
    with pytest.raises(ValueError, match="use_critic=False"):
        PPOLearner(_ppo_spec(), use_critic=False)
    with pytest.raises(AttributeError, match="override build_learner_connector"):
        learner.config.add_default_connectors_to_learner_pipeline  # noqa: B018


# ---------------------------------------------------------------------------------------
# (2) RLlib's connector names: ConnectorV2, its helpers, columns, a pipeline call without metrics
# ---------------------------------------------------------------------------------------


def test_an_rllib_connector_v2_piece_runs_as_a_learner_connector_piece():
    from lightning_rl.algorithms.ppo import PPOLearner
    from lightning_rl.connectors import ConnectorV2

    class AddReturnsToGo(ConnectorV2):
        def __init__(self, input_observation_space=None, input_action_space=None, *, gamma=1.0, **kwargs):
            super().__init__(input_observation_space, input_action_space, **kwargs)
            self.gamma = gamma

        def __call__(self, *, rl_module, batch, episodes, explore=None, shared_data=None, metrics=None, **kwargs):
            for sa_episode in self.single_agent_episode_iterator(episodes):
                rewards = np.asarray(sa_episode.rewards, dtype=np.float32)
                returns = np.zeros_like(rewards)
                running = 0.0
                for t in reversed(range(len(rewards))):
                    running = rewards[t] + self.gamma * running
                    returns[t] = running
                self.add_n_batch_items(batch, Columns.RETURNS_TO_GO, returns, len(sa_episode), sa_episode)
            return batch

    learner = PPOLearner(_ppo_spec(), learner_connector_pieces=[AddReturnsToGo(OBS_SPACE, ACT_SPACE)])
    learner.build()
    batch = learner.episodes_to_train_batch(_episodes())["default_policy"]
    torch.testing.assert_close(batch[Columns.RETURNS_TO_GO], torch.tensor([6.0, 5.0, 3.0, 1.0, 0.5]))
    assert Columns.INTRINSIC_REWARDS == "intrinsic_rewards" and Columns.EPS_ID == "eps_id"


def test_a_pipeline_runs_without_metrics_or_shared_data():
    from lightning_rl.connectors import AddColumnsFromEpisodes, ConnectorPipeline, GeneralAdvantageEstimation

    module = _ppo_spec().build().as_multi_rl_module()
    pipeline = ConnectorPipeline([AddColumnsFromEpisodes(), GeneralAdvantageEstimation(gamma=0.99, lambda_=0.95)])
    batch = pipeline(rl_module=module, batch={}, episodes=_episodes(), explore=False)
    assert Columns.ADVANTAGES in batch["default_policy"]


# ---------------------------------------------------------------------------------------
# (9) Spec helpers
# ---------------------------------------------------------------------------------------


def test_rl_module_spec_update_and_from_module():
    spec = RLModuleSpec(module_class=PolicyHead)
    spec.update(RLModuleSpec(observation_space=OBS_SPACE, action_space=ACT_SPACE))
    assert spec.module_class is PolicyHead and spec.observation_space == OBS_SPACE
    spec.update(RLModuleSpec(module_class=SharedEncoder), override=False)
    assert spec.module_class is PolicyHead
    described = RLModuleSpec.from_module(spec.build())
    assert described.module_class is PolicyHead and described.action_space == ACT_SPACE


def test_multi_rl_module_spec_update_with_and_without_override():
    spec = _shared_encoder_spec()
    other = MultiRLModuleSpec(
        rl_module_specs={"p0": RLModuleSpec(model_config={"x": 1}), "p2": RLModuleSpec(module_class=PolicyHead)}
    )
    spec.update(other)
    assert sorted(spec.rl_module_specs) == ["p0", "p1", "p2", SHARED_ENCODER_ID]
    assert spec.rl_module_specs["p0"].module_class is PolicyHead  # updated, not replaced
    assert spec.rl_module_specs["p0"].model_config == {"x": 1}
    spec.update(other, override=True)
    assert spec.rl_module_specs["p0"].module_class is None  # replaced


# ---------------------------------------------------------------------------------------
# (11) Required module APIs, checked at setup
# ---------------------------------------------------------------------------------------


def test_ppo_rejects_a_module_without_a_value_function_at_build_naming_the_api():
    from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
    from lightning_rl.core.rl_modules import ValueFunctionAPI

    assert PPOLearner.rl_module_required_apis() == [ValueFunctionAPI]
    assert isinstance(_ppo_spec().build(), ValueFunctionAPI) and issubclass(PPOModule, ValueFunctionAPI)
    spec = RLModuleSpec(module_class=SharedEncoder, observation_space=OBS_SPACE, action_space=ACT_SPACE)
    learner = PPOLearner(spec)
    with pytest.raises(
        ValueError, match=r"'default_policy' \(SharedEncoder\) does not implement \['ValueFunctionAPI'\]"
    ):
        learner.build()


# ---------------------------------------------------------------------------------------
# (10) *_lifetime results are running totals (docs/coming_from_rllib.md says so)
# ---------------------------------------------------------------------------------------


def test_lifetime_results_are_running_totals_not_per_update_increments():
    learner = _trained_bc_learner()  # one update of 64 rows
    results = learner.update_from_batch(random_batch(seed=4))
    assert results["__all_modules__"]["num_env_steps_trained_lifetime"] == 128
    assert results["default_policy"]["num_module_steps_trained_lifetime"] == 128


def test_restore_from_path_with_a_component_reads_a_lightning_checkpoint(tmp_path):
    from _helpers import loader_of, make_trainer, random_train_items

    from lightning_rl.algorithms.bc import BCLearner

    source = BCLearner(module_spec=bc_spec(), lr=0.05)
    trainer = make_trainer(tmp_path)
    trainer.fit(source, train_dataloaders=loader_of(random_train_items(2)))
    trainer.save_checkpoint(tmp_path / "fit.ckpt")
    target = _trained_bc_learner()
    target.restore_from_path(str(tmp_path / "fit.ckpt"), component="rl_module/default_policy")
    assert_same_tensors(target.get_module_state(), source.get_module_state())
