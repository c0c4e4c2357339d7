"""Learners on multi-agent episodes: per-agent GAE, several modules trained at once, frozen modules, module spaces."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import assert_same, loader_of, make_trainer
from lightning.pytorch import LightningDataModule

from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.core.columns import DEFAULT_MODULE_ID, Columns
from lightning_rl.core.data_contract import DataOffer
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode
from lightning_rl.learner.lightning_hooks import specs_for_module_spaces

ONE_NUMBER = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
TWO_ACTIONS = gym.spaces.Discrete(2)
SMALL = {"fcnet_hiddens": [8]}


class TenthOfObsValues(PPOModule):
    """A PPO module whose state value is fixed: a tenth of the observation's first number."""

    def compute_values(self, batch: dict[str, Any]) -> torch.Tensor:
        return batch[Columns.OBS][:, 0] / 10


def _obs(value: float) -> np.ndarray:
    return np.array([value], np.float32)


def _turn_based_episode() -> MultiAgentEpisode:
    """Two players taking turns (as a PettingZoo AEC env steps them); p0 ends first, p1 is cut while running.

    p0 acts on 1, 2, 3 and is rewarded 0.5 + 1.0, then 3.0, then -2.0 (terminated at 4); p1 acts
    on 10, 20 and is rewarded -1.0 + 2.0, then 4.0, and its chunk ends at 30, still running.
    """
    episode = MultiAgentEpisode("game")
    episode.add_env_reset({"p0": _obs(1)})
    steps = [
        # (acting agent, rewards of this env step, observations after it, terminateds)
        ("p0", {"p0": 0.5}, {"p1": _obs(10)}, {}),
        ("p1", {"p0": 1.0, "p1": -1.0}, {"p0": _obs(2)}, {}),
        ("p0", {"p1": 2.0}, {"p1": _obs(20)}, {}),
        ("p1", {"p0": 3.0}, {"p0": _obs(3)}, {}),
        ("p0", {"p0": -2.0, "p1": 4.0}, {"p0": _obs(4), "p1": _obs(30)}, {"p0": True}),
    ]
    for agent, rewards, observations, terminateds in steps:
        episode.add_env_step(observations, {agent: 0}, rewards, terminateds=terminateds)
    episode.cut()  # the successor would continue with p1; this chunk is what the Learner trains on
    return episode.to_numpy()


def test_gae_runs_along_each_agents_own_turns_in_a_turn_based_game():
    spec = RLModuleSpec(TenthOfObsValues, ONE_NUMBER, TWO_ACTIONS, SMALL)
    learner = PPOLearner(spec, gamma=0.9, gae_lambda=0.8)
    learner.build()
    batch = learner.episodes_to_train_batch([_turn_based_episode()])[DEFAULT_MODULE_ID]

    # By hand, V(s) = s / 10, gamma * lambda = 0.72. p0: values 0.1, 0.2, 0.3, then 0 (terminated).
    p0_deltas = [1.5 + 0.9 * 0.2 - 0.1, 3.0 + 0.9 * 0.3 - 0.2, -2.0 - 0.3]
    p0_last = p0_deltas[2]
    p0_middle = p0_deltas[1] + 0.72 * p0_last
    p0 = [p0_deltas[0] + 0.72 * p0_middle, p0_middle, p0_last]
    # p1: values 1.0, 2.0, bootstrapped from V(30) = 3.0 (its chunk was cut, not ended).
    p1_deltas = [1.0 + 0.9 * 2.0 - 1.0, 4.0 + 0.9 * 3.0 - 2.0]
    p1 = [p1_deltas[0] + 0.72 * p1_deltas[1], p1_deltas[1]]

    assert batch[Columns.OBS][:, 0].tolist() == [1, 2, 3, 10, 20]
    assert batch[Columns.REWARDS].tolist() == [1.5, 3.0, -2.0, 1.0, 4.0]
    assert batch[Columns.TERMINATEDS].tolist() == [False, False, True, False, False]
    raw = torch.tensor(p0 + p1)
    torch.testing.assert_close(batch[Columns.VALUE_TARGETS], raw + batch[Columns.VF_PREDS])
    # Standardized over the module's rows, as RLlib's GAE piece leaves them.
    torch.testing.assert_close(batch[Columns.ADVANTAGES], (raw - raw.mean()) / raw.std(unbiased=False))
    torch.testing.assert_close(batch[Columns.VF_PREDS], torch.tensor([0.1, 0.2, 0.3, 1.0, 2.0]))


def _parallel_episodes(
    agents: dict[str, int], mapping: Callable[[str, MultiAgentEpisode], str], *, steps: int, seed: int
) -> MultiAgentEpisode:
    """Agents (``{agent_id: obs size}``) that all observe and act at every step, as in a Parallel env."""
    rng = np.random.default_rng(seed)
    episode = MultiAgentEpisode(agent_to_module_mapping_fn=mapping)

    def observations() -> dict[str, np.ndarray]:
        return {agent: rng.normal(size=size).astype(np.float32) for agent, size in agents.items()}

    episode.add_env_reset(observations())
    for _ in range(steps):
        episode.add_env_step(
            observations(),
            {agent: int(rng.integers(2)) for agent in agents},
            {agent: float(rng.normal()) for agent in agents},
            extra_model_outputs={agent: {Columns.ACTION_LOGP: np.float32(-math.log(2))} for agent in agents},
        )
    episode.cut()
    return episode.to_numpy()


AGENT_MODULES = {"x": "a", "y": "b", "z": "frozen"}


def _three_module_learner() -> PPOLearner:
    spec = MultiRLModuleSpec(
        {module_id: RLModuleSpec(PPOModule, ONE_NUMBER, TWO_ACTIONS, SMALL) for module_id in ("a", "b", "frozen")}
    )
    learner = PPOLearner(spec, num_epochs=2, minibatch_size=None, policies_to_train=["a", "b"], lr=1e-2)
    learner.build()
    return learner


def _optimizer_states(learner: PPOLearner, module_id: str) -> dict[str, Any]:
    return {name: optimizer.state_dict()["state"] for name, optimizer in learner.get_optimizers_for_module(module_id)}


def test_two_modules_train_with_their_own_optimizers_while_a_frozen_one_stays_identical_and_gets_no_rows():
    learner = _three_module_learner()
    mapping = lambda agent_id, episode: AGENT_MODULES[agent_id]  # noqa: E731
    episodes = [_parallel_episodes({"x": 1, "y": 1, "z": 1}, mapping, steps=6, seed=seed) for seed in range(2)]
    before = {module_id: learner.module[module_id].get_state() for module_id in ("a", "b", "frozen")}

    assert sorted(learner.episodes_to_train_batch(episodes)) == ["a", "b"]
    results = learner.update_from_episodes(episodes)

    assert "total_loss" not in results["frozen"] and "num_module_steps_trained" not in results["frozen"]
    for module_id in ("a", "b"):
        after = learner.module[module_id].get_state()
        assert any(not torch.equal(after[name], before[module_id][name]) for name in after), module_id
        (name, optimizer), *others = learner.get_optimizers_for_module(module_id)
        assert not others and optimizer.state_dict()["state"], f"{module_id}'s one optimizer has stepped"
        own = {id(p) for p in learner.module[module_id].parameters()}
        assert {id(p) for group in optimizer.param_groups for p in group["params"]} == own
        assert results[module_id]["num_module_steps_trained"] == 12  # two episodes of six steps, each once per epoch
    assert_same(learner.module["frozen"].get_state(), before["frozen"], "frozen")
    assert all(not state for state in _optimizer_states(learner, "frozen").values())


def test_agents_mapped_to_a_module_the_learner_lacks_are_named():
    learner = _three_module_learner()
    episode = _parallel_episodes({"x": 1, "w": 1}, lambda agent_id, episode: agent_id, steps=2, seed=0)
    with pytest.raises(ValueError, match="maps agent 'x' to module 'x', which the Learner does not have"):
        learner.episodes_to_train_batch([episode])


def test_an_agent_without_a_step_in_a_chunk_gives_no_rows():
    learner = PPOLearner(RLModuleSpec(TenthOfObsValues, ONE_NUMBER, TWO_ACTIONS, SMALL))
    learner.build()
    episode = MultiAgentEpisode()
    episode.add_env_reset({"p0": _obs(1)})
    episode.add_env_step({"p0": _obs(2), "late": _obs(7)}, {"p0": 1}, {"p0": 1.0})  # "late" joins, has no step yet
    episode.cut()
    batch = learner.episodes_to_train_batch([episode.to_numpy()])[DEFAULT_MODULE_ID]
    assert batch[Columns.OBS][:, 0].tolist() == [1.0]


class _MultiAgentData(LightningDataModule):
    """A data module as the multi-agent one looks to a Learner: module spaces and episodes."""

    def __init__(self, spaces: dict[str, tuple[gym.Space, gym.Space]], agents: dict[str, int]) -> None:
        super().__init__()
        self.module_spaces = spaces
        self.agents = agents

    def train_dataloader(self) -> Any:
        episodes = [_parallel_episodes(self.agents, lambda agent_id, episode: agent_id, steps=4, seed=0)]
        return loader_of([TrainItem(TrainingData(episodes=episodes))])

    def data_offer(self) -> DataOffer:
        return DataOffer(frozenset({"episodes"}), module_spaces=lambda: self.module_spaces)

    def accept_requirements(self, requirements: Any) -> None:
        pass


PER_AGENT_SPACES = {
    "p0": (ONE_NUMBER, TWO_ACTIONS),
    "p1": (gym.spaces.Box(-np.inf, np.inf, (3,), np.float32), TWO_ACTIONS),
}


def test_fit_builds_one_module_per_id_of_the_data_modules_module_spaces_from_the_default_spec(tmp_path):
    learner = PPOLearner(model_config=SMALL, num_epochs=1, minibatch_size=None)
    make_trainer(tmp_path).fit(learner, datamodule=_MultiAgentData(PER_AGENT_SPACES, {"p0": 1, "p1": 3}))
    assert sorted(learner.module.keys()) == ["p0", "p1"]
    for module_id, (obs_space, act_space) in PER_AGENT_SPACES.items():
        module = learner.module[module_id]
        assert (module.observation_space, module.action_space) == (obs_space, act_space)
        assert isinstance(module, PPOModule) and module.model_config == SMALL
    assert learner.module["p1"].pi[0].in_features == 3


def test_fit_fills_an_explicit_multi_module_specs_missing_spaces_per_module_id(tmp_path):
    spec = MultiRLModuleSpec(
        {
            "p0": RLModuleSpec(PPOModule, model_config={"fcnet_hiddens": [4]}),
            "p1": RLModuleSpec(PPOModule, model_config=SMALL),
            "opponent": RLModuleSpec(PPOModule, ONE_NUMBER, TWO_ACTIONS, SMALL),
        }
    )
    learner = PPOLearner(spec, num_epochs=1, minibatch_size=None)
    make_trainer(tmp_path).fit(learner, datamodule=_MultiAgentData(PER_AGENT_SPACES, {"p0": 1, "p1": 3}))
    assert learner.module["p0"].pi[0].out_features == 4
    assert learner.module["p1"].observation_space == PER_AGENT_SPACES["p1"][0]
    assert learner.module["opponent"].observation_space == ONE_NUMBER


def test_module_spaces_naming_a_module_the_spec_lacks_or_with_other_spaces_are_refused():
    spec = MultiRLModuleSpec({"p0": RLModuleSpec(PPOModule), "extra": RLModuleSpec(PPOModule)})
    with pytest.raises(
        ValueError, match=r"maps agents to modules \['p0', 'p1'\].*no module \['p1'\].*\['extra', 'p0'\]"
    ):
        specs_for_module_spaces(spec, PER_AGENT_SPACES)
    with pytest.raises(ValueError, match=r"specs of modules \['extra'\] have no observation/action space"):
        specs_for_module_spaces(spec, {"p0": PER_AGENT_SPACES["p0"]})
    wrong = MultiRLModuleSpec({"p0": RLModuleSpec(PPOModule, PER_AGENT_SPACES["p1"][0])})
    with pytest.raises(
        ValueError, match="module 'p0': the module spec's observation space is Box.*maps to it have Box"
    ):
        specs_for_module_spaces(wrong, {"p0": PER_AGENT_SPACES["p0"]})
    with pytest.raises(ValueError, match="module_spaces is empty"):
        specs_for_module_spaces(spec, {})


def test_a_fixed_opponent_without_parameters_joins_the_learner_without_an_optimizer():
    from lightning_rl.env.opponents import RandomLegalModule

    masked = gym.spaces.Dict(
        {"action_mask": gym.spaces.Box(0, 1, (3,), np.int8), "observation": gym.spaces.Box(-1, 1, (4,), np.float32)}
    )
    learner = PPOLearner(
        MultiRLModuleSpec({"main": RLModuleSpec(PPOModule, masked, gym.spaces.Discrete(3))}), policies_to_train=["main"]
    )
    learner.build()
    learner.add_module(
        module_id="random", module_spec=RLModuleSpec(RandomLegalModule, masked, gym.spaces.Discrete(3), {"seed": 0})
    )
    assert sorted(learner.module.keys()) == ["main", "random"]
    assert [name for name in learner._named_optimizers if name.startswith("random")] == []
    assert [name for name in learner._named_optimizers if name.startswith("main")]
