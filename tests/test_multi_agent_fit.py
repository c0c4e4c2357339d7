"""``MultiAgentDataModule`` under ``Trainer.fit``: PettingZoo envs, policy mapping, evaluation, DDP."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from ranks import run_on_ranks

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")

from lightning_rl.algorithms.ppo import PPOLearner  # noqa: E402
from lightning_rl.data import MultiAgentDataModule  # noqa: E402


def _trainer(**kwargs: Any) -> Trainer:
    settings = dict(
        accelerator="cpu", devices=1, max_epochs=-1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1, num_sanity_val_steps=0,
    )  # fmt: skip
    settings.update(kwargs)
    return Trainer(**settings)


def _weights(learner: PPOLearner) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in learner.module.state_dict().items()}


def _main(agent_id: str, episode: Any) -> str:
    return "main"


def test_a_shared_policy_on_simple_spread_trains_and_logs_agent_and_module_returns():
    seed_everything(0)
    learner = PPOLearner(model_config={"fcnet_hiddens": [16]}, num_epochs=1, minibatch_size=64)
    data = MultiAgentDataModule(
        "mpe2.simple_spread_v3", env_kwargs={"max_cycles": 10}, num_envs=2, rollout_fragment_length=15, seed=0,
        rollouts_per_epoch=2, max_env_steps=60, evaluation_num_episodes=2,
    )  # fmt: skip
    trainer = _trainer()
    trainer.fit(learner, datamodule=data)

    assert sorted(learner.module.keys()) == ["default_policy"]
    # 2 copies x 15 env steps per rollout, 2 rollouts; every agent acts at every env step.
    assert data.num_env_steps_sampled_lifetime == 60
    assert data.num_agent_steps_sampled_lifetime == 180
    metrics = trainer.callback_metrics
    agent_returns = [float(metrics[f"env_runners/agent_episode_return_mean/agent_{i}"]) for i in range(3)]
    module_return = float(metrics["env_runners/module_episode_return_mean/default_policy"])
    assert all(math.isfinite(value) and value < 0 for value in agent_returns)  # distances are penalties
    assert module_return == pytest.approx(np.mean(agent_returns), rel=1e-5)
    # The env's return is the sum over its agents; so is evaluation's.
    assert float(metrics["env_runners/episode_return_mean"]) == pytest.approx(sum(agent_returns), rel=1e-5)
    assert math.isfinite(float(metrics["eval/episode_return_mean"]))
    assert float(metrics["eval/episode_len_mean"]) == 10
    assert float(metrics["default_policy/num_module_steps_trained"]) > 0


def test_one_module_per_agent_in_a_turn_based_game_trains_both_players():
    seed_everything(0)
    learner = PPOLearner(model_config={"fcnet_hiddens": [16]}, num_epochs=1, minibatch_size=32)
    data = MultiAgentDataModule(
        "pettingzoo.classic.connect_four_v3", policy_mapping_fn="per_agent", num_envs=2,
        rollout_fragment_length=40, seed=0, rollouts_per_epoch=1, max_env_steps=80, evaluation_num_episodes=1,
    )  # fmt: skip
    trainer = _trainer(limit_val_batches=0)
    learner_spaces = data.module_spaces
    assert sorted(learner_spaces) == ["player_0", "player_1"]
    trainer.fit(learner, datamodule=data)
    assert sorted(learner.module.keys()) == ["player_0", "player_1"]
    for module_id in ("player_0", "player_1"):
        optimizer = learner.get_optimizer(module_id)
        assert optimizer.state, f"{module_id}'s optimizer never stepped"
        assert learner.module[module_id].observation_space == learner_spaces[module_id][0]
    # Connect four takes one move per env step: agent steps equal env steps, minus moves still pending.
    assert 0 < data.num_agent_steps_sampled_lifetime <= data.num_env_steps_sampled_lifetime


def test_evaluation_plays_fixed_opponents_in_both_seats_and_logs_win_rates():
    seed_everything(0)
    learner = PPOLearner(model_config={"fcnet_hiddens": [16]})
    data = MultiAgentDataModule(
        "pettingzoo.classic.connect_four_v3", policy_mapping_fn=_main, num_envs=3, seed=0,
        evaluation_num_episodes=6, evaluation_opponents=["random", "heuristic"], evaluation_module_id="main",
    )  # fmt: skip
    seen: list[Any] = []
    sample_eval = data.sample_eval_item

    def recording_eval():
        item = sample_eval()
        seen.append(item)
        return item

    data.sample_eval_item = recording_eval
    trainer = _trainer()
    trainer.validate(learner, datamodule=data)

    (item,) = seen
    assert len(item.data.episodes) == 6
    rates = {key: float(value) for key, value in trainer.callback_metrics.items() if key.startswith("eval/win_rate")}
    assert set(rates) == {"eval/win_rate_vs_random", "eval/win_rate_vs_heuristic"}
    # 6 games each: a rate is a count of wins over 6.
    for value in rates.values():
        assert 0 <= value <= 1 and (value * 6) == pytest.approx(round(value * 6))


def test_evaluation_opponents_need_a_module_and_known_names():
    with pytest.raises(ValueError, match="evaluation_module_id"):
        MultiAgentDataModule("pettingzoo.classic.connect_four_v3", evaluation_opponents=["random"])
    with pytest.raises(ValueError, match="unknown opponents \\['grandmaster'\\]"):
        MultiAgentDataModule(
            "pettingzoo.classic.connect_four_v3", evaluation_opponents=["grandmaster"], evaluation_module_id="main"
        )
    with pytest.raises(ValueError, match="policy_mapping_fn"):
        MultiAgentDataModule("pettingzoo.classic.connect_four_v3", policy_mapping_fn="everyone_for_themselves")


def _two_modules_on_rank(rank: int, world_size: int) -> dict[str, Any]:
    from lightning.pytorch import Trainer, seed_everything

    from lightning_rl.algorithms.ppo import PPOLearner
    from lightning_rl.data import MultiAgentDataModule

    seed_everything(0)
    learner = PPOLearner(model_config={"fcnet_hiddens": [16]}, num_epochs=2, minibatch_size=16)
    data = MultiAgentDataModule(
        "pettingzoo.classic.connect_four_v3", policy_mapping_fn="per_agent", num_envs=2,
        rollout_fragment_length=30, seed=0, rollouts_per_epoch=2, max_env_steps=240,
    )  # fmt: skip
    trainer = Trainer(
        accelerator="cpu", strategy="ddp", devices=world_size, max_epochs=-1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    first_obs, start = [], {}
    sample = data.sample_train_item

    def recording_sample():
        if not start:  # the first rollout: the weights as built, before any update
            start.update({name: value.detach().clone().numpy() for name, value in learner.module.state_dict().items()})
        item = sample()
        first_obs.append(np.array(item.data.episodes[0].agent_episodes["player_0"].observations[1]))
        return item

    data.sample_train_item = recording_sample
    trainer.fit(learner, datamodule=data)
    return {
        "weights": {name: value.detach().clone().numpy() for name, value in learner.module.state_dict().items()},
        "start": start,
        "modules": sorted(learner.module.keys()),
        "env_steps": data.num_env_steps_sampled_lifetime,
        "first_obs": first_obs,
    }


def test_two_ddp_ranks_train_two_modules_identically_on_their_own_games():
    ranks = run_on_ranks(_two_modules_on_rank, world_size=2)
    for result in ranks:
        assert result["modules"] == ["player_0", "player_1"]
        assert result["env_steps"] == 240  # 2 ranks x 2 copies x 30 moves, twice: the budget, over all ranks
    weights_0, weights_1 = ranks[0]["weights"], ranks[1]["weights"]
    assert weights_0.keys() == weights_1.keys()
    for name in weights_0:
        np.testing.assert_array_equal(weights_0[name], weights_1[name], err_msg=name)
    # Both modules learned, and the ranks played different games (their envs are seeded apart).
    for module_id in ("player_0", "player_1"):
        moved = [
            name for name in weights_0
            if name.startswith(f"_rl_modules.{module_id}.") and not np.array_equal(weights_0[name], ranks[0]["start"][name])
        ]  # fmt: skip
        assert moved, f"{module_id} did not train"
    assert any(not np.array_equal(a, b) for a, b in zip(ranks[0]["first_obs"], ranks[1]["first_obs"]))


@pytest.mark.parametrize(
    ("config", "overrides", "logged"),
    [
        (
            "ppo_simple_spread.yaml",
            ["--data.init_args.num_envs", "2", "--data.init_args.max_env_steps", "400"],
            "env_runners/agent_episode_return_mean/agent_2",
        ),
        (
            "ppo_connect_four_selfplay.yaml",
            ["--data.init_args.num_envs", "4", "--data.init_args.rollout_fragment_length", "32",
             "--data.init_args.max_env_steps", "1024", "--model.init_args.minibatch_size", "64"],
            "eval/win_rate_vs_heuristic",
        ),
    ],
)  # fmt: skip
def test_the_multi_agent_example_configs_run_from_the_command_line(tmp_path, config, overrides, logged):
    from lightning_rl.cli import LightningRLCLI

    examples = Path(__file__).resolve().parent.parent / "examples"
    cli = LightningRLCLI(
        args=[
            "fit", "--config", str(examples / config), "--trainer.default_root_dir", str(tmp_path),
            "--trainer.enable_progress_bar", "false", "--data.init_args.rollout_fragment_length", "25",
            "--data.init_args.rollouts_per_epoch", "8", "--data.init_args.evaluation_num_episodes", "4",
            *overrides,
        ]
    )  # fmt: skip
    assert logged in cli.trainer.callback_metrics
    assert (tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt").exists()
    if config.startswith("ppo_connect_four"):
        # 8 rollouts, the league evaluated after the 5th: main_v0 joined, frozen, beside the fixed opponents.
        assert sorted(cli.model.module.keys()) == ["fixed_heuristic", "fixed_random", "main", "main_v0"]
        assert not any(cli.model.should_module_be_updated(m) for m in ("main_v0", "fixed_random", "fixed_heuristic"))
        # The example's CNN: the [6, 7, 2] board as a 2-channel image, shared by the policy and the value head.
        from lightning_rl.core.encoders import ImageEncoder

        encoder = cli.model.module["main"].obs_encoder
        assert isinstance(encoder, ImageEncoder) and (encoder.image.channels, encoder.image.height) == (2, 6)


def test_evaluation_plays_exactly_the_games_it_starts_long_ones_included():
    from lightning_rl.env.multi_agent_runner import MultiAgentEnvRunner
    from lightning_rl.env.opponents import RandomLegalModule

    runner = MultiAgentEnvRunner("pettingzoo.classic.connect_four_v3", num_envs=8, seed=0)
    space, actions = runner.observation_space("player_0"), runner.action_space("player_0")
    random_player = RandomLegalModule(observation_space=space, action_space=actions, model_config={"seed": 0})
    episodes = runner.sample_episodes(random_player, num_episodes=5)
    lengths = [len(episode) for episode in episodes]
    # 5 games on 5 of the 8 copies, each played to its end: as long as random games run (~21 moves),
    # not just the first 5 of 8 to finish.
    assert len(episodes) == 5 and all(episode.is_done for episode in episodes)
    assert len({episode.id_ for episode in episodes}) == 5
    reference = [len(e) for e in MultiAgentEnvRunner("pettingzoo.classic.connect_four_v3", num_envs=1, seed=0)
                 .sample_episodes(random_player, num_episodes=20)]  # fmt: skip
    assert np.mean(lengths) > 0.6 * np.mean(reference)
    runner.close()


def test_a_data_module_used_again_goes_on_from_its_last_seeds_and_statistics():
    seed_everything(0)
    learner = PPOLearner(model_config={"fcnet_hiddens": [8]}, num_epochs=1, minibatch_size=32)
    data = MultiAgentDataModule(
        "mpe2.simple_spread_v3", env_kwargs={"max_cycles": 5}, num_envs=1, rollout_fragment_length=10, seed=0,
        rollouts_per_epoch=1, max_env_steps=10,
    )  # fmt: skip
    _trainer(limit_val_batches=0).fit(learner, datamodule=data)
    first_state = data.state_dict()["train_runner"]
    data.hparams.max_env_steps = 20
    _trainer(limit_val_batches=0).fit(learner, datamodule=data)
    second_state = data.state_dict()["train_runner"]
    assert second_state["num_episodes_lifetime"] > first_state["num_episodes_lifetime"]
    assert data.num_env_steps_sampled_lifetime == 20


def test_each_rank_samples_from_its_own_stream_also_after_a_resume():
    from types import SimpleNamespace

    def data_on_rank(rank: int) -> MultiAgentDataModule:
        data = MultiAgentDataModule("pettingzoo.classic.connect_four_v3", seed=0)
        data.trainer = SimpleNamespace(global_rank=rank, world_size=2)
        return data

    def draws(data: MultiAgentDataModule) -> list[float]:
        with data._sampling_stream(torch.device("cpu")):
            return torch.rand(3).tolist()

    rank_0, rank_1 = data_on_rank(0), data_on_rank(1)
    assert draws(rank_0) != draws(rank_1)
    saved = rank_0.state_dict()  # Lightning writes rank 0's state, and every rank loads it
    resumed_0, resumed_1 = data_on_rank(0), data_on_rank(1)
    resumed_0.load_state_dict(saved)
    resumed_1.load_state_dict(saved)
    next_0 = draws(resumed_0)
    assert next_0 == draws(rank_0)  # rank 0 goes on where it stopped
    assert draws(resumed_1) != next_0
    # The global generator (minibatch shuffling) is left where it was.
    torch.manual_seed(5)
    expected = torch.rand(1)
    torch.manual_seed(5)
    draws(resumed_1)
    assert torch.rand(1) == expected
