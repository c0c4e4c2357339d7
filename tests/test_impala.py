"""IMPALA: V-trace on rows and sequences against the kernel and hand computations, the connector
piece, settings, the data contract, a recurrent fit and (slow) learning CartPole."""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from _helpers import make_trainer
from lightning.pytorch import seed_everything

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms.impala import IMPALALearner
from lightning_rl.algorithms.ppo import PPOModule
from lightning_rl.cli import LightningRLCLI
from lightning_rl.connectors import AddNextValues, AddTimeDimToBatchAndZeroPad
from lightning_rl.core.data_contract import SampleReuse
from lightning_rl.core.vtrace import vtrace
from lightning_rl.data import OnPolicyDataModule
from lightning_rl.env import EnvRunner

GAMMA = 0.9
OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
DISCRETE = gym.spaces.Discrete(2)


def spec(module_class: type = PPOModule, **model_config) -> RLModuleSpec:
    config = {"fcnet_hiddens": [16], **model_config}
    return RLModuleSpec(module_class=module_class, observation_space=OBS, action_space=DISCRETE, model_config=config)


def built(learner_class: type = IMPALALearner, **kwargs) -> IMPALALearner:
    learner = learner_class(spec(), gamma=GAMMA, **kwargs)
    learner.build()
    return learner


def two_chunks(seed: int = 0) -> dict[str, torch.Tensor]:
    """Rows of two chunks laid end to end: 3 steps ending in a termination, then 5 steps cut by the rollout."""
    generator = torch.Generator().manual_seed(seed)
    rows = 8
    terminateds = torch.zeros(rows, dtype=torch.bool)
    terminateds[2] = True
    last_in_chunk = torch.zeros(rows, dtype=torch.bool)
    last_in_chunk[[2, 7]] = True
    values_bootstrapped = torch.randn(rows, generator=generator)
    values_bootstrapped[2] = 0.0  # what AddNextValues writes after a terminating step
    return {
        Columns.REWARDS: torch.randn(rows, generator=generator),
        Columns.TERMINATEDS: terminateds,
        Columns.ACTION_LOGP: -torch.rand(rows, generator=generator),
        Columns.VALUES_BOOTSTRAPPED: values_bootstrapped,
        Columns.LAST_IN_CHUNK: last_in_chunk,
        "target_logp": -torch.rand(rows, generator=generator),
        "values": torch.randn(rows, generator=generator),
    }


def rows_vtrace(learner: IMPALALearner, rows: dict[str, torch.Tensor]):
    """The loss's V-trace of a minibatch of rows."""
    config = learner.config_for_module("default_policy")
    return learner.compute_vtrace(config=config, batch=rows, target_logp=rows["target_logp"], values=rows["values"])


def n_step_returns(rewards: list[float], bootstrap: float, gamma: float) -> list[float]:
    """``sum_k gamma^k r_{t+k} + gamma^(n-t) * bootstrap`` for every step of one sequence, by hand."""
    returns = []
    for t in range(len(rewards)):
        total = sum(gamma ** (k - t) * rewards[k] for k in range(t, len(rewards)))
        returns.append(total + gamma ** (len(rewards) - t) * bootstrap)
    return returns


# ---- V-trace on the time axis -------------------------------------------------------------


def test_vtrace_on_rows_equals_the_kernel_on_hand_made_time_major_sequences():
    learner = built(vtrace_clip_rho_threshold=1.2, vtrace_clip_pg_rho_threshold=0.8)
    rows = two_chunks()
    out = rows_vtrace(learner, rows)

    # The same steps laid out by hand: [T=5, B=2], the terminated chunk padded after its 3 steps.
    def time_major(column: torch.Tensor) -> torch.Tensor:
        padded = torch.zeros(5, 2, dtype=column.dtype)
        padded[:3, 0], padded[:, 1] = column[:3], column[3:]
        return padded

    mask = time_major(torch.ones(8, dtype=torch.bool))
    discounts = GAMMA * (1.0 - rows[Columns.TERMINATEDS].float())
    expected = vtrace(
        target_logp=time_major(rows["target_logp"]),
        behaviour_logp=time_major(rows[Columns.ACTION_LOGP]),
        rewards=time_major(rows[Columns.REWARDS]),
        values=time_major(rows["values"]),
        bootstrap_values=rows[Columns.VALUES_BOOTSTRAPPED][[2, 7]],
        discounts=time_major(discounts),
        loss_mask=mask,
        clip_rho_threshold=1.2,
        clip_pg_rho_threshold=0.8,
    )
    def as_rows(time_major_column: torch.Tensor) -> torch.Tensor:
        return torch.cat([time_major_column[:3, 0], time_major_column[:, 1]])

    torch.testing.assert_close(out.vs, as_rows(expected.vs))
    torch.testing.assert_close(out.pg_advantages, as_rows(expected.pg_advantages))


def test_on_policy_vtrace_is_the_n_step_return_bootstrapped_at_each_chunk_end():
    learner = built(vtrace_clip_rho_threshold=float("inf"), vtrace_clip_pg_rho_threshold=float("inf"))
    rows = two_chunks()
    rows["target_logp"] = rows[Columns.ACTION_LOGP].clone()  # pi == mu
    out = rows_vtrace(learner, rows)
    rewards = rows[Columns.REWARDS].tolist()
    # The terminated chunk is worth 0 after its last step; the cut one bootstraps from V(x_8).
    expected = n_step_returns(rewards[:3], 0.0, GAMMA)
    expected += n_step_returns(rewards[3:], float(rows[Columns.VALUES_BOOTSTRAPPED][7]), GAMMA)
    torch.testing.assert_close(out.vs, torch.tensor(expected))
    # The advantages are the one-step errors of the next step's target.
    next_vs = torch.tensor([*expected[1:3], 0.0, *expected[4:], float(rows[Columns.VALUES_BOOTSTRAPPED][7])])
    discounts = GAMMA * (1.0 - rows[Columns.TERMINATEDS].float())
    torch.testing.assert_close(out.pg_advantages, rows[Columns.REWARDS] + discounts * next_vs - rows["values"])


def test_a_minibatch_cut_inside_a_chunk_bootstraps_from_values_bootstrapped_at_its_last_row():
    learner = built(vtrace_clip_rho_threshold=float("inf"), vtrace_clip_pg_rho_threshold=float("inf"))
    rows = two_chunks()
    rows["target_logp"] = rows[Columns.ACTION_LOGP].clone()
    minibatch = {name: column[3:6] for name, column in rows.items()}  # inside the second chunk
    out = rows_vtrace(learner, minibatch)
    bootstrap = float(rows[Columns.VALUES_BOOTSTRAPPED][5])
    expected = n_step_returns(rows[Columns.REWARDS][3:6].tolist(), bootstrap, GAMMA)
    torch.testing.assert_close(out.vs, torch.tensor(expected))


def test_sequences_bootstrap_from_values_bootstrapped_at_their_last_real_step():
    learner = built(vtrace_clip_rho_threshold=float("inf"), vtrace_clip_pg_rho_threshold=float("inf"))
    rows = two_chunks()
    rows["target_logp"] = rows[Columns.ACTION_LOGP].clone()
    # [S=2, T=4]: the second chunk's first 4 steps (cut by max_seq_len), then its last step padded.
    sequences = {
        name: torch.stack([column[3:7], torch.cat([column[7:8], column.new_zeros(3)])]) for name, column in rows.items()
    }
    sequences[Columns.LOSS_MASK] = torch.tensor([[True] * 4, [True, False, False, False]])
    config = learner.config_for_module("default_policy")
    out = learner.compute_vtrace(
        config=config, batch=sequences, target_logp=sequences["target_logp"], values=sequences["values"]
    )
    rewards = rows[Columns.REWARDS].tolist()
    bootstraps = rows[Columns.VALUES_BOOTSTRAPPED]
    torch.testing.assert_close(out.vs[0], torch.tensor(n_step_returns(rewards[3:7], float(bootstraps[6]), GAMMA)))
    torch.testing.assert_close(out.vs[1, :1], torch.tensor(n_step_returns(rewards[7:8], float(bootstraps[7]), GAMMA)))
    assert torch.all(out.vs[1, 1:] == 0)


def test_the_loss_is_policy_gradient_plus_value_loss_minus_entropy_bonus():
    learner = built(entropy_coeff=0.1, vf_loss_coeff=0.25)
    rows = two_chunks()
    module = learner.module["default_policy"]
    rows[Columns.OBS] = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    rows[Columns.ACTIONS] = torch.tensor([0, 1, 1, 0, 0, 1, 0, 1])
    fwd_out = module.forward_train(rows)
    config = learner.config_for_module("default_policy")
    loss = learner.compute_loss_for_module(module_id="default_policy", config=config, batch=rows, fwd_out=fwd_out)

    dist = module.get_train_action_dist_cls().from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
    logp, values = dist.logp(rows[Columns.ACTIONS]), fwd_out[Columns.VF_PREDS]
    out = learner.compute_vtrace(config=config, batch=rows, target_logp=logp, values=values)
    policy_loss = -(logp * out.pg_advantages).mean()
    vf_loss = 0.5 * (values - out.vs).pow(2).mean()
    expected = policy_loss + 0.25 * vf_loss - 0.1 * dist.entropy().mean()
    torch.testing.assert_close(loss, expected)


# ---- The connector piece -----------------------------------------------------------------


def test_add_next_values_gives_each_row_the_value_of_the_next_observation_and_marks_chunk_ends():
    runner = EnvRunner("CartPole-v1", num_envs=2, rollout_fragment_length=30, seed=0)
    module_spec = RLModuleSpec(
        module_class=PPOModule,
        observation_space=runner.observation_space,
        action_space=runner.action_space,
        model_config={"fcnet_hiddens": [8]},
    )
    learner = IMPALALearner(module_spec)
    learner.build()
    module = learner.module["default_policy"]
    episodes = runner.sample(module)
    runner.close()
    assert any(episode.is_terminated for episode in episodes)  # CartPole falls within 30 random steps
    rows = learner.episodes_to_train_batch(episodes)["default_policy"]
    assert any(isinstance(piece, AddNextValues) for piece in learner.learner_connector)

    row = 0
    for episode in episodes:
        observations = torch.as_tensor(np.asarray(episode.observations), dtype=torch.float32)
        with torch.no_grad():
            next_values = module.compute_values({Columns.OBS: observations[1:]})
        if episode.is_terminated:
            next_values[-1] = 0.0
        torch.testing.assert_close(rows[Columns.VALUES_BOOTSTRAPPED][row : row + len(episode)], next_values)
        expected_ends = torch.zeros(len(episode), dtype=torch.bool)
        expected_ends[-1] = True
        assert torch.equal(rows[Columns.LAST_IN_CHUNK][row : row + len(episode)], expected_ends)
        row += len(episode)
    assert row == len(rows[Columns.OBS])


def test_a_recurrent_modules_sequences_carry_the_bootstrap_columns():
    runner = EnvRunner("CartPole-v1", num_envs=2, rollout_fragment_length=12, seed=0)
    model_config = {"fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 5}
    learner = IMPALALearner(
        RLModuleSpec(
            module_class=PPOModule,
            observation_space=runner.observation_space,
            action_space=runner.action_space,
            model_config=model_config,
        ),
        shuffle_batch_per_epoch=True,  # allowed: a stateful module's minibatches are whole sequences
    )
    learner.build()
    episodes = runner.sample(learner.module["default_policy"])
    runner.close()
    batch = learner.episodes_to_train_batch(episodes)["default_policy"]
    mask = batch[Columns.LOSS_MASK]
    assert batch[Columns.VALUES_BOOTSTRAPPED].shape == mask.shape == batch[Columns.LAST_IN_CHUNK].shape
    # One chunk end per episode chunk, each at a real step; none on padding.
    assert int(batch[Columns.LAST_IN_CHUNK].sum()) == len(episodes)
    assert not bool((batch[Columns.LAST_IN_CHUNK] & ~mask).any())
    results = learner.update_from_episodes(episodes, minibatch_size=10, shuffle_batch_per_epoch=True)
    assert math.isfinite(results["default_policy"]["total_loss"])


# ---- Settings and the data contract -------------------------------------------------------


@pytest.mark.parametrize(
    "setting, value",
    [
        ("vtrace_clip_rho_threshold", 0.0),
        ("vtrace_clip_pg_rho_threshold", -1.0),
        ("gamma", 1.5),
        ("vf_loss_coeff", -0.5),
        ("entropy_coeff", [[10, 0.01]]),
        ("circular_buffer_num_batches", 0),
        ("circular_buffer_iterations_per_batch", 1.5),
        ("broadcast_interval", 0),
    ],
)
def test_bad_settings_fail_at_construction_in_one_line_naming_them(setting, value):
    with pytest.raises(ValueError, match=setting) as error:
        IMPALALearner(spec(), **{setting: value})
    assert "\n" not in str(error.value)


def test_cuda_graphs_are_refused_naming_the_reason():
    with pytest.raises(ValueError, match="cuda_graphs"):
        IMPALALearner(spec(), cuda_graphs=True)


def test_shuffled_minibatches_of_a_feed_forward_module_are_refused():
    with pytest.raises(ValueError, match="shuffle_batch_per_epoch=False for feed-forward modules"):
        built(shuffle_batch_per_epoch=True)
    learner = built()
    with pytest.raises(ValueError, match="shuffle_batch_per_epoch=False"):
        learner.update_from_batch({Columns.OBS: np.zeros((2, 4), np.float32)}, shuffle_batch_per_epoch=True)


def test_defaults_are_rllibs_and_data_requirements_carry_the_sample_reuse_settings():
    learner = IMPALALearner(spec())
    hparams = learner.hparams
    assert (hparams.num_epochs, hparams.minibatch_size, hparams.shuffle_batch_per_epoch) == (1, None, False)
    assert (hparams.lr, hparams.grad_clip, hparams.grad_clip_by) == (0.0005, 40.0, "global_norm")
    assert learner.data_requirements().sample_reuse == SampleReuse(1, 1, 1)
    learner = IMPALALearner(
        spec(), circular_buffer_num_batches=3, circular_buffer_iterations_per_batch=2, broadcast_interval=5
    )
    assert learner.data_requirements().sample_reuse == SampleReuse(3, 2, 5)


# ---- Training -----------------------------------------------------------------------------


def test_a_recurrent_module_fits_with_finite_losses(tmp_path: Path):
    seed_everything(0)
    model_config = {"fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 8, "max_seq_len": 5}
    learner = IMPALALearner(model_config=model_config, minibatch_size=20)
    data = OnPolicyDataModule("CartPole-v1", num_envs=2, rollout_fragment_length=16, rollouts_per_epoch=2, seed=0,
                              evaluation_num_episodes=1)  # fmt: skip
    results = []
    trainer = make_trainer(tmp_path, limit_val_batches=0)
    original = learner.update

    def update(*args, **kwargs):
        result = original(*args, **kwargs)
        results.append(result["default_policy"])
        return result

    learner.update = update
    trainer.fit(learner, datamodule=data)
    # The time-axis piece ran last: the losses came from sequences that carried the bootstrap columns.
    assert isinstance(list(learner.learner_connector)[-1], AddTimeDimToBatchAndZeroPad)
    assert len(results) == 2
    for result in results:
        for key in ("total_loss", "policy_loss", "vf_loss", "entropy", "mean_vtrace_rho"):
            assert math.isfinite(result[key]), key


@pytest.mark.parametrize("name", ["IMPALALearner", "APPOLearner"])
def test_the_command_line_finds_both_learners_by_their_short_names(tmp_path: Path, name: str):
    cli = LightningRLCLI(
        args=[
            "fit", "--model", name, "--model.model_config", "{fcnet_hiddens: [8]}",
            "--data", "OnPolicyDataModule", "--data.env", "CartPole-v1", "--data.num_envs", "2",
            "--data.rollout_fragment_length", "16", "--data.rollouts_per_epoch", "2",
            "--data.evaluation_num_episodes", "1", "--trainer.max_epochs", "1", "--trainer.logger", "false",
            "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false",
            "--trainer.default_root_dir", str(tmp_path),
        ]
    )  # fmt: skip
    assert type(cli.model).__name__ == name
    assert math.isfinite(cli.trainer.callback_metrics["default_policy/total_loss"])


@pytest.mark.slow
def test_impala_learns_cartpole(tmp_path: Path):
    seed_everything(0)
    learner = IMPALALearner(model_config={"fcnet_hiddens": [64, 64]}, lr=0.001)
    data = OnPolicyDataModule(
        "CartPole-v1", num_envs=8, rollout_fragment_length=32, rollouts_per_epoch=10, max_env_steps=25_000, seed=0
    )
    trainer = make_trainer(tmp_path, max_epochs=-1)
    trainer.fit(learner, datamodule=data)
    # Seeds 0/1/2 score 442/319/471 after 25k env steps (about 2 s on one core); random play scores ~20.
    assert trainer.callback_metrics["eval/episode_return_mean"] >= 150
