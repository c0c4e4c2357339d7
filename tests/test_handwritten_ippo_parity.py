"""``benchmarks/multi_agent.py`` compares like with like: ours and ``benchmarks/handwritten_ippo.py`` on simple_spread.

The benchmark's verdict (ours' median per-agent return >= the hand-written IPPO's) means
something only if the two run the same algorithm and measure the same number. These tests pin
both: the example config's settings are the hand-written loop's constants; from the same weights,
one rollout's rows and the same minibatch shuffles, one update of ours' ``PPOLearner`` and one
of the hand-written ``ppo_update`` (its GAE with the truncation bootstrapped, per-minibatch
advantage normalization, unclipped value loss, entropy, global-norm clip, Adam) leave the same
weights; and ours' per-agent return statistic is the hand-written loop's, on the same episodes.
"""

from __future__ import annotations

import collections
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.core.columns import DEFAULT_MODULE_ID, Columns
from lightning_rl.core.rl_module_specs import RLModuleSpec
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode
from lightning_rl.env.multi_agent_runner import MultiAgentEnvRunner

pytest.importorskip("mpe2")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "ppo_simple_spread.yaml"
ENV = "mpe2.simple_spread_v3"


@pytest.fixture
def handwritten(import_benchmark) -> ModuleType:
    return import_benchmark("handwritten_ippo")


@pytest.fixture
def multi_agent_benchmark(import_benchmark) -> ModuleType:
    return import_benchmark("multi_agent")


def _example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def _example_learner(runner: MultiAgentEnvRunner) -> PPOLearner:
    """The example's ``PPOLearner``, with its module built for the runner's spaces."""
    settings = dict(_example()["model"]["init_args"])
    observation_space, action_space = runner.module_spaces()[DEFAULT_MODULE_ID]
    spec = RLModuleSpec(PPOModule, observation_space, action_space, settings.pop("model_config"))
    learner = PPOLearner(spec, **settings)
    learner.build()
    return learner


def _linear_layers(network: nn.Module) -> list[nn.Linear]:
    return [layer for layer in network.modules() if isinstance(layer, nn.Linear)]


def _copy_weights(learner: PPOLearner, agent: nn.Module) -> None:
    """Give the hand-written agent's policy and value MLPs the weights of our module's."""
    module = learner.module[DEFAULT_MODULE_ID]
    with torch.no_grad():
        for theirs, ours in ((agent.policy, module.pi), (agent.value, module.vf)):
            for their_layer, our_layer in zip(_linear_layers(theirs), _linear_layers(ours), strict=True):
                their_layer.weight.copy_(our_layer.weight)
                their_layer.bias.copy_(our_layer.bias)


def _handwritten_advantages(handwritten: ModuleType, agent: nn.Module, episodes: list[MultiAgentEpisode]) -> torch.Tensor:
    """The hand-written loop's GAE over each agent's trajectory, in the order of our rows.

    As its rollout does: a truncated episode's last reward gets ``gamma * V(final obs)`` added,
    and its GAE starts afresh after that step (``last_done``).
    """
    advantages = []
    for episode in episodes:
        for agent_episode in episode.agent_episodes.values():
            assert agent_episode.is_truncated and not agent_episode.is_terminated  # simple_spread only truncates
            observations = torch.as_tensor(np.asarray(agent_episode.observations), dtype=torch.float32)
            rewards = torch.as_tensor(np.asarray(agent_episode.rewards), dtype=torch.float32).clone()
            steps = len(rewards)
            with torch.no_grad():
                values = agent.get_value(observations)
            rewards[-1] += handwritten.GAMMA * values[-1]
            starts = torch.zeros(steps, 1, 1)
            starts[0] = 1.0
            columns = handwritten.compute_gae(
                rewards.view(steps, 1, 1), values[:-1].view(steps, 1, 1), starts, torch.zeros(1, 1), torch.ones(1, 1)
            )
            advantages.append(columns.view(-1))
    return torch.cat(advantages)


def test_the_example_config_has_the_handwritten_loops_settings(handwritten: ModuleType):
    config = _example()
    model, data = config["model"]["init_args"], config["data"]["init_args"]
    assert model["model_config"] == {"fcnet_hiddens": [handwritten.HIDDEN] * 2, "fcnet_activation": "tanh"}
    settings = {key: model[key] for key in ("lr", "gamma", "gae_lambda", "clip_param", "num_epochs",
                                            "minibatch_size", "grad_clip", "vf_loss_coeff", "entropy_coeff")}  # fmt: skip
    assert settings == {
        "lr": handwritten.LR, "gamma": handwritten.GAMMA, "gae_lambda": handwritten.GAE_LAMBDA,
        "clip_param": handwritten.CLIP, "num_epochs": handwritten.NUM_EPOCHS,
        "minibatch_size": handwritten.MINIBATCH_SIZE, "grad_clip": handwritten.MAX_GRAD_NORM,
        "vf_loss_coeff": handwritten.VF_COEF, "entropy_coeff": handwritten.ENT_COEF,
    }  # fmt: skip
    assert model["vf_clip_param"] is None  # the hand-written value loss is an unclipped MSE
    assert (data["env"], data["env_kwargs"], data["policy_mapping_fn"]) == (ENV, {}, "shared")
    assert (data["num_envs"], data["rollout_fragment_length"]) == (handwritten.NUM_ENVS, handwritten.NUM_STEPS)


def test_one_update_of_ours_and_of_the_handwritten_loop_from_the_same_weights_and_rows_agree(handwritten: ModuleType):
    runner = MultiAgentEnvRunner(ENV, num_envs=handwritten.NUM_ENVS, seed=0)
    learner = _example_learner(runner)
    episodes = runner.sample(learner.module, num_env_steps=handwritten.NUM_STEPS)
    runner.close()
    batch = learner.episodes_to_train_batch(episodes)
    rows = batch[DEFAULT_MODULE_ID]
    agent = handwritten.Agent(rows[Columns.OBS].shape[1], int(learner.module[DEFAULT_MODULE_ID].action_space.n))
    _copy_weights(learner, agent)

    # GAE: ours keeps the raw advantages as value_targets - vf_preds (its advantages column is standardized).
    raw_advantages = rows[Columns.VALUE_TARGETS] - rows[Columns.VF_PREDS]
    torch.testing.assert_close(raw_advantages, _handwritten_advantages(handwritten, agent, episodes), rtol=1e-5, atol=1e-4)
    with torch.no_grad():
        their_logp = agent.get_dist(rows[Columns.OBS]).log_prob(rows[Columns.ACTIONS].long())
    torch.testing.assert_close(rows[Columns.ACTION_LOGP], their_logp)

    # One update each on the same rows; the same global seed gives both the same per-epoch randperm.
    optimizer = torch.optim.Adam(agent.parameters(), lr=handwritten.LR, eps=handwritten.ADAM_EPS)
    their_batch = {"obs": rows[Columns.OBS], "actions": rows[Columns.ACTIONS].long(), "logp": rows[Columns.ACTION_LOGP],
                   "advantages": raw_advantages, "returns": rows[Columns.VALUE_TARGETS]}  # fmt: skip
    torch.manual_seed(1)
    handwritten.ppo_update(agent, optimizer, their_batch)
    torch.manual_seed(1)
    learner.update(batch=batch, num_epochs=learner.hparams.num_epochs, minibatch_size=learner.hparams.minibatch_size,
                   shuffle_batch_per_epoch=True)  # fmt: skip

    module = learner.module[DEFAULT_MODULE_ID]
    for theirs, ours in ((agent.policy, module.pi), (agent.value, module.vf)):
        for their_layer, our_layer in zip(_linear_layers(theirs), _linear_layers(ours), strict=True):
            # 30 Adam steps of lr 7e-4 move the weights by ~1e-2; rounding (fused Adam) stays far below.
            torch.testing.assert_close(our_layer.weight, their_layer.weight, rtol=0, atol=1e-5)
            torch.testing.assert_close(our_layer.bias, their_layer.bias, rtol=0, atol=1e-5)


def test_ours_per_agent_return_is_the_handwritten_loops_mean_over_its_last_100_episodes(
    handwritten: ModuleType, multi_agent_benchmark: ModuleType
):
    runner = MultiAgentEnvRunner(ENV, num_envs=handwritten.NUM_ENVS, seed=0)
    learner = _example_learner(runner)
    # The hand-written loop's window: each completed episode's return summed over agents / agents.
    window: collections.deque[float] = collections.deque(maxlen=handwritten.RETURN_WINDOW)
    for _ in range(5):  # 5 x 8 copies x 4 episodes of 25 steps: 160 episodes, more than the window
        for episode in runner.sample(learner.module, num_env_steps=handwritten.NUM_STEPS):
            assert episode.is_done and len(episode) == 25  # every rollout ends where episodes end
            window.append(episode.get_return() / len(episode.agent_episodes))
        stats = runner.get_metrics()
    runner.close()

    result = multi_agent_benchmark.ours_result(stats, wall_s=1.0, seed=0)  # what the benchmark reports for ours
    assert len(window) == handwritten.RETURN_WINDOW and stats["num_episodes_lifetime"] == 160
    assert result["return_mean_per_agent"] == pytest.approx(float(np.mean(window)), abs=1e-3)  # ours_result rounds to 3
