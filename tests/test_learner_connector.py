"""The Learner's connector pipeline: built by build(), extended by algorithms, users and overrides."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from lightning_rl import Columns, Learner, RLModule, RLModuleSpec
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.connectors import AddColumnsFromEpisodes, ConnectorPipeline, piece_name
from lightning_rl.connectors.episodes import add_value_targets_and_advantages, episodes_to_batch
from lightning_rl.env.episode import SingleAgentEpisode

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(2)


class LinearPolicy(RLModule):
    def setup(self) -> None:
        self.logits = nn.Linear(1, 2)

    def _forward(self, batch):
        return {Columns.ACTION_DIST_INPUTS: self.logits(batch[Columns.OBS])}


def add_loss_weights(rl_module, batch, episodes, shared_data, metrics):
    """A user's piece: a per-row loss weight (module level, so a LearnerGroup can pickle it)."""
    for module_batch in batch.values():
        module_batch["loss_weights"] = 1.0 + module_batch[Columns.REWARDS]
    return batch


class WeightedLearner(Learner):
    """Weights each row's loss by the user's column, and keeps the weights it read."""

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        self.weights_read = batch["loss_weights"]
        return (batch["loss_weights"] * fwd_out[Columns.ACTION_DIST_INPUTS].logsumexp(-1)).mean()


def make_episode(rewards: list[float], *, terminated: bool = False, first_obs: float = 0.0) -> SingleAgentEpisode:
    steps = len(rewards)
    return SingleAgentEpisode(
        observations=(first_obs + np.arange(steps + 1, dtype=np.float32))[:, None] / 10,
        actions=np.zeros(steps, dtype=np.int64),
        rewards=np.asarray(rewards, dtype=np.float32),
        terminated=terminated,
        extra_model_outputs={Columns.ACTION_LOGP: np.full(steps, -0.7, dtype=np.float32)},
    )


def linear_spec() -> RLModuleSpec:
    return RLModuleSpec(module_class=LinearPolicy, observation_space=OBS_SPACE, action_space=ACTION_SPACE)


EPISODES = [make_episode([1.0, 2.0, 3.0], terminated=True), make_episode([0.5, 0.5], first_obs=5.0)]


def test_a_user_piece_adds_a_column_that_compute_loss_for_module_reads():
    learner = WeightedLearner(linear_spec(), learner_connector_pieces=[add_loss_weights])
    learner.build()
    results = learner.update_from_episodes(EPISODES)
    torch.testing.assert_close(learner.weights_read, torch.tensor([2.0, 3.0, 4.0, 1.5, 1.5]))
    assert math.isfinite(results["default_policy"]["total_loss"])


def expect_no_columns_yet(rl_module, batch, episodes, shared_data, metrics):
    if batch:
        raise AssertionError(f"a prepended piece runs before any column exists; got {sorted(batch)}")
    return batch


def test_an_override_of_build_learner_connector_places_a_piece_anywhere():
    class ColumnsFirst(WeightedLearner):
        def build_learner_connector(self) -> ConnectorPipeline:
            pipeline = super().build_learner_connector()
            pipeline.insert_after(AddColumnsFromEpisodes, add_loss_weights)
            pipeline.prepend(expect_no_columns_yet)
            return pipeline

    learner = ColumnsFirst(linear_spec())
    learner.build()
    assert [piece_name(piece) for piece in learner.learner_connector] == [
        "expect_no_columns_yet",
        "AddColumnsFromEpisodes",
        "add_loss_weights",
    ]
    learner.update_from_episodes(EPISODES)
    assert len(learner.weights_read) == 5


def ppo_spec() -> RLModuleSpec:
    return RLModuleSpec(
        module_class=PPOModule,
        observation_space=OBS_SPACE,
        action_space=ACTION_SPACE,
        model_config={"fcnet_hiddens": [8]},
    )


def test_ppo_adds_gae_to_the_default_pipeline_and_a_users_pieces_run_before_it():
    # As in RLlib: a config's learner connector pieces run before the algorithm's GAE.
    learner = PPOLearner(ppo_spec(), learner_connector_pieces=[add_loss_weights])
    learner.build()
    assert [piece_name(piece) for piece in learner.learner_connector] == [
        "AddColumnsFromEpisodes",
        "add_loss_weights",
        "GeneralAdvantageEstimation",
        "log_vf_explained_var",
    ]
    batch = learner.episodes_to_train_batch(EPISODES)["default_policy"]
    assert {Columns.ADVANTAGES, Columns.VALUE_TARGETS, "loss_weights"} <= set(batch)


def test_ppos_gae_follows_a_modules_config_overrides():
    overrides = {"default_policy": {"gamma": 0.5, "gae_lambda": 0.0}}
    learner = PPOLearner(ppo_spec(), gamma=0.99, gae_lambda=0.95, config_overrides_per_module=overrides)
    learner.build()
    batch = learner.episodes_to_train_batch(EPISODES)["default_policy"]
    expected = add_value_targets_and_advantages(
        episodes_to_batch(EPISODES, torch.device("cpu")),
        EPISODES,
        learner.module["default_policy"].compute_values,
        gamma=0.5,
        gae_lambda=0.0,
    )
    torch.testing.assert_close(batch[Columns.VALUE_TARGETS], expected[Columns.VALUE_TARGETS])
    # The advantages are left standardized, as RLlib's GAE piece leaves them.
    raw = expected[Columns.ADVANTAGES]
    torch.testing.assert_close(batch[Columns.ADVANTAGES], (raw - raw.mean()) / raw.std(unbiased=False))
    assert "vf_explained_var" in learner.metrics.reduce()["default_policy"]
