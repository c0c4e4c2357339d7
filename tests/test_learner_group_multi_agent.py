"""LearnerGroup on multi-agent episodes: dealt out whole, turned into per-module batches by each learner.

Two learner processes start once (``group``) and serve every test here. The episodes are
hand-built parallel-env episodes whose agents map to modules through a lambda (which plain
pickling refuses: the mapping itself must stay in the driver). A reference Learner in this
process trains on the same episodes; with SGD and no minibatches, two learners must match it
to float rounding, also where a module's agents appear in one learner's episodes only.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import bc_spec

from lightning_rl import ALL_MODULES, LearnerConfig, MultiRLModuleSpec
from lightning_rl.algorithms.bc import BCLearner
from lightning_rl.env.episode import SingleAgentEpisode
from lightning_rl.env.multi_agent_episode import MultiAgentEpisode
from lightning_rl.learner.group._episodes import episodes_from_wire, episodes_to_wire
from lightning_rl.learner.group.learner_group import LearnerGroup

LR = 0.1
# Agent -> module: "x" and "y" train modules "a" and "b"; "z" acts with "frozen", which is not trained.
AGENT_MODULES = {"x": "a", "y": "b", "z": "frozen", "w": "c"}
TRAINED = ["a", "b"]


class SGDLearner(BCLearner):
    """Behaviour cloning with SGD and momentum; records whether its episodes' arrays are on shared memory."""

    def configure_optimizers_for_module(self, module_id: str, config: LearnerConfig) -> None:
        params = self.get_parameters(self.module[module_id])
        self.register_optimizer(
            module_id=module_id,
            optimizer=torch.optim.SGD(params, lr=config.lr, momentum=0.9),
            params=params,
            lr_or_lr_schedule=config.lr,
        )

    def episodes_to_train_batch(self, episodes: Any) -> Any:
        arrays = [
            agent_episode.observations
            for episode in episodes
            for agent_episode in getattr(episode, "agent_episodes", {}).values()
        ]
        ranges = _shm_ranges()
        self.observations_in_shm = [any(lo <= a.ctypes.data < hi for lo, hi in ranges) for a in arrays]
        return super().episodes_to_train_batch(episodes)


def _shm_ranges() -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of ``/dev/shm`` files."""
    if not os.path.exists("/proc/self/maps"):
        return []
    with open("/proc/self/maps") as maps:
        return [
            tuple(int(x, 16) for x in line.split()[0].split("-"))  # type: ignore[misc]
            for line in maps
            if "/dev/shm/" in line
        ]


def make_learner() -> SGDLearner:
    spec = MultiRLModuleSpec(rl_module_specs={module_id: bc_spec() for module_id in ("a", "b", "frozen")})
    return SGDLearner(module_spec=spec, lr=LR, policies_to_train=TRAINED)


def episode(steps: int, agents: str, seed: int) -> MultiAgentEpisode:
    """A parallel-env episode of ``steps`` env steps in which ``agents`` (e.g. ``"xy"``) all act every step."""
    rng = np.random.default_rng(seed)
    episode = MultiAgentEpisode(agent_to_module_mapping_fn=lambda agent, _: AGENT_MODULES[agent])

    def observations() -> dict[str, np.ndarray]:
        return {agent: rng.normal(size=4).astype(np.float32) for agent in agents}

    episode.add_env_reset(observations())
    for step in range(steps):
        obs = observations()
        last = step == steps - 1
        episode.add_env_step(
            obs,
            {agent: int(rng.integers(2)) for agent in agents},
            {agent: 1.0 for agent in agents},
            terminateds={"__all__": last},
        )
    return episode.to_numpy()


def weights_of(learner: Any) -> dict[str, dict[str, np.ndarray]]:
    """For ``foreach_learner`` and the reference: every module's weights as numpy."""
    return {m: {k: v.detach().cpu().numpy() for k, v in s.items()} for m, s in learner.module.get_state().items()}


def assert_close(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for module_id in a:
        assert a[module_id].keys() == b[module_id].keys(), module_id
        for name in a[module_id]:
            np.testing.assert_allclose(a[module_id][name], b[module_id][name], atol=atol, rtol=0, err_msg=name)


def assert_ranks_agree(group: LearnerGroup) -> dict[str, dict[str, np.ndarray]]:
    first, second = group.foreach_learner(weights_of)
    assert_close(first, second, atol=0.0)
    return first


@pytest.fixture(scope="module")
def group():
    group = LearnerGroup(make_learner(), num_learners=2, num_threads_per_learner=1, timeout_s=60)
    yield group
    group.shutdown()


@pytest.fixture
def reference(group) -> SGDLearner:
    """A local learner holding the group's weights, with fresh optimizers on both sides."""
    learner = make_learner()
    learner.build()
    group.set_state(learner.get_state())
    return learner


def test_two_learners_train_several_modules_as_one_learner_on_all_episodes(group, reference):
    frozen_before = group.get_weights(["frozen"])
    for i in range(3):
        # Uneven lengths: each learner's share of "a" and "b" rows differs from half, and from update to update.
        episodes = [episode(3 + i, "xyz", seed=10 * i), episode(7, "xy", seed=10 * i + 1), episode(5 - i, "xyz", seed=10 * i + 2)]
        timesteps = {"num_env_steps_sampled_lifetime": 100 * (i + 1)}
        got = group.update_from_episodes(episodes, num_epochs=2, timesteps=timesteps)
        expected = reference.update_from_episodes(episodes, num_epochs=2, timesteps=timesteps)
        assert_close(assert_ranks_agree(group), weights_of(reference))
        assert got.keys() == expected.keys()  # per-module results, as one learner gives them
        assert "num_module_steps_trained" not in got.get("frozen", {})  # frozen sits out
        for module_id in TRAINED:
            assert got[module_id]["num_module_steps_trained"] == expected[module_id]["num_module_steps_trained"]
            assert got[module_id]["gradients_default_optimizer_global_norm"] == pytest.approx(
                expected[module_id]["gradients_default_optimizer_global_norm"], rel=1e-5
            )
        assert got[ALL_MODULES]["num_env_steps_trained"] == expected[ALL_MODULES]["num_env_steps_trained"]
    np.testing.assert_array_equal(group.get_weights(["frozen"])["frozen"]["pi.0.weight"], frozen_before["frozen"]["pi.0.weight"])


def test_a_module_whose_agents_play_in_one_learners_episodes_only_gets_its_whole_gradient(group, reference):
    # 17 env steps dealt by their middles: the first episode (x only) to rank 0, the others (x and y)
    # to rank 1, so rank 0 has no rows of "b". DDP's plain average would halve b's gradient.
    episodes = [episode(9, "x", seed=1), episode(3, "xy", seed=2), episode(5, "xy", seed=3)]
    for _ in range(2):
        got = group.update_from_episodes(episodes)
        expected = reference.update_from_episodes(episodes)
        assert_close(assert_ranks_agree(group), weights_of(reference))
        assert got["b"]["num_module_steps_trained"] == 8
        assert got["b"]["gradients_default_optimizer_global_norm"] == pytest.approx(
            expected["b"]["gradients_default_optimizer_global_norm"], rel=1e-5
        )
    # With minibatches (and shuffled rows) the learners still take their steps together.
    group.update_from_episodes(episodes, num_epochs=2, minibatch_size=4, shuffle_batch_per_epoch=True)
    assert_ranks_agree(group)
    # The episodes' arrays reached both learners through the driver's shared memory, not pickled.
    for in_shm in group.foreach_learner(lambda learner: learner.observations_in_shm):
        assert in_shm and all(in_shm)


def test_a_module_added_and_removed_between_updates(group, reference):
    spec = group.add_module(module_id="c", module_spec=bc_spec(), new_should_module_be_updated=["a", "b", "c"])
    try:
        assert set(spec.rl_module_specs) == {"a", "b", "frozen", "c"}
        reference.add_module(module_id="c", module_spec=bc_spec(), new_should_module_be_updated=["a", "b", "c"])
        group.set_weights({"c": weights_of(reference)["c"]})
        # "w" (module "c") plays only in the second learner's episodes.
        episodes = [episode(6, "xy", seed=4), episode(2, "xw", seed=5), episode(4, "yw", seed=6)]
        got = group.update_from_episodes(episodes)
        reference.update_from_episodes(episodes)
        assert got["c"]["num_module_steps_trained"] == 6
        assert_close(assert_ranks_agree(group), weights_of(reference))
    finally:
        group.remove_module("c", new_should_module_be_updated=TRAINED)
    # Episodes whose agent maps to the removed module are rejected everywhere; the group stays usable.
    before = assert_ranks_agree(group)
    with pytest.raises(ValueError, match="rejected by learner rank\\(s\\) \\[1\\].*agent 'w' to module 'c'"):
        group.update_from_episodes([episode(6, "xy", seed=7), episode(6, "xw", seed=8)])
    assert_close(assert_ranks_agree(group), before, atol=0.0)
    group.update_from_episodes([episode(6, "xy", seed=7)])


def test_single_and_multi_agent_episodes_in_one_update_are_refused_before_sending(group):
    single = SingleAgentEpisode(
        observations=np.zeros((3, 4), np.float32), actions=np.zeros(2, np.int64), rewards=np.ones(2, np.float32)
    )
    with pytest.raises(ValueError, match="not a mix: episode 1 is a MultiAgentEpisode, episode 0 a SingleAgentEpisode"):
        group.update_from_episodes([single, episode(2, "x", seed=0)])
    with pytest.raises(ValueError, match="got a dict at index 1"):
        group.update(episodes=[episode(2, "x", seed=0), {"obs": 1}])
    with LearnerGroup(make_learner()) as local:  # the same check for a learner in this process
        with pytest.raises(ValueError, match="not a mix"):
            local.update_from_episodes([episode(2, "x", seed=0), single])


def test_episodes_travel_as_arrays_and_come_back_whole():
    running = MultiAgentEpisode("game", agent_to_module_mapping_fn=lambda agent, _: AGENT_MODULES[agent])
    running.add_env_reset({"x": np.ones(4, np.float32)})  # list-backed, and "x" never completes a step
    sent = [episode(3, "xy", seed=1), running]
    wire = episodes_to_wire(sent)
    leaves: list[Any] = []

    def collect(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                collect(item)
        else:
            leaves.append(value)

    collect(wire)
    # Only arrays and scalars: no per-step Python objects, and no mapping function.
    assert all(isinstance(leaf, (np.ndarray, str, bool, int)) for leaf in leaves)
    received = episodes_from_wire(wire)
    for before, after in zip(sent, received):
        assert (after.id_, after.env_t_started, len(after), after.is_terminated) == (
            before.id_, before.env_t_started, len(before), before.is_terminated
        )
        assert after.agent_to_module_mapping == before.agent_to_module_mapping
        for agent_id, agent_episode in before.agent_episodes.items():
            got = after.agent_episodes[agent_id]
            np.testing.assert_array_equal(got.observations, np.asarray(agent_episode.observations))
            np.testing.assert_array_equal(got.actions, np.asarray(agent_episode.actions).reshape(got.actions.shape))
            assert (got.id_, got.is_terminated, got.t_started) == (
                agent_episode.id_, agent_episode.is_terminated, agent_episode.t_started
            )
    assert episodes_from_wire(episodes_to_wire([])) == []
