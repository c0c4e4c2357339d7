"""Action masks for DQN, and connect four against a fixed opponent as a single-agent env.

DQN's greedy and exploring actions stay legal (also through ``Policy`` and an exported graph);
its target maximizes over the next state's legal actions, whose mask the replay rows carry; a
terminal state without legal actions gives a finite loss; SAC, IQL and CQL refuse masked
observations by name. ``AgainstOpponentEnv``: seats, rewards, legal opponent moves, seeding, and
short ``lightning-rl fit`` runs of ``examples/dqn_connect_four.yaml`` and ``ppo_connect_four.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms.appo import APPOLearner
from lightning_rl.algorithms.cql import CQLLearner, CQLModule
from lightning_rl.algorithms.dqn import DQNLearner, DQNModule
from lightning_rl.algorithms.impala import IMPALALearner
from lightning_rl.algorithms.iql import IQLLearner, IQLModule
from lightning_rl.algorithms.off_policy import N_STEP, WEIGHTS
from lightning_rl.algorithms.ppo import PPOLearner, PPOModule
from lightning_rl.algorithms.sac import SACLearner, SACModule
from lightning_rl.cli import LightningRLCLI, evaluate_command, record_command
from lightning_rl.connectors.add_columns import split_action_masks
from lightning_rl.core.action_masks import NEXT_ACTION_MASK, masked_argmax, random_legal_actions
from lightning_rl.core.observation_layout import ObservationLayout
from lightning_rl.data import AsyncSamplingDataModule
from lightning_rl.data.prioritized_replay import PrioritizedReplayBuffer
from lightning_rl.data.uniform_replay import ReplayBuffer
from lightning_rl.env import EnvRunner
from lightning_rl.policy import Policy
from lightning_rl.policy.export import export_policy

pytest.importorskip("pettingzoo")
from lightning_rl.env.against_opponent import AgainstOpponentEnv  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = str(REPO / "examples" / "dqn_connect_four.yaml")
PPO_EXAMPLE = str(REPO / "examples" / "ppo_connect_four.yaml")
NUM_ACTIONS = 5
OBS_PART = gym.spaces.Box(-10.0, 10.0, (NUM_ACTIONS,), np.float32)
MASKED = gym.spaces.Dict({"action_mask": gym.spaces.Box(0, 1, (NUM_ACTIONS,), np.int8), "observation": OBS_PART})
ACTIONS = gym.spaces.Discrete(NUM_ACTIONS)
MODULE_ID = "default_policy"


def random_masks(rows: int, seed: int) -> torch.Tensor:
    """Bool masks ``[rows, NUM_ACTIONS]`` with at least one legal action per row."""
    generator = torch.Generator().manual_seed(seed)
    masks = torch.rand(rows, NUM_ACTIONS, generator=generator) < 0.4
    masks[torch.arange(rows), torch.randint(NUM_ACTIONS, (rows,), generator=generator)] = True
    return masks


def masked_dqn_module(**model_config: Any) -> DQNModule:
    torch.manual_seed(0)
    return DQNModule(MASKED, ACTIONS, {"fcnet_hiddens": [16], **model_config})


def identity_learner(**kwargs: Any) -> DQNLearner:
    """A Learner on the masked space whose online and target ``Q(s) = s``: the hand-set values are the Q values."""
    spec = RLModuleSpec(DQNModule, observation_space=MASKED, action_space=ACTIONS, model_config={"fcnet_hiddens": []})
    learner = DQNLearner(spec, **kwargs)
    learner.build()
    module = learner.module[MODULE_ID]
    with torch.no_grad():
        for net in (module.q_net, module.target_q_net):
            net.q[0].weight.copy_(torch.eye(NUM_ACTIONS))
            net.q[0].bias.zero_()
    return learner


def td_errors_of(learner: DQNLearner, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and per-row TD errors of one batch, computed as an update does."""
    reported = {}
    learner.record_td_errors = lambda module_id, td_errors: reported.update({module_id: td_errors})
    fwd_out = learner.module[MODULE_ID].forward_train(batch)
    loss = learner.compute_loss_for_module(
        module_id=MODULE_ID, config=learner.config_for_module(MODULE_ID), batch=batch, fwd_out=fwd_out
    )
    return loss, reported[MODULE_ID]


def masked_batch(next_q: list[list[float]], next_masks: list[list[bool]], terminated: list[bool]) -> dict[str, Any]:
    """Rows taking action 0 at ``obs = 0`` (so ``Q(s, a) = 0``) for reward 0, then ``next_q`` as ``new_obs``."""
    rows = len(next_q)
    return {
        Columns.OBS: torch.zeros(rows, NUM_ACTIONS),
        Columns.ACTION_MASK: torch.ones(rows, NUM_ACTIONS, dtype=torch.bool),
        Columns.ACTIONS: torch.zeros(rows, dtype=torch.long),
        Columns.REWARDS: torch.zeros(rows),
        Columns.NEXT_OBS: torch.tensor(next_q),
        NEXT_ACTION_MASK: torch.tensor(next_masks),
        Columns.TERMINATEDS: torch.tensor(terminated),
        Columns.TRUNCATEDS: torch.zeros(rows, dtype=torch.bool),
        N_STEP: torch.ones(rows, dtype=torch.long),
        WEIGHTS: torch.ones(rows),
    }


# --------------------------------------------------------------------------------------------
# Acting
# --------------------------------------------------------------------------------------------


def test_masked_argmax_picks_the_best_legal_action_of_random_values_under_many_masks():
    values = torch.randn(2000, NUM_ACTIONS, generator=torch.Generator().manual_seed(1))
    masks = random_masks(2000, 2)
    chosen = masked_argmax(values, masks)
    assert masks[torch.arange(2000), chosen].all()
    best_legal = torch.where(masks, values, -torch.inf).max(-1).values
    torch.testing.assert_close(values[torch.arange(2000), chosen], best_legal)


@pytest.mark.parametrize("dueling", [False, True])
def test_greedy_dqn_actions_are_legal_and_the_best_legal_q_value(dueling: bool):
    module = masked_dqn_module(dueling=dueling)
    obs = torch.randn(1000, NUM_ACTIONS) * 5
    masks = random_masks(1000, 3)
    out = module.forward_inference({Columns.OBS: obs, Columns.ACTION_MASK: masks})
    actions = out[Columns.ACTIONS]
    assert masks[torch.arange(1000), actions].all()
    best_legal = torch.where(masks, out["q_values"], -torch.inf).max(-1).values
    torch.testing.assert_close(out["q_values"][torch.arange(1000), actions], best_legal)


@pytest.mark.parametrize("epsilon", [1.0, 0.5])
def test_exploration_picks_only_legal_actions_and_every_legal_one(epsilon: float):
    module = masked_dqn_module()
    module.epsilon.fill_(epsilon)
    masks = torch.zeros(3000, NUM_ACTIONS, dtype=torch.bool)
    masks[:, [1, 3, 4]] = True
    torch.manual_seed(4)
    actions = module.forward_exploration({Columns.OBS: torch.randn(3000, NUM_ACTIONS), Columns.ACTION_MASK: masks})[
        Columns.ACTIONS
    ]
    assert set(actions.tolist()) == {1, 3, 4}  # legal only, and each of them explored
    torch.manual_seed(5)
    varied = random_masks(3000, 6)
    actions = random_legal_actions(varied)
    assert varied[torch.arange(3000), actions].all()


def test_a_masked_dqn_module_needs_the_mask():
    module = masked_dqn_module()
    with pytest.raises(ValueError, match="masked observation space .* need the 'action_mask' column"):
        module.forward_inference({Columns.OBS: torch.zeros(2, NUM_ACTIONS)})


def test_policy_and_its_torch_export_of_a_masked_dqn_module_act_legally(tmp_path: Path):
    module = masked_dqn_module()
    with torch.no_grad():  # the unmasked favourite is always action 0, so the mask is what decides
        module.q_net.q[-1].bias[0] = 100.0
    policy = Policy(module)
    masks = random_masks(300, 7).numpy().astype(np.int8)
    obs = np.random.default_rng(8).uniform(-1, 1, (300, NUM_ACTIONS)).astype(np.float32)
    actions = policy.act({"action_mask": masks, "observation": obs})
    assert masks[np.arange(300), actions].all() and (actions == 0).any() and (actions != 0).any()
    path = export_policy(policy, tmp_path / "policy.pt2", "torch")
    program = torch.export.load(str(path)).module()
    with torch.no_grad():
        exported = program(torch.from_numpy(obs), action_mask=torch.from_numpy(masks)).numpy()
    np.testing.assert_array_equal(exported, actions)


# --------------------------------------------------------------------------------------------
# The target
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("double_q", [True, False])
def test_the_target_maximizes_over_the_next_states_legal_actions_only(double_q: bool):
    learner = identity_learner(gamma=0.5, double_q=double_q)
    # The illegal actions hold the largest next Q values (9 and 7); the best legal one is 2 (row 0) and -1 (row 1).
    batch = masked_batch(
        next_q=[[9.0, 1.0, 2.0, 0.0, 0.0], [7.0, -1.0, -3.0, 8.0, -2.0]],
        next_masks=[[False, True, True, False, True], [False, True, True, False, True]],
        terminated=[False, False],
    )
    _, td_errors = td_errors_of(learner, batch)
    torch.testing.assert_close(td_errors, torch.tensor([0 - 0.5 * 2.0, 0 - 0.5 * -1.0]))


def test_a_terminal_next_state_without_legal_actions_gives_a_finite_loss():
    learner = identity_learner(gamma=0.5)
    batch = masked_batch(
        next_q=[[1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0]],
        next_masks=[[False] * NUM_ACTIONS, [True, False, False, False, False]],
        terminated=[True, False],
    )
    batch[Columns.REWARDS] = torch.tensor([1.0, 0.0])
    loss, td_errors = td_errors_of(learner, batch)
    assert torch.isfinite(loss)
    torch.testing.assert_close(td_errors, torch.tensor([0 - 1.0, 0 - 0.5 * 1.0]))


def test_a_masked_dqn_batch_without_the_next_mask_is_refused_by_name():
    learner = identity_learner()
    batch = masked_batch([[0.0] * NUM_ACTIONS], [[True] * NUM_ACTIONS], [False])
    del batch[NEXT_ACTION_MASK]
    with pytest.raises(ValueError, match="lacks column.*next_action_mask"):
        learner.update_from_batch(batch)


@pytest.mark.parametrize(
    "learner_class, module_class", [(SACLearner, SACModule), (IQLLearner, IQLModule), (CQLLearner, CQLModule)]
)
def test_continuous_action_learners_refuse_masked_observations_by_name(learner_class: type, module_class: type):
    spec = RLModuleSpec(module_class, observation_space=MASKED, action_space=gym.spaces.Box(-1.0, 1.0, (2,)))
    message = rf"{learner_class.__name__} cannot train module 'default_policy' on action-masked observations"
    with pytest.raises(ValueError, match=message):
        learner_class(spec).build()


# --------------------------------------------------------------------------------------------
# The opponent env, the runner and the replay rows
# --------------------------------------------------------------------------------------------


def _pieces(obs: dict[str, np.ndarray]) -> tuple[int, int]:
    board = obs["observation"]
    return int(board[..., 0].sum()), int(board[..., 1].sum())


def test_seats_alternate_and_the_opponent_moves_first_from_the_second_seat():
    env = AgainstOpponentEnv("random")
    seats = []
    for episode in range(4):
        obs, info = env.reset(seed=episode)
        seats.append(info["seat"])
        assert _pieces(obs) == (0, info["seat"])  # from the second seat the opponent has moved once
        assert obs["action_mask"].sum() == 7
    assert seats == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="seat must be one of"):
        AgainstOpponentEnv("random", seat="middle")
    with pytest.raises(ValueError, match="opponent must be one of"):
        AgainstOpponentEnv("grandmaster")


@pytest.mark.parametrize("opponent", ["random", "heuristic"])
def test_games_end_with_a_win_loss_or_draw_reward_and_the_opponent_only_plays_legal_moves(opponent: str):
    env = AgainstOpponentEnv(opponent, seat="random")
    rng = np.random.default_rng(0)
    finals = set()
    for game in range(30):
        obs, info = env.reset(seed=game)
        done = False
        while not done:
            own, theirs = _pieces(obs)
            action = rng.choice(np.flatnonzero(obs["action_mask"]))
            obs, reward, terminated, truncated, _ = env.step(action)
            assert env.observation_space.contains(obs)
            done = terminated or truncated
            new_own, new_theirs = _pieces(obs)
            # One piece of the learner's per step, and one of the opponent's unless the learner's move ended the game.
            assert new_own == own + 1 and new_theirs - theirs in ((0,) if done and reward > 0 else (0, 1))
            assert done or (reward == 0 and new_theirs == theirs + 1)
        assert obs["action_mask"].sum() == 0  # no legal move once the game is over
        finals.add(reward)
    assert finals <= {-1.0, 0.0, 1.0} and -1.0 in finals
    assert opponent == "heuristic" or 1.0 in finals  # a random player beats the random opponent sometimes


def test_the_same_seed_replays_the_same_games():
    def game(seed: int) -> list[Any]:
        env = AgainstOpponentEnv("random", seat="random")
        obs, info = env.reset(seed=seed)
        trace, done = [info["seat"], obs["observation"].copy()], False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
            trace += [obs["observation"].copy(), reward]
            done = terminated or truncated
        return trace

    first, again, other = game(3), game(3), game(4)
    assert all(np.array_equal(a, b) for a, b in zip(first, again)) and len(first) == len(again)
    assert len(first) != len(other) or not all(np.array_equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize("prioritized, n_step", [(False, 1), (True, 3)])
def test_the_runner_acts_legally_and_replay_rows_carry_the_next_states_mask(prioritized: bool, n_step: int):
    env = AgainstOpponentEnv()
    spec = RLModuleSpec(
        DQNModule, env.observation_space, env.action_space, model_config={"fcnet_hiddens": [16], "dueling": True}
    )
    learner = DQNLearner(spec, minibatch_size=64, epsilon=0.0, n_step=n_step, gradient_steps=2)
    learner.build()
    with EnvRunner(AgainstOpponentEnv, num_envs=2, rollout_fragment_length=60, seed=0) as runner:
        assert runner.stored_observation_space.shape == (7 + 6 * 7 * 2,)  # the mask stored beside the board
        # Greedy acting: compute_actions refuses any illegal action the module returns.
        episodes = runner.sample(learner.module[MODULE_ID])
    buffer = PrioritizedReplayBuffer(1000, seed=0) if prioritized else ReplayBuffer(1000, seed=0)
    buffer.add_episodes(episodes)
    layout = ObservationLayout(runner.observation_space)
    sample = buffer.sample(256, n_step=n_step)
    _, next_masks = layout.split_masked_batch(sample[Columns.NEXT_OBS])
    terminated = sample[Columns.TERMINATEDS].astype(bool)
    # A game's last position has no legal move; every other position (n steps on) has some.
    assert terminated.any() and not next_masks[terminated].any() and next_masks[~terminated].any(axis=1).all()
    results = learner.update_from_replay(buffer)
    assert np.isfinite(results[MODULE_ID]["qf_loss"])


def test_the_example_config_fits_for_a_few_hundred_moves_and_its_checkpoint_evaluates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    cli = LightningRLCLI(
        args=[
            "fit", "--config", EXAMPLE,
            "--trainer.default_root_dir", str(tmp_path),
            "--trainer.enable_progress_bar", "false",
            "--data.init_args.max_env_steps", "384",
            "--data.init_args.learning_starts", "256",
            "--data.init_args.rollouts_per_epoch", "3",
            "--data.init_args.evaluation_num_episodes", "4",
            "--model.init_args.gradient_steps", "4",
        ]
    )  # fmt: skip
    assert isinstance(cli.model, DQNLearner)
    assert cli.datamodule.num_env_steps_sampled_lifetime == 384
    assert cli.model.weights_seq_no == 2 * 4  # items 2 and 3 learn
    assert -1.0 <= float(cli.trainer.callback_metrics["eval/episode_return_mean"]) <= 1.0
    # evaluate plays the config's env; the stored rows reach the policy as the env's masked dicts.
    checkpoint = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    evaluate_command.main(
        ["--ckpt_path", str(checkpoint), "--config", EXAMPLE, "--num_episodes", "3", "--num_envs", "2"]
    )
    assert "AgainstOpponentEnv" in capsys.readouterr().out


def test_ppo_trains_on_a_masked_single_agent_env_with_the_masks_it_sampled_under():
    """The runner stores the mask inside each observation; PPO's rows get it back as ``action_mask``."""
    env = AgainstOpponentEnv()
    spec = RLModuleSpec(PPOModule, env.observation_space, env.action_space, model_config={"fcnet_hiddens": [16]})
    learner = PPOLearner(spec, minibatch_size=64, num_epochs=1)
    learner.build()
    layout = ObservationLayout(env.observation_space)
    with EnvRunner(AgainstOpponentEnv, num_envs=2, rollout_fragment_length=40, seed=0) as runner:
        episodes = runner.sample(learner.module[MODULE_ID])
    stored = np.concatenate([np.asarray(episode.observations)[:-1] for episode in episodes])
    batch = learner.episodes_to_train_batch(episodes)[MODULE_ID]
    boards, masks = layout.split_masked_batch(stored)
    np.testing.assert_array_equal(batch[Columns.OBS].numpy(), boards)
    np.testing.assert_array_equal(batch[Columns.ACTION_MASK].numpy(), masks)
    assert masks[np.arange(len(masks)), batch[Columns.ACTIONS].numpy()].all()  # every sampled move was legal
    # Before any update the module's masked log-probabilities are the ones it sampled with.
    with torch.no_grad():
        out = learner.module[MODULE_ID].forward_train(batch)
    logp = learner.module[MODULE_ID].get_train_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
    torch.testing.assert_close(logp.logp(batch[Columns.ACTIONS]), batch[Columns.ACTION_LOGP])
    assert {np.asarray(episode.observations).shape[1] for episode in episodes} == {7 + 6 * 7 * 2}  # left unsplit
    results = learner.update_from_episodes(episodes)
    assert np.isfinite(results[MODULE_ID]["policy_loss"])
    # Episodes split already (the multi-agent runner's form: boards, and the masks as a model output) pass as they are.
    split = [split_action_masks(episode, layout) for episode in episodes]
    assert [split_action_masks(episode, layout) for episode in split] == split


def test_the_ppo_example_fits_a_masked_single_agent_env_and_its_checkpoint_acts_legally(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    cli = LightningRLCLI(
        args=[
            "fit", "--config", PPO_EXAMPLE,
            "--trainer.default_root_dir", str(tmp_path),
            "--trainer.enable_progress_bar", "false",
            "--data.init_args.num_envs", "2",
            "--data.init_args.rollout_fragment_length", "32",
            "--data.init_args.max_env_steps", "128",
            "--data.init_args.rollouts_per_epoch", "2",
            "--data.init_args.evaluation_num_episodes", "2",
            "--data.init_args.evaluation_num_envs", "2",
            "--model.init_args.minibatch_size", "32",
            "--model.init_args.num_epochs", "1",
            "--model.init_args.model_config.fcnet_hiddens", "[16]",
        ]
    )  # fmt: skip
    assert isinstance(cli.model, PPOLearner)
    assert cli.datamodule.num_env_steps_sampled_lifetime == 128
    assert cli.model.weights_seq_no == 2 * 2  # two rollouts of 64 rows, each two minibatches of 32
    assert -1.0 <= float(cli.trainer.callback_metrics["eval/episode_return_mean"]) <= 1.0
    checkpoint = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    policy = Policy.from_checkpoint(str(checkpoint))
    env = AgainstOpponentEnv(seat="second")
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        action = policy.act(obs, deterministic=False)
        assert obs["action_mask"][action] == 1
        obs, *_ = env.step(action)
    # evaluate --opponent plays the config's AgainstOpponentEnv against another fixed opponent.
    play = ["--ckpt_path", str(checkpoint), "--config", PPO_EXAMPLE, "--num_episodes", "2", "--num_envs", "2"]
    evaluate_command.main([*play, "--opponent", "heuristic"])
    assert "AgainstOpponentEnv (env from --config, against the heuristic opponent): 2 greedy episodes" in (
        capsys.readouterr().out
    )
    source = evaluate_command.env_source(None, Path(PPO_EXAMPLE), {}, "", opponent="heuristic")
    assert source.env_kwargs == {"opponent": "heuristic", "seat": "alternate"}
    opponent = type(source.make_env().opponent)
    assert opponent is type(AgainstOpponentEnv(opponent="heuristic").opponent)
    assert opponent is not type(AgainstOpponentEnv(opponent="random").opponent)
    message = "--opponent 'self': AgainstOpponentEnv plays a fixed opponent, one of ['heuristic', 'random']"
    with pytest.raises(SystemExit):
        evaluate_command.main([*play, "--opponent", "self"])
    assert message in capsys.readouterr().err
    # record too: a Minari dataset of the games against the heuristic.
    pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    record_command.main([*play, "--opponent", "heuristic", "--dataset_id", "c4/ppo-heuristic-v0"])
    assert "(env from --config, against the heuristic opponent): 2 episodes" in capsys.readouterr().out
    assert (tmp_path / "datasets" / "c4" / "ppo-heuristic-v0").is_dir()


@pytest.mark.parametrize("learner_class", [APPOLearner, IMPALALearner])
def test_appo_and_impala_fit_a_masked_single_agent_env_from_asynchronous_samplers(learner_class: type):
    # The samplers' episodes reach the same AddColumnsFromEpisodes, which splits their rows.
    data = AsyncSamplingDataModule(
        "lightning_rl.env.against_opponent.AgainstOpponentEnv", num_envs=2, num_env_runners=1,
        rollout_fragment_length=16, seed=0, max_env_steps=128, evaluation_num_episodes=2,
    )  # fmt: skip
    trainer = Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    learner = learner_class(minibatch_size=32, model_config={"fcnet_hiddens": [16]})
    trainer.fit(learner, datamodule=data)
    assert data.num_env_steps_sampled_lifetime == 128 and learner.weights_seq_no > 0
    assert np.isfinite(float(trainer.callback_metrics["default_policy/policy_loss"]))
