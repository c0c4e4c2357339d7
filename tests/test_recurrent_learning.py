"""Recurrent PPO on the Learner side: episodes cut into zero-padded sequences, trained on whole.

The sequences are hand-checked on episode chunks that cross rollout cuts (``t_started > 0``)
and autoresets; the same episode must give the same action distributions and values stepped
one env step at a time (acting) as replayed in sequences (learning); padded steps get exactly
zero gradient; minibatches and DDP ranks count whole sequences.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import loader_of, make_trainer
from ranks import run_on_ranks
from recurrent_rollouts import Rollouts

from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.connectors import (
    AddColumnsFromEpisodes,
    AddTimeDimToBatchAndZeroPad,
    ConnectorPipeline,
)
from lightning_rl.connectors.episodes import episodes_to_batch, values_along_chunks
from lightning_rl.core.columns import ALL_MODULES, Columns
from lightning_rl.core.metrics import MetricsLogger
from lightning_rl.core.recurrent import unpack_state
from lightning_rl.core.rl_module_specs import MultiRLModuleSpec, RLModuleSpec
from lightning_rl.core.rl_modules import MultiRLModule
from lightning_rl.core.sequences import sequence_layout
from lightning_rl.core.train_item import TrainingData, TrainItem
from lightning_rl.env.episode import SingleAgentEpisode

CARTPOLE = gym.make("CartPole-v1")


def lstm_spec(max_seq_len: int = 4, env: gym.Env = CARTPOLE, **model_config: Any) -> RLModuleSpec:
    config = {
        "fcnet_hiddens": [8],
        "use_lstm": True,
        "lstm_cell_size": 8,
        "max_seq_len": max_seq_len,
        "lstm_use_prev_action": True,
        "lstm_use_prev_reward": True,
        **model_config,
    }
    return RLModuleSpec(
        module_class=PPOModule,
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config=config,
    )


def ff_spec() -> RLModuleSpec:
    return RLModuleSpec(
        module_class=PPOModule,
        observation_space=CARTPOLE.observation_space,
        action_space=CARTPOLE.action_space,
        model_config={"fcnet_hiddens": [8]},
    )


def built(spec: RLModuleSpec | MultiRLModuleSpec, **settings: Any) -> PPOLearner:
    learner = PPOLearner(spec, **settings)
    learner.build()
    return learner


def two_rollouts(module: PPOModule, steps: int = 15, **kwargs: Any) -> list[SingleAgentEpisode]:
    """Two rollouts of 2 envs: whole episodes (autoreset), chunks cut mid-episode, and their continuations."""
    rollouts = Rollouts(module, **kwargs)
    return rollouts.sample(steps) + rollouts.sample(steps)


def stepped(module: PPOModule, rows: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The train pass on every step alone (T = 1), from the state the actor stored for it."""
    with torch.no_grad():
        out = module.forward_train(
            {
                Columns.OBS: rows[Columns.OBS][:, None],
                Columns.STATE_IN: unpack_state(rows[Columns.STATE_IN], module.get_initial_state()),
                Columns.PREV_ACTIONS: rows[Columns.PREV_ACTIONS][:, None],
                Columns.PREV_REWARDS: rows[Columns.PREV_REWARDS][:, None],
            }
        )
    return {key: out[key][:, 0] for key in (Columns.ACTION_DIST_INPUTS, Columns.VF_PREDS)}


# ----------------------------------------------------------------------------------------
# The layout, by hand
# ----------------------------------------------------------------------------------------


def hand_episode(length: int, first_row: int, *, t_started: int = 0, terminated: bool = False) -> SingleAgentEpisode:
    """Observations and packed states that name their row: obs = row, state_in = 100 * (row + 1) + position."""
    rows = first_row + np.arange(length)
    return SingleAgentEpisode(
        observations=np.repeat(np.arange(first_row, first_row + length + 1, dtype=np.float32)[:, None], 4, axis=1),
        actions=np.ones(length, dtype=np.int64),
        rewards=np.ones(length, dtype=np.float32),
        terminated=terminated,
        extra_model_outputs={
            Columns.ACTION_LOGP: np.zeros(length, dtype=np.float32),
            Columns.STATE_IN: (100.0 * (rows[:, None] + 1) + np.arange(32)).astype(np.float32),
            Columns.PREV_ACTIONS: np.ones(length, dtype=np.int64),
            Columns.PREV_REWARDS: np.ones(length, dtype=np.float32),
        },
        t_started=t_started,
    )


def to_sequences_of(rl_module: MultiRLModule, episodes: list[SingleAgentEpisode]) -> dict[str, Any]:
    pipeline = ConnectorPipeline([AddColumnsFromEpisodes(), AddTimeDimToBatchAndZeroPad()])
    return pipeline(rl_module=rl_module, batch={}, episodes=episodes, shared_data={}, metrics=MetricsLogger())


def test_chunks_are_cut_into_zero_padded_sequences_that_start_from_their_stored_states():
    rl_module = MultiRLModuleSpec(rl_module_specs={"p": lstm_spec(max_seq_len=2)}).build()
    # A whole episode of 5 steps, then a chunk of 3 continuing an episode cut at its step 7.
    episodes = [hand_episode(5, 0, terminated=True), hand_episode(3, 5, t_started=7)]
    batch = to_sequences_of(rl_module, episodes)["p"]

    mask = [[True, True], [True, True], [True, False], [True, True], [True, False]]
    assert batch[Columns.LOSS_MASK].tolist() == mask
    assert batch[Columns.OBS][..., 0].tolist() == [[0, 1], [2, 3], [4, 0], [5, 6], [7, 0]]
    assert batch[Columns.TERMINATEDS].tolist() == [[False, False], [False, False], [True, False]] + [[False] * 2] * 2
    assert batch[Columns.ACTIONS].tolist() == [[1, 1], [1, 1], [1, 0], [1, 1], [1, 0]]
    assert batch[Columns.PREV_REWARDS].tolist() == [[1, 1], [1, 1], [1, 0], [1, 1], [1, 0]]
    # Each sequence's state is the one stored for its first row (0, 2, 4, 5, 7), in sorted name order.
    first_rows = torch.tensor([0, 2, 4, 5, 7])
    assert sorted(batch[Columns.STATE_IN]) == ["pi_c", "pi_h", "vf_c", "vf_h"]
    for offset, name in enumerate(["pi_c", "pi_h", "vf_c", "vf_h"]):
        expected = 100.0 * (first_rows[:, None] + 1) + 8 * offset + torch.arange(8)
        torch.testing.assert_close(batch[Columns.STATE_IN][name], expected, rtol=0, atol=0)


def test_feed_forward_rows_pass_untouched():
    ff = MultiRLModuleSpec(rl_module_specs={"p": ff_spec()}).build()
    episode = hand_episode(3, 0)
    columns = AddColumnsFromEpisodes()(rl_module=ff, batch={}, episodes=[episode], shared_data={}, metrics=MetricsLogger())
    kept = dict(columns["p"])
    out = AddTimeDimToBatchAndZeroPad()(rl_module=ff, batch=columns, episodes=[episode], shared_data={}, metrics=MetricsLogger())
    assert out["p"].keys() == kept.keys() and all(out["p"][key] is kept[key] for key in kept)


class LayoutRecordingPPO(PPOLearner):
    """Records each loss call's module and minibatch layout: (module, sequence length or 0 for rows, real steps)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layouts: list[tuple[str, int, int]] = []

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        mask = batch.get(Columns.LOSS_MASK)
        layout = (0, len(batch[Columns.OBS])) if mask is None else (mask.shape[1], int(mask.sum()))
        assert batch[Columns.OBS].dim() == (2 if mask is None else 3)
        self.layouts.append((module_id, *layout))
        return super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)


# simple_spread's agents on modules of three kinds: an LSTM (sequences of 4), a GRU (sequences of 6), an MLP.
MIXED_MODULES = {
    "agent_0": {"fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 4},
    "agent_1": {"fcnet_hiddens": [8], "use_lstm": True, "recurrent_cell": "gru", "lstm_cell_size": 8, "max_seq_len": 6},
    "agent_2": {"fcnet_hiddens": [8]},
}


def mixed_modules_on_simple_spread(**settings: Any) -> tuple[dict[str | None, LayoutRecordingPPO], list[Any]]:
    """Learners of ``MIXED_MODULES`` from the same weights, keyed by the one module each trains (``None``: all of
    them), and simple_spread episodes of 2 env copies the modules acted in, cut mid-episode (chunks continue)."""
    pytest.importorskip("mpe2")
    from lightning_rl.env.multi_agent_runner import MultiAgentEnvRunner

    runner = MultiAgentEnvRunner("mpe2.simple_spread_v3", env_kwargs={"max_cycles": 9}, num_envs=2,
                                 policy_mapping_fn="per_agent", seed=0)  # fmt: skip
    spaces = {"observation_space": runner.observation_space("agent_0"), "action_space": runner.action_space("agent_0")}
    specs = {
        agent: RLModuleSpec(module_class=PPOModule, model_config=config, **spaces)
        for agent, config in MIXED_MODULES.items()
    }
    torch.manual_seed(0)
    learners: dict[str | None, LayoutRecordingPPO] = {}
    for trained in (None, *MIXED_MODULES):
        rule = None if trained is None else [trained]
        spec = MultiRLModuleSpec(rl_module_specs=specs)
        learners[trained] = LayoutRecordingPPO(spec, policies_to_train=rule, **settings)
        learners[trained].build()
        learners[trained].module.load_state_dict(learners[None].module.state_dict())
    episodes = runner.sample(learners[None].module, num_env_steps=13)
    runner.close()
    return learners, episodes


def steps_of(episodes: list[Any], agent: str) -> int:
    return sum(len(episode.agent_episodes[agent]) for episode in episodes if agent in episode.agent_episodes)


def test_stateful_and_feed_forward_modules_train_together_as_each_trains_alone():
    """One Learner, LSTM, GRU and MLP modules of different sequence lengths together (as RLlib allows): on the
    whole batch each module's update is exactly the one a Learner training it alone makes, in its own layout."""
    # A small clip, so clipping acts: it clips each module's gradients by their own norm.
    learners, episodes = mixed_modules_on_simple_spread(grad_clip=0.01)
    start = {name: value.clone() for name, value in learners[None].module.state_dict().items()}
    for learner in learners.values():
        learner.update(episodes=episodes, num_epochs=2)
    together = learners[None].module.state_dict()
    module_of = {name: name.split(".")[1] for name in together}  # "_rl_modules.<module id>.<parameter>"
    assert set(module_of.values()) == set(MIXED_MODULES)
    for agent in MIXED_MODULES:
        alone = learners[agent].module.state_dict()
        for name in together:
            if module_of[name] == agent:
                torch.testing.assert_close(together[name], alone[name], rtol=0, atol=0, msg=name)
            else:  # a Learner training one module leaves the others as they were
                assert torch.equal(alone[name], start[name]), name
        assert any(not torch.equal(start[name], together[name]) for name in start if module_of[name] == agent)
        # Sequences [S, T, obs] of the module's own T, or rows [B, obs]; every step, once per epoch.
        length = MIXED_MODULES[agent].get("max_seq_len", 0)
        layouts = [(t, n) for module, t, n in learners[None].layouts if module == agent]
        assert layouts == [(length, steps_of(episodes, agent))] * 2


def test_minibatches_of_mixed_modules_hold_each_modules_layout_and_a_pass_covers_every_step():
    learners, episodes = mixed_modules_on_simple_spread()
    learner = learners[None]
    learner.update(episodes=episodes, num_epochs=2, minibatch_size=8, shuffle_batch_per_epoch=True)
    calls = {agent: [(t, n) for module, t, n in learner.layouts if module == agent] for agent in MIXED_MODULES}
    assert len({len(found) for found in calls.values()}) == 1  # every module trains at every step
    per_pass = len(calls["agent_2"]) // 2
    for agent, config in MIXED_MODULES.items():
        length = config.get("max_seq_len", 0)
        assert {t for t, _ in calls[agent]} == {length}
        # About 8 real steps a minibatch (whole sequences: those that start in its stretch of 8), every step a pass.
        assert all(n <= 8 + max(length - 1, 0) for _, n in calls[agent])
        assert sum(n for _, n in calls[agent][:per_pass]) >= steps_of(episodes, agent)
    # A minibatch must hold a whole sequence of every stateful module: the GRU's 6 steps name it.
    with pytest.raises(ValueError, match="minibatch_size=5 is below module 'agent_1'.s max_seq_len=6"):
        learner.update(episodes=episodes, minibatch_size=5)


@pytest.mark.slow  # two learner processes (10-20 s)
def test_a_learner_group_trains_mixed_modules_on_two_processes():
    from lightning_rl.learner.group.learner_group import LearnerGroup

    learners, episodes = mixed_modules_on_simple_spread()
    before = {module_id: {name: value.detach().clone() for name, value in module.state_dict().items()}
              for module_id, module in learners[None].module.items()}  # fmt: skip
    with LearnerGroup(learners[None], num_learners=2, num_threads_per_learner=1) as group:
        results = group.update(episodes=episodes, num_epochs=2, minibatch_size=8)  # the ranks split the episodes
        after = group.get_weights()
    assert set(results) >= set(MIXED_MODULES)
    for module_id in MIXED_MODULES:
        moved = [not np.array_equal(before[module_id][name].numpy(), value) for name, value in after[module_id].items()]
        assert any(moved), module_id


def test_a_stateful_module_needs_stored_states_and_a_sequence_batch():
    learner = built(lstm_spec())
    episode = hand_episode(3, 0)
    del episode.extra_model_outputs[Columns.STATE_IN]
    with pytest.raises(ValueError, match="state_in"):
        learner.episodes_to_train_batch([episode])
    rows = {key: value.numpy() for key, value in episodes_to_batch([hand_episode(3, 0)], torch.device("cpu")).items()}
    rows.update(advantages=np.zeros(3, np.float32), value_targets=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="must be sequences"):
        learner.update_from_batch(rows)


def test_the_learner_ends_its_connector_with_the_time_axis_only_for_stateful_modules():
    def user_piece(*, batch, **_: Any):
        return batch

    stateful = built(lstm_spec(), learner_connector_pieces=[user_piece])
    assert isinstance(list(stateful.learner_connector)[-1], AddTimeDimToBatchAndZeroPad)
    feed_forward = built(ff_spec())
    assert not any(isinstance(piece, AddTimeDimToBatchAndZeroPad) for piece in feed_forward.learner_connector)


# ----------------------------------------------------------------------------------------
# Acting and learning agree
# ----------------------------------------------------------------------------------------


def test_recorded_chunks_cross_rollout_cuts_and_autoresets():
    learner = built(lstm_spec())
    episodes = two_rollouts(learner.module["default_policy"])
    continued = [episode for episode in episodes if episode.t_started > 0]
    started = [episode for episode in episodes if episode.t_started == 0]
    # Past the 2 first episodes, every episode that starts at step 0 started at an autoreset.
    assert continued and len(started) > 2 and max(map(len, episodes)) > 4
    for episode in started:  # an episode's first step: the initial state, no previous action or reward
        assert not episode.extra_model_outputs[Columns.STATE_IN][0].any()
        assert episode.extra_model_outputs[Columns.PREV_REWARDS][0] == 0
        assert episode.extra_model_outputs[Columns.PREV_ACTIONS][0] == 0
    for episode in continued:  # a continuation starts from the state the actor carried over the cut
        assert episode.extra_model_outputs[Columns.STATE_IN][0].any()
        assert episode.extra_model_outputs[Columns.PREV_REWARDS][0] == 1


@pytest.mark.parametrize(
    "model_config",
    [{}, {"recurrent_cell": "gru", "vf_share_layers": True}],
    ids=["lstm-separate", "gru-shared"],
)
def test_acting_and_learning_give_the_same_distributions_and_values(model_config):
    learner = built(lstm_spec(max_seq_len=4, **model_config), minibatch_size=None)
    module = learner.module["default_policy"]
    episodes = two_rollouts(module, steps=20, max_episode_steps=40)
    assert max(map(len, episodes)) > 4 and any(episode.t_started > 0 for episode in episodes)
    rows = episodes_to_batch(episodes, torch.device("cpu"))
    acting = stepped(module, rows)
    # What acting computed while stepping is what the stored state reproduces one step at a time.
    torch.testing.assert_close(acting[Columns.ACTION_DIST_INPUTS], rows[Columns.ACTION_DIST_INPUTS], rtol=0, atol=1e-5)

    batch = learner.episodes_to_train_batch(episodes)["default_policy"]
    mask = batch[Columns.LOSS_MASK]
    assert (~mask).any() and mask.shape[1] == 4
    with torch.no_grad():
        learning = module.forward_train(batch)
    for key in (Columns.ACTION_DIST_INPUTS, Columns.VF_PREDS):
        torch.testing.assert_close(learning[key][mask], acting[key], rtol=0, atol=1e-5)
    # GAE's values (each chunk one sequence from its first stored state) are the stepping values too.
    torch.testing.assert_close(batch[Columns.VF_PREDS][mask], acting[Columns.VF_PREDS], rtol=0, atol=1e-5)


def test_the_bootstrap_value_of_a_cut_chunk_comes_from_the_state_after_its_last_step():
    learner = built(lstm_spec())
    module = learner.module["default_policy"]
    rollouts = Rollouts(module, num_envs=1, max_episode_steps=200)
    first = rollouts.sample(9)[-1]
    second = rollouts.sample(3)[0]
    assert first.id_ == second.id_ and second.t_started == 9 and not first.is_done
    rows = episodes_to_batch([first], torch.device("cpu"))
    _, last_values = values_along_chunks(rows, [first], module.compute_values, module.get_initial_state())
    # The continuation's first step is stored with the state after the cut and the last action and reward.
    after_cut = stepped(module, episodes_to_batch([second], torch.device("cpu")))[Columns.VF_PREDS][0]
    torch.testing.assert_close(last_values[0], after_cut, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------------------
# The loss and the update
# ----------------------------------------------------------------------------------------


def _gradients(learner: PPOLearner, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    module = learner.module["default_policy"]
    module.zero_grad()
    loss = learner.compute_loss_for_module(
        module_id="default_policy",
        config=learner.config_for_module("default_policy"),
        batch=batch,
        fwd_out=module.forward_train(batch),
    )
    loss.backward()
    return {name: param.grad.clone() for name, param in module.named_parameters()}


@pytest.mark.parametrize("use_kl_loss", [False, True])
def test_a_padded_step_gets_exactly_zero_gradient(use_kl_loss):
    learner = built(lstm_spec(), use_kl_loss=use_kl_loss)
    learner.before_gradient_based_update(timesteps={})
    batch = learner.episodes_to_train_batch(two_rollouts(learner.module["default_policy"]))["default_policy"]
    padded = ~batch[Columns.LOSS_MASK]
    assert padded.any()
    before = _gradients(learner, batch)

    generator = torch.Generator().manual_seed(1)
    perturbed = dict(batch)
    for key in (
        Columns.OBS, Columns.ADVANTAGES, Columns.VALUE_TARGETS, Columns.ACTION_LOGP, Columns.PREV_REWARDS,
        Columns.ACTION_DIST_INPUTS,
    ):
        noise = 100 * torch.randn(batch[key].shape, generator=generator)
        where = padded.reshape(*padded.shape, *[1] * (batch[key].dim() - 2))
        perturbed[key] = torch.where(where, noise, batch[key])
    perturbed[Columns.ACTIONS] = torch.where(padded, torch.ones_like(batch[Columns.ACTIONS]), batch[Columns.ACTIONS])
    after = _gradients(learner, perturbed)
    assert any(gradient.abs().sum() > 0 for gradient in before.values())
    for name, gradient in before.items():
        assert torch.equal(gradient, after[name]), name


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_ppo_update_on_recurrent_episodes_trains_on_whole_sequences(env_id):
    learner = built(lstm_spec(max_seq_len=4, env=gym.make(env_id)), num_epochs=2, minibatch_size=8)
    module = learner.module["default_policy"]
    episodes = two_rollouts(module, env_id=env_id)
    shapes: list[tuple[int, ...]] = []
    real_steps: list[int] = []
    compute_loss = learner.compute_loss_for_module

    def recording(**kwargs: Any) -> torch.Tensor:
        shapes.append(tuple(kwargs["batch"][Columns.LOSS_MASK].shape))
        real_steps.append(int(kwargs["batch"][Columns.LOSS_MASK].sum()))
        return compute_loss(**kwargs)

    learner.compute_loss_for_module = recording
    before = {name: value.clone() for name, value in module.state_dict().items()}
    results = learner.update(episodes=episodes, num_epochs=2, minibatch_size=8)

    # minibatch_size 8 counts real env steps: a minibatch is the whole sequences (of 4 steps, some
    # shorter where an episode ended) that start in a stretch of 8 real steps of the pass's order.
    env_steps = sum(map(len, episodes))
    steps_per_epoch = math.ceil(env_steps / 8)
    assert len(shapes) == 2 * steps_per_epoch and all(shape[1] == 4 for shape in shapes)
    for epoch in range(2):  # every sequence once per pass, and each minibatch about 8 real steps
        assert sum(real_steps[epoch * steps_per_epoch : (epoch + 1) * steps_per_epoch]) == env_steps
    assert all(5 <= count <= 11 for count in real_steps[: steps_per_epoch - 1])
    assert results["default_policy"]["weights_seq_no"] == 2 * steps_per_epoch
    assert results[ALL_MODULES]["num_env_steps_trained"] == 2 * env_steps  # real steps, not padding
    assert math.isfinite(results["default_policy"]["total_loss"])
    assert math.isfinite(results["default_policy"]["vf_explained_var"])  # logged on rows, before the time axis
    assert any(not torch.equal(before[name], value) for name, value in module.state_dict().items())


# ----------------------------------------------------------------------------------------
# DDP: ranks with unequal episode lengths take the same sequence minibatch steps
# ----------------------------------------------------------------------------------------


def _ddp_main(rank: int, world_size: int, tmp_path: str) -> dict[str, Any]:
    torch.manual_seed(0)
    learner = PPOLearner(lstm_spec(max_seq_len=4), num_epochs=2, minibatch_size=8, lr=0.01)
    learner.build()
    # Rank 0: two envs for 12 steps; rank 1: one env for 5 steps, so far fewer sequences.
    num_envs, steps = (2, 12) if rank == 0 else (1, 5)
    episodes = Rollouts(learner.module["default_policy"], num_envs=num_envs, seed=10 * rank).sample(steps)
    layout = sequence_layout(torch.tensor([len(episode) for episode in episodes]), 4)
    trainer = make_trainer(tmp_path, strategy="ddp", devices=world_size, use_distributed_sampler=False)
    trainer.fit(learner, train_dataloaders=loader_of([TrainItem(TrainingData(episodes=episodes))]))
    return {
        "num_sequences": layout.num_sequences,
        "seq_no": learner.step_runner.weights_seq_no,
        "weights": {name: value.numpy().copy() for name, value in learner.module["default_policy"].state_dict().items()},
    }


def test_ddp_ranks_with_unequal_episode_lengths_take_equal_sequence_minibatch_steps(tmp_path):
    rank0, rank1 = run_on_ranks(_ddp_main, str(tmp_path), timeout=60)
    assert rank0["num_sequences"] > rank1["num_sequences"]
    # 2 epochs of ceil(sequences of the larger rank / 2 sequences per minibatch), on both ranks.
    assert rank0["seq_no"] == rank1["seq_no"] == 2 * math.ceil(rank0["num_sequences"] / 2)
    for name, value in rank0["weights"].items():
        np.testing.assert_array_equal(value, rank1["weights"][name], err_msg=name)


def test_sequence_minibatches_group_whole_sequences_by_the_real_steps_they_start_in():
    from lightning_rl.core.batch import iterate_minibatches

    # Five sequences of T = 4 with 4, 1, 4, 2 and 3 real steps (14 in all), in order.
    loss_mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    batch = {"p": {Columns.LOSS_MASK: loss_mask, Columns.OBS: torch.arange(5.0)[:, None].expand(5, 4)}}
    minibatches = list(iterate_minibatches(batch, num_epochs=1, minibatch_size=5, shuffle=False))
    # ceil(14 / 5) = 3 steps. Starts at real steps 0, 4, 5, 9, 11: stretches [0, 5), [5, 10) and
    # [10, 15) -> sequences {0, 1}, {2, 3} and {4}.
    assert [mb["p"][Columns.OBS][:, 0].tolist() for mb in minibatches] == [[0.0, 1.0], [2.0, 3.0], [4.0]]
    for _ in range(5):  # shuffled: every sequence exactly once per pass, in ceil(14 / 5) steps
        passes = list(iterate_minibatches(batch, num_epochs=2, minibatch_size=5, shuffle=True))
        assert len(passes) == 2 * 3
        for first in (0, 3):
            seen = sorted(v for mb in passes[first : first + 3] for v in mb["p"][Columns.OBS][:, 0].tolist())
            assert seen == [0.0, 1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match="max_seq_len"):
        list(iterate_minibatches(batch, num_epochs=1, minibatch_size=3, shuffle=False))


@pytest.mark.parametrize(
    "observation_space",
    [
        gym.spaces.Box(0, 255, (12, 12, 3), np.uint8),  # an image: the CNN runs per step, before the cell
        gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (12, 12, 3), np.uint8), "speed": gym.spaces.Box(-1, 1, (2,))}),
    ],
    ids=["image", "dict"],
)
def test_image_and_dict_encoders_sit_in_front_of_the_cell_and_acting_matches_learning(observation_space):
    from lightning_rl.core.acting import Acting
    from lightning_rl.core.observation_layout import ObservationLayout

    torch.manual_seed(0)
    config = {"use_lstm": True, "lstm_cell_size": 8, "fcnet_hiddens": [8], "conv_filters": [[4, 3, 2]]}
    module = PPOModule(observation_space, gym.spaces.Discrete(3), model_config=config)
    assert module.pi_obs_encoder is not None and any(isinstance(m, torch.nn.Conv2d) for m in module.modules())
    layout = ObservationLayout(observation_space)
    observation_space.seed(0)
    obs = torch.as_tensor(np.stack([layout.flatten_one(observation_space.sample()) for _ in range(10)]))
    acting = Acting(module, num_rows=2)
    stepped_logits, states = [], []
    with torch.no_grad():
        for t in range(5):  # two rows, five steps
            out, _ = acting.act(obs[2 * t : 2 * t + 2], explore=False)
            stepped_logits.append(out[Columns.ACTION_DIST_INPUTS])
            states.append(out[Columns.STATE_IN])
        replayed = module.forward_train(
            {Columns.OBS: obs.reshape(5, 2, *obs.shape[1:]).transpose(0, 1),
             Columns.STATE_IN: unpack_state(states[0], module.get_initial_state())}
        )  # fmt: skip
    torch.testing.assert_close(replayed[Columns.ACTION_DIST_INPUTS], torch.stack(stepped_logits, dim=1), atol=1e-5, rtol=0)
