"""DQN: the TD target and loss against hand computations, dueling heads, epsilon-greedy acting,
target-network syncs, resuming from a checkpoint, the example config and a CartPole run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from lightning_rl import Columns, RLModuleSpec
from lightning_rl.algorithms.dqn import Q_TARGET_NEXT, Q_VALUES, Q_VALUES_NEXT, DQNLearner, DQNModule
from lightning_rl.algorithms.off_policy import BATCH_INDEXES, N_STEP, WEIGHTS
from lightning_rl.cli import LightningRLCLI
from lightning_rl.data import OffPolicyDataModule
from lightning_rl.data.uniform_replay import ReplayBuffer
from lightning_rl.env import EnvRunner

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = str(REPO / "examples" / "dqn_cartpole.yaml")
OBS2 = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
TWO_ACTIONS = gym.spaces.Discrete(2)
MODULE_ID = "default_policy"


def dqn_spec(
    obs_space: gym.Space = OBS2, action_space: gym.Space = TWO_ACTIONS, **model_config: Any
) -> RLModuleSpec:
    config = {"fcnet_hiddens": [16], **model_config}
    return RLModuleSpec(
        module_class=DQNModule, observation_space=obs_space, action_space=action_space, model_config=config
    )


def linear_learner(**kwargs: Any) -> DQNLearner:
    """A Learner whose Q networks are hand-set linear maps of the 2-d observation:

    online ``Q(s) = [s0, s1]``, target ``Q_target(s) = [s1, s0]``: the two disagree on the
    best action, so double and vanilla DQN bootstrap from different values.
    """
    learner = DQNLearner(dqn_spec(fcnet_hiddens=[]), **kwargs)
    learner.build()
    module = learner.module[MODULE_ID]
    with torch.no_grad():
        module.q_net.q[0].weight.copy_(torch.eye(2))
        module.q_net.q[0].bias.zero_()
        module.target_q_net.q[0].weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
        module.target_q_net.q[0].bias.zero_()
    return learner


def replay_batch(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """A replay minibatch from rows of ``obs, action, reward, new_obs`` (+ optional flags)."""
    return {
        Columns.OBS: torch.tensor([row["obs"] for row in rows], dtype=torch.float32),
        Columns.ACTIONS: torch.tensor([row["action"] for row in rows]),
        Columns.REWARDS: torch.tensor([row["reward"] for row in rows], dtype=torch.float32),
        Columns.NEXT_OBS: torch.tensor([row["new_obs"] for row in rows], dtype=torch.float32),
        Columns.TERMINATEDS: torch.tensor([row.get("terminated", False) for row in rows]),
        Columns.TRUNCATEDS: torch.tensor([row.get("truncated", False) for row in rows]),
        N_STEP: torch.tensor([row.get("n_step", 1) for row in rows]),
        WEIGHTS: torch.tensor([row.get("weight", 1.0) for row in rows], dtype=torch.float32),
    }


def loss_and_td_errors(learner: DQNLearner, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the loss the way an update does; return it and the TD errors the loss reported."""
    reported = {}
    learner.record_td_errors = lambda module_id, td_errors: reported.update({module_id: td_errors})
    learner.before_gradient_based_update(timesteps={})
    fwd_out = learner.module[MODULE_ID].forward_train(batch)
    loss = learner.compute_loss_for_module(
        module_id=MODULE_ID, config=learner.config_for_module(MODULE_ID), batch=batch, fwd_out=fwd_out
    )
    return loss, reported[MODULE_ID]


# Rows for the hand computation, gamma = 0.5. Online Q(s) = s, target Q(s) = s reversed.
TD_ROWS = [
    # Q(s, 0) = 1. Online picks a* = 1 at s' = [1, 3], worth 1 to the target; the target's own max is 3.
    {"obs": [1.0, 2.0], "action": 0, "reward": 1.0, "new_obs": [1.0, 3.0]},
    # Terminated: no bootstrap at all, y = r.
    {"obs": [4.0, 0.0], "action": 0, "reward": 2.0, "new_obs": [5.0, 0.0], "terminated": True},
    # Truncated: bootstraps as usual. Online a* = 0 at s' = [4, 2], worth 2; target max is 4.
    {"obs": [0.0, 3.0], "action": 1, "reward": 0.5, "new_obs": [4.0, 2.0], "truncated": True},
    # A 3-step return: the bootstrap is discounted by 0.5 ** 3. Online a* = 1, worth 2; target max 6.
    {"obs": [2.0, 5.0], "action": 1, "reward": 1.0, "new_obs": [2.0, 6.0], "n_step": 3},
]
Q_TAKEN = [1.0, 4.0, 3.0, 5.0]
TARGETS = {
    True: [1 + 0.5 * 1, 2.0, 0.5 + 0.5 * 2, 1 + 0.125 * 2],  # double Q
    False: [1 + 0.5 * 3, 2.0, 0.5 + 0.5 * 4, 1 + 0.125 * 6],  # vanilla: max of the target
}


@pytest.mark.parametrize("double_q", [True, False])
def test_td_errors_match_the_hand_computed_target(double_q: bool):
    learner = linear_learner(gamma=0.5, double_q=double_q)
    _, td_errors = loss_and_td_errors(learner, replay_batch(TD_ROWS))
    expected = torch.tensor(Q_TAKEN) - torch.tensor(TARGETS[double_q])
    torch.testing.assert_close(td_errors, expected)


def test_the_target_carries_no_gradient_and_the_train_pass_also_gives_the_online_next_q_values():
    learner = linear_learner(gamma=0.5)
    batch = replay_batch(TD_ROWS)
    fwd_out = learner.module[MODULE_ID].forward_train(batch)
    torch.testing.assert_close(fwd_out[Q_VALUES], batch[Columns.OBS])
    torch.testing.assert_close(fwd_out[Q_VALUES_NEXT], batch[Columns.NEXT_OBS])
    # Only double Q's argmax reads the online next values: no graph is kept for them.
    assert fwd_out[Q_VALUES].requires_grad and not fwd_out[Q_VALUES_NEXT].requires_grad
    target = learner.module[MODULE_ID].forward_target(batch)[Q_TARGET_NEXT]
    torch.testing.assert_close(target, batch[Columns.NEXT_OBS].flip(-1))

    loss, _ = loss_and_td_errors(learner, batch)
    loss.backward()
    module = learner.module[MODULE_ID]
    assert module.q_net.q[0].weight.grad is not None
    assert all(param.grad is None for param in module.target_q_net.parameters())


@pytest.mark.parametrize(
    ("loss_fn", "expected"),
    [
        # TD errors 0.5 and -3: Huber is 0.5 * 0.5**2 inside |x| < 1 and |x| - 0.5 outside.
        ("huber", (0.5 * 0.25 + (3 - 0.5)) / 2),
        ("mse", (0.25 + 9.0) / 2),
    ],
)
def test_huber_and_squared_error_losses(loss_fn: str, expected: float):
    learner = linear_learner(td_error_loss_fn=loss_fn)
    rows = [  # terminated rows: the target is the reward alone
        {"obs": [1.5, 0.0], "action": 0, "reward": 1.0, "new_obs": [0.0, 0.0], "terminated": True},
        {"obs": [0.0, 1.0], "action": 1, "reward": 4.0, "new_obs": [0.0, 0.0], "terminated": True},
    ]
    loss, td_errors = loss_and_td_errors(learner, replay_batch(rows))
    torch.testing.assert_close(td_errors, torch.tensor([0.5, -3.0]))
    assert loss.item() == pytest.approx(expected)


def test_importance_weights_scale_each_rows_loss():
    learner = linear_learner(td_error_loss_fn="mse")
    rows = [
        {"obs": [1.5, 0.0], "action": 0, "reward": 1.0, "new_obs": [0.0, 0.0], "terminated": True, "weight": 2.0},
        {"obs": [0.0, 1.0], "action": 1, "reward": 4.0, "new_obs": [0.0, 0.0], "terminated": True, "weight": 0.0},
    ]
    loss, _ = loss_and_td_errors(learner, replay_batch(rows))
    assert loss.item() == pytest.approx((2.0 * 0.25 + 0.0 * 9.0) / 2)


def test_dueling_q_is_value_plus_mean_centred_advantages():
    module = dqn_spec(action_space=gym.spaces.Discrete(3), fcnet_hiddens=[], dueling=True).build()
    with torch.no_grad():
        module.q_net.value[0].weight.copy_(torch.tensor([[1.0, 1.0]]))
        module.q_net.value[0].bias.fill_(0.5)
        module.q_net.advantage[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]))
        module.q_net.advantage[0].bias.zero_()
    obs = torch.tensor([[1.0, 2.0], [-1.0, 0.0]])
    q = module.forward_inference({Columns.OBS: obs})[Q_VALUES]
    value = obs.sum(-1, keepdim=True) + 0.5
    advantages = torch.stack([obs[:, 0], obs[:, 1], 2 * obs.sum(-1)], dim=-1)
    torch.testing.assert_close(q, value + advantages - advantages.mean(-1, keepdim=True))
    torch.testing.assert_close(q.mean(-1, keepdim=True), value)  # the mean Q is the state value


def test_dueling_streams_share_all_hidden_layers_but_the_last():
    module = dqn_spec(fcnet_hiddens=[8, 6], dueling=True).build()
    q_net = module.q_net
    assert [layer.out_features for layer in q_net.encoder if isinstance(layer, torch.nn.Linear)] == [8]
    assert [layer.out_features for layer in q_net.value if isinstance(layer, torch.nn.Linear)] == [6, 1]
    assert [layer.out_features for layer in q_net.advantage if isinstance(layer, torch.nn.Linear)] == [6, 2]
    assert isinstance(q_net.encoder[1], torch.nn.ReLU)  # DQN's default activation
    assert module.target_q_net.state_dict().keys() == q_net.state_dict().keys()


class FakeReplay:
    """Hands out one fixed minibatch; records the priorities the Learner reports."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.batch = {key: value.numpy() for key, value in replay_batch(rows).items()}
        self.batch[BATCH_INDEXES] = np.arange(100, 100 + len(rows))
        self.priority_updates: list[tuple[np.ndarray, np.ndarray]] = []

    def sample(self, batch_size: int, *, n_step: int, gamma: float) -> dict[str, np.ndarray]:
        return dict(self.batch)

    def update_priorities(self, batch_indexes: np.ndarray, td_errors: np.ndarray) -> None:
        self.priority_updates.append((batch_indexes, td_errors))


def test_td_errors_of_each_step_reach_the_replay_priorities_and_the_q_statistics_the_results():
    learner = linear_learner(gamma=0.5, lr=0.0, gradient_steps=2, minibatch_size=4)
    replay = FakeReplay(TD_ROWS)
    results = learner.update_from_replay(replay)
    assert len(replay.priority_updates) == 2
    indexes, td_errors = replay.priority_updates[0]
    np.testing.assert_array_equal(indexes, [100, 101, 102, 103])
    np.testing.assert_allclose(td_errors, np.array(Q_TAKEN) - np.array(TARGETS[True]), rtol=1e-6)
    assert results[MODULE_ID]["td_error_mean"] == pytest.approx(np.abs(td_errors).mean())
    assert results[MODULE_ID]["qf_mean"] == pytest.approx(np.mean(Q_TAKEN))
    assert (results[MODULE_ID]["qf_max"], results[MODULE_ID]["qf_min"]) == (max(Q_TAKEN), min(Q_TAKEN))
    # Online Q(s') = s', target Q(s') = s' reversed: each action's gap is |s'0 - s'1|.
    gaps = [abs(row["new_obs"][0] - row["new_obs"][1]) for row in TD_ROWS]
    assert results[MODULE_ID]["target_qf_gap_mean"] == pytest.approx(np.mean(gaps))
    assert results[MODULE_ID]["qf_loss"] == pytest.approx(results[MODULE_ID]["total_loss"])


def test_epsilon_follows_its_schedule_from_build_on_every_update():
    learner = DQNLearner(dqn_spec(), epsilon=[[0, 1.0], [1000, 0.1]])
    learner.build()
    module = learner.module[MODULE_ID]
    assert module.epsilon.item() == 1.0 and module.epsilon.dtype == torch.float32
    # Before learning starts (no replay) the update still moves epsilon along.
    results = learner.update_from_replay(None, timesteps={"num_env_steps_sampled_lifetime": 500})
    assert module.epsilon.item() == pytest.approx(0.55)
    assert results[MODULE_ID]["curr_epsilon"] == pytest.approx(0.55)
    learner.update_from_replay(None, timesteps={"num_env_steps_sampled_lifetime": 5000})
    assert module.epsilon.item() == pytest.approx(0.1)
    assert "epsilon" in module.state_dict()  # saved with the weights

    constant = DQNLearner(dqn_spec(), epsilon=0.3)
    constant.build()
    assert constant.module[MODULE_ID].epsilon.item() == pytest.approx(0.3)


@pytest.mark.parametrize("epsilon", [0.0, 0.3, 1.0])
def test_exploration_takes_a_uniformly_random_action_with_probability_epsilon(epsilon: float):
    module = dqn_spec(action_space=gym.spaces.Discrete(4)).build()
    module.epsilon.fill_(epsilon)
    obs = torch.zeros(20000, 2)  # one state: one greedy action
    greedy = module.forward_inference({Columns.OBS: obs[:1]})[Columns.ACTIONS].item()
    torch.manual_seed(0)
    actions = module.forward_exploration({Columns.OBS: obs})[Columns.ACTIONS]
    frequencies = torch.bincount(actions, minlength=4).float() / len(actions)
    # A random action is each of the 4 with probability 1/4, the greedy one included.
    expected = torch.full((4,), epsilon / 4)
    expected[greedy] += 1 - epsilon
    torch.testing.assert_close(frequencies, expected, atol=0.01, rtol=0)


def test_inference_is_greedy_and_actions_respect_the_space_start():
    space = gym.spaces.Discrete(3, start=-1)
    module = dqn_spec(action_space=space).build()
    obs = torch.randn(64, 2)
    out = module.forward_inference({Columns.OBS: obs})
    torch.testing.assert_close(out[Columns.ACTIONS], out[Q_VALUES].argmax(-1) - 1)
    module.epsilon.fill_(1.0)
    explored = module.forward_exploration({Columns.OBS: obs})[Columns.ACTIONS]
    assert all(space.contains(int(action)) for action in explored)

    # The loss maps env actions back to Q columns: action -1 is column 0.
    learner = DQNLearner(dqn_spec(action_space=space), gamma=0.0)
    learner.build()
    batch = replay_batch([{"obs": [0.3, -0.2], "action": -1, "reward": 0.0, "new_obs": [0.0, 0.0]}])
    _, td_errors = loss_and_td_errors(learner, batch)
    q = learner.module[MODULE_ID].forward_inference(batch)[Q_VALUES]
    torch.testing.assert_close(td_errors, q[:, 0].detach())


def test_target_network_is_frozen_and_outside_the_optimizer():
    learner = DQNLearner(dqn_spec(dueling=True))
    learner.build()
    module = learner.module[MODULE_ID]
    assert all(not param.requires_grad for param in module.target_q_net.parameters())
    optimized = {id(param) for group in learner.get_optimizer().param_groups for param in group["params"]}
    assert optimized == {id(param) for param in module.q_net.parameters()}
    for online, target in zip(module.q_net.parameters(), module.target_q_net.parameters()):
        assert torch.equal(online, target)  # starts as a copy


def cartpole_replay(steps: int = 200) -> tuple[ReplayBuffer, EnvRunner]:
    runner = EnvRunner("CartPole-v1", num_envs=2, rollout_fragment_length=steps // 2, seed=0)
    buffer = ReplayBuffer(1000, seed=0)
    module = DQNModule(runner.observation_space, runner.action_space, {"fcnet_hiddens": [8]})
    buffer.add_episodes(runner.sample(module))
    return buffer, runner


def test_hard_target_sync_happens_exactly_every_target_network_update_freq_gradient_steps():
    buffer, runner = cartpole_replay()
    spec = dqn_spec(runner.observation_space, runner.action_space, fcnet_hiddens=[8])
    learner = DQNLearner(spec, lr=1e-2, minibatch_size=16, gradient_steps=1, target_network_update_freq=3)
    learner.build()
    module = learner.module[MODULE_ID]

    def state(net: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {name: value.clone() for name, value in net.state_dict().items()}

    synced = state(module.target_q_net)
    for step in range(1, 10):
        learner.update_from_replay(buffer)
        online, target = state(module.q_net), state(module.target_q_net)
        if step % 3 == 0:
            synced = online
        else:  # the online net has moved on since the last sync; the target has not
            assert any(not torch.equal(online[name], synced[name]) for name in online)
        assert all(torch.equal(target[name], synced[name]) for name in target), f"after gradient step {step}"


def test_inference_only_modules_have_no_target_network():
    module = RLModuleSpec(
        module_class=DQNModule, observation_space=OBS2, action_space=TWO_ACTIONS, inference_only=True
    ).build()
    assert module.target_q_net is None and module.get_target_network_pairs() == []
    with pytest.raises(ValueError, match="inference_only"):
        module.forward_target({Columns.NEXT_OBS: torch.zeros(1, 2)})


def test_non_discrete_actions_and_bad_hyperparameters_fail_naming_them():
    with pytest.raises(ValueError, match="Discrete action space"):
        dqn_spec(action_space=gym.spaces.Box(-1.0, 1.0, (1,), np.float32)).build()
    with pytest.raises(ValueError, match="epsilon must stay in"):
        DQNLearner(dqn_spec(), epsilon=[[0, 1.5], [100, 0.1]])
    with pytest.raises(ValueError, match="epsilon"):
        DQNLearner(dqn_spec(), epsilon=-0.1)
    with pytest.raises(ValueError, match="td_error_loss_fn"):
        DQNLearner(dqn_spec(), td_error_loss_fn="l1")
    with pytest.raises(ValueError, match="double_q"):
        DQNLearner(dqn_spec(), double_q="yes")
    with pytest.raises(ValueError, match="target_network_update_freq"):
        DQNLearner(dqn_spec(), target_network_update_freq=0)
    with pytest.raises(ValueError, match="either module_spec or model_config"):
        DQNLearner(dqn_spec(), model_config={"dueling": True})
    with pytest.raises(ValueError, match="epsilon must stay in"):
        DQNLearner(dqn_spec(), config_overrides_per_module={MODULE_ID: {"epsilon": 2.0}})


# ----------------------------------------------------------------------------------------
# Under Trainer.fit
# ----------------------------------------------------------------------------------------

EPSILON = [[0, 1.0], [1000, 0.0]]


def cartpole_learner(**kwargs: Any) -> DQNLearner:
    settings = dict(
        model_config={"fcnet_hiddens": [16]},
        epsilon=EPSILON,
        minibatch_size=16,
        gradient_steps=2,
        target_network_update_freq=3,
    )
    settings.update(kwargs)
    return DQNLearner(**settings)


def cartpole_data(**kwargs: Any) -> OffPolicyDataModule:
    settings = dict(
        env="CartPole-v1",
        seed=0,
        replay_buffer_capacity=1000,
        train_freq=32,
        learning_starts=64,
        rollouts_per_epoch=4,
        max_env_steps=256,
        evaluation_num_episodes=1,
    )
    settings.update(kwargs)
    return OffPolicyDataModule(**settings)


class CaptureAtStart(Callback):
    """The module's weights and epsilon when training starts (after a checkpoint is restored)."""

    def on_train_start(self, trainer: Trainer, pl_module: DQNLearner) -> None:
        self.state = {name: value.clone() for name, value in pl_module.module[MODULE_ID].state_dict().items()}


def test_resuming_restores_target_network_epsilon_and_the_schedule_position(tmp_path: Path):
    trainer_settings = dict(
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        max_epochs=-1,
    )
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    learner = cartpole_learner()
    Trainer(callbacks=[checkpoint], **trainer_settings).fit(learner, datamodule=cartpole_data())
    module = learner.module[MODULE_ID]
    saved = {name: value.clone() for name, value in module.state_dict().items()}
    # 7 of the 8 items learn (the buffer holds learning_starts=64 steps from the 2nd on), 2 steps
    # each: 14 gradient steps. The last sync was at step 12, so the target now differs from the net.
    assert learner.weights_seq_no == 14
    assert any(not torch.equal(saved[f"q_net.{k}"], saved[f"target_q_net.{k}"]) for k in module.q_net.state_dict())
    assert saved["epsilon"].item() == pytest.approx(1.0 - 256 / 1000)  # set for the last item, at 256 env steps

    resumed = cartpole_learner()
    capture = CaptureAtStart()
    trainer = Trainer(callbacks=[capture], enable_checkpointing=False, **trainer_settings)
    trainer.fit(resumed, datamodule=cartpole_data(max_env_steps=352), ckpt_path=str(tmp_path / "last.ckpt"))
    for name, value in saved.items():  # online and target weights, and epsilon
        assert torch.equal(capture.state[name], value), name
    # Three more items; the buffer (not checkpointed) refills to 64 steps, so the last two learn.
    assert resumed.weights_seq_no == 14 + 2 * 2
    # The schedule continues from the restored timestep: the last update ran at 352 env steps.
    assert resumed.module[MODULE_ID].epsilon.item() == pytest.approx(1.0 - 352 / 1000)


def test_the_example_config_fits_from_the_command_line(tmp_path: Path):
    cli = LightningRLCLI(
        args=[
            "fit", "--config", EXAMPLE,
            "--trainer.default_root_dir", str(tmp_path),
            "--trainer.enable_progress_bar", "false",
            "--data.init_args.max_env_steps", "768",
            "--data.init_args.learning_starts", "512",
            "--data.init_args.rollouts_per_epoch", "3",
            "--data.init_args.evaluation_num_episodes", "2",
            "--model.init_args.gradient_steps", "4",
        ]
    )  # fmt: skip
    assert isinstance(cli.model, DQNLearner)
    assert cli.datamodule.num_env_steps_sampled_lifetime == 768
    assert cli.model.weights_seq_no == 2 * 4  # items 2 and 3 learn
    assert "eval/episode_return_mean" in cli.trainer.callback_metrics
    assert (tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt").exists()


class EvalReturns(Callback):
    def __init__(self) -> None:
        self.returns: list[float] = []

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: DQNLearner) -> None:
        self.returns.append(float(trainer.callback_metrics["eval/episode_return_mean"]))


@pytest.mark.slow
def test_dqn_learns_cartpole():
    # The example's settings on a smaller scale: 64x64 net, 64 gradient steps per 256 env
    # steps, 3-step returns, epsilon down to 0.04 over 5k steps. Seeds 0-3 all pass 200
    # within 7.7k env steps (~5 s); the run may take 15k.
    torch.manual_seed(0)
    learner = DQNLearner(
        model_config={"fcnet_hiddens": [64, 64]},
        lr=2.3e-3,
        epsilon=[[0, 1.0], [5000, 0.04]],
        n_step=3,
        gradient_steps=64,
        minibatch_size=64,
        target_network_update_freq=64,
    )
    data = OffPolicyDataModule(
        "CartPole-v1",
        seed=0,
        replay_buffer_capacity=20000,
        train_freq=256,
        learning_starts=1000,
        rollouts_per_epoch=10,  # evaluate every 2560 env steps
        max_env_steps=15360,
        evaluation_num_episodes=5,
    )
    evals = EvalReturns()
    stop = EarlyStopping("eval/episode_return_mean", mode="max", stopping_threshold=200.0, patience=1000)
    trainer = Trainer(
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[evals, stop],
    )
    trainer.fit(learner, datamodule=data)
    assert max(evals.returns) > 150, evals.returns
    assert math.isfinite(trainer.callback_metrics["default_policy/qf_loss"])
